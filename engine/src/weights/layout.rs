//! Checkpoint layouts on disk, mapped onto the model's (diffusers) tensor names.
//!
//! Two layouts are understood:
//! - **diffusers**: a directory with `transformer/`, `vae/`, `text_encoder/` and
//!   `tokenizer/`. A component's weights are `<stem>.safetensors` (stem
//!   `diffusion_pytorch_model` for the transformer and VAE, `model` for the text
//!   encoder), or shards listed in `<stem>.safetensors.index.json`
//!   (`{"weight_map": {tensor: shard file}}`), or one variant of either
//!   (`<stem>.bf16.safetensors`). Names are used as stored.
//! - **Lightricks single file**: one `.safetensors` holding the transformer under
//!   `model.diffusion_model.` and the VAE under `vae.`; the text encoder and the
//!   tokenizer then come from a diffusers-style directory beside the file. Names are
//!   mapped as the reference conversion does: for the transformer the prefix is
//!   stripped and `patchify_proj -> proj_in`, `adaln_single -> time_embed`,
//!   `q_norm -> norm_q`, `k_norm -> norm_k`; for the VAE the `vae.` prefix is
//!   stripped, the original block indices are mapped onto diffusers' blocks (three
//!   versions of the layout: 0.9.0, 0.9.1, 0.9.5+, detected from the file),
//!   `res_blocks -> resnets`, `conv_shortcut -> conv_shortcut.conv`,
//!   `norm3.norm -> norm3`, `last_time_embedder -> time_embedder`,
//!   `last_scale_shift_table -> scale_shift_table`, the per-channel statistics
//!   `mean-of-means -> latents_mean`, `std-of-means -> latents_std`, and the other
//!   statistics (`channel`, `mean-of-stds`) dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::safetensors::{LoadOptions, SafetensorsSource};
use super::source::WeightError;

/// A model component with its own weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// The DiT (`transformer/`).
    Transformer,
    /// The video VAE (`vae/`).
    Vae,
    /// The T5 encoder (`text_encoder/`).
    TextEncoder,
}

impl Component {
    /// Every component, in load order.
    pub const ALL: [Component; 3] = [
        Component::TextEncoder,
        Component::Transformer,
        Component::Vae,
    ];

    /// The diffusers sub-directory.
    pub fn dir_name(self) -> &'static str {
        match self {
            Component::Transformer => "transformer",
            Component::Vae => "vae",
            Component::TextEncoder => "text_encoder",
        }
    }

    /// The weights file stem inside the sub-directory.
    pub fn file_stem(self) -> &'static str {
        match self {
            Component::Transformer | Component::Vae => "diffusion_pytorch_model",
            Component::TextEncoder => "model",
        }
    }
}

/// The weights path could not be understood as a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The path does not exist or cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A component's weights are not where the layout puts them.
    #[error("{dir}: no {what} (expected {expected})")]
    Missing {
        /// The directory searched.
        dir: PathBuf,
        /// What is missing.
        what: String,
        /// The file names accepted.
        expected: String,
    },
    /// A shard index is malformed or names a shard that is absent.
    #[error("{index}: {detail}")]
    Index {
        /// The index file.
        index: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A component's files could not be opened as safetensors.
    #[error(transparent)]
    Weights(#[from] WeightError),
}

/// How stored names become model names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameMap {
    /// Stored names are the model's (diffusers layout).
    Identity,
    /// Lightricks single-file transformer names.
    LightricksDit,
    /// Lightricks single-file VAE names, for the detected layout version.
    LightricksVae(VaeVersion),
}

/// Version of the original VAE layout (decides the block index mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VaeVersion {
    /// 0.9.0: decoder blocks with `conv_in` stages and no timestep conditioning.
    V090,
    /// 0.9.1: timestep-conditioned decoder, original encoder layout.
    V091,
    /// 0.9.5 and later (also LTX-2's video VAE).
    V095,
}

/// The files of one component and how to name their tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFiles {
    /// The component.
    pub component: Component,
    /// Its safetensors files (one, or the shards in index order).
    pub files: Vec<PathBuf>,
    /// The shard index, when the weights are sharded.
    pub index: Option<PathBuf>,
    /// Stored name to model name.
    pub names: NameMap,
}

