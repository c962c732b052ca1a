//! The weights digest, defined once for the engine (which writes it) and the
//! harness (which records and checks it): sha256 over the `sha256sum`-format lines
//! `"<sha256 hex of the file>  <relative path>\n"` of every file of a weights
//! directory except [`DIGEST_FILE`], sorted by path (byte order), written as
//! `"sha256:" + hex`. It depends on neither file order nor timestamps.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Name of the file at the root of a weights directory that holds its digest
/// (written last, so a directory without it is incomplete).
pub const DIGEST_FILE: &str = "DIGEST";

/// Lowercase hex sha256 of the file at `path`, streamed in 1 MiB reads.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The digest of `(relative path, sha256 hex)` pairs, in any order:
/// `sha256:<64 hex>` per the module docs.
pub fn digest_of<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut sorted: Vec<(&str, &str)> = files.into_iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    for (path, sha) in sorted {
        h.update(format!("{sha}  {path}\n").as_bytes());
    }
    format!("sha256:{:x}", h.finalize())
}

/// The digest in a [`DIGEST_FILE`]'s text (surrounding whitespace ignored), when
/// it is exactly `sha256:` and 64 hex digits.
pub fn parse_digest(text: &str) -> Option<String> {
    let d = text.trim();
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_order_independent_and_matches_a_hand_computation() {
        let a = ("vae/x.safetensors", "aa");
        let b = ("transformer/y.safetensors", "bb");
        let d = digest_of([a, b]);
        assert_eq!(d, digest_of([b, a]));
        let mut h = Sha256::new();
        h.update(b"bb  transformer/y.safetensors\naa  vae/x.safetensors\n");
        assert_eq!(d, format!("sha256:{:x}", h.finalize()));
        assert_ne!(d, digest_of([("vae/x.safetensors", "ab"), b]));
    }

    #[test]
    fn file_hash_is_the_fips_vector() {
        let d = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/weights-digest");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("abc"), b"abc").unwrap();
        assert_eq!(
            sha256_file(&d.join("abc")).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(sha256_file(&d.join("missing")).is_err());
    }

    #[test]
    fn only_a_well_formed_digest_parses() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert_eq!(parse_digest(&format!("{good}\n")), Some(good.clone()));
        assert_eq!(parse_digest(&good[..good.len() - 1]), None);
        assert_eq!(parse_digest(&good.replace("sha256", "sha1")), None);
        assert_eq!(parse_digest(&format!("sha256:{}", "g".repeat(64))), None);
    }
}
