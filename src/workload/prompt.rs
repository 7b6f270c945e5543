//! Prompt synthesis with exact token lengths: prompts composed from single-token words whose text
//! re-encodes to exactly the requested count, shared prefixes made of whole KV blocks from a small
//! salted pool, salted unique suffixes, and the learner of the chat template's token overhead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::sampler::derive_seed;
use super::tokenizer::TokenModel;

/// Default KV-cache block size in tokens (vLLM and Dynamo default).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Default number of distinct shared prefixes: a few keep the prefix cache realistic (more than
/// one hot prefix) while each stays hot enough to be cached.
pub const DEFAULT_PREFIX_POOL_SIZE: usize = 4;

/// Rounds of re-encode-and-adjust before giving up. With a byte-level BPE word pool the first
/// guess is exact; the extra rounds absorb words that merge or split at their boundaries.
const MAX_CONVERGE_ROUNDS: usize = 64;

/// Built prefixes kept for reuse; far more than (hit ratios × pool size) of one workload, and a
/// bound keeps a long-running daemon's memory flat when ISLs vary.
const MAX_CACHED_PREFIXES: usize = 256;

// Domain tags mixed into seeds so prefixes and suffixes never share a random stream.
const PREFIX_DOMAIN: u64 = 0x7072_6566; // "pref"
const SUFFIX_DOMAIN: u64 = 0x7375_6666; // "suff"

/// Why a prompt could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("KV block size must be at least 1 token")]
    ZeroBlockSize,
    #[error("the prefix pool must hold at least 1 prefix")]
    ZeroPrefixPool,
    #[error("prefix pool slot {slot} does not exist (pool size {pool})")]
    NoSuchPrefixSlot { slot: usize, pool: usize },
    #[error(
        "could not compose a prompt of exactly {target} tokens: closest was {closest} after \
         {rounds} rounds"
    )]
    NotConverged {
        target: usize,
        closest: usize,
        rounds: usize,
    },
}

/// How prompts are built for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptConfig {
    /// KV-cache block size of the served model, in tokens.
    pub block_size: usize,
    /// Number of distinct shared prefixes requests are spread over.
    pub prefix_pool_size: usize,
    /// Differs per run (e.g. random at start-up), so the server's cache from earlier runs never
    /// matches this run's prompts.
    pub run_salt: u64,
}

impl PromptConfig {
    /// Defaults for block size and pool size with the given run salt.
    pub fn with_salt(run_salt: u64) -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            prefix_pool_size: DEFAULT_PREFIX_POOL_SIZE,
            run_salt,
        }
    }
}

/// One prompt to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRequest {
    /// Tokens of prompt text to produce (after subtracting the chat template's overhead; see
    /// [`OverheadLearner::body_tokens`]).
    pub tokens: usize,
    /// Tokens of shared prefix wanted; rounded down to whole blocks and to what fits in `tokens`.
    pub shared_prefix_tokens: usize,
    /// The random stream this request belongs to, e.g. the step seed of its workload step.
    pub stream: u64,
    /// The request's index within its stream; also picks the prefix pool slot.
    pub index: u64,
}

/// A built prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The prompt text (a shared prefix, if any, followed by the unique suffix).
    pub text: String,
    /// The tokens the text encodes to, as counted by the builder's [`TokenModel`]: exact with a
    /// real tokenizer, an estimate with the approximation.
    pub tokens: usize,
    /// How many of those tokens are the shared prefix (a multiple of the block size).
    pub prefix_tokens: usize,
    /// The pool slot of the shared prefix, when there is one.
    pub prefix_slot: Option<usize>,
}

/// Builds prompts for one run; share it via `Arc` between workers and paired targets (it is
/// `Send + Sync`), so every target receives byte-identical prompts.
#[derive(Debug)]
pub struct PromptBuilder {
    model: Arc<TokenModel>,
    config: PromptConfig,
    prefixes: Mutex<HashMap<(usize, usize), Arc<str>>>,
}

impl PromptBuilder {
    /// A builder counting with `model`.
    pub fn new(model: Arc<TokenModel>, config: PromptConfig) -> Result<Self, PromptError> {
        if config.block_size == 0 {
            return Err(PromptError::ZeroBlockSize);
        }
        if config.prefix_pool_size == 0 {
            return Err(PromptError::ZeroPrefixPool);
        }
        Ok(Self {
            model,
            config,
            prefixes: Mutex::new(HashMap::new()),
        })
    }

