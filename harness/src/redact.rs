//! Credentials kept out of what the harness prints: the user-info part of any
//! URL in a text (`scheme://user:secret@host` -> `scheme://<redacted>@host`),
//! whether the URL came from `--store` or from `AWS_ENDPOINT_URL` and reached
//! the text through a client's error message.

/// `text` with the user-info of every `scheme://...@host` in it replaced by
/// `<redacted>`. The authority ends at the first `/`, whitespace, quote or
/// bracket after `://`; its last `@` ends the user-info.
pub fn urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || "\"'<>()[]{}`,;".contains(c))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(i) => {
                out.push_str("<redacted>");
                out.push_str(&authority[i..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `text` with each of `secrets` (non-empty ones) replaced by `<redacted>`:
/// for values known to be secret wherever they appear, even outside a URL
/// (the user and password of `AWS_ENDPOINT_URL`, raw and percent-decoded).
pub fn values(text: &str, secrets: &[String]) -> String {
    let mut out = urls(text);
    for s in secrets.iter().filter(|s| s.len() >= 3) {
        out = out.replace(s.as_str(), "<redacted>");
    }
    out
}

/// The user and password in the user-info of `url` (`scheme://user:pass@host`),
/// each as written and percent-decoded: the values [`values`] hides.
pub fn userinfo_of(url: &str) -> Vec<String> {
    let Some((_, tail)) = url.split_once("://") else {
        return Vec::new();
    };
    let authority = tail.split('/').next().unwrap_or("");
    let Some(i) = authority.rfind('@') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for part in authority[..i].splitn(2, ':') {
        out.push(part.to_string());
        let decoded = percent_decode(part);
        if decoded != part {
            out.push(decoded);
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_info_of_every_url_is_hidden_and_nothing_else() {
        assert_eq!(
            urls("GET http://key:SECRET@127.0.0.1:9000/b/k failed: refused"),
            "GET http://<redacted>@127.0.0.1:9000/b/k failed: refused"
        );
        assert_eq!(
            urls("s3://a:b@bucket/x and (https://u@h) end"),
            "s3://<redacted>@bucket/x and (https://<redacted>@h) end"
        );
        assert_eq!(urls("http://127.0.0.1:9000/x"), "http://127.0.0.1:9000/x");
        assert_eq!(urls("no url: a@b"), "no url: a@b");
        let s = userinfo_of("http://key:SE%2FCRET@127.0.0.1:1");
        assert_eq!(s, vec!["key", "SE%2FCRET", "SE/CRET"]);
        assert_eq!(values("said SE/CRET once", &s), "said <redacted> once");
    }
}
