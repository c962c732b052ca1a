//! Where a model's tensors come from, and the path builder models load through.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::tensor::Tensor;

/// A tensor could not be provided as the model expects it. Every variant names
/// the tensor and, where one is involved, the file.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The tensor is absent.
    #[error("{file}: missing tensor '{name}' (expected shape {expected:?})")]
    Missing {
        /// Tensor name.
        name: String,
        /// File or directory searched.
        file: PathBuf,
        /// Shape the model expects.
        expected: Vec<usize>,
    },
    /// The tensor has another shape.
    #[error("{file}: tensor '{name}' has shape {found:?}, expected {expected:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// File holding it.
        file: PathBuf,
        /// Shape the model expects.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// The tensor has a storage type the model cannot use.
    #[error("{file}: tensor '{name}' has dtype {found}, expected {expected}")]
    DType {
        /// Tensor name.
        name: String,
        /// File holding it.
        file: PathBuf,
        /// Type(s) accepted.
        expected: String,
        /// Type in the file.
        found: String,
    },
    /// A tensor the model does not know is present.
    #[error("{file}: unexpected tensor '{name}' (not part of the {model} layout)")]
    Unexpected {
        /// Tensor name.
        name: String,
        /// File holding it.
        file: PathBuf,
        /// The model whose layout it is not part of.
        model: String,
    },
    /// The file is cut short or its header is inconsistent.
    #[error("{file}: {detail}")]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// What is wrong, naming the tensor where one is involved.
        detail: String,
    },
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A provider of named tensors, widened to `f32` for the CPU arm.
pub trait TensorSource: Send + Sync {
    /// The tensor `name` as `f32`, checked to have exactly `shape`.
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightError>;
}

/// An in-memory source (tests, and weights built in code).
#[derive(Debug, Default, Clone)]
pub struct MapSource {
    tensors: HashMap<String, Tensor>,
}

impl MapSource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add or replace tensor `name`.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.tensors.insert(name.into(), t);
    }

    /// Names held.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

impl TensorSource for MapSource {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightError> {
        let t = self.tensors.get(name).ok_or_else(|| WeightError::Missing {
            name: name.to_string(),
            file: PathBuf::from("<memory>"),
            expected: shape.to_vec(),
        })?;
        if t.shape() != shape {
            return Err(WeightError::Shape {
                name: name.to_string(),
                file: PathBuf::from("<memory>"),
                expected: shape.to_vec(),
                found: t.shape().to_vec(),
            });
        }
        Ok(t.clone())
    }
}

/// A prefix into a [`TensorSource`], so model code names tensors exactly as the
/// checkpoint does: `vb.pp("transformer_blocks").pp(3).get("attn1.to_q.weight", ..)`.
#[derive(Clone)]
pub struct VarBuilder<'a> {
    source: &'a dyn TensorSource,
    prefix: String,
}

impl<'a> VarBuilder<'a> {
    /// A builder at the root of `source`.
    pub fn new(source: &'a dyn TensorSource) -> Self {
        VarBuilder {
            source,
            prefix: String::new(),
        }
    }

    /// A builder one level down (`prefix.seg`).
    pub fn pp(&self, seg: impl std::fmt::Display) -> VarBuilder<'a> {
        let prefix = if self.prefix.is_empty() {
            seg.to_string()
        } else {
            format!("{}.{}", self.prefix, seg)
        };
        VarBuilder {
            source: self.source,
            prefix,
        }
    }

    /// The full name of `name` under this prefix.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        }
    }

    /// Load tensor `name` under this prefix with exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightError> {
        self.source.load_f32(&self.path(name), shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn var_builder_names_mirror_checkpoint_paths() {
        let mut m = MapSource::new();
        m.insert("blocks.3.attn1.to_q.weight", Tensor::zeros(&[2, 2]));
        let vb = VarBuilder::new(&m);
        let b = vb.pp("blocks").pp(3);
        assert_eq!(b.path("attn1.to_q.weight"), "blocks.3.attn1.to_q.weight");
        assert!(b.get("attn1.to_q.weight", &[2, 2]).is_ok());
        let e = b.get("attn1.to_q.weight", &[2, 3]).unwrap_err().to_string();
        assert!(
            e.contains("blocks.3.attn1.to_q.weight") && e.contains("[2, 3]"),
            "{e}"
        );
        let e = b.get("attn1.to_k.weight", &[2]).unwrap_err().to_string();
        assert!(
            e.contains("missing tensor 'blocks.3.attn1.to_k.weight'"),
            "{e}"
        );
    }
}
