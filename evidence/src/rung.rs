//! The rung file format: one TOML file per rung (`rungs/N.toml`).
//!
//! A rung fixes everything a render depends on: preset, geometry, steps, guidance,
//! seed, device, profile and levers, and optionally a weights directory and a lease
//! requirement. Unknown keys are errors (a typo must not silently fall back to a
//! default). Every error names the file, the field and what was expected.
//!
//! ```toml
//! preset = "tiny"          # tiny | ltxv-2b | ltxv-13b
//! width = 64               # pixels, a multiple of 32
//! height = 64              # pixels, a multiple of 32
//! frames = 9               # 8k+1
//! steps = 4                # denoise steps, 2..=1000
//! guidance = 3.0           # classifier-free guidance scale; > 1 runs two forwards per step
//! seed = 42
//! device = "cpu"           # cpu | cuda
//! prompt = "a fox in the snow"
//! profile = "default"      # default | baseline (every lever in its old arm)
//! # weights = "/data/ltxv-2b"   # optional; synthesized deterministically when absent
//! [levers]                 # per-lever arm, overriding the profile
//! widen-f32 = "single"
//! [require]
//! lease = false            # true: `harness run` refuses without a lease id
//! ```

use crate::error::TomlFileError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the render runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The CPU reference arm.
    Cpu,
    /// The device-resident CUDA arm.
    Cuda,
}

/// Which default every lever not named in `[levers]` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Every lever in its best measured arm.
    #[default]
    Default,
    /// Every lever in its old arm: the `baseline` arm of `specs/levers.toml`.
    Baseline,
}

/// Requirements `harness run` enforces before starting the engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Require {
    /// A lease id must be given (`--lease-id` or `HARNESS_LEASE_ID`).
    #[serde(default)]
    pub lease: bool,
}

/// One rung, as read from its file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rung {
    /// Model preset name (`tiny`, `ltxv-2b`, `ltxv-13b`).
    pub preset: String,
    /// Frame width in pixels (multiple of 32).
    pub width: u32,
    /// Frame height in pixels (multiple of 32).
    pub height: u32,
    /// Number of frames, 8k+1.
    pub frames: u32,
    /// Denoise steps.
    pub steps: u32,
    /// Classifier-free guidance scale; above 1.0 each step runs two forwards.
    pub guidance: f64,
    /// Seed of the initial noise.
    pub seed: u64,
    /// Where the render runs.
    pub device: Device,
    /// The prompt.
    #[serde(default = "default_prompt")]
    pub prompt: String,
    /// The negative prompt (used by the unconditional forward).
    #[serde(default)]
    pub negative_prompt: String,
    /// Frames per second of the output video and of the RoPE time scale.
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// Lever defaults.
    #[serde(default)]
    pub profile: Profile,
    /// Lever arms by lever id (`staging = "batched"`), overriding the profile.
    #[serde(default)]
    pub levers: BTreeMap<String, String>,
    /// Weights directory or file; synthesized from the preset when absent.
    #[serde(default)]
    pub weights: Option<PathBuf>,
    /// Requirements for running this rung.
    #[serde(default)]
    pub require: Require,
}

fn default_prompt() -> String {
    "a red fox trotting through fresh snow at sunrise, cinematic".to_string()
}

fn default_fps() -> f64 {
    25.0
}

/// The largest rung file read, bytes. A rung is a dozen lines; this leaves room
/// for a long prompt and comments and refuses a file nobody wrote by hand before
/// reading it into memory.
pub const MAX_RUNG_FILE_BYTES: u64 = 1 << 20;

/// The longest prompt or negative prompt, bytes (UTF-8). The text encoder reads
/// 128 tokens (a few hundred bytes of text) and cuts the rest; 64 KiB is far
/// beyond any prompt that changes the render and keeps every record of the run
/// small.
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;

/// The most latent tokens a rung may ask for: `((frames - 1) / 8 + 1) x
/// (height / 32) x (width / 32)`. The LTX-Video schedule's shift grows with the
/// token count (`exp(mu)`, mu linear in tokens); computed in f64 and cast to f32
/// (as diffusers does), its sigmas stay finite and strictly decreasing for every
/// step count from 2 to 1000 up to about 81,600 tokens and stop being finite near
/// 101,000 (the engine's `schedule::sigmas` refuses both; the figures come from
/// `cargo test -p engine --lib schedule::tests::the_schedule_limits -- --nocapture`).
/// 65,536 is below both,
/// and over twice the largest geometry LTX-Video documents (1216x704x257: 28,160).
pub const MAX_LATENT_TOKENS: u64 = 65_536;

