//! Deterministic synthetic weights in the real diffusers layout
//! (`engine synth-weights`).
//!
//! Every tensor of a preset's three models is written with its real name, shape
//! and storage type (bf16 as released) into `transformer/`, `vae/` and
//! `text_encoder/`, beside each component's `config.json`, `model_index.json`,
//! `scheduler/scheduler_config.json` and a small T5-style
//! `tokenizer/tokenizer.json`. Values come from [`crate::models::init`]: one
//! rule per tensor name (fan-in scaled projections, norm weights near 1, small
//! biases and modulation tables, positive latent scales) over the counter-based
//! Gaussian stream of [`crate::rng`] named after the tensor, seeded with
//! [`SYNTH_SEED`]. Element `i` of a tensor depends only on (seed, name, i), so
//! the work is cut into units of at most [`SynthOptions::unit_elems`] elements
//! generated in parallel, in any order, with identical bytes.
//!
//! Streaming: each file is written front to back in windows of units; a window
//! is generated in parallel, then written and hashed in order, so memory holds a
//! few windows, never a model. Files are written in parallel. A component larger
//! than [`SynthOptions::shard_bytes`] is split into
//! `<stem>-0000i-of-0000n.safetensors` shards with a
//! `<stem>.safetensors.index.json`, as the releases are. `DIGEST` is written
//! last (see [`crate::weights::digest`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::models::{dit, init, t5, vae};
use crate::presets::Preset;
use crate::text::synth_tokenizer::synth_tokenizer_json;
use crate::weights::digest::{self, FileDigest};
use crate::weights::layout::Component;
use crate::weights::spec::{DType, TensorSpec};

/// The seed of every synthetic weight (stream names are the tensor names).
pub const SYNTH_SEED: u64 = 0;

/// Knobs of a synthesis run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthOptions {
    /// Largest shard in bytes (data, excluding the header); a component above it
    /// is sharded. Default 5 GB (10^9 bytes), the releases' `max_shard_size`.
    pub shard_bytes: u64,
    /// Elements per parallel work unit. Default 2^20.
    pub unit_elems: usize,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            shard_bytes: 5_000_000_000,
            unit_elems: 1 << 20,
        }
    }
}

/// Synthesis failed.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A file could not be written.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Hashing failed.
    #[error(transparent)]
    Digest(#[from] digest::DigestError),
    /// The preset cannot get a tokenizer.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// One safetensors file to write: its path under the output directory and
/// its tensors in data order.
#[derive(Debug, Clone, PartialEq)]
pub struct FilePlan {
    /// Relative path (`transformer/diffusion_pytorch_model.safetensors`).
    pub rel: String,
    /// Tensors, in the order their bytes are laid out.
    pub tensors: Vec<TensorSpec>,
}

impl FilePlan {
    /// Data bytes (all tensors).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes() as u64).sum()
    }
}

/// Everything a synthesis writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Safetensors files.
    pub files: Vec<FilePlan>,
    /// Small text files (configs, indexes, tokenizer): relative path and contents.
    pub texts: Vec<(String, String)>,
}

impl Plan {
    /// Total tensor bytes.
    pub fn weight_bytes(&self) -> u64 {
        self.files.iter().map(FilePlan::data_bytes).sum()
    }
}

/// The tensors of each component of `p`, in declaration order.
pub fn component_specs(p: &Preset) -> Vec<(Component, Vec<TensorSpec>)> {
    vec![
        (Component::Transformer, dit::tensor_specs(&p.dit)),
        (Component::Vae, vae::tensor_specs(&p.vae)),
        (Component::TextEncoder, t5::tensor_specs(&p.t5)),
    ]
}

