//! A deterministic, random-access Gaussian generator.
//!
//! Algorithm (fixed; changing it changes every latent and synthetic weight):
//!
//! 1. A stream key: `key = splitmix64_mix(seed ^ fnv1a64(stream name))`, so
//!    every named stream (`latents`, `decode_noise`, a tensor name, ...) of one
//!    seed is independent.
//! 2. Uniform 64-bit words: word `c` of a stream is the `(c + 1)`-th output of
//!    SplitMix64 started at `key`, i.e. `splitmix64_mix(key + (c + 1) * 0x9E3779B97F4A7C15)`;
//!    any word can be computed without the ones before it.
//! 3. Normals by Box-Muller in f64: element pair `j` takes words `2j` and
//!    `2j + 1` as `u1 = (w >> 11 + 1) / 2^53` in (0, 1] and `u2 = (w >> 11) / 2^53`,
//!    `r = sqrt(-2 ln u1)`, element `2j = r cos(2 pi u2)`, element `2j + 1 = r sin(2 pi u2)`,
//!    each rounded to f32.
//!
//! Because element `i` depends only on `(seed, stream, i)`, a tensor can be
//! filled in parallel chunks and gives the same values in any order.

/// Stream of a render's initial latents.
pub const LATENTS_STREAM: &str = "latents";
/// Stream of the noise mixed into the latents before a timestep-conditioned decode.
pub const DECODE_NOISE_STREAM: &str = "decode_noise";

/// The initial latents of a render with `seed`: standard normals of stream
/// [`LATENTS_STREAM`] filling `[channels, frames, height, width]` (latent grid)
/// in row-major order, the order in which the reference draws them before
/// packing them into tokens.
pub fn initial_latents(
    seed: u64,
    channels: usize,
    grid: (usize, usize, usize),
) -> crate::tensor::Tensor {
    let shape = [channels, grid.0, grid.1, grid.2];
    let v = Gaussian::new(seed, LATENTS_STREAM).vec(shape.iter().product());
    crate::tensor::Tensor::new(&shape, v).expect("shape and length agree")
}

/// The decode noise of a render with `seed`, `[channels, frames, height,
/// width]`, from stream [`DECODE_NOISE_STREAM`].
pub fn decode_noise(
    seed: u64,
    channels: usize,
    grid: (usize, usize, usize),
) -> crate::tensor::Tensor {
    let shape = [channels, grid.0, grid.1, grid.2];
    let v = Gaussian::new(seed, DECODE_NOISE_STREAM).vec(shape.iter().product());
    crate::tensor::Tensor::new(&shape, v).expect("shape and length agree")
}

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Steele, Lea, Flood 2014).
pub fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Elements per parallel piece of [`Gaussian::vec`] (even; ~16 K normals, tens
/// of microseconds each).
const FILL_PIECE: usize = 1 << 14;

/// One named stream of standard normals under one seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gaussian {
    key: u64,
}

impl Gaussian {
    /// The stream `name` of `seed`.
    pub fn new(seed: u64, name: &str) -> Self {
        Gaussian {
            key: splitmix64_mix(seed ^ fnv1a64(name.as_bytes())),
        }
    }

    /// Uniform word `c` of the stream.
    pub fn word(&self, c: u64) -> u64 {
        splitmix64_mix(
            self.key
                .wrapping_add(c.wrapping_add(1).wrapping_mul(GOLDEN)),
        )
    }

    /// Element `i` of the stream (a standard normal as f32).
    pub fn at(&self, i: u64) -> f32 {
        let (a, b) = self.pair(i / 2);
        if i % 2 == 0 {
            a
        } else {
            b
        }
    }

    fn pair(&self, j: u64) -> (f32, f32) {
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        let u1 = ((self.word(2 * j) >> 11) + 1) as f64 * SCALE;
        let u2 = (self.word(2 * j + 1) >> 11) as f64 * SCALE;
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        ((r * t.cos()) as f32, (r * t.sin()) as f32)
    }

