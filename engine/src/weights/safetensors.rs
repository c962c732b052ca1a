//! A [`TensorSource`] over memory-mapped `.safetensors` files (one file or the
//! shards of one component), validated against a model's [`TensorSpec`]s.
//!
//! Opening a source parses every header (with the `safetensors` crate's
//! [`Metadata`]), renames stored names to the model's (diffusers) names, and checks
//! that every tensor's bytes lie inside its file, so a truncated file is reported
//! at open, naming the first tensor it cuts. [`SafetensorsSource::validate`] then
//! checks the set against the model's specs: missing, unexpected, mis-shaped and
//! mis-typed tensors each give an error naming the tensor, the file and what was
//! expected. Loading widens BF16/F16/F32 to `f32`.
//!
//! Two host-arm levers act here: with [`Widen::Double`] the stored bytes of each
//! tensor are also copied into memory the source keeps for its lifetime (the
//! seed's double hold); with `release_pages` each tensor's file pages are dropped
//! from this process and from the page cache once widened.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ::safetensors::tensor::Metadata;
use ::safetensors::Dtype as StDtype;
use memmap2::{Mmap, MmapOptions};
use rayon::prelude::*;

use super::residency::{self, Residency};
use super::source::{TensorSource, WeightError};
use super::spec::{DType, TensorSpec};
use crate::tensor::Tensor;

/// How weights are widened to `f32` on the host arm (the `widen-f32` lever's
/// arms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Widen {
    /// Keep the stored (bf16) bytes in owned memory beside the f32 copy.
    Double,
    /// Keep only the f32 copy.
    Single,
}

/// How a source materializes tensors (the host-arm levers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// `widen-f32`: keep the stored bytes beside the f32 copy (`Double`) or not.
    pub widen: Widen,
    /// `release-pages`: drop each tensor's file pages once it is materialized.
    pub release_pages: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            widen: Widen::Single,
            release_pages: true,
        }
    }
}

/// Counters of what a source did, for phase attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Tensors materialized.
    pub tensors: u64,
    /// Stored bytes read from the files.
    pub bytes_read: u64,
    /// Stored bytes kept in owned memory (`widen-f32 = double`).
    pub bytes_retained: u64,
    /// Bytes unmapped from this process by `release-pages`.
    pub bytes_released: u64,
}

struct StFile {
    path: PathBuf,
    file: File,
    map: Mmap,
}

#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    stored_name: String,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// Where one tensor's stored bytes lie in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    /// Model (diffusers) name.
    pub name: String,
    /// The file holding it.
    pub file: PathBuf,
    /// Storage type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute byte offset of its data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: usize,
}

/// Safetensors files of one model component, memory-mapped.
pub struct SafetensorsSource {
    component: String,
    files: Vec<StFile>,
    entries: HashMap<String, Entry>,
    opts: LoadOptions,
    retained: Mutex<Vec<Vec<u8>>>,
    tensors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_retained: AtomicU64,
    bytes_released: AtomicU64,
}

/// Our storage type of a safetensors dtype, if the CPU arm can widen it.
pub fn dtype_of(d: StDtype) -> Option<DType> {
    match d {
        StDtype::BF16 => Some(DType::BF16),
        StDtype::F16 => Some(DType::F16),
        StDtype::F32 => Some(DType::F32),
        _ => None,
    }
}

/// The safetensors dtype of one of our storage types.
pub fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::BF16 => StDtype::BF16,
        DType::F16 => StDtype::F16,
        DType::F32 => StDtype::F32,
    }
}

fn corrupt(file: &Path, detail: String) -> WeightError {
    WeightError::Corrupt {
        file: file.to_path_buf(),
        detail,
    }
}

/// Parse the header of a mapped safetensors file: the header length and metadata.
fn parse_header(path: &Path, bytes: &[u8]) -> Result<(usize, Metadata), WeightError> {
    let len8: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            corrupt(
                path,
                format!(
                    "file is {} bytes, shorter than the 8-byte safetensors header length",
                    bytes.len()
                ),
            )
        })?;
    let n = u64::from_le_bytes(len8) as usize;
    let header = bytes.get(8..8usize.saturating_add(n)).ok_or_else(|| {
        corrupt(
            path,
            format!(
                "header claims {n} bytes but the file has {} after the length (truncated \
                 or not a safetensors file)",
                bytes.len().saturating_sub(8)
            ),
        )
    })?;
    let meta: Metadata = serde_json::from_slice(header)
        .map_err(|e| corrupt(path, format!("invalid safetensors header: {e}")))?;
    Ok((n, meta))
}