fn pretty(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Split `specs` into shards of at most `limit` data bytes (a tensor larger than
/// the limit gets a shard of its own), in order.
fn shard(specs: Vec<TensorSpec>, limit: u64) -> Vec<Vec<TensorSpec>> {
    let mut out: Vec<Vec<TensorSpec>> = vec![Vec::new()];
    let mut size = 0u64;
    for s in specs {
        let b = s.nbytes() as u64;
        if size > 0 && size + b > limit {
            out.push(Vec::new());
            size = 0;
        }
        size += b;
        if let Some(last) = out.last_mut() {
            last.push(s);
        }
    }
    out
}

/// The files of preset `p` under `opts`.
pub fn plan(p: &Preset, opts: &SynthOptions) -> Result<Plan, SynthError> {
    let mut files = Vec::new();
    let mut texts = Vec::new();
    for (c, specs) in component_specs(p) {
        let dir = c.dir_name();
        let stem = c.file_stem();
        let total: u64 = specs.iter().map(|s| s.nbytes() as u64).sum();
        let shards = shard(specs, opts.shard_bytes);
        if shards.len() == 1 {
            let tensors = shards.into_iter().next().unwrap_or_default();
            files.push(FilePlan {
                rel: format!("{dir}/{stem}.safetensors"),
                tensors,
            });
        } else {
            let n = shards.len();
            let mut map = BTreeMap::new();
            for (i, tensors) in shards.into_iter().enumerate() {
                let name = format!("{stem}-{:05}-of-{n:05}.safetensors", i + 1);
                for t in &tensors {
                    map.insert(t.name.clone(), name.clone());
                }
                files.push(FilePlan {
                    rel: format!("{dir}/{name}"),
                    tensors,
                });
            }
            texts.push((
                format!("{dir}/{stem}.safetensors.index.json"),
                pretty(&serde_json::json!({
                    "metadata": {"total_size": total},
                    "weight_map": map,
                })),
            ));
        }
        let config = match c {
            Component::Transformer => p.dit.to_config_json(),
            Component::Vae => p.vae.to_config_json(),
            Component::TextEncoder => p.t5.to_config_json(),
        };
        texts.push((format!("{dir}/config.json"), pretty(&config)));
    }
    texts.push((
        "scheduler/scheduler_config.json".into(),
        pretty(&p.scheduler.to_config_json()),
    ));
    texts.push((
        "tokenizer/tokenizer.json".into(),
        synth_tokenizer_json(p.t5.vocab_size).map_err(|e| SynthError::Tokenizer(e.to_string()))?,
    ));
    texts.push((
        "tokenizer/tokenizer_config.json".into(),
        pretty(&serde_json::json!({
            "tokenizer_class": "T5TokenizerFast",
            "model_max_length": p.max_text_tokens,
            "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
        })),
    ));
    texts.push((
        "model_index.json".into(),
        pretty(&serde_json::json!({
            "_class_name": "LTXPipeline",
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "T5EncoderModel"],
            "tokenizer": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "LTXVideoTransformer3DModel"],
            "vae": ["diffusers", "AutoencoderKLLTXVideo"],
            "synthetic": {"preset": p.name, "seed": SYNTH_SEED},
        })),
    ));
    Ok(Plan { files, texts })
}