    /// Fill `out` with elements `start .. start + out.len()` of the stream.
    pub fn fill(&self, start: u64, out: &mut [f32]) {
        let mut i = start;
        let mut k = 0;
        if i % 2 == 1 && k < out.len() {
            out[k] = self.at(i);
            i += 1;
            k += 1;
        }
        while k + 1 < out.len() {
            let (a, b) = self.pair(i / 2);
            out[k] = a;
            out[k + 1] = b;
            i += 2;
            k += 2;
        }
        if k < out.len() {
            out[k] = self.at(i);
        }
    }

    /// The first `n` elements of the stream. Every element depends on its
    /// index alone, so the pieces are filled on the rayon pool in parallel with
    /// the same values as one sequential [`Gaussian::fill`] (each piece starts
    /// on an even index: a pair is never split between two pieces).
    pub fn vec(&self, n: usize) -> Vec<f32> {
        use rayon::prelude::*;
        let mut v = vec![0.0; n];
        v.par_chunks_mut(FILL_PIECE)
            .enumerate()
            .for_each(|(k, c)| self.fill((k * FILL_PIECE) as u64, c));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_and_fnv_match_their_published_values() {
        // SplitMix64 seeded with 1234567: first output (reference implementation).
        assert_eq!(
            splitmix64_mix(1234567u64.wrapping_add(GOLDEN)),
            6457827717110365317
        );
        // FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }

    /// The parallel fill gives element `i` exactly `at(i)` at every length,
    /// piece boundaries and odd tails included (an odd piece size would split a
    /// pair and shift every later value by one: this turns red).
    #[test]
    fn the_parallel_vec_is_the_stream_element_by_element() {
        let g = Gaussian::new(7, "decode_noise");
        for n in [
            0,
            1,
            2,
            FILL_PIECE - 1,
            FILL_PIECE,
            FILL_PIECE + 1,
            3 * FILL_PIECE + 7,
        ] {
            let v = g.vec(n);
            assert_eq!(v.len(), n);
            for (i, x) in v.iter().enumerate() {
                assert_eq!(x.to_bits(), g.at(i as u64).to_bits(), "n {n} i {i}");
            }
        }
    }

    #[test]
    fn same_seed_same_values_other_seed_or_stream_other_values() {
        let a = Gaussian::new(42, "latents").vec(1000);
        let b = Gaussian::new(42, "latents").vec(1000);
        assert_eq!(a, b);
        let c = Gaussian::new(43, "latents").vec(1000);
        let d = Gaussian::new(42, "decode_noise").vec(1000);
        assert!(a.iter().zip(&c).filter(|(x, y)| x == y).count() < 5);
        assert!(a.iter().zip(&d).filter(|(x, y)| x == y).count() < 5);
    }

    #[test]
    fn same_seed_same_latents_other_seed_other_latents() {
        let a = initial_latents(42, 128, (2, 3, 4));
        assert_eq!(a.shape(), &[128, 2, 3, 4]);
        assert_eq!(a, initial_latents(42, 128, (2, 3, 4)));
        let b = initial_latents(43, 128, (2, 3, 4));
        assert!(a.data().iter().zip(b.data()).all(|(x, y)| x != y));
        let n = decode_noise(42, 128, (2, 3, 4));
        assert!(a.data().iter().zip(n.data()).all(|(x, y)| x != y));
        // A longer clip extends the same stream: its first values are the shorter clip's.
        let c = initial_latents(42, 1, (1, 1, 7));
        assert_eq!(&c.data()[..5], initial_latents(42, 1, (1, 1, 5)).data());
    }

    #[test]
    fn random_access_fill_agrees_with_sequential() {
        let g = Gaussian::new(7, "t");
        let all = g.vec(101);
        for (start, len) in [(0, 101), (1, 50), (37, 64), (100, 1), (3, 0)] {
            let mut part = vec![0.0; len];
            g.fill(start as u64, &mut part);
            assert_eq!(&part[..], &all[start..start + len], "{start} {len}");
        }
    }

    #[test]
    fn moments_are_standard_normal() {
        let v = Gaussian::new(1, "moments").vec(200_000);
        let n = v.len() as f64;
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n;
        let var = v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / n;
        let kurt = v.iter().map(|x| (*x as f64 - mean).powi(4)).sum::<f64>() / n / (var * var);
        // Standard errors: mean 0.0022, var 0.0032, kurtosis 0.011.
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.015, "{var}");
        assert!((kurt - 3.0).abs() < 0.06, "{kurt}");
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
