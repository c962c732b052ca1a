//! What the engine writes for the comparisons against the reference
//! implementation (`specs/fidelity.md`): the text encoder's output for a prompt
//! set (`engine encode-text`, read by `scripts/t5_check.py`) and a render's
//! noise streams (`engine noise`, read by `scripts/render_oracle.py`, which
//! hands them to diffusers so that both sides start from the same numbers).
//! Both are safetensors files with string metadata.

pub mod encode_text;
pub mod noise;

use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, View};

/// Writing an oracle file failed.
#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    /// The file could not be written.
    #[error("{file}: cannot write: {detail}")]
    Write {
        /// The file.
        file: std::path::PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// One tensor to write: its type, shape and little-endian bytes.
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Entry {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// A safetensors file being assembled: named f32 and i32 tensors and string
/// metadata, written in one go (names sorted by the format).
#[derive(Default)]
pub struct TensorFile {
    entries: Vec<(String, Entry)>,
    meta: HashMap<String, String>,
}

impl TensorFile {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an f32 tensor of `shape` (its element count must equal `v.len()`).
    pub fn f32(&mut self, name: impl Into<String>, shape: &[usize], v: &[f32]) {
        debug_assert_eq!(shape.iter().product::<usize>(), v.len());
        self.entries.push((
            name.into(),
            Entry {
                dtype: Dtype::F32,
                shape: shape.to_vec(),
                bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
        ));
    }

    /// Add an i32 vector.
    pub fn i32(&mut self, name: impl Into<String>, v: &[i32]) {
        self.entries.push((
            name.into(),
            Entry {
                dtype: Dtype::I32,
                shape: vec![v.len()],
                bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
        ));
    }

    /// Set a metadata string.
    pub fn meta(&mut self, key: &str, value: impl Into<String>) {
        self.meta.insert(key.to_string(), value.into());
    }

    /// Write the file to `path` (through a temporary file and a rename, so a
    /// reader never sees half of it).
    pub fn write(&self, path: &Path) -> Result<(), OracleError> {
        let err = |detail: String| OracleError::Write {
            file: path.to_path_buf(),
            detail,
        };
        let items: Vec<(&str, &Entry)> =
            self.entries.iter().map(|(n, e)| (n.as_str(), e)).collect();
        let tmp = path.with_extension("safetensors.part");
        safetensors::serialize_to_file(items, Some(self.meta.clone()), &tmp)
            .map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn written_tensors_and_metadata_read_back() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/oracle");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("t.safetensors");
        let mut f = TensorFile::new();
        f.f32("x", &[2, 2], &[1.5, -2.0, 0.25, 3.0]);
        f.i32("ids", &[7, 1, 0]);
        f.meta("arm", "cpu");
        f.write(&p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(m.metadata().as_ref().unwrap()["arm"], "cpu");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let x = st.tensor("x").unwrap();
        assert_eq!(x.shape(), &[2, 2]);
        assert_eq!(&x.data()[4..8], &(-2.0f32).to_le_bytes());
        let ids = st.tensor("ids").unwrap();
        assert_eq!(ids.dtype(), Dtype::I32);
        assert_eq!(&ids.data()[..4], &7i32.to_le_bytes());
        assert!(!p.with_extension("safetensors.part").exists());
        let e = f
            .write(&d.join("missing/dir/t.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing/dir/t.safetensors"), "{e}");
    }
}
