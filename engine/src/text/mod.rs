//! Text conditioning inputs: prompt tokenization from `tokenizer.json`
//! ([`tokenizer`]), the small synthetic T5-style tokenizer written with synthetic
//! weights ([`synth_tokenizer`]), and precomputed prompt embeddings
//! ([`embeds`]).

pub mod embeds;
pub mod synth_tokenizer;
pub mod tokenizer;
