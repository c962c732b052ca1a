//! Text from bundles, rung files and the command line made safe where it is
//! shown: in a markdown table cell ([`md_cell`], [`md_code`]) and on a
//! terminal ([`terminal`]). A rung name, lever value, host name, phase name or
//! reason is user text: it must not add a table row or heading, open an HTML
//! tag, close a code span, or reach a terminal as an escape sequence.

use std::fmt::Write;

/// `c` as a visible escape (`\x1b`, `\u{202e}`): for control characters, which
/// a terminal would act on and a viewer would hide.
fn visible(c: char, out: &mut String) {
    let n = c as u32;
    if n < 0x100 {
        let _ = write!(out, "\\x{n:02x}");
    } else {
        let _ = write!(out, "\\u{{{n:x}}}");
    }
}

/// Whether `c` is shown escaped on a terminal: C0 and C1 controls, DEL, and
/// the invisible bidirectional and zero-width formatting characters that can
/// make text read other than it is.
fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `s` for a terminal: every control character (newline, tab and escape
/// included) and invisible formatting character rendered visibly as `\xNN`
/// or `\u{N}`; a backslash is left as it is. Plain text is unchanged.
pub fn terminal(s: &str) -> String {
    if !s.chars().any(is_hidden) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_hidden(c) {
            visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` for one cell of a markdown table (or one list item): `|` as `\|`,
/// backticks as `` \` ``, `<` as `&lt;`, a newline as the two characters `\n`,
/// and every other control character visibly (`\x1b`). Plain text is
/// unchanged.
pub fn md_cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '`' => out.push_str("\\`"),
            '<' => out.push_str("&lt;"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_hidden(c) => visible(c, &mut out),
            c => out.push(c),
        }
    }
    out
}

/// `s` as a markdown code span (`` `s` ``) in running text, unless it holds a
/// backtick, newline or other hidden character: inside a code span no escape
/// works, so such text is given as [`md_cell`] text instead.
pub fn md_code(s: &str) -> String {
    if !s.is_empty() && !s.chars().any(|c| c == '`' || is_hidden(c)) {
        format!("`{s}`")
    } else {
        md_cell(s)
    }
}

/// `s` as a code span inside a table cell: as [`md_code`], and not when it
/// holds a `|` (which ends a cell even inside a code span).
pub fn md_code_cell(s: &str) -> String {
    if s.contains('|') {
        md_cell(s)
    } else {
        md_code(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_row_heading_tag_or_escape_sequence_stays_text() {
        let rung = "r|b\n| injected | row |\n# H";
        let cell = md_cell(rung);
        assert!(!cell.contains('\n'));
        assert_eq!(cell, "r\\|b\\n\\| injected \\| row \\|\\n# H");
        assert_eq!(
            md_cell("<img src=x onerror=alert(1)>"),
            "&lt;img src=x onerror=alert(1)>"
        );
        assert_eq!(md_cell("a`b"), "a\\`b");
        assert_eq!(md_cell("plain rung 2 (x > y)"), "plain rung 2 (x > y)");
        assert_eq!(md_code("7f0605dedf9a"), "`7f0605dedf9a`");
        assert_eq!(md_code("a`b"), "a\\`b");
        assert_eq!(md_code("vm|Xeon (R)"), "`vm|Xeon (R)`");
        assert_eq!(md_code_cell("vm|Xeon"), "vm\\|Xeon");
        let t = terminal("staging=\x1b]0;T\x07\x1b[2J\nrow");
        assert_eq!(t, "staging=\\x1b]0;T\\x07\\x1b[2J\\x0arow");
        assert_eq!(terminal("plain"), "plain");
        assert_eq!(terminal("a\u{202e}b"), "a\\u{202e}b");
    }
}
