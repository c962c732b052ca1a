//! `engine noise`: a rung's two noise streams ([`crate::rng`]) in the shape the
//! reference draws them, so a reference run can start from the engine's numbers.
//!
//! File: `latents` and `decode_noise`, both f32 `[1, C, F', H', W']` (batch,
//! latent channels, latent grid), the shape diffusers' `LTXPipeline` draws its
//! initial latents in before packing them into tokens and its decode noise in
//! after unpacking. Metadata: `seed`, `grid` (`F'xH'xW'`), `channels`.

use std::path::Path;

use super::{OracleError, TensorFile};
use crate::rng::{decode_noise, initial_latents};

/// Write the noise of a render with `seed` over the latent `grid` with
/// `channels` latent channels to `path`.
pub fn write_noise(
    seed: u64,
    channels: usize,
    grid: (usize, usize, usize),
    path: &Path,
) -> Result<(), OracleError> {
    let shape = [1, channels, grid.0, grid.1, grid.2];
    let mut f = TensorFile::new();
    f.f32(
        "latents",
        &shape,
        initial_latents(seed, channels, grid).data(),
    );
    f.f32(
        "decode_noise",
        &shape,
        decode_noise(seed, channels, grid).data(),
    );
    f.meta("seed", seed.to_string());
    f.meta("grid", format!("{}x{}x{}", grid.0, grid.1, grid.2));
    f.meta("channels", channels.to_string());
    f.write(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_file_holds_the_streams_the_render_draws() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/oracle");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("noise.safetensors");
        write_noise(42, 4, (2, 1, 3), &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let read = |n: &str| -> Vec<f32> {
            let t = st.tensor(n).unwrap();
            assert_eq!(t.shape(), &[1, 4, 2, 1, 3]);
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        assert_eq!(read("latents"), initial_latents(42, 4, (2, 1, 3)).data());
        assert_eq!(read("decode_noise"), decode_noise(42, 4, (2, 1, 3)).data());
        assert_ne!(read("latents"), read("decode_noise"));
    }
}