/// The safetensors header of `f`: 8-byte little-endian length, then the JSON
/// (tensors at consecutive offsets in plan order), padded with spaces to 8 bytes.
pub fn header_bytes(f: &FilePlan) -> Vec<u8> {
    let mut m = serde_json::Map::new();
    m.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut off = 0usize;
    for t in &f.tensors {
        let n = t.nbytes();
        m.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype.safetensors_name(), "shape": t.shape,
                               "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(m)).unwrap_or_default();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out
}

/// Encode `vals` (already rounded to `dtype`) as little-endian bytes.
fn encode(vals: &[f32], dtype: DType, out: &mut Vec<u8>) {
    match dtype {
        DType::BF16 => {
            for v in vals {
                out.extend_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::F16 => {
            for v in vals {
                out.extend_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::F32 => {
            for v in vals {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// The bytes of elements `start .. start + n` of synthetic tensor `t`.
pub fn unit_bytes(t: &TensorSpec, start: u64, n: usize) -> Vec<u8> {
    let mut vals = vec![0f32; n];
    init::fill(&t.name, &t.shape, t.dtype, SYNTH_SEED, start, &mut vals);
    let mut out = Vec::with_capacity(n * t.dtype.size());
    encode(&vals, t.dtype, &mut out);
    out
}

/// What a synthesis wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthReport {
    /// `sha256:<hex>`, also in `DIR/DIGEST`.
    pub digest: String,
    /// Every file, sorted by path.
    pub files: Vec<FileDigest>,
    /// Tensor bytes written.
    pub weight_bytes: u64,
    /// Distinct pool threads that generated data (evidence of parallel work).
    pub threads_used: u32,
}

fn write_file(
    dir: &Path,
    f: &FilePlan,
    opts: &SynthOptions,
    used: &AtomicU64,
) -> Result<FileDigest, SynthError> {
    let path = dir.join(&f.rel);
    let io = |source| SynthError::Io {
        file: path.clone(),
        source,
    };
    let mut out = BufWriter::with_capacity(8 << 20, File::create(&path).map_err(io)?);
    let mut h = Sha256::new();
    let header = header_bytes(f);
    out.write_all(&header).map_err(io)?;
    h.update(&header);
    let mut bytes = header.len() as u64;
    let units: Vec<(usize, u64, usize)> = f
        .tensors
        .iter()
        .enumerate()
        .flat_map(|(ti, t)| {
            let n = t.numel() as u64;
            let step = opts.unit_elems.max(1) as u64;
            (0..n.div_ceil(step)).map(move |k| {
                let s = k * step;
                (ti, s, (n - s).min(step) as usize)
            })
        })
        .collect();
    let window = 4 * rayon::current_num_threads().max(1);
    for w in units.chunks(window) {
        let blocks: Vec<Vec<u8>> = w
            .par_iter()
            .map(|&(ti, s, n)| {
                if let Some(i) = rayon::current_thread_index() {
                    used.fetch_or(1u64 << (i % 64), Ordering::Relaxed);
                }
                unit_bytes(&f.tensors[ti], s, n)
            })
            .collect();
        for b in blocks {
            out.write_all(&b).map_err(io)?;
            h.update(&b);
            bytes += b.len() as u64;
        }
    }
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(FileDigest {
        path: f.rel.clone(),
        bytes,
        sha256: digest::hex(&h.finalize()),
    })
}

/// Write preset `p`'s synthetic weights into `dir` (created if needed; files of
/// the same names are replaced; an existing `DIGEST` is removed first so an
/// interrupted run never looks complete), then `DIR/DIGEST`. Runs on the current
/// rayon pool.
pub fn synthesize(p: &Preset, dir: &Path, opts: &SynthOptions) -> Result<SynthReport, SynthError> {
    let io = |file: &Path| {
        let file = file.to_path_buf();
        move |source| SynthError::Io { file, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dg = dir.join(digest::DIGEST_FILE);
    if dg.exists() {
        std::fs::remove_file(&dg).map_err(io(&dg))?;
    }
    let plan = plan(p, opts)?;
    for sub in [
        "transformer",
        "vae",
        "text_encoder",
        "tokenizer",
        "scheduler",
    ] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(io(&d))?;
    }
    let used = AtomicU64::new(0);
    let mut files: Vec<FileDigest> = plan
        .files
        .par_iter()
        .map(|f| write_file(dir, f, opts, &used))
        .collect::<Result<_, _>>()?;
    for (rel, text) in &plan.texts {
        let path = dir.join(rel);
        std::fs::write(&path, text.as_bytes()).map_err(io(&path))?;
        let mut h = Sha256::new();
        h.update(text.as_bytes());
        files.push(FileDigest {
            path: rel.clone(),
            bytes: text.len() as u64,
            sha256: digest::hex(&h.finalize()),
        });
    }
    files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let d = digest::digest_of(&files);
    digest::write_digest_file(dir, &d)?;
    Ok(SynthReport {
        digest: d,
        files,
        weight_bytes: plan.weight_bytes(),
        threads_used: used.load(Ordering::Relaxed).count_ones(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;
    use crate::weights::layout::Layout;
    use crate::weights::safetensors::LoadOptions;
    use crate::weights::TensorSource;

    fn dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/synth")
            .join(name);
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    #[test]
    fn big_presets_are_sharded_like_releases() {
        let p = preset("ltxv-13b").unwrap();
        let pl = plan(&p, &SynthOptions::default()).unwrap();
        let tr: Vec<_> = pl
            .files
            .iter()
            .filter(|f| f.rel.starts_with("transformer/"))
            .collect();
        assert!(tr.len() >= 6, "{}", tr.len());
        assert_eq!(
            tr[0].rel,
            format!(
                "transformer/diffusion_pytorch_model-00001-of-{:05}.safetensors",
                tr.len()
            )
        );
        assert!(tr.iter().all(|f| f.data_bytes() <= 5_000_000_000));
        assert_eq!(
            pl.weight_bytes(),
            component_specs(&p)
                .iter()
                .flat_map(|(_, s)| s)
                .map(|s| s.nbytes() as u64)
                .sum::<u64>()
        );
        assert!(pl
            .texts
            .iter()
            .any(|(r, _)| r == "transformer/diffusion_pytorch_model.safetensors.index.json"));
        assert!(pl
            .texts
            .iter()
            .any(|(r, _)| r == "text_encoder/model.safetensors.index.json"));
        let tiny = plan(&preset("tiny").unwrap(), &SynthOptions::default()).unwrap();
        assert_eq!(tiny.files.len(), 3);
        assert!(tiny.weight_bytes() < 16 << 20, "{}", tiny.weight_bytes());
    }

    #[test]
    fn synthesis_is_deterministic_parallel_and_loads_back_exactly() {
        let p = preset("tiny").unwrap();
        let opts = SynthOptions {
            shard_bytes: 100_000,
            unit_elems: 4096,
        };
        let (a, b) = (dir("a"), dir("b"));
        let ra = pool(2).install(|| synthesize(&p, &a, &opts)).unwrap();
        let rb = pool(1).install(|| synthesize(&p, &b, &opts)).unwrap();
        assert_eq!(ra.digest, rb.digest, "thread count must not change bytes");
        assert_eq!(ra.threads_used, 2, "two pool threads generated data");
        assert_eq!(rb.threads_used, 1);
        assert_eq!(digest::read_digest_file(&a).unwrap(), ra.digest);
        assert_eq!(digest::digest_of(&digest::hash_dir(&a).unwrap()), ra.digest);
        // Sharded at 100 kB: the index and every shard are in place.
        assert!(a
            .join("transformer/diffusion_pytorch_model.safetensors.index.json")
            .is_file());
        // Loads back through the layout, validates, and equals the in-memory init.
        let lay = Layout::resolve(&a).unwrap();
        for (c, specs) in component_specs(&p) {
            let cf = lay.component(c).unwrap();
            let src = cf.open(LoadOptions::default()).unwrap();
            src.validate(&specs, &|_| false).unwrap();
            for s in specs.iter().step_by(7) {
                let t = src.load_f32(&s.name, &s.shape).unwrap();
                assert_eq!(t, init::tensor(s, SYNTH_SEED), "{}", s.name);
            }
        }
        assert!(lay.tokenizer_json().is_some());
        // A different seed would give other bytes: the digest sees content.
        let one = &ra.files[0];
        let path = a.join(&one.path);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_ne!(digest::digest_of(&digest::hash_dir(&a).unwrap()), ra.digest);
    }

    #[test]
    fn shard_index_mismatch_and_missing_shard_are_named() {
        let p = preset("tiny").unwrap();
        let opts = SynthOptions {
            shard_bytes: 100_000,
            unit_elems: 1 << 16,
        };
        let a = dir("index");
        synthesize(&p, &a, &opts).unwrap();
        let idx = a.join("transformer/diffusion_pytorch_model.safetensors.index.json");
        let text = std::fs::read_to_string(&idx).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let home = v["weight_map"]["proj_in.weight"]
            .as_str()
            .unwrap()
            .to_string();
        let other = v["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .map(|f| f.as_str().unwrap().to_string())
            .find(|f| *f != home)
            .unwrap();
        v["weight_map"]["proj_in.weight"] = other.clone().into();
        std::fs::write(&idx, v.to_string()).unwrap();
        let lay = Layout::resolve(&a).unwrap();
        let e = lay
            .component(Component::Transformer)
            .unwrap()
            .open(LoadOptions::default());
        let e = e.err().unwrap().to_string();
        assert!(
            e.contains("'proj_in.weight'") && e.contains("index.json"),
            "{e}"
        );
        std::fs::write(&idx, text).unwrap();
        std::fs::remove_file(a.join("transformer").join(&other)).unwrap();
        let e = lay
            .component(Component::Transformer)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("shard '{other}'")) && e.contains("missing"),
            "{e}"
        );
    }
}