    /// The token model prompts are counted with.
    pub fn model(&self) -> &Arc<TokenModel> {
        &self.model
    }

    /// The configuration in use.
    pub fn config(&self) -> PromptConfig {
        self.config
    }

    /// Shared tokens for a prefix hit ratio `ratio` at input length `isl`:
    /// ⌊ratio · isl / block⌋ · block, so the server can cache exactly that many whole blocks.
    /// Ratios outside [0, 1] are clamped.
    pub fn shared_prefix_tokens(&self, isl: usize, ratio: f64) -> usize {
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        let blocks = (ratio * isl as f64 / self.config.block_size as f64).floor() as usize;
        blocks * self.config.block_size
    }

    /// The shared-prefix length a prompt of `tokens` tokens gets when `shared` are wanted: whole
    /// blocks, or the entire prompt when `shared` covers it (a hit ratio of 1: every request of a
    /// pool slot is the same prompt, so the server can reuse all of it — even though the chat
    /// template's tokens make the prompt text a little shorter than the ISL).
    pub fn prefix_len(&self, tokens: usize, shared: usize) -> usize {
        if tokens > 0 && shared >= tokens {
            tokens
        } else {
            self.whole_blocks(shared)
        }
    }

    /// The pool slot request `index` draws its prefix from: round robin, so every slot is used
    /// evenly and stays warm.
    pub fn prefix_slot(&self, index: u64) -> usize {
        (index % self.config.prefix_pool_size as u64) as usize
    }

    /// The shared prefix of pool `slot` with exactly `tokens` tokens (see
    /// [`PromptBuilder::prefix_len`] for the length). The same (run salt, slot, tokens) always
    /// gives byte-identical text.
    pub fn prefix(&self, slot: usize, tokens: usize) -> Result<Arc<str>, PromptError> {
        if slot >= self.config.prefix_pool_size {
            return Err(PromptError::NoSuchPrefixSlot {
                slot,
                pool: self.config.prefix_pool_size,
            });
        }
        let key = (slot, tokens);
        if let Some(text) = self.cached_prefix(key) {
            return Ok(text);
        }
        let seed = derive_seed(
            self.config.run_salt,
            &[PREFIX_DOMAIN, slot as u64, tokens as u64],
        );
        let text: Arc<str> = self.compose("", 0, tokens, seed)?.into();
        let mut prefixes = self
            .prefixes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if prefixes.len() >= MAX_CACHED_PREFIXES {
            prefixes.clear();
        }
        prefixes.insert(key, Arc::clone(&text));
        Ok(text)
    }

    /// Every pool prefix of `tokens` tokens as a prompt of its own, for warming the server's
    /// prefix cache before a prefix-cache step measures.
    pub fn warmup_prompts(&self, tokens: usize) -> Result<Vec<Prompt>, PromptError> {
        (0..self.config.prefix_pool_size)
            .map(|slot| {
                Ok(Prompt {
                    text: self.prefix(slot, tokens)?.to_string(),
                    tokens,
                    prefix_tokens: tokens,
                    prefix_slot: Some(slot),
                })
            })
            .collect()
    }

    /// Builds one prompt: the shared prefix of the request's pool slot (if any) followed by a
    /// unique suffix salted with the run salt, the stream and the index, together exactly
    /// `request.tokens` tokens by the builder's count.
    pub fn build(&self, request: &PromptRequest) -> Result<Prompt, PromptError> {
        let prefix_tokens = self.prefix_len(request.tokens, request.shared_prefix_tokens);
        let (prefix, prefix_slot) = if prefix_tokens > 0 {
            let slot = self.prefix_slot(request.index);
            (Some(self.prefix(slot, prefix_tokens)?), Some(slot))
        } else {
            (None, None)
        };
        let seed = derive_seed(
            self.config.run_salt,
            &[SUFFIX_DOMAIN, request.stream, request.index],
        );
        let head = prefix.as_deref().unwrap_or("");
        let text = self.compose(head, prefix_tokens, request.tokens, seed)?;
        Ok(Prompt {
            text,
            tokens: request.tokens,
            prefix_tokens,
            prefix_slot,
        })
    }

    /// A new user message of `tokens` tokens (multi-turn), salted by `stream` and `index`.
    pub fn user_message(
        &self,
        tokens: usize,
        stream: u64,
        index: u64,
    ) -> Result<Prompt, PromptError> {
        self.build(&PromptRequest {
            tokens,
            shared_prefix_tokens: 0,
            stream,
            index,
        })
    }

