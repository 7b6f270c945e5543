//! What the canary sends: prompts of exact token length with shared prefixes of whole KV blocks
//! and the learner of a server's prompt overhead ([`prompt`]), the token counting they are built
//! with ([`tokenizer`]), the seeded samplers of lengths and open-loop arrivals ([`sampler`]),
//! request traces for replay ([`trace`]), and datasets of real prompts ([`dataset`]).

/// Prompt tokens of one request, a conversation's last turn included: every length is held to
/// it before a prompt is built, a config's and a trace file's alike.
pub const MAX_ISL: u32 = 262_144;
/// Output tokens of one request.
pub const MAX_OSL: u32 = 131_072;
/// Turns of one conversation: a multi-turn workload's, a dataset conversation's (the `turn`
/// label's values).
pub const MAX_TURNS: u32 = 100;

pub mod dataset;
pub mod prompt;
pub mod sampler;
pub mod tokenizer;
pub mod trace;