impl SafetensorsSource {
    /// Map `files` (the shards of one component) and index their tensors under
    /// the names `rename` gives them (`None` drops a tensor, e.g. the VAE tensors
    /// inside a Lightricks transformer file). `component` is used in messages.
    ///
    /// Errors: unreadable or malformed files, a tensor whose bytes run past the end
    /// of its file (truncation, naming the tensor), and the same name in two files.
    pub fn open(
        component: &str,
        files: &[PathBuf],
        rename: &dyn Fn(&str, &[usize]) -> Option<String>,
        opts: LoadOptions,
    ) -> Result<SafetensorsSource, WeightError> {
        let mut mapped = Vec::with_capacity(files.len());
        let mut entries: HashMap<String, Entry> = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let io = |source| WeightError::Io {
                file: path.clone(),
                source,
            };
            let file = File::open(path).map_err(io)?;
            let flen = file.metadata().map_err(io)?.len() as usize;
            if flen < 8 {
                return Err(corrupt(
                    path,
                    format!(
                        "file is {flen} bytes, shorter than the 8-byte safetensors header length"
                    ),
                ));
            }
            // SAFETY: a read-only shared mapping. The files are weights the engine
            // only reads; a file truncated by someone else while mapped would fault
            // (SIGBUS), which is why lengths are checked against the header here.
            let map = unsafe { MmapOptions::new().map(&file) }.map_err(io)?;
            let (n, meta) = parse_header(path, &map)?;
            let data_start = 8 + n;
            let mut names: Vec<(String, &::safetensors::tensor::TensorInfo)> =
                meta.tensors().into_iter().collect();
            names.sort_by_key(|(_, i)| i.data_offsets);
            for (stored, info) in names {
                let (s, e) = info.data_offsets;
                let (start, end) = (data_start + s, data_start + e);
                if end > flen {
                    return Err(corrupt(
                        path,
                        format!(
                            "tensor '{stored}' ({:?} {:?}) needs bytes {start}..{end} but the \
                             file ends at {flen}: the file is truncated",
                            info.dtype, info.shape
                        ),
                    ));
                }
                let Some(name) = rename(&stored, &info.shape) else {
                    continue;
                };
                if let Some(prev) = entries.get(&name) {
                    return Err(corrupt(
                        path,
                        format!("tensor '{name}' is also in {}", files[prev.file].display()),
                    ));
                }
                entries.insert(
                    name,
                    Entry {
                        file: fi,
                        stored_name: stored.clone(),
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start,
                        end,
                    },
                );
            }
            mapped.push(StFile {
                path: path.clone(),
                file,
                map,
            });
        }
        Ok(SafetensorsSource {
            component: component.to_string(),
            files: mapped,
            entries,
            opts,
            retained: Mutex::new(Vec::new()),
            tensors: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_retained: AtomicU64::new(0),
            bytes_released: AtomicU64::new(0),
        })
    }

    fn where_is(&self) -> PathBuf {
        match self.files.as_slice() {
            [one] => one.path.clone(),
            many => many
                .first()
                .and_then(|f| f.path.parent())
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        }
    }

    /// Check the indexed tensors against `specs`: every spec present with its
    /// shape and a float type the CPU arm widens (BF16, F16, F32), and no tensor
    /// outside the specs unless `allow_extra(name)` (real checkpoints carry parts
    /// this engine does not run, e.g. the VAE encoder). The first problem found is
    /// returned, in spec order, then extras in name order.
    pub fn validate(
        &self,
        specs: &[TensorSpec],
        allow_extra: &dyn Fn(&str) -> bool,
    ) -> Result<(), WeightError> {
        for s in specs {
            let e = self
                .entries
                .get(&s.name)
                .ok_or_else(|| WeightError::Missing {
                    name: s.name.clone(),
                    file: self.where_is(),
                    expected: s.shape.clone(),
                })?;
            self.check_entry(&s.name, e, &s.shape, Some(s.dtype))?;
        }
        let known: std::collections::HashSet<&str> =
            specs.iter().map(|s| s.name.as_str()).collect();
        let mut extra: Vec<&String> = self
            .entries
            .keys()
            .filter(|n| !known.contains(n.as_str()) && !allow_extra(n))
            .collect();
        extra.sort();
        if let Some(n) = extra.first() {
            return Err(WeightError::Unexpected {
                name: (*n).clone(),
                file: self.files[self.entries[*n].file].path.clone(),
                model: self.component.clone(),
            });
        }
        Ok(())
    }

    fn check_entry(
        &self,
        name: &str,
        e: &Entry,
        shape: &[usize],
        want: Option<DType>,
    ) -> Result<(), WeightError> {
        let file = &self.files[e.file].path;
        if e.shape != shape {
            return Err(WeightError::Shape {
                name: name.to_string(),
                file: file.clone(),
                expected: shape.to_vec(),
                found: e.shape.clone(),
            });
        }
        if dtype_of(e.dtype).is_none() {
            let expected = match want {
                Some(d) => format!(
                    "{} (or another float the CPU arm widens: BF16, F16, F32)",
                    d.safetensors_name()
                ),
                None => "BF16, F16 or F32".to_string(),
            };
            return Err(WeightError::DType {
                name: name.to_string(),
                file: file.clone(),
                expected,
                found: format!("{:?}", e.dtype),
            });
        }
        Ok(())
    }

    /// Names indexed (model names).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Every indexed tensor's model name and shape, sorted by name.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(n, e)| (n.clone(), e.shape.clone()))
            .collect();
        v.sort();
        v
    }

    /// The files mapped, in open order.
    pub fn files(&self) -> Vec<&Path> {
        self.files.iter().map(|f| f.path.as_path()).collect()
    }

    /// Stored bytes of every indexed tensor.
    pub fn stored_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }

    /// Where every indexed tensor's stored bytes lie, for readers that copy
    /// them elsewhere untouched (the device arm's staging): file by file in open
    /// order, by offset within a file. Errors name a tensor whose storage type
    /// is not a float this engine reads (BF16, F16, F32).
    pub fn extents(&self) -> Result<Vec<Extent>, WeightError> {
        let mut v = Vec::with_capacity(self.entries.len());
        for (name, e) in &self.entries {
            let file = &self.files[e.file].path;
            let dtype = dtype_of(e.dtype).ok_or_else(|| WeightError::DType {
                name: name.clone(),
                file: file.clone(),
                expected: "BF16, F16 or F32".into(),
                found: format!("{:?}", e.dtype),
            })?;
            v.push((
                e.file,
                Extent {
                    name: name.clone(),
                    file: file.clone(),
                    dtype,
                    shape: e.shape.clone(),
                    offset: e.start as u64,
                    bytes: e.end - e.start,
                },
            ));
        }
        v.sort_by_key(|(f, x)| (*f, x.offset));
        Ok(v.into_iter().map(|(_, x)| x).collect())
    }

    /// What the source has done so far.
    pub fn stats(&self) -> LoadStats {
        LoadStats {
            tensors: self.tensors.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_retained: self.bytes_retained.load(Ordering::Relaxed),
            bytes_released: self.bytes_released.load(Ordering::Relaxed),
        }
    }

    /// Page-cache residency of all mapped files together.
    pub fn residency(&self) -> std::io::Result<Residency> {
        let mut r = Residency::default();
        for f in &self.files {
            r = r.plus(residency::mapping_residency(&f.map)?);
        }
        Ok(r)
    }

    /// Drop every mapped page of every file (headers and page-boundary leftovers
    /// included) from this process and the page cache. Used at the end of a
    /// component's load when `release-pages` is on.
    pub fn release_all(&self) {
        for f in &self.files {
            let n = residency::release_range(&f.map, &f.file, 0, f.map.len());
            self.bytes_released.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Give up the mappings and keep only the stored bytes retained under
    /// `widen-f32 = double` (empty under `single`).
    pub fn into_retained(self) -> Vec<Vec<u8>> {
        self.retained
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the options ask for released pages.
    pub fn options(&self) -> LoadOptions {
        self.opts
    }
}

/// Widen stored little-endian `bytes` of `dtype` into `out` (same element count).
fn widen_into(dtype: StDtype, bytes: &[u8], out: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    match dtype {
        StDtype::BF16 => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(2 * CHUNK))
            .for_each(|(o, b)| {
                for (x, p) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *x = f32::from_bits((u16::from_le_bytes([p[0], p[1]]) as u32) << 16);
                }
            }),
        StDtype::F16 => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(2 * CHUNK))
            .for_each(|(o, b)| {
                for (x, p) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *x = half::f16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32();
                }
            }),
        _ => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(4 * CHUNK))
            .for_each(|(o, b)| {
                for (x, p) in o.iter_mut().zip(b.chunks_exact(4)) {
                    *x = f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
                }
            }),
    }
}

