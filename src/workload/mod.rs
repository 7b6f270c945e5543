//! What the canary sends: prompts of exact token length with shared prefixes of whole KV blocks
//! and the learner of a server's prompt overhead ([`prompt`]), the token counting they are built
//! with ([`tokenizer`]), the seeded samplers of lengths and open-loop arrivals ([`sampler`]), and
//! request traces for replay ([`trace`]).

pub mod prompt;
pub mod sampler;
pub mod tokenizer;
pub mod trace;
