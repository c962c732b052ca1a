//! Precomputed prompt embeddings as an alternative to tokenizer + T5
//! (`--prompt-embeds FILE.safetensors`).
//!
//! The file holds `embeds` `[L, C]` and `mask` `[L]` (1 on real tokens, 0 on
//! padding), any float type; `C` must be the DiT's caption channels. For guidance
//! above 1 it must also hold `negative_embeds` `[L', C]` and `negative_mask` `[L']`.

use std::path::Path;

use crate::tensor::Tensor;
use crate::weights::safetensors::Widen;
use crate::weights::safetensors::{LoadOptions, SafetensorsSource};
use crate::weights::{TensorSource, WeightError};

/// Encoder states and mask of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptEmbeds {
    /// `[L, C]` encoder states.
    pub states: Tensor,
    /// `L` values, 1.0 for a real token.
    pub mask: Vec<f32>,
}

/// The prompt (and, when present, negative prompt) embeddings of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedsFile {
    /// The prompt.
    pub positive: PromptEmbeds,
    /// The negative prompt, if the file has one.
    pub negative: Option<PromptEmbeds>,
}

fn read_pair(
    src: &SafetensorsSource,
    file: &Path,
    states: &str,
    mask: &str,
    channels: usize,
) -> Result<Option<PromptEmbeds>, WeightError> {
    let shapes = src.shapes();
    let Some((_, s)) = shapes.iter().find(|(n, _)| n == states) else {
        return Ok(None);
    };
    if s.len() != 2 || s[1] != channels || s[0] == 0 {
        return Err(WeightError::Shape {
            name: states.to_string(),
            file: file.to_path_buf(),
            expected: vec![s.first().copied().unwrap_or(1).max(1), channels],
            found: s.clone(),
        });
    }
    let l = s[0];
    let t = src.load_f32(states, &[l, channels])?;
    let m = src.load_f32(mask, &[l])?.into_data();
    if let Some(bad) = m.iter().find(|&&v| v != 0.0 && v != 1.0) {
        return Err(WeightError::Corrupt {
            file: file.to_path_buf(),
            detail: format!("tensor '{mask}' holds {bad}, expected only 0 and 1"),
        });
    }
    Ok(Some(PromptEmbeds { states: t, mask: m }))
}

/// Read `file`, checking `embeds` is `[L, channels]` and `mask` is `[L]` of 0/1.
pub fn load_prompt_embeds(file: &Path, channels: usize) -> Result<EmbedsFile, WeightError> {
    let opts = LoadOptions {
        widen: Widen::Single,
        release_pages: false,
    };
    let src = SafetensorsSource::open(
        "prompt-embeds",
        &[file.to_path_buf()],
        &|n, _| Some(n.into()),
        opts,
    )?;
    let positive =
        read_pair(&src, file, "embeds", "mask", channels)?.ok_or_else(|| WeightError::Missing {
            name: "embeds".into(),
            file: file.to_path_buf(),
            expected: vec![0, channels],
        })?;
    let negative = read_pair(&src, file, "negative_embeds", "negative_mask", channels)?;
    Ok(EmbedsFile { positive, negative })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::safetensors::tests::write_st;
    use ::safetensors::Dtype;
    use std::path::PathBuf;

    fn f32b(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_embeds_and_checks_shapes_and_mask() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/embeds");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("e.safetensors");
        let states: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        write_st(
            &p,
            &[
                ("embeds", Dtype::F32, vec![3, 2], f32b(&states)),
                ("mask", Dtype::F32, vec![3], f32b(&[1.0, 1.0, 0.0])),
            ],
        );
        let e = load_prompt_embeds(&p, 2).unwrap();
        assert_eq!(e.positive.states.shape(), &[3, 2]);
        assert_eq!(e.positive.states.data(), states.as_slice());
        assert_eq!(e.positive.mask, vec![1.0, 1.0, 0.0]);
        assert!(e.negative.is_none());
        let err = load_prompt_embeds(&p, 4).unwrap_err().to_string();
        assert!(
            err.contains("'embeds'") && err.contains("e.safetensors") && err.contains("[3, 4]"),
            "{err}"
        );
        let q = d.join("badmask.safetensors");
        write_st(
            &q,
            &[
                ("embeds", Dtype::F32, vec![3, 2], f32b(&states)),
                ("mask", Dtype::F32, vec![3], f32b(&[1.0, 0.5, 0.0])),
            ],
        );
        let err = load_prompt_embeds(&q, 2).unwrap_err().to_string();
        assert!(err.contains("'mask'") && err.contains("0.5"), "{err}");
        let r = d.join("nomask.safetensors");
        write_st(&r, &[("embeds", Dtype::F32, vec![3, 2], f32b(&states))]);
        let err = load_prompt_embeds(&r, 2).unwrap_err().to_string();
        assert!(err.contains("missing tensor 'mask'"), "{err}");
    }
}
