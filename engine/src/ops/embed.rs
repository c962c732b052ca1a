//! Sinusoidal timestep embedding (diffusers `get_timestep_embedding` with
//! `flip_sin_to_cos = true`, `downscale_freq_shift = 0`, as LTX-Video uses it).

/// The `dim`-wide embedding of timestep `t`: with `half = dim / 2` and
/// `f_i = exp(-ln(10000) i / half)`, the cosines `cos(t f_i)` then the sines
/// `sin(t f_i)`, computed in f32 as the reference does (odd `dim` pads a 0).
pub fn timestep_embedding(t: f32, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let ln = -(10000f64.ln() as f32);
    let args: Vec<f32> = (0..half)
        .map(|i| t * (ln * i as f32 / half as f32).exp())
        .collect();
    let mut out: Vec<f32> = args.iter().map(|a| a.cos()).collect();
    out.extend(args.iter().map(|a| a.sin()));
    if dim % 2 == 1 {
        out.push(0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_by_hand() {
        // dim 4: half 2, f = [1, exp(-ln(1e4)/2) = 0.01]; t = 500 -> args [500, 5].
        let e = timestep_embedding(500.0, 4);
        let want = [500f32.cos(), 5f32.cos(), 500f32.sin(), 5f32.sin()];
        for (g, w) in e.iter().zip(want) {
            assert!((g - w).abs() < 2e-5, "{e:?} vs {want:?}");
        }
        // t = 0: cosines 1, sines 0.
        assert_eq!(
            timestep_embedding(0.0, 6),
            vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(timestep_embedding(1.0, 3).len(), 3);
    }
}
