//! The names of a sealed bundle's files, in one place: the seal writes them, the
//! verifier and every reader look them up (`specs/bundle.md` documents each file).

/// `manifest.json`: the canonical manifest; its sha256 is the bundle id.
pub const MANIFEST: &str = "manifest.json";
/// `log.zst`: the engine's output lines, zstd-compressed text.
pub const LOG: &str = "log.zst";
/// `samples.parquet`: one row per sampler tick.
pub const SAMPLES: &str = "samples.parquet";
/// `phases.parquet`: one row per phase instance.
pub const PHASES: &str = "phases.parquet";
/// `markers.parquet`: one row per marker line the engine wrote.
pub const MARKERS: &str = "markers.parquet";
/// `frames.parquet`: one row per frame the completion check read (absent when none).
pub const FRAMES: &str = "frames.parquet";
/// The frame images copied from the staging frames directory when present.
pub const FRAME_IMAGES: &[&str] = &["first.png", "middle.png", "last.png"];
/// The engine's video in the staging frames directory (moved to
/// `store/renders/<id>.y4m` at the seal; the manifest's `video` entry hashes it).
pub const VIDEO: &str = "video.y4m";
