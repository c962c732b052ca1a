//! Short forms of ids for people: the first 12 characters of a bundle id, campaign
//! id or sha256, as tables and messages print them.
//!
//! Ids come from directory names and manifests, which a damaged or hand-made store
//! can fill with anything; cutting at a byte offset would panic inside a multi-byte
//! character, so the cut is by characters.

/// Characters kept by [`short`].
pub const SHORT_LEN: usize = 12;

/// The first [`SHORT_LEN`] characters of `id` (all of it when shorter).
pub fn short(id: &str) -> &str {
    match id.char_indices().nth(SHORT_LEN) {
        Some((at, _)) => &id[..at],
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_hex_at_twelve_and_never_inside_a_character() {
        assert_eq!(short("7f0605dedf9a8064"), "7f0605dedf9a");
        assert_eq!(short("abc"), "abc");
        assert_eq!(short(""), "");
        // 11 ASCII bytes then a 4-byte character: a byte cut at 12 would panic.
        assert_eq!(short("0123456789a🎞bcd"), "0123456789a🎞");
        assert_eq!(short("ééééééééééééé"), "éééééééééééé");
    }
}