impl TensorSource for SafetensorsSource {
    fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightError> {
        let e = self.entries.get(name).ok_or_else(|| WeightError::Missing {
            name: name.to_string(),
            file: self.where_is(),
            expected: shape.to_vec(),
        })?;
        self.check_entry(name, e, shape, None)?;
        let f = &self.files[e.file];
        let bytes = &f.map[e.start..e.end];
        let numel: usize = shape.iter().product();
        let mut out = vec![0f32; numel];
        widen_into(e.dtype, bytes, &mut out);
        self.tensors.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if self.opts.widen == Widen::Double {
            let copy = bytes.to_vec();
            self.bytes_retained
                .fetch_add(copy.len() as u64, Ordering::Relaxed);
            self.retained
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(copy);
        }
        if self.opts.release_pages {
            let n = residency::release_range(&f.map, &f.file, e.start, e.end - e.start);
            self.bytes_released.fetch_add(n, Ordering::Relaxed);
        }
        Tensor::new(shape, out).map_err(|err| WeightError::Corrupt {
            file: f.path.clone(),
            detail: format!("tensor '{}' ({}): {err}", name, e.stored_name),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// Write a safetensors file of `(name, dtype, shape, bytes)` (test helper).
    pub fn write_st(path: &Path, tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut off = 0usize;
        for (n, d, s, b) in tensors {
            header.insert(
                n.to_string(),
                serde_json::json!({"dtype": d, "shape": s, "data_offsets": [off, off + b.len()]}),
            );
            off += b.len();
        }
        let mut h = serde_json::to_vec(&header).unwrap();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut f = File::create(path).unwrap();
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&h).unwrap();
        for (_, _, _, b) in tensors {
            f.write_all(b).unwrap();
        }
    }

    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
            .collect()
    }

    fn dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/safetensors")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn ident(n: &str, _: &[usize]) -> Option<String> {
        Some(n.to_string())
    }