    fn whole_blocks(&self, tokens: usize) -> usize {
        tokens / self.config.block_size * self.config.block_size
    }

    fn cached_prefix(&self, key: (usize, usize)) -> Option<Arc<str>> {
        let prefixes = self
            .prefixes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        prefixes.get(&key).cloned()
    }

    /// [`compose`] with this builder's token model.
    fn compose(
        &self,
        head: &str,
        head_tokens: usize,
        target: usize,
        seed: u64,
    ) -> Result<String, PromptError> {
        compose(&self.model, head, head_tokens, target, seed)
    }
}

/// Appends words to `head` (which counts `head_tokens`) until the whole text re-encodes to
/// exactly `target` tokens: guess one word per missing token, encode, then add or drop words
/// by the difference. Words are drawn afresh on every round, so a word that merges with its
/// neighbour or splits in two is soon replaced and the loop cannot cycle for long. Shared by
/// [`PromptBuilder`] and the trace prompts (`trace::BlockPrompts`), whose head is a row's blocks.
pub(crate) fn compose(
    model: &TokenModel,
    head: &str,
    head_tokens: usize,
    target: usize,
    seed: u64,
) -> Result<String, PromptError> {
    let words = model.words();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut chosen: Vec<usize> = (0..target.saturating_sub(head_tokens))
        .map(|_| rng.random_range(0..words.len()))
        .collect();
    let mut closest = head_tokens;
    for _ in 0..MAX_CONVERGE_ROUNDS {
        let mut text = String::with_capacity(head.len() + chosen.len() * 8);
        text.push_str(head);
        for &word in &chosen {
            text.push_str(&words[word].text);
        }
        let count = if text.is_empty() {
            0
        } else {
            model.count(&text)
        };
        if count == target {
            return Ok(text);
        }
        if count.abs_diff(target) < closest.abs_diff(target) {
            closest = count;
        }
        // Words seen to cost more than a token each move the count by more than one per word;
        // scaling the step by the observed cost keeps the loop from overshooting back and
        // forth, and the step never drops below one word so it always moves.
        let tokens_per_word = if chosen.is_empty() {
            1.0
        } else {
            (count.saturating_sub(head_tokens) as f64 / chosen.len() as f64).max(1.0)
        };
        let step = |tokens: usize| ((tokens as f64 / tokens_per_word) as usize).max(1);
        if count < target {
            let missing = step(target - count);
            chosen.extend((0..missing).map(|_| rng.random_range(0..words.len())));
        } else if chosen.is_empty() {
            // The head alone is already too long; no suffix can shorten it.
            break;
        } else {
            let excess = step(count - target).min(chosen.len());
            chosen.truncate(chosen.len() - excess);
        }
    }
    Err(PromptError::NotConverged {
        target,
        closest,
        rounds: MAX_CONVERGE_ROUNDS,
    })
}

/// Learns how the server's reported prompt length relates to the prompt text's length, so that
/// requests can be sized for the server to see exactly the wanted ISL.
///
/// The model is `reported = offset + slope · requested`. With a real tokenizer the slope is 1 and
/// the offset is the chat template's overhead (role markers, BOS, generation prompt); with the
/// approximation the slope also absorbs its average per-token error. The slope is fitted only once
/// the requested lengths vary (by more than a token); until then it is 1. Shared between workers
/// through `&self`.
///
/// One fit per target: servers differ in their templates, and one target's reports must never
/// change another's prompts. A report outside what a prompt of that length can become
/// ([`plausible_report`]) is not learnt from, and the offset is bounded
/// ([`MAX_TEMPLATE_TOKENS`]), so a server that lies about its prompt tokens cannot shrink or
/// swell even its own prompts beyond that.
#[derive(Debug, Default)]
pub struct OverheadLearner {
    fits: Mutex<std::collections::HashMap<String, Fit>>,
}

/// The most tokens a chat template adds (system prompts included); offsets beyond are clamped.
pub const MAX_TEMPLATE_TOKENS: f64 = 4096.0;

/// Whether a server's `reported` prompt tokens can describe a prompt built with `requested`
/// tokens: at least half of them (a tokenizer counting half as many is the worst approximation
/// seen) and at most twice as many plus a template.
pub fn plausible_report(requested: usize, reported: u64) -> bool {
    let (x, y) = (requested as f64, reported as f64);
    y >= x / 2.0 && y <= 2.0 * x + MAX_TEMPLATE_TOKENS
}

