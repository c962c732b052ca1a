//! Pointwise activations, in place.

use rayon::prelude::*;

const PAR_LEN: usize = 1 << 15;

/// GELU with the tanh approximation (`gelu-approximate`, transformers'
/// `gelu_new`): `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: &mut [f32]) {
    let f = |v: &mut f32| {
        let x = *v;
        let inner = 0.797_884_6_f32 * (x + 0.044_715 * x * x * x);
        *v = 0.5 * x * (1.0 + inner.tanh());
    };
    if x.len() >= PAR_LEN {
        x.par_iter_mut().for_each(f);
    } else {
        x.iter_mut().for_each(f);
    }
}

/// SiLU (swish): `x / (1 + e^-x)`.
pub fn silu(x: &mut [f32]) {
    let f = |v: &mut f32| *v /= 1.0 + (-*v).exp();
    if x.len() >= PAR_LEN {
        x.par_iter_mut().for_each(f);
    } else {
        x.iter_mut().for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_by_hand() {
        // x = 1: inner = 0.7978846 * 1.044715 = 0.8335615, tanh = 0.6823839,
        // 0.5 * 1.6823839 = 0.8411920. x = -2: inner = -1.8097466, tanh = -0.9476160 -> -0.0454023.
        let mut x = vec![0.0, 1.0, -2.0, 10.0, -10.0];
        gelu_tanh(&mut x);
        let want = [0.0, 0.841_192, -0.045_402_3, 10.0, 0.0];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?}");
        }
    }

    #[test]
    fn silu_by_hand() {
        // 1 / (1 + e^-1) = 0.7310586; -2 / (1 + e^2) = -0.2384058.
        let mut x = vec![0.0, 1.0, -2.0, 30.0];
        silu(&mut x);
        let want = [0.0, 0.731_058_6, -0.238_405_8, 30.0];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?}");
        }
    }
}