    fn specs() -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("a.weight", &[2, 3], DType::BF16),
            TensorSpec::new("b.bias", &[3], DType::BF16),
        ]
    }

    fn good(path: &Path) {
        write_st(
            path,
            &[
                (
                    "a.weight",
                    StDtype::BF16,
                    vec![2, 3],
                    bf16_bytes(&[1.0, -2.0, 0.5, 3.0, -0.25, 8.0]),
                ),
                ("b.bias", StDtype::F16, vec![3], {
                    [0.5f32, -1.5, 2.0]
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
                        .collect()
                }),
            ],
        );
    }

    #[test]
    fn extents_point_at_each_tensors_bytes_file_by_file() {
        let d = dir("extents");
        let (p1, p2) = (d.join("s1.safetensors"), d.join("s2.safetensors"));
        write_st(
            &p1,
            &[
                ("z.w", StDtype::BF16, vec![2], vec![1, 2, 3, 4]),
                ("drop.me", StDtype::F32, vec![1], vec![9; 4]),
                ("a.w", StDtype::F32, vec![1], vec![5, 6, 7, 8]),
            ],
        );
        write_st(&p2, &[("m.w", StDtype::F16, vec![3], vec![7; 6])]);
        let rename = |n: &str, _: &[usize]| (n != "drop.me").then(|| format!("x.{n}"));
        let s = SafetensorsSource::open(
            "model",
            &[p2.clone(), p1.clone()],
            &rename,
            LoadOptions::default(),
        )
        .unwrap();
        let e = s.extents().unwrap();
        let names: Vec<&str> = e.iter().map(|x| x.name.as_str()).collect();
        // Open order of the files, then offset order within each.
        assert_eq!(names, ["x.m.w", "x.z.w", "x.a.w"]);
        assert_eq!(e[0].file, p2);
        assert_eq!(
            (e[0].dtype, e[0].bytes, e[0].shape.clone()),
            (DType::F16, 6, vec![3])
        );
        let raw = std::fs::read(&p1).unwrap();
        for x in &e[1..] {
            assert_eq!(x.file, p1);
        }
        assert_eq!(&raw[e[1].offset as usize..][..4], &[1, 2, 3, 4]);
        assert_eq!(&raw[e[2].offset as usize..][..4], &[5, 6, 7, 8]);
        write_st(&p1, &[("i", StDtype::I64, vec![1], vec![0; 8])]);
        let s = SafetensorsSource::open("model", &[p1], &ident, LoadOptions::default()).unwrap();
        let err = s.extents().unwrap_err().to_string();
        assert!(err.contains("'i'") && err.contains("I64"), "{err}");
    }

    #[test]
    fn loads_and_widens_bf16_and_f16_exactly() {
        let d = dir("good");
        let p = d.join("m.safetensors");
        good(&p);
        let s = SafetensorsSource::open("model", &[p], &ident, LoadOptions::default()).unwrap();
        s.validate(&specs(), &|_| false).unwrap();
        let a = s.load_f32("a.weight", &[2, 3]).unwrap();
        assert_eq!(a.data(), &[1.0, -2.0, 0.5, 3.0, -0.25, 8.0]);
        let b = s.load_f32("b.bias", &[3]).unwrap();
        assert_eq!(b.data(), &[0.5, -1.5, 2.0]);
        assert_eq!(s.stats().tensors, 2);
        assert_eq!(s.stats().bytes_read, 12 + 6);
        assert_eq!(s.stats().bytes_retained, 0);
    }

    #[test]
    fn double_widening_retains_the_stored_bytes() {
        let d = dir("double");
        let p = d.join("m.safetensors");
        good(&p);
        let opts = LoadOptions {
            widen: Widen::Double,
            release_pages: false,
        };
        let s = SafetensorsSource::open("model", &[p], &ident, opts).unwrap();
        s.load_f32("a.weight", &[2, 3]).unwrap();
        s.load_f32("b.bias", &[3]).unwrap();
        assert_eq!(s.stats().bytes_retained, 18);
    }

    #[test]
    fn each_defect_names_tensor_file_and_expectation() {
        let d = dir("defects");
        // Missing.
        let p = d.join("missing.safetensors");
        write_st(&p, &[("a.weight", StDtype::BF16, vec![2, 3], vec![0; 12])]);
        let s =
            SafetensorsSource::open("transformer", &[p], &ident, LoadOptions::default()).unwrap();
        let e = s.validate(&specs(), &|_| false).unwrap_err().to_string();
        assert!(
            e.contains("missing tensor 'b.bias'")
                && e.contains("missing.safetensors")
                && e.contains("[3]"),
            "{e}"
        );
        // Extra.
        let p = d.join("extra.safetensors");
        write_st(
            &p,
            &[
                ("a.weight", StDtype::BF16, vec![2, 3], vec![0; 12]),
                ("b.bias", StDtype::BF16, vec![3], vec![0; 6]),
                ("z.stray", StDtype::BF16, vec![1], vec![0; 2]),
            ],
        );
        let s =
            SafetensorsSource::open("transformer", &[p], &ident, LoadOptions::default()).unwrap();
        let e = s.validate(&specs(), &|_| false).unwrap_err().to_string();
        assert!(
            e.contains("unexpected tensor 'z.stray'")
                && e.contains("extra.safetensors")
                && e.contains("transformer"),
            "{e}"
        );
        s.validate(&specs(), &|n| n.starts_with("z.")).unwrap();
        // Mis-shaped.
        let p = d.join("shape.safetensors");
        write_st(
            &p,
            &[
                ("a.weight", StDtype::BF16, vec![3, 2], vec![0; 12]),
                ("b.bias", StDtype::BF16, vec![3], vec![0; 6]),
            ],
        );
        let s = SafetensorsSource::open("vae", &[p], &ident, LoadOptions::default()).unwrap();
        let e = s.validate(&specs(), &|_| false).unwrap_err().to_string();
        assert!(
            e.contains("'a.weight' has shape [3, 2], expected [2, 3]")
                && e.contains("shape.safetensors"),
            "{e}"
        );
        let e = s.load_f32("a.weight", &[2, 3]).unwrap_err().to_string();
        assert!(e.contains("expected [2, 3]"), "{e}");
        // Mis-typed.
        let p = d.join("dtype.safetensors");
        write_st(
            &p,
            &[
                ("a.weight", StDtype::I16, vec![2, 3], vec![0; 12]),
                ("b.bias", StDtype::BF16, vec![3], vec![0; 6]),
            ],
        );
        let s = SafetensorsSource::open("vae", &[p], &ident, LoadOptions::default()).unwrap();
        let e = s.validate(&specs(), &|_| false).unwrap_err().to_string();
        assert!(
            e.contains("'a.weight' has dtype I16, expected BF16")
                && e.contains("dtype.safetensors"),
            "{e}"
        );
        // Truncated.
        let p = d.join("trunc.safetensors");
        good(&p);
        let len = std::fs::metadata(&p).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(len - 3).unwrap();
        let e = SafetensorsSource::open(
            "vae",
            std::slice::from_ref(&p),
            &ident,
            LoadOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("tensor 'b.bias'")
                && e.contains("truncated")
                && e.contains("trunc.safetensors"),
            "{e}"
        );
        // Cut inside the header, and too short for the length prefix.
        f.set_len(20).unwrap();
        let e = SafetensorsSource::open(
            "vae",
            std::slice::from_ref(&p),
            &ident,
            LoadOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("header claims") && e.contains("trunc.safetensors"),
            "{e}"
        );
        f.set_len(3).unwrap();
        let e = SafetensorsSource::open(
            "vae",
            std::slice::from_ref(&p),
            &ident,
            LoadOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("3 bytes"), "{e}");
        // A missing file names itself.
        let e = SafetensorsSource::open(
            "vae",
            &[d.join("nope.safetensors")],
            &ident,
            LoadOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("nope.safetensors"), "{e}");
    }

    #[test]
    fn shards_combine_and_duplicates_are_refused() {
        let d = dir("shards");
        let p1 = d.join("m-00001-of-00002.safetensors");
        let p2 = d.join("m-00002-of-00002.safetensors");
        write_st(
            &p1,
            &[("a.weight", StDtype::BF16, vec![2, 3], bf16_bytes(&[1.0; 6]))],
        );
        write_st(
            &p2,
            &[("b.bias", StDtype::F32, vec![3], {
                [1.0f32, 2.0, 3.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect()
            })],
        );
        let s = SafetensorsSource::open(
            "m",
            &[p1.clone(), p2.clone()],
            &ident,
            LoadOptions::default(),
        )
        .unwrap();
        s.validate(&specs(), &|_| false).unwrap();
        assert_eq!(s.load_f32("b.bias", &[3]).unwrap().data(), &[1.0, 2.0, 3.0]);
        let e = SafetensorsSource::open("m", &[p1.clone(), p1], &ident, LoadOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("'a.weight' is also in"), "{e}");
    }

    #[test]
    fn rename_maps_and_drops_names() {
        let d = dir("rename");
        let p = d.join("m.safetensors");
        write_st(
            &p,
            &[
                (
                    "model.diffusion_model.a.weight",
                    StDtype::BF16,
                    vec![2, 3],
                    vec![0; 12],
                ),
                (
                    "model.diffusion_model.b.bias",
                    StDtype::BF16,
                    vec![3],
                    vec![0; 6],
                ),
                ("vae.x", StDtype::BF16, vec![1], vec![0; 2]),
            ],
        );
        let rn =
            |n: &str, _: &[usize]| n.strip_prefix("model.diffusion_model.").map(str::to_string);
        let s = SafetensorsSource::open("transformer", &[p], &rn, LoadOptions::default()).unwrap();
        s.validate(&specs(), &|_| false).unwrap();
    }
}