/// The learned relation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverheadEstimate {
    /// Tokens the server adds regardless of the text (the chat template).
    pub offset: f64,
    /// Server tokens per counted token (1 with a real tokenizer).
    pub slope: f64,
    /// How many responses the estimate rests on.
    pub observations: u64,
}

/// Running means and co-moments (Welford), so constant inputs give an exactly zero variance and
/// long runs do not lose precision to cancellation.
#[derive(Debug, Default, Clone, Copy)]
struct Fit {
    n: u64,
    mean_x: f64,
    mean_y: f64,
    m2_x: f64,
    c_xy: f64,
}

/// Slopes outside this band mean the observations are not about the template (e.g. a server that
/// truncates prompts); the learner then keeps a pure offset.
const PLAUSIBLE_SLOPE: std::ops::RangeInclusive<f64> = 0.5..=2.0;

impl OverheadLearner {
    /// A learner with no observations (no correction until the first response).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one response of `target`: the prompt was built with `requested_tokens` and the
    /// server reported `reported_prompt_tokens` in `usage.prompt_tokens`. False (and nothing
    /// learnt) for a report no prompt of that length can give.
    pub fn observe(
        &self,
        target: &str,
        requested_tokens: usize,
        reported_prompt_tokens: u64,
    ) -> bool {
        if !plausible_report(requested_tokens, reported_prompt_tokens) {
            return false;
        }
        let mut fits = self
            .fits
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let fit = match fits.get_mut(target) {
            Some(fit) => fit,
            None => fits.entry(target.to_owned()).or_default(),
        };
        let (x, y) = (requested_tokens as f64, reported_prompt_tokens as f64);
        fit.n += 1;
        let n = fit.n as f64;
        let dx = x - fit.mean_x;
        fit.mean_x += dx / n;
        fit.mean_y += (y - fit.mean_y) / n;
        fit.m2_x += dx * (x - fit.mean_x);
        fit.c_xy += dx * (y - fit.mean_y);
        true
    }

    /// `target`'s current estimate, `None` before its first observation.
    pub fn estimate(&self, target: &str) -> Option<OverheadEstimate> {
        let fit = *self
            .fits
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(target)?;
        if fit.n == 0 {
            return None;
        }
        let fitted_slope = (fit.n >= 2 && fit.m2_x / fit.n as f64 >= 1.0)
            .then(|| fit.c_xy / fit.m2_x)
            .filter(|slope| PLAUSIBLE_SLOPE.contains(slope));
        let slope = fitted_slope.unwrap_or(1.0);
        Some(OverheadEstimate {
            offset: (fit.mean_y - slope * fit.mean_x)
                .clamp(-MAX_TEMPLATE_TOKENS, MAX_TEMPLATE_TOKENS),
            slope,
            observations: fit.n,
        })
    }

    /// The prompt length to build so that `target` sees `isl` tokens, from its current estimate
    /// (see [`body_tokens`]).
    pub fn body_tokens(&self, target: &str, isl: usize) -> usize {
        body_tokens(self.estimate(target), isl)
    }
}

