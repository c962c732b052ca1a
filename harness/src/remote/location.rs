//! `s3://bucket/prefix`: where a team's store lives, and the object keys of its
//! bundles (`<prefix>/bundles/<id>/<file>`, the same layout as a store on disk).

use std::fmt;

use object_store::path::Path as ObjectPath;

use crate::remote::error::RemoteError;

/// The URL scheme of an S3-protocol store.
pub const SCHEME: &str = "s3://";

/// A parsed `s3://bucket/prefix` store location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    /// The bucket name (S3's rules: 3-63 characters of `a-z0-9.-`).
    pub bucket: String,
    /// The key prefix without leading or trailing `/` (may be empty).
    pub prefix: String,
}

/// Whether `text` names an S3-protocol store (starts with `s3://`).
pub fn is_s3(text: &str) -> bool {
    text.starts_with(SCHEME)
}

impl S3Location {
    /// Parse `s3://bucket[/prefix]`. Refused, naming what was expected: another
    /// scheme, credentials or a port in the URL (credentials come only from the
    /// environment and the AWS config files), an invalid bucket name, and prefix
    /// segments outside `A-Za-z0-9._-` or equal to `.`/`..`.
    pub fn parse(text: &str) -> Result<S3Location, RemoteError> {
        // A URL with credentials in it is never echoed whole.
        let shown = crate::redact::urls(text);
        let bad = |why: &str| RemoteError::Location {
            url: shown.clone(),
            why: why.to_string(),
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("expected s3://bucket/prefix"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.contains('@') || bucket.contains(':') {
            return Err(bad(
                "credentials and ports do not belong in the URL: they come from the \
                 AWS_* environment or ~/.aws (see the README), the endpoint from \
                 AWS_ENDPOINT_URL",
            ));
        }
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && !bucket.starts_with(['.', '-'])
            && !bucket.ends_with(['.', '-']);
        if !bucket_ok {
            return Err(bad(
                "the bucket name must be 3-63 characters of a-z, 0-9, '.' and '-', \
                 starting and ending with a letter or digit",
            ));
        }
        let prefix = prefix.trim_matches('/');
        for seg in prefix.split('/').filter(|s| !s.is_empty()) {
            let ok = seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !ok {
                return Err(bad(&format!(
                    "prefix segment {seg:?}: expected characters A-Z a-z 0-9 . _ - (and not . or ..)"
                )));
            }
        }
        if prefix.contains("//") {
            return Err(bad("the prefix has an empty segment ('//')"));
        }
        Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    fn join(&self, tail: &str) -> String {
        if self.prefix.is_empty() {
            tail.to_string()
        } else {
            format!("{}/{tail}", self.prefix)
        }
    }

    /// The key prefix all bundles live under (`<prefix>/bundles`).
    pub fn bundles_key(&self) -> ObjectPath {
        ObjectPath::from(self.join("bundles"))
    }

    /// The key of file `name` of bundle `id`.
    pub fn object_key(&self, id: &str, name: &str) -> ObjectPath {
        ObjectPath::from(self.join(&format!("bundles/{id}/{name}")))
    }

    /// The key prefix of bundle `id` (`<prefix>/bundles/<id>`).
    pub fn bundle_key(&self, id: &str) -> ObjectPath {
        ObjectPath::from(self.join(&format!("bundles/{id}")))
    }

    /// The bundle as a path-like URL (`s3://bucket/prefix/bundles/<id>`): what
    /// readers hold in place of a directory ([`crate::bundle::files`] reads it
    /// through the bucket; polars scans it through its own cloud reader).
    pub fn bundle_url(&self, id: &str) -> String {
        format!(
            "{SCHEME}{}/{}",
            self.bucket,
            self.join(&format!("bundles/{id}"))
        )
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{SCHEME}{}", self.bucket)
        } else {
            write!(f, "{SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_parses_to_bucket_and_prefix_and_keys_follow_the_store_layout() {
        let l = S3Location::parse("s3://team-evidence/ltx/h200/").unwrap();
        assert_eq!(l.bucket, "team-evidence");
        assert_eq!(l.prefix, "ltx/h200");
        assert_eq!(l.to_string(), "s3://team-evidence/ltx/h200");
        assert_eq!(
            l.object_key("ab", "manifest.json").as_ref(),
            "ltx/h200/bundles/ab/manifest.json"
        );
        assert_eq!(l.bundle_url("ab"), "s3://team-evidence/ltx/h200/bundles/ab");
        let bare = S3Location::parse("s3://bkt").unwrap();
        assert_eq!(bare.prefix, "");
        assert_eq!(bare.object_key("ab", "m").as_ref(), "bundles/ab/m");
    }

    #[test]
    fn bad_locations_are_refused_naming_what_was_expected() {
        for (url, want) in [
            ("gs://bkt/p", "expected s3://"),
            ("s3://AKIA:secret@bkt/p", "credentials"),
            ("s3://bkt:9000/p", "credentials and ports"),
            ("s3://Bk/p", "bucket name"),
            ("s3://bkt/a/../b", "prefix segment"),
            ("s3://bkt/a b", "prefix segment"),
            ("s3://bkt/a//b", "empty segment"),
        ] {
            let e = S3Location::parse(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("secret"), "a credential echoed: {e}");
        }
    }
}
