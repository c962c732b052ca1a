//! Deterministic synthetic weights: one rule per tensor name that keeps
//! activations finite and non-trivial through the whole pipeline, and values
//! drawn from the [`crate::rng::Gaussian`] stream named after the
//! tensor, so any tensor (or any slice of one) can be regenerated alone, in
//! parallel, from `(seed, name)`.
//!
//! Values are rounded to the storage type (bf16 for the released layouts), so
//! a weight written to a file and read back widens to exactly the f32 the
//! tests regenerate in memory.

use crate::rng::Gaussian;
use crate::tensor::Tensor;
use crate::weights::{DType, MapSource, TensorSpec};

/// How one tensor's values are drawn from its standard-normal stream `n`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `std * n`: projection and convolution weights (`std = 1/sqrt(fan_in)`),
    /// biases, modulation tables, embeddings.
    Normal {
        /// Standard deviation.
        std: f32,
    },
    /// `1 + std * n`: norm weights.
    OnePlusNormal {
        /// Standard deviation around 1.
        std: f32,
    },
    /// `exp(std * n)`: strictly positive scales (`latents_std`).
    LogNormal {
        /// Standard deviation of the logarithm.
        std: f32,
    },
    /// Every element equals the value (`timestep_scale_multiplier` = 1000).
    Constant(f32),
}

/// The rule for tensor `name` of `shape` (names as in
/// [`tensor_specs`](crate::models::dit::tensor_specs) and its siblings).
pub fn init_for(name: &str, shape: &[usize]) -> Init {
    let last = name.rsplit('.').next().unwrap_or(name);
    if last == "timestep_scale_multiplier" {
        return Init::Constant(1000.0);
    }
    if name == "latents_mean" {
        return Init::Normal { std: 0.1 };
    }
    if name == "latents_std" {
        return Init::LogNormal { std: 0.2 };
    }
    if last == "relative_attention_bias" || name.ends_with("relative_attention_bias.weight") {
        return Init::Normal { std: 0.5 };
    }
    if last == "scale_shift_table" {
        return Init::Normal { std: 0.1 };
    }
    if name == "shared.weight" || name.ends_with("embed_tokens.weight") {
        return Init::Normal { std: 1.0 };
    }
    if last == "bias" {
        return Init::Normal { std: 0.02 };
    }
    if shape.len() == 1 && last == "weight" {
        // RMS / Layer norm weights (norm_q, norm_k, layer_norm, norm3, ...).
        return Init::OnePlusNormal { std: 0.1 };
    }
    let fan_in: usize = shape.iter().skip(1).product();
    Init::Normal {
        std: 1.0 / (fan_in.max(1) as f32).sqrt(),
    }
}

/// Fill `out` with elements `start .. start + out.len()` (row-major) of the
/// synthetic tensor `name` of `shape` under `seed`, rounded to `dtype`.
pub fn fill(name: &str, shape: &[usize], dtype: DType, seed: u64, start: u64, out: &mut [f32]) {
    let rule = init_for(name, shape);
    match rule {
        Init::Constant(c) => out.iter_mut().for_each(|x| *x = c),
        _ => Gaussian::new(seed, name).fill(start, out),
    }
    for x in out.iter_mut() {
        let v = match rule {
            Init::Normal { std } => std * *x,
            Init::OnePlusNormal { std } => 1.0 + std * *x,
            Init::LogNormal { std } => (std * *x).exp(),
            Init::Constant(c) => c,
        };
        *x = round_to(v, dtype);
    }
}

/// `v` rounded (to nearest, ties to even) to the precision of `dtype`, as f32.
pub fn round_to(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::F32 => v,
    }
}

/// The whole synthetic tensor of `spec` under `seed`.
pub fn tensor(spec: &TensorSpec, seed: u64) -> Tensor {
    let mut data = vec![0.0; spec.numel()];
    fill(&spec.name, &spec.shape, spec.dtype, seed, 0, &mut data);
    Tensor::from_fn(&spec.shape, |i| data[i])
}

/// An in-memory source holding the synthetic tensors of `specs` under `seed`.
pub fn source(specs: &[TensorSpec], seed: u64) -> MapSource {
    let mut m = MapSource::new();
    for s in specs {
        m.insert(s.name.clone(), tensor(s, seed));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_by_name() {
        assert_eq!(
            init_for("decoder.timestep_scale_multiplier", &[]),
            Init::Constant(1000.0)
        );
        assert_eq!(
            init_for("latents_std", &[128]),
            Init::LogNormal { std: 0.2 }
        );
        assert_eq!(
            init_for("transformer_blocks.0.attn1.norm_q.weight", &[64]),
            Init::OnePlusNormal { std: 0.1 }
        );
        assert_eq!(init_for("proj_in.bias", &[64]), Init::Normal { std: 0.02 });
        assert_eq!(
            init_for("proj_in.weight", &[64, 128]),
            Init::Normal {
                std: 1.0 / 128f32.sqrt()
            }
        );
        assert_eq!(
            init_for("decoder.conv_in.conv.weight", &[64, 128, 3, 3, 3]),
            Init::Normal {
                std: 1.0 / (128.0f32 * 27.0).sqrt()
            }
        );
        assert_eq!(
            init_for("scale_shift_table", &[2, 64]),
            Init::Normal { std: 0.1 }
        );
    }

    #[test]
    fn values_are_bf16_exact_deterministic_and_sliceable() {
        let spec = TensorSpec::new("a.weight", &[16, 32], DType::BF16);
        let t = tensor(&spec, 5);
        assert_eq!(t, tensor(&spec, 5));
        assert_ne!(t, tensor(&spec, 6));
        assert!(t.data().iter().all(|x| round_to(*x, DType::BF16) == *x));
        let mut part = vec![0.0; 100];
        fill("a.weight", &[16, 32], DType::BF16, 5, 77, &mut part);
        assert_eq!(&part[..], &t.data()[77..177]);
        let std = (t.data().iter().map(|x| x * x).sum::<f32>() / t.numel() as f32).sqrt();
        assert!((std - 1.0 / 32f32.sqrt()).abs() < 0.03, "{std}");
        let c = tensor(
            &TensorSpec::new("decoder.timestep_scale_multiplier", &[], DType::BF16),
            1,
        );
        assert_eq!(c.data(), &[1000.0]);
        let s = tensor(&TensorSpec::new("latents_std", &[128], DType::BF16), 1);
        assert!(s.data().iter().all(|x| *x > 0.0));
    }
}