/// What [`Rung::validate`] says about the step count: the schedule stretches its
/// last sigma to the terminal value, which divides by zero with one step.
pub const STEPS_EXPECTED: &str =
    "between 2 and 1000 (the LTX-Video schedule stretches its last sigma to the terminal value, which needs at least 2 steps)";

impl Rung {
    /// Read and validate a rung file (at most [`MAX_RUNG_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<Rung, TomlFileError> {
        let io = |source| TomlFileError::Io {
            what: "rung file",
            file: path.to_path_buf(),
            source,
        };
        let bytes = std::fs::metadata(path).map_err(io)?.len();
        if bytes > MAX_RUNG_FILE_BYTES {
            return Err(TomlFileError::Field {
                file: path.to_path_buf(),
                field: "(the file)".into(),
                expected: format!("a rung file of at most {MAX_RUNG_FILE_BYTES} bytes"),
                found: format!("{bytes} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(&text, path)
    }

    /// Parse and validate rung text; `file` is used in error messages only.
    pub fn parse(text: &str, file: &Path) -> Result<Rung, TomlFileError> {
        let rung: Rung = toml::from_str(text).map_err(|e| TomlFileError::Parse {
            file: file.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        rung.validate(file)?;
        Ok(rung)
    }

    /// Check every field's domain.
    pub fn validate(&self, file: &Path) -> Result<(), TomlFileError> {
        let bad = |field: &str, expected: &str, found: String| TomlFileError::Field {
            file: file.to_path_buf(),
            field: field.to_string(),
            expected: expected.to_string(),
            found,
        };
        if self.preset.trim().is_empty() {
            return Err(bad(
                "preset",
                "a preset name such as \"tiny\"",
                "an empty string".into(),
            ));
        }
        for (field, v) in [("width", self.width), ("height", self.height)] {
            if v == 0 || v % 32 != 0 || v > 8192 {
                return Err(bad(
                    field,
                    "a multiple of 32 between 32 and 8192 pixels",
                    v.to_string(),
                ));
            }
        }
        if self.frames == 0 || (self.frames - 1) % 8 != 0 || self.frames > 1025 {
            return Err(bad(
                "frames",
                "8k+1 frames (9, 17, ..., 121), at most 1025",
                self.frames.to_string(),
            ));
        }
        if self.steps < 2 || self.steps > 1000 {
            return Err(bad("steps", STEPS_EXPECTED, self.steps.to_string()));
        }
        let tokens = self.latent_tokens();
        if tokens > MAX_LATENT_TOKENS {
            return Err(bad(
                "width, height and frames",
                &format!(
                    "at most {MAX_LATENT_TOKENS} latent tokens ((frames - 1) / 8 + 1) x (height / 32) x (width / 32): beyond it the LTX-Video schedule is not finite and decreasing"
                ),
                format!(
                    "{tokens} tokens ({}x{}x{})",
                    self.width, self.height, self.frames
                ),
            ));
        }
        for (field, text) in [
            ("prompt", &self.prompt),
            ("negative_prompt", &self.negative_prompt),
        ] {
            if text.len() > MAX_PROMPT_BYTES {
                return Err(bad(
                    field,
                    &format!(
                        "at most {MAX_PROMPT_BYTES} bytes (the text encoder reads 128 tokens and cuts the rest)"
                    ),
                    format!("{} bytes", text.len()),
                ));
            }
        }
        if !self.guidance.is_finite() || self.guidance < 0.0 || self.guidance > 100.0 {
            return Err(bad(
                "guidance",
                "a finite scale between 0 and 100",
                self.guidance.to_string(),
            ));
        }
        if !self.fps.is_finite() || self.fps <= 0.0 || self.fps > 1000.0 {
            return Err(bad(
                "fps",
                "a frame rate above 0 and at most 1000",
                self.fps.to_string(),
            ));
        }
        for (k, v) in &self.levers {
            if k.is_empty() || v.is_empty() {
                return Err(bad(
                    "levers",
                    "lever = \"arm\" with both non-empty",
                    format!("{k:?} = {v:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether each denoise step runs two forwards (conditional and unconditional).
    pub fn uses_guidance(&self) -> bool {
        self.guidance > 1.0
    }

    /// Latent grid (frames, height, width) = ((F-1)/8+1, H/32, W/32).
    pub fn latent_grid(&self) -> (u32, u32, u32) {
        ((self.frames - 1) / 8 + 1, self.height / 32, self.width / 32)
    }

    /// Latent tokens of the render: the product of [`Rung::latent_grid`].
    pub fn latent_tokens(&self) -> u64 {
        let (f, h, w) = self.latent_grid();
        f as u64 * h as u64 * w as u64
    }

    /// Output voxels (width x height x frames), the scale rank fits costs against.
    pub fn voxels(&self) -> u64 {
        self.width as u64 * self.height as u64 * self.frames as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
preset = "tiny"
width = 64
height = 64
frames = 9
steps = 4
guidance = 3.0
seed = 42
device = "cpu"
[levers]
widen-f32 = "single"
"#;

    fn p(text: &str) -> Result<Rung, TomlFileError> {
        Rung::parse(text, Path::new("rungs/x.toml"))
    }

    #[test]
    fn good_rung_parses_with_defaults() {
        let r = p(GOOD).unwrap();
        assert_eq!(r.latent_grid(), (2, 2, 2));
        assert_eq!(r.profile, Profile::Default);
        assert_eq!(r.fps, 25.0);
        assert!(r.uses_guidance());
        assert_eq!(r.levers["widen-f32"], "single");
        assert!(!r.require.lease);
        assert_eq!(r.voxels(), 64 * 64 * 9);
    }

    #[test]
    fn errors_name_file_field_and_expectation() {
        let e = p(&GOOD.replace("frames = 9", "frames = 10"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rungs/x.toml")
                && e.contains("'frames'")
                && e.contains("8k+1")
                && e.contains("10"),
            "{e}"
        );
        let e = p(&GOOD.replace("width = 64", "width = 65"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'width'") && e.contains("multiple of 32"), "{e}");
        let e = p(&GOOD.replace("width = 64", "widht = 64"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rungs/x.toml") && e.contains("widht"), "{e}");
        let e = p(&GOOD.replace("\"cpu\"", "\"tpu\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tpu"), "{e}");
        let e = p("preset = ").unwrap_err().to_string();
        assert!(e.contains("rungs/x.toml"), "{e}");
        let e = p(&GOOD.replace("steps = 4", "steps = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'steps'"), "{e}");
    }

    #[test]
    fn what_the_engine_would_refuse_is_refused_here_with_the_reason() {
        let e = p(&GOOD.replace("steps = 4", "steps = 1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'steps'") && e.contains("at least 2 steps"),
            "{e}"
        );
        assert!(p(&GOOD.replace("steps = 4", "steps = 2")).is_ok());
        // The documented maximum width and height with many frames: a schedule
        // that is not finite. 8192x8192x9 = 2x256x256 = 131072 tokens.
        let big = GOOD
            .replace("width = 64", "width = 8192")
            .replace("height = 64", "height = 8192");
        let e = p(&big).unwrap_err().to_string();
        assert!(
            e.contains("65536 latent tokens") && e.contains("131072 tokens"),
            "{e}"
        );
        // Exactly at the bound: 8192x4096x9 = 2x128x256 = 65536 tokens.
        assert!(p(&big.replace("height = 8192", "height = 4096")).is_ok());
        let long = format!(
            "{GOOD}\nprompt = \"{}\"\n",
            "x".repeat(MAX_PROMPT_BYTES + 1)
        );
        let long = long.replace("[levers]\nwiden-f32 = \"single\"\n", "");
        let long = format!("{long}[levers]\nwiden-f32 = \"single\"\n");
        let e = p(&long).unwrap_err().to_string();
        assert!(e.contains("'prompt'") && e.contains("65537 bytes"), "{e}");
    }

    #[test]
    fn a_rung_file_over_a_mebibyte_is_refused_before_it_is_read() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/evidence-unit");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join(format!("huge-rung-{}.toml", std::process::id()));
        std::fs::write(&f, vec![b'#'; (MAX_RUNG_FILE_BYTES + 1) as usize]).unwrap();
        let e = Rung::load(&f).unwrap_err().to_string();
        let _ = std::fs::remove_file(&f);
        assert!(
            e.contains("at most 1048576 bytes") && e.contains("1048577 bytes"),
            "{e}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let e = Rung::load(Path::new("no/such/rung.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/rung.toml"), "{e}");
    }
}
