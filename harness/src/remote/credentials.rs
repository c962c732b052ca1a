//! The S3 client's settings from the ecosystem's own places, never from flags:
//! the `AWS_*` environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, and the rest `object_store` reads: web identity, ECS and
//! instance credentials), then the shared files the AWS CLI and SDKs use for the
//! profile `AWS_PROFILE` (else `default`): `AWS_SHARED_CREDENTIALS_FILE` (else
//! `~/.aws/credentials`) for the keys, `AWS_CONFIG_FILE` (else `~/.aws/config`,
//! section `[profile NAME]` or `[default]`) for `region` and `endpoint_url` (and
//! keys, which the CLI also accepts there). The environment wins over the files.
//!
//! The resolved settings hold a secret: [`Settings`] has no `Debug` form and its
//! values are never formatted into a message or a log.

use std::collections::BTreeMap;
use std::path::PathBuf;

use object_store::aws::AmazonS3ConfigKey;
use object_store::ClientConfigKey;

/// The settings the harness hands to both its own client and polars' reader.
pub struct Settings {
    /// Key/value pairs for `AmazonS3Builder::with_config`.
    pub pairs: Vec<(AmazonS3ConfigKey, String)>,
    /// Where each setting came from, by name (no values): for messages.
    pub sources: Vec<String>,
}

/// The `[section]` -> key -> value pairs of an INI-style AWS file (`#` and `;`
/// comments, `key = value` lines; keys lowercased; later duplicates win).
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if let Some(name) = l.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            section = Some(name.trim().to_string());
            continue;
        }
        if let (Some(s), Some((k, v))) = (&section, l.split_once('=')) {
            out.entry(s.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(rel)))
}

/// Whether `endpoint` is plain HTTP to this machine (loopback), which needs no
/// `AWS_ALLOW_HTTP`: a test server, or a gateway on the host itself.
pub fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host.split(':').next().unwrap_or("")
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Resolve the settings: the environment first, then the shared files for what
/// the environment leaves unset; a loopback `http://` endpoint is allowed
/// without TLS; with an endpoint and no region, `us-east-1` (what S3-protocol
/// servers other than AWS accept).
pub fn resolve() -> Settings {
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
    let read = |p: Option<PathBuf>| {
        p.and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| parse_ini(&t))
            .unwrap_or_default()
    };
    let creds = read(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
    let config = read(home_file("AWS_CONFIG_FILE", ".aws/config"));
    let from_creds = creds.get(&profile).cloned().unwrap_or_default();
    let config_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    let from_config = config.get(&config_section).cloned().unwrap_or_default();
    let mut pairs = Vec::new();
    let mut sources = Vec::new();
    let mut pick = |key: AmazonS3ConfigKey,
                    envs: &[&str],
                    file_key: &str,
                    files: &[(&BTreeMap<String, String>, &str)]|
     -> Option<String> {
        for e in envs {
            if let Some(v) = env(e) {
                sources.push(format!("{file_key} from ${e}"));
                pairs.push((key, v.clone()));
                return Some(v);
            }
        }
        for (f, what) in files {
            if let Some(v) = f.get(file_key).filter(|v| !v.is_empty()) {
                sources.push(format!("{file_key} from {what} [{profile}]"));
                pairs.push((key, v.clone()));
                return Some(v.clone());
            }
        }
        None
    };
    let both: [(&BTreeMap<String, String>, &str); 2] = [
        (&from_creds, "the credentials file"),
        (&from_config, "the config file"),
    ];
    let key_id = pick(
        AmazonS3ConfigKey::AccessKeyId,
        &["AWS_ACCESS_KEY_ID"],
        "aws_access_key_id",
        &both,
    );
    if key_id.is_some() {
        pick(
            AmazonS3ConfigKey::SecretAccessKey,
            &["AWS_SECRET_ACCESS_KEY"],
            "aws_secret_access_key",
            &both,
        );
        pick(
            AmazonS3ConfigKey::Token,
            &["AWS_SESSION_TOKEN"],
            "aws_session_token",
            &both,
        );
    }
    let endpoint = pick(
        AmazonS3ConfigKey::Endpoint,
        &["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"],
        "endpoint_url",
        &[(&from_config, "the config file")],
    );
    let region = pick(
        AmazonS3ConfigKey::Region,
        &["AWS_REGION", "AWS_DEFAULT_REGION"],
        "region",
        &[(&from_config, "the config file")],
    );
    if region.is_none() && endpoint.is_some() {
        pairs.push((AmazonS3ConfigKey::Region, "us-east-1".to_string()));
        sources.push("region us-east-1 (an endpoint and no region)".into());
    }
    if let Some(e) = &endpoint {
        if env("AWS_ALLOW_HTTP").is_none() && is_loopback_http(e) {
            pairs.push((
                AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
                "true".to_string(),
            ));
            sources.push("plain HTTP allowed (a loopback endpoint)".into());
        }
    }
    Settings { pairs, sources }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_files_parse_by_profile_with_comments_and_spacing() {
        let t = "# team\n[default]\naws_access_key_id = AK1\n; x\n[profile ci]\nRegion=eu-west-1\nendpoint_url = http://127.0.0.1:9000\n";
        let m = parse_ini(t);
        assert_eq!(m["default"]["aws_access_key_id"], "AK1");
        assert_eq!(m["profile ci"]["region"], "eu-west-1");
        assert_eq!(m["profile ci"]["endpoint_url"], "http://127.0.0.1:9000");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn only_loopback_http_is_allowed_without_the_ecosystem_switch() {
        assert!(is_loopback_http("http://127.0.0.1:9010"));
        assert!(is_loopback_http("http://localhost:9010/"));
        assert!(is_loopback_http("http://[::1]:9010"));
        assert!(!is_loopback_http("http://10.0.0.5:9000"));
        assert!(!is_loopback_http("http://127.0.0.1.evil.example:80"));
        assert!(!is_loopback_http("https://127.0.0.1:9010"));
    }
}