/// The prompt length to build so that the server sees `isl` tokens under `estimate`: at least 1
/// for a non-zero `isl`, and `isl` itself without an estimate. Taking a snapshot of the estimate
/// (e.g. once per step) keeps the prompts of a step, and so of paired targets, the same length.
pub fn body_tokens(estimate: Option<OverheadEstimate>, isl: usize) -> usize {
    if isl == 0 {
        return 0;
    }
    match estimate {
        None => isl,
        Some(estimate) => {
            let body = ((isl as f64 - estimate.offset) / estimate.slope).round();
            body.max(1.0) as usize
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::workload::tokenizer::Word;
    use crate::workload::tokenizer::tests::trained_tokenizer;
    use std::sync::OnceLock;

    /// The in-test trained tokenizer as a shared token model (the trace prompts' tests use it too).
    pub(crate) fn real_model() -> Arc<TokenModel> {
        static MODEL: OnceLock<Arc<TokenModel>> = OnceLock::new();
        MODEL
            .get_or_init(|| Arc::new(TokenModel::from_tokenizer(trained_tokenizer(), "test")))
            .clone()
    }

    fn builder(model: Arc<TokenModel>, run_salt: u64) -> PromptBuilder {
        PromptBuilder::new(model, PromptConfig::with_salt(run_salt)).expect("valid config")
    }

    fn request(tokens: usize, shared: usize, index: u64) -> PromptRequest {
        PromptRequest {
            tokens,
            shared_prefix_tokens: shared,
            stream: 99,
            index,
        }
    }

    #[test]
    fn prompts_reencode_to_exactly_the_target_on_a_real_tokenizer() {
        let model = real_model();
        let builder = builder(model.clone(), 1);
        let mut rng = StdRng::seed_from_u64(2024);
        let mut lengths: Vec<usize> = (0..60).map(|_| rng.random_range(1..=4096)).collect();
        lengths.extend([1, 2, 3, 15, 16, 17, 4096]);
        for (index, &tokens) in lengths.iter().enumerate() {
            let prompt = builder
                .build(&request(tokens, 0, index as u64))
                .expect("converges");
            assert_eq!(prompt.tokens, tokens);
            assert_eq!(model.count(&prompt.text), tokens, "target {tokens}");
        }
    }

    #[test]
    fn prompts_with_shared_prefixes_are_exact_and_prefixes_are_whole_blocks() {
        let model = real_model();
        let builder = builder(model.clone(), 7);
        for (tokens, ratio) in [
            (2048, 0.25),
            (2048, 0.5),
            (1000, 0.75),
            (333, 0.9),
            (64, 1.0),
        ] {
            let shared = builder.shared_prefix_tokens(tokens, ratio);
            assert_eq!(shared % DEFAULT_BLOCK_SIZE, 0);
            assert_eq!(
                shared,
                (ratio * tokens as f64 / 16.0).floor() as usize * 16,
                "⌊r·L/block⌋·block"
            );
            for index in 0..6 {
                let prompt = builder
                    .build(&request(tokens, shared, index))
                    .expect("converges");
                assert_eq!(model.count(&prompt.text), tokens);
                assert_eq!(prompt.prefix_tokens, shared);
                let slot = prompt.prefix_slot.expect("has a prefix");
                let prefix = builder.prefix(slot, shared).expect("prefix");
                assert!(prompt.text.starts_with(&*prefix));
                assert_eq!(model.count(&prefix), shared, "prefix is whole blocks");
            }
        }
    }

    #[test]
    fn requests_of_one_pool_slot_share_a_byte_identical_prefix() {
        let builder = builder(real_model(), 3);
        let shared = builder.shared_prefix_tokens(1024, 0.5);
        let prompts: Vec<Prompt> = (0..8)
            .map(|index| {
                builder
                    .build(&request(1024, shared, index))
                    .expect("builds")
            })
            .collect();
        // Round robin over a pool of 4: requests 0 and 4 share slot 0, 1 and 5 slot 1, ...
        for index in 0..4 {
            let (a, b) = (&prompts[index], &prompts[index + 4]);
            assert_eq!(a.prefix_slot, Some(index));
            assert_eq!(b.prefix_slot, Some(index));
            let prefix = builder.prefix(index, shared).expect("prefix");
            assert_eq!(&a.text.as_bytes()[..prefix.len()], prefix.as_bytes());
            assert_eq!(&b.text.as_bytes()[..prefix.len()], prefix.as_bytes());
            assert_ne!(a.text, b.text, "unique suffixes differ");
        }
        let pool: std::collections::HashSet<Arc<str>> = (0..4)
            .map(|slot| builder.prefix(slot, shared).expect("prefix"))
            .collect();
        assert_eq!(pool.len(), 4, "slots hold different prefixes");
        // A fresh builder of the same run rebuilds identical text (paired targets, restarts).
        let rebuilt = PromptBuilder::new(real_model(), PromptConfig::with_salt(3))
            .expect("valid config")
            .build(&request(1024, shared, 0))
            .expect("builds");
        assert_eq!(rebuilt, prompts[0]);
    }

    #[test]
    fn salts_make_runs_and_requests_differ() {
        let model = real_model();
        let (run_a, run_b) = (builder(model.clone(), 1), builder(model, 2));
        let shared = 256;
        let a = run_a.build(&request(512, shared, 0)).expect("builds");
        let b = run_b.build(&request(512, shared, 0)).expect("builds");
        // Another run's prefix shares not even its first block, so old caches cannot hit.
        let first_block = |text: &str| text.split(' ').take(17).collect::<Vec<_>>().join(" ");
        assert_ne!(first_block(&a.text), first_block(&b.text));
        assert_ne!(
            run_a.prefix(0, shared).unwrap(),
            run_b.prefix(0, shared).unwrap()
        );
        // Within a run, the unique part depends on the stream and the index.
        let suffix = |prompt: &Prompt, builder: &PromptBuilder| {
            let prefix = builder.prefix(prompt.prefix_slot.unwrap(), shared).unwrap();
            prompt.text[prefix.len()..].to_owned()
        };
        let same_slot_next = run_a.build(&request(512, shared, 4)).expect("builds");
        let other_stream = run_a
            .build(&PromptRequest {
                stream: 100,
                ..request(512, shared, 0)
            })
            .expect("builds");
        assert_ne!(suffix(&a, &run_a), suffix(&same_slot_next, &run_a));
        assert_ne!(suffix(&a, &run_a), suffix(&other_stream, &run_a));
        // And the same inputs reproduce the same prompt.
        assert_eq!(run_a.build(&request(512, shared, 0)).expect("builds"), a);
    }

    #[test]
    fn prefix_is_clamped_to_whole_blocks_that_fit() {
        let builder = builder(real_model(), 5);
        let prompt = builder.build(&request(100, 200, 0)).expect("builds");
        assert_eq!(
            prompt.prefix_tokens, 100,
            "a prefix covering the prompt shares all of it"
        );
        let prompt = builder.build(&request(100, 90, 0)).expect("builds");
        assert_eq!(prompt.prefix_tokens, 80);
        assert_eq!(builder.model().count(&prompt.text), 100);
        let none = builder.build(&request(100, 15, 0)).expect("builds");
        assert_eq!((none.prefix_tokens, none.prefix_slot), (0, None));
        assert_eq!(builder.build(&request(0, 0, 0)).expect("builds").text, "");
        assert!(matches!(
            builder.prefix(4, 16),
            Err(PromptError::NoSuchPrefixSlot { slot: 4, pool: 4 })
        ));
    }

    #[test]
    fn warmup_prompts_cover_every_slot() {
        let builder = builder(real_model(), 8);
        let warm = builder
            .warmup_prompts(builder.prefix_len(1000, 500))
            .expect("builds");
        assert_eq!(warm.len(), DEFAULT_PREFIX_POOL_SIZE);
        for (slot, prompt) in warm.iter().enumerate() {
            assert_eq!(prompt.prefix_slot, Some(slot));
            assert_eq!(prompt.tokens, 496);
            assert_eq!(builder.model().count(&prompt.text), 496);
        }
    }

    #[test]
    fn approximation_builds_exact_by_its_own_count() {
        let model = Arc::new(TokenModel::approximate());
        let builder = builder(model.clone(), 1);
        for tokens in [1, 7, 128, 1024, 4096] {
            let prompt = builder
                .user_message(tokens, 1, tokens as u64)
                .expect("builds");
            assert_eq!(model.count(&prompt.text), tokens);
        }
    }

    #[test]
    fn converges_when_words_cost_several_tokens() {
        // Nonsense words split into several tokens of the trained tokenizer, so the first guess
        // overshoots and the loop has to add and drop words to land on the target.
        let mut words: Vec<Word> = ["qzxv", "vvkjq", "zzyzx", "xqjw", "kvqz"]
            .iter()
            .zip(0u32..)
            .map(|(text, id)| Word {
                id,
                text: format!(" {text}").into_boxed_str(),
            })
            .collect();
        words.extend(real_model().words()[..8].iter().cloned());
        let tokenizer = TokenModel::from_tokenizer(trained_tokenizer(), "test");
        let model = Arc::new(tokenizer.with_words(words.clone()));
        assert!(words.iter().any(|word| model.count(&word.text) >= 3));
        let builder = builder(model.clone(), 11);
        for tokens in [1, 2, 5, 64, 500, 2048] {
            let prompt = builder
                .user_message(tokens, 0, tokens as u64)
                .expect("converges");
            assert_eq!(model.count(&prompt.text), tokens);
        }
    }

    #[test]
    fn reports_failure_when_no_word_combination_fits() {
        // Under the approximation every 7-to-12-letter word costs exactly two tokens, so no
        // prompt of an odd length can be composed from them.
        let words = vec![
            Word {
                id: 0,
                text: " between".into(),
            },
            Word {
                id: 1,
                text: " important".into(),
            },
        ];
        let model = Arc::new(TokenModel::approximate().with_words(words));
        let builder = builder(model, 1);
        assert_eq!(
            builder.user_message(10, 0, 0).expect("even fits").tokens,
            10
        );
        assert!(matches!(
            builder.user_message(11, 0, 0),
            Err(PromptError::NotConverged {
                target: 11,
                closest: 10 | 12,
                rounds: MAX_CONVERGE_ROUNDS,
            })
        ));
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let model = Arc::new(TokenModel::approximate());
        let zero_block = PromptConfig {
            block_size: 0,
            ..PromptConfig::with_salt(0)
        };
        assert_eq!(
            PromptBuilder::new(model.clone(), zero_block).unwrap_err(),
            PromptError::ZeroBlockSize
        );
        let zero_pool = PromptConfig {
            prefix_pool_size: 0,
            ..PromptConfig::with_salt(0)
        };
        assert_eq!(
            PromptBuilder::new(model, zero_pool).unwrap_err(),
            PromptError::ZeroPrefixPool
        );
    }

    #[test]
    fn learner_subtracts_a_constant_template_overhead() {
        let learner = OverheadLearner::new();
        assert_eq!(
            learner.body_tokens("t", 1024),
            1024,
            "no correction before a response"
        );
        // The server wraps the text in a template of 11 tokens.
        learner.observe("t", 1024, 1035);
        assert_eq!(learner.body_tokens("t", 1024), 1013);
        learner.observe("t", 1013, 1024);
        assert_eq!(learner.body_tokens("t", 1024), 1013);
        assert_eq!(learner.body_tokens("t", 4096), 4085);
        let estimate = learner.estimate("t").expect("observed");
        assert_eq!((estimate.slope, estimate.observations), (1.0, 2));
        assert!((estimate.offset - 11.0).abs() < 1e-9);
        assert_eq!(
            learner.body_tokens("t", 5),
            1,
            "never asks for an empty prompt"
        );
        assert_eq!(learner.body_tokens("t", 0), 0);
        // A snapshot of the estimate gives the same answer without the learner.
        assert_eq!(body_tokens(Some(estimate), 1024), 1013);
        assert_eq!(body_tokens(None, 1024), 1024);
    }

    #[test]
    fn learner_corrects_an_approximation_that_undercounts() {
        // The server sees 1.25 server tokens per approximated token plus 9 template tokens.
        let learner = OverheadLearner::new();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let requested = rng.random_range(128..=4096);
            learner.observe(
                "t",
                requested,
                (9.0 + 1.25 * requested as f64).round() as u64,
            );
        }
        let estimate = learner.estimate("t").expect("observed");
        assert!((estimate.slope - 1.25).abs() < 0.001, "{estimate:?}");
        for isl in [128usize, 1024, 4096] {
            let body = learner.body_tokens("t", isl);
            let seen = 9.0 + 1.25 * body as f64;
            assert!(
                (seen - isl as f64).abs() <= 1.0,
                "isl {isl}: server would see {seen}"
            );
        }
    }

    #[test]
    fn learner_ignores_implausible_slopes() {
        // A server capping prompts at 100 tokens says nothing about the template.
        let capped = OverheadLearner::new();
        for requested in [400, 800, 1600] {
            assert!(!capped.observe("t", requested, 100));
        }
        assert_eq!(capped.estimate("t"), None);
    }

    #[test]
    fn one_targets_reports_never_change_anothers_prompts() {
        let learner = OverheadLearner::new();
        assert!(learner.observe("healthy", 64, 75));
        // A liar reporting 10^12 tokens, and one reporting 0: neither is learnt from.
        assert!(!learner.observe("liar", 64, 1_000_000_000_000));
        assert!(!learner.observe("zero", 64, 0));
        assert_eq!(learner.body_tokens("healthy", 64), 53);
        assert_eq!(learner.body_tokens("liar", 64), 64);
        assert_eq!(learner.body_tokens("zero", 64), 64);
        // A target whose reports are plausible per request yet add up to a huge template: the
        // offset is bounded.
        let odd = OverheadLearner::new();
        assert!(odd.observe("t", 4000, 12_000));
        assert_eq!(odd.estimate("t").unwrap().offset, MAX_TEMPLATE_TOKENS);
    }
}
