//! A small, valid T5-style tokenizer (`tokenizer.json`) for synthetic weights.
//!
//! Same shape as T5's: a Unigram model with `<pad>` = 0, `</s>` = 1, `<unk>` = 2,
//! the pre-tokenizer T5's files carry (split on whitespace, then Metaspace: `▁`
//! marks a word start) and a post-processor appending `</s>`. No normalizer:
//! a real T5 `tokenizer.json` normalizes with SentencePiece's precompiled
//! character map, which is not synthesized here, and transformers 5 rebuilds a
//! T5 tokenizer from the vocabulary with that map as its only normalizer
//! (none when the file has none). With any other normalizer in the file the
//! `tokenizers` crate, which runs the file as written, and the reference would
//! tokenize differently (an NFKC normalizer without the whitespace split did:
//! runs of spaces, tabs and newlines became tokens of their own here and not
//! there). The vocabulary is the three specials, `▁`,
//! single characters, then whole words (`▁word`) from a fixed English list, cut to
//! fit the text encoder's vocabulary. Word pieces score higher than characters,
//! so known words are one token and anything else falls back to characters.

use serde_json::{json, Value};

/// Characters every synthetic vocabulary holds (so any lowercase text tokenizes
/// without `<unk>`).
const CHARS: &str = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-";

/// Words added as whole pieces, most useful first.
const WORDS: &[&str] = &[
    "a",
    "the",
    "of",
    "and",
    "in",
    "on",
    "at",
    "with",
    "to",
    "through",
    "is",
    "an",
    "red",
    "fox",
    "snow",
    "fresh",
    "sunrise",
    "cinematic",
    "trotting",
    "cat",
    "dog",
    "lazy",
    "quick",
    "brown",
    "jumps",
    "over",
    "blue",
    "green",
    "sky",
    "sea",
    "city",
    "night",
    "day",
    "light",
    "dark",
    "forest",
    "river",
    "mountain",
    "camera",
    "slow",
    "motion",
    "close",
    "up",
    "wide",
    "shot",
    "walking",
    "running",
    "flying",
    "bird",
    "tree",
    "water",
    "fire",
    "sun",
    "moon",
    "rain",
    "street",
    "car",
    "man",
    "woman",
    "child",
    "old",
    "young",
    "small",
    "large",
    "white",
    "black",
    "golden",
    "hour",
    "soft",
    "warm",
    "cold",
    "wind",
    "field",
    "flowers",
    "ocean",
    "waves",
    "beach",
    "sand",
    "clouds",
    "storm",
    "lightning",
    "smoke",
    "dust",
    "glass",
    "window",
    "room",
    "table",
    "chair",
    "door",
    "house",
    "road",
    "bridge",
    "train",
    "boat",
    "plane",
    "horse",
    "again",
    "video",
    "scene",
    "from",
    "above",
    "below",
    "behind",
    "front",
    "side",
    "view",
];

/// A tokenizer error: the encoder's vocabulary is too small for even the base set.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("a synthetic tokenizer needs a vocabulary of at least {needed} ids, the text encoder has {vocab}")]
pub struct VocabTooSmall {
    /// Ids needed for the specials and characters.
    pub needed: usize,
    /// The encoder's vocabulary size.
    pub vocab: usize,
}

/// The `tokenizer.json` text of a synthetic tokenizer whose ids all lie below
/// `vocab` (the text encoder's embedding rows).
pub fn synth_tokenizer_json(vocab: usize) -> Result<String, VocabTooSmall> {
    let mut pieces: Vec<(String, f64)> = vec![
        ("<pad>".into(), 0.0),
        ("</s>".into(), 0.0),
        ("<unk>".into(), 0.0),
        ("\u{2581}".into(), -3.0),
    ];
    for c in CHARS.chars() {
        pieces.push((c.to_string(), -8.0));
    }
    let needed = pieces.len();
    if vocab < needed {
        return Err(VocabTooSmall { needed, vocab });
    }
    for (i, w) in WORDS.iter().enumerate() {
        if pieces.len() >= vocab {
            break;
        }
        pieces.push((format!("\u{2581}{w}"), -4.0 - i as f64 * 0.001));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let metaspace = json!({"type": "Metaspace", "replacement": "\u{2581}",
                           "prepend_scheme": "always", "split": true});
    let pre_tokenizer = json!({"type": "Sequence",
                               "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]});
    let eos = json!({"SpecialToken": {"id": "</s>", "type_id": 0}});
    let v: Value = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<pad>"), special(1, "</s>"), special(2, "<unk>")],
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, eos,
                     {"Sequence": {"id": "B", "type_id": 0}}, eos],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}
        },
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": 2,
            "vocab": pieces.iter().map(|(p, s)| json!([p, s])).collect::<Vec<_>>(),
            "byte_fallback": false
        }
    });
    Ok(serde_json::to_string_pretty(&v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_in_the_tokenizers_crate_and_fits_the_vocab() {
        let j = synth_tokenizer_json(100).unwrap();
        let t = tokenizers::Tokenizer::from_bytes(j.as_bytes()).unwrap();
        assert_eq!(t.get_vocab_size(true), 100);
        assert_eq!(t.token_to_id("</s>"), Some(1));
        let e = t.encode("a fox", true).unwrap();
        assert_eq!(e.get_tokens(), ["\u{2581}a", "\u{2581}fox", "</s>"]);
        // An unknown word falls back to characters, never to <unk>.
        let e = t.encode("zq", true).unwrap();
        assert_eq!(e.get_tokens(), ["\u{2581}", "z", "q", "</s>"]);
        // Whitespace of any kind and length only separates words, as in T5's
        // own tokenizer files.
        let e = t.encode("  a fox\n\tin\tthe   snow  ", true).unwrap();
        assert_eq!(
            e.get_tokens(),
            [
                "\u{2581}a",
                "\u{2581}fox",
                "\u{2581}in",
                "\u{2581}the",
                "\u{2581}snow",
                "</s>"
            ]
        );
        assert!(e.get_ids().iter().all(|&i| i < 100 && i != 2));
        assert_eq!(
            synth_tokenizer_json(10).unwrap_err(),
            VocabTooSmall {
                needed: 46,
                vocab: 10
            }
        );
    }
}
