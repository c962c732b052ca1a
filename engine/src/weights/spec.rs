//! The declared layout of a checkpoint: tensor names, shapes and storage types.

use serde::{Deserialize, Serialize};

/// Storage type of a tensor in a checkpoint file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// bfloat16 (2 bytes).
    BF16,
    /// IEEE half (2 bytes).
    F16,
    /// IEEE single (4 bytes).
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    /// The safetensors name of the type (`BF16`, `F16`, `F32`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
        }
    }
}

/// One tensor a model expects: its full checkpoint name (diffusers naming, without
/// a component prefix such as `transformer/`), shape and storage type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Full name, e.g. `transformer_blocks.0.attn1.to_q.weight`.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Storage type in the checkpoint.
    pub dtype: DType,
}

impl TensorSpec {
    /// A spec of `name`, `shape`, `dtype`.
    pub fn new(name: impl Into<String>, shape: &[usize], dtype: DType) -> Self {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes in the checkpoint.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// Total parameters of a spec list.
pub fn param_count(specs: &[TensorSpec]) -> u64 {
    specs.iter().map(|s| s.numel() as u64).sum()
}