impl ComponentFiles {
    /// Open the files as one source with `opts`, mapping names, and cross-check
    /// the shard index (every indexed tensor is in the shard the index names).
    pub fn open(&self, opts: LoadOptions) -> Result<SafetensorsSource, LayoutError> {
        let names = self.names.clone();
        let rename = move |n: &str, _shape: &[usize]| map_name(&names, n);
        check_index(self)?;
        let src = SafetensorsSource::open(self.component.dir_name(), &self.files, &rename, opts)?;
        Ok(src)
    }
}

/// A checkpoint on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// A diffusers directory.
    Diffusers {
        /// The directory.
        root: PathBuf,
    },
    /// A Lightricks single file; text encoder and tokenizer from `root`.
    SingleFile {
        /// The `.safetensors` file with transformer and VAE.
        file: PathBuf,
        /// The directory beside it, searched for `text_encoder/` and `tokenizer/`.
        root: PathBuf,
        /// VAE layout version detected from the file.
        vae: VaeVersion,
    },
}

impl Layout {
    /// Recognise `path`: a directory is the diffusers layout, a file the
    /// Lightricks single-file layout.
    pub fn resolve(path: &Path) -> Result<Layout, LayoutError> {
        let md = std::fs::metadata(path).map_err(|source| LayoutError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if md.is_dir() {
            return Ok(Layout::Diffusers {
                root: path.to_path_buf(),
            });
        }
        let root = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let names = stored_names(path)?;
        Ok(Layout::SingleFile {
            file: path.to_path_buf(),
            root,
            vae: detect_vae_version(&names),
        })
    }

    /// The directory holding `text_encoder/` and `tokenizer/`.
    pub fn root(&self) -> &Path {
        match self {
            Layout::Diffusers { root } | Layout::SingleFile { root, .. } => root,
        }
    }

    /// The files of `c`.
    pub fn component(&self, c: Component) -> Result<ComponentFiles, LayoutError> {
        match (self, c) {
            (Layout::SingleFile { file, .. }, Component::Transformer) => Ok(ComponentFiles {
                component: c,
                files: vec![file.clone()],
                index: None,
                names: NameMap::LightricksDit,
            }),
            (Layout::SingleFile { file, vae, .. }, Component::Vae) => Ok(ComponentFiles {
                component: c,
                files: vec![file.clone()],
                index: None,
                names: NameMap::LightricksVae(*vae),
            }),
            _ => diffusers_component(&self.root().join(c.dir_name()), c),
        }
    }

    /// `tokenizer/tokenizer.json`, if present.
    pub fn tokenizer_json(&self) -> Option<PathBuf> {
        let p = self.root().join("tokenizer").join("tokenizer.json");
        p.is_file().then_some(p)
    }
}

/// The tensor names stored in a safetensors file (header only).
fn stored_names(path: &Path) -> Result<Vec<(String, Vec<usize>)>, LayoutError> {
    let src = SafetensorsSource::open(
        "checkpoint",
        &[path.to_path_buf()],
        &|n, _| Some(n.to_string()),
        LoadOptions::default(),
    )?;
    Ok(src.shapes())
}

/// The VAE layout version of a Lightricks file, as the reference conversion
/// decides it: an encoder `conv_out` with 2048 input channels means 0.9.5+; else a
/// decoder `last_time_embedder` means 0.9.1; else 0.9.0.
pub fn detect_vae_version(names: &[(String, Vec<usize>)]) -> VaeVersion {
    let conv_out = names
        .iter()
        .find(|(n, _)| n == "vae.encoder.conv_out.conv.weight");
    if conv_out.is_some_and(|(_, s)| s.get(1) == Some(&2048)) {
        return VaeVersion::V095;
    }
    if names
        .iter()
        .any(|(n, _)| n == "vae.decoder.last_time_embedder.timestep_embedder.linear_1.weight")
    {
        return VaeVersion::V091;
    }
    VaeVersion::V090
}

fn diffusers_component(dir: &Path, c: Component) -> Result<ComponentFiles, LayoutError> {
    let stem = c.file_stem();
    let single = dir.join(format!("{stem}.safetensors"));
    let index = dir.join(format!("{stem}.safetensors.index.json"));
    if single.is_file() {
        return Ok(ComponentFiles {
            component: c,
            files: vec![single],
            index: None,
            names: NameMap::Identity,
        });
    }
    if index.is_file() {
        return sharded(dir, c, &index);
    }
    // One variant (`<stem>.<variant>.safetensors[.index.json]`) is accepted too.
    let mut variants: BTreeSet<PathBuf> = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(stem).and_then(|r| r.strip_prefix('.'));
            if let Some(r) = rest {
                if r.ends_with(".safetensors.index.json")
                    || (r.ends_with(".safetensors") && r.matches('.').count() == 1)
                {
                    variants.insert(e.path());
                }
            }
        }
    }
    if variants.len() == 1 {
        let Some(v) = variants.into_iter().next() else {
            unreachable!("one element")
        };
        if v.to_string_lossy().ends_with(".index.json") {
            return sharded(dir, c, &v);
        }
        return Ok(ComponentFiles {
            component: c,
            files: vec![v],
            index: None,
            names: NameMap::Identity,
        });
    }
    Err(LayoutError::Missing {
        dir: dir.to_path_buf(),
        what: format!("{} weights", c.dir_name()),
        expected: if variants.is_empty() {
            format!("{stem}.safetensors or {stem}.safetensors.index.json with its shards")
        } else {
            format!(
                "exactly one variant, found {}",
                variants
                    .iter()
                    .map(|p| p
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    })
}

fn sharded(dir: &Path, c: Component, index: &Path) -> Result<ComponentFiles, LayoutError> {
    let bad = |detail: String| LayoutError::Index {
        index: index.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(index).map_err(|source| LayoutError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut shards: BTreeSet<String> = BTreeSet::new();
    for (tensor, file) in map {
        let f = file.as_str().ok_or_else(|| {
            bad(format!(
                "tensor '{tensor}' maps to {file}, expected a file name"
            ))
        })?;
        if f.contains('/') || f.contains("..") {
            return Err(bad(format!(
                "tensor '{tensor}' maps to '{f}', expected a file name in {}",
                dir.display()
            )));
        }
        shards.insert(f.to_string());
    }
    if shards.is_empty() {
        return Err(bad("the weight map is empty".into()));
    }
    let mut files = Vec::new();
    for s in &shards {
        let p = dir.join(s);
        if !p.is_file() {
            let example = map
                .iter()
                .find(|(_, f)| f.as_str() == Some(s))
                .map(|(t, _)| t.as_str())
                .unwrap_or("?");
            return Err(bad(format!(
                "shard '{s}' (holding e.g. tensor '{example}') is missing from {}",
                dir.display()
            )));
        }
        files.push(p);
    }
    Ok(ComponentFiles {
        component: c,
        files,
        index: Some(index.to_path_buf()),
        names: NameMap::Identity,
    })
}

/// Check a sharded component against its index: every tensor is in the shard the
/// index names, and every tensor in a shard is in the index.
pub fn check_index(cf: &ComponentFiles) -> Result<(), LayoutError> {
    let Some(index) = &cf.index else {
        return Ok(());
    };
    let bad = |detail: String| LayoutError::Index {
        index: index.clone(),
        detail,
    };
    let text = std::fs::read_to_string(index).map_err(|source| LayoutError::Io {
        path: index.clone(),
        source,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    if let Some(m) = v.get("weight_map").and_then(|m| m.as_object()) {
        for (t, f) in m {
            want.insert(t.clone(), f.as_str().unwrap_or_default().to_string());
        }
    }
    for f in &cf.files {
        let fname = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for (n, _) in stored_names(f)? {
            match want.remove(&n) {
                Some(ref w) if *w == fname => {}
                Some(w) => {
                    return Err(bad(format!(
                        "tensor '{n}' is in shard '{fname}' but the index puts it in '{w}'"
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "tensor '{n}' is in shard '{fname}' but not in the index"
                    )))
                }
            }
        }
    }
    if let Some((t, f)) = want.into_iter().next() {
        return Err(bad(format!(
            "tensor '{t}' is indexed in '{f}' but that shard lacks it"
        )));
    }
    Ok(())
}

/// The model name of stored tensor `n` under `map`; `None` drops it.
pub fn map_name(map: &NameMap, n: &str) -> Option<String> {
    match map {
        NameMap::Identity => Some(n.to_string()),
        NameMap::LightricksDit => lightricks_dit_name(n),
        NameMap::LightricksVae(v) => lightricks_vae_name(n, *v),
    }
}

/// A Lightricks single-file transformer name mapped to diffusers; VAE tensors
/// (any name containing `vae`) are dropped.
pub fn lightricks_dit_name(n: &str) -> Option<String> {
    if n.contains("vae") {
        return None;
    }
    let s = n.strip_prefix("model.diffusion_model.").unwrap_or(n);
    Some(
        s.replace("patchify_proj", "proj_in")
            .replace("adaln_single", "time_embed")
            .replace("q_norm", "norm_q")
            .replace("k_norm", "norm_k"),
    )
}

/// The decoder block index map of each VAE version: original `up_blocks.i` to the
/// diffusers module path.
fn up_block_map(v: VaeVersion) -> &'static [&'static str] {
    match v {
        VaeVersion::V090 => &[
            "mid_block",
            "up_blocks.0",
            "up_blocks.1.upsamplers.0",
            "up_blocks.1",
            "up_blocks.2.conv_in",
            "up_blocks.2.upsamplers.0",
            "up_blocks.2",
            "up_blocks.3.conv_in",
            "up_blocks.3.upsamplers.0",
            "up_blocks.3",
        ],
        VaeVersion::V091 | VaeVersion::V095 => &[
            "mid_block",
            "up_blocks.0.upsamplers.0",
            "up_blocks.0",
            "up_blocks.1.upsamplers.0",
            "up_blocks.1",
            "up_blocks.2.upsamplers.0",
            "up_blocks.2",
            "up_blocks.3.upsamplers.0",
            "up_blocks.3",
        ],
    }
}

/// The encoder block index map of each VAE version.
fn down_block_map(v: VaeVersion) -> &'static [&'static str] {
    match v {
        VaeVersion::V090 | VaeVersion::V091 => &[
            "down_blocks.0",
            "down_blocks.0.downsamplers.0",
            "down_blocks.0.conv_out",
            "down_blocks.1",
            "down_blocks.1.downsamplers.0",
            "down_blocks.1.conv_out",
            "down_blocks.2",
            "down_blocks.2.downsamplers.0",
            "down_blocks.3",
            "mid_block",
        ],
        VaeVersion::V095 => &[
            "down_blocks.0",
            "down_blocks.0.downsamplers.0",
            "down_blocks.1",
            "down_blocks.1.downsamplers.0",
            "down_blocks.2",
            "down_blocks.2.downsamplers.0",
            "down_blocks.3",
            "down_blocks.3.downsamplers.0",
            "mid_block",
        ],
    }
}

/// Replace `<kind>.<i>` (a whole path segment pair) by `table[i]`.
fn remap_block(s: &str, kind: &str, table: &[&str]) -> String {
    let parts: Vec<&str> = s.split('.').collect();
    let mut out: Vec<String> = Vec::with_capacity(parts.len() + 2);
    let mut i = 0;
    while i < parts.len() {
        if parts[i] == kind && i + 1 < parts.len() {
            if let Some(t) = parts[i + 1]
                .parse::<usize>()
                .ok()
                .and_then(|k| table.get(k))
            {
                out.push((*t).to_string());
                i += 2;
                continue;
            }
        }
        out.push(parts[i].to_string());
        i += 1;
    }
    out.join(".")
}

/// A Lightricks single-file VAE name mapped to diffusers; non-VAE tensors and
/// the unused per-channel statistics are dropped.
pub fn lightricks_vae_name(n: &str, v: VaeVersion) -> Option<String> {
    let s = n.strip_prefix("vae.")?;
    if s.starts_with("per_channel_statistics.") {
        return match s {
            "per_channel_statistics.mean-of-means" => Some("latents_mean".into()),
            "per_channel_statistics.std-of-means" => Some("latents_std".into()),
            _ => None,
        };
    }
    let s = remap_block(s, "up_blocks", up_block_map(v));
    let s = remap_block(&s, "down_blocks", down_block_map(v));
    let mut s = s
        .replace("res_blocks", "resnets")
        .replace("norm3.norm", "norm3");
    if s.contains("conv_shortcut") && !s.contains("conv_shortcut.conv") {
        s = s.replace("conv_shortcut", "conv_shortcut.conv");
    }
    if v != VaeVersion::V090 {
        s = s
            .replace("last_time_embedder", "time_embedder")
            .replace("last_scale_shift_table", "scale_shift_table");
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lightricks_transformer_names_map_to_diffusers() {
        assert_eq!(
            lightricks_dit_name("model.diffusion_model.patchify_proj.weight").as_deref(),
            Some("proj_in.weight")
        );
        assert_eq!(
            lightricks_dit_name("model.diffusion_model.adaln_single.linear.bias").as_deref(),
            Some("time_embed.linear.bias")
        );
        assert_eq!(
            lightricks_dit_name("model.diffusion_model.transformer_blocks.7.attn2.k_norm.weight")
                .as_deref(),
            Some("transformer_blocks.7.attn2.norm_k.weight")
        );
        assert_eq!(
            lightricks_dit_name(
                "model.diffusion_model.adaln_single.emb.timestep_embedder.linear_1.weight"
            )
            .as_deref(),
            Some("time_embed.emb.timestep_embedder.linear_1.weight")
        );
        assert_eq!(lightricks_dit_name("vae.decoder.conv_in.conv.weight"), None);
    }

    #[test]
    fn lightricks_vae_095_names_map_to_diffusers() {
        let v = VaeVersion::V095;
        let m = |n| lightricks_vae_name(n, v);
        assert_eq!(
            m("vae.decoder.up_blocks.0.res_blocks.4.conv1.conv.weight").as_deref(),
            Some("decoder.mid_block.resnets.4.conv1.conv.weight")
        );
        assert_eq!(
            m("vae.decoder.up_blocks.1.conv.conv.weight").as_deref(),
            Some("decoder.up_blocks.0.upsamplers.0.conv.conv.weight")
        );
        assert_eq!(
            m("vae.decoder.up_blocks.6.res_blocks.0.scale_shift_table").as_deref(),
            Some("decoder.up_blocks.2.resnets.0.scale_shift_table")
        );
        assert_eq!(
            m("vae.decoder.up_blocks.8.res_blocks.2.conv2.conv.bias").as_deref(),
            Some("decoder.up_blocks.3.resnets.2.conv2.conv.bias")
        );
        assert_eq!(
            m("vae.decoder.last_time_embedder.timestep_embedder.linear_2.weight").as_deref(),
            Some("decoder.time_embedder.timestep_embedder.linear_2.weight")
        );
        assert_eq!(
            m("vae.decoder.last_scale_shift_table").as_deref(),
            Some("decoder.scale_shift_table")
        );
        assert_eq!(
            m("vae.per_channel_statistics.mean-of-means").as_deref(),
            Some("latents_mean")
        );
        assert_eq!(
            m("vae.per_channel_statistics.std-of-means").as_deref(),
            Some("latents_std")
        );
        assert_eq!(m("vae.per_channel_statistics.channel"), None);
        assert_eq!(m("vae.per_channel_statistics.mean-of-stds"), None);
        assert_eq!(
            m("vae.encoder.down_blocks.7.conv.conv.weight").as_deref(),
            Some("encoder.down_blocks.3.downsamplers.0.conv.conv.weight")
        );
        assert_eq!(
            m("vae.encoder.down_blocks.8.res_blocks.1.conv1.conv.weight").as_deref(),
            Some("encoder.mid_block.resnets.1.conv1.conv.weight")
        );
        assert_eq!(m("model.diffusion_model.proj_in.weight"), None);
    }

    #[test]
    fn lightricks_vae_090_uses_its_own_block_map() {
        let m = |n| lightricks_vae_name(n, VaeVersion::V090);
        assert_eq!(
            m("vae.decoder.up_blocks.4.conv.weight").as_deref(),
            Some("decoder.up_blocks.2.conv_in.conv.weight")
        );
        assert_eq!(
            m("vae.decoder.up_blocks.3.res_blocks.0.conv_shortcut.weight").as_deref(),
            Some("decoder.up_blocks.1.resnets.0.conv_shortcut.conv.weight")
        );
        assert_eq!(
            m("vae.decoder.up_blocks.9.res_blocks.0.norm3.norm.weight").as_deref(),
            Some("decoder.up_blocks.3.resnets.0.norm3.weight")
        );
    }

    #[test]
    fn version_detection_follows_the_reference_rule() {
        let n = |s: &str, sh: &[usize]| (s.to_string(), sh.to_vec());
        assert_eq!(
            detect_vae_version(&[n("vae.encoder.conv_out.conv.weight", &[129, 2048, 3, 3, 3])]),
            VaeVersion::V095
        );
        assert_eq!(
            detect_vae_version(&[
                n("vae.encoder.conv_out.conv.weight", &[129, 512, 3, 3, 3]),
                n(
                    "vae.decoder.last_time_embedder.timestep_embedder.linear_1.weight",
                    &[512, 256]
                )
            ]),
            VaeVersion::V091
        );
        assert_eq!(detect_vae_version(&[]), VaeVersion::V090);
    }
}
