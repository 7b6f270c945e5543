//! Prompts built from trace rows: [`BlockPrompts`] turns each block id into the same text
//! wherever it appears, keeping recently used block texts in a bounded cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{TAIL_DOMAIN, TRACE_DOMAIN, TraceRow};
use crate::workload::prompt::{PromptError, compose};
use crate::workload::sampler::derive_seed;
use crate::workload::tokenizer::TokenModel;

/// Block texts kept for reuse: enough for the hot blocks of a large trace; the byte bound keeps
/// the cache small when blocks are long (512 tokens are ~3 KB of text).
const MAX_CACHED_BLOCKS: usize = 65_536;
const MAX_CACHED_BLOCK_BYTES: usize = 64 << 20;

/// One prompt built from a trace row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPrompt {
    /// The prompt text: the row's whole blocks, then text unique to the row.
    pub text: String,
    /// The tokens the text encodes to, as counted by the [`TokenModel`] (exact with a real
    /// tokenizer, an estimate with the approximation).
    pub tokens: usize,
    /// How many of those tokens are the row's block texts (a multiple of the block size).
    pub shared_blocks_tokens: usize,
}

/// Builds prompts from trace rows for one run: each block id maps to `block_size` tokens of text
/// that depend only on (run salt, id), so rows naming the same leading ids start with
/// byte-identical text. Share it through an `Arc` (it is `Send + Sync`) so every target and
/// worker gets the same texts.
#[derive(Debug)]
pub struct BlockPrompts {
    model: Arc<TokenModel>,
    block_size: usize,
    run_salt: u64,
    cache: Mutex<BlockCache>,
}

/// Block texts by id, with their total size; cleared whole when a bound is passed, which costs
/// only a rebuild of the texts still in use.
#[derive(Debug, Default)]
struct BlockCache {
    texts: HashMap<u64, Arc<str>>,
    bytes: usize,
}

impl BlockPrompts {
    /// Prompts counted with `model`, `block_size` tokens per block id, salted with `run_salt`
    /// (a new salt per run keeps an earlier run's cache from matching).
    pub fn new(
        model: Arc<TokenModel>,
        block_size: usize,
        run_salt: u64,
    ) -> Result<Self, PromptError> {
        if block_size == 0 {
            return Err(PromptError::ZeroBlockSize);
        }
        Ok(Self {
            model,
            block_size,
            run_salt,
            cache: Mutex::new(BlockCache::default()),
        })
    }

    /// Tokens per block id.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The text of block `id`: exactly `block_size` tokens of single-token words, the same for
    /// the same (run salt, id) on every call and every builder.
    pub fn block_text(&self, id: u64) -> Result<Arc<str>, PromptError> {
        if let Some(text) = self.lock().texts.get(&id) {
            return Ok(Arc::clone(text));
        }
        // Composed outside the lock: other workers' blocks need not wait for this one.
        let seed = derive_seed(self.run_salt, &[TRACE_DOMAIN, id]);
        let text: Arc<str> = compose(&self.model, "", 0, self.block_size, seed)?.into();
        let mut cache = self.lock();
        if cache.texts.len() >= MAX_CACHED_BLOCKS
            || cache.bytes + text.len() > MAX_CACHED_BLOCK_BYTES
        {
            cache.texts.clear();
            cache.bytes = 0;
        }
        if cache.texts.insert(id, Arc::clone(&text)).is_none() {
            cache.bytes += text.len();
        }
        Ok(text)
    }

    /// The prompt of `row` with `body_tokens` tokens of text (its `input_length` less the chat
    /// template's tokens): the texts of the row's leading block ids, as many whole blocks as
    /// fit, then text unique to the row seeded by (run salt, `row_index`) up to the length; so a
    /// shorter body drops the last blocks and a longer one than the ids cover ends in unique
    /// text. The total re-encodes to exactly `body_tokens` by the model's count (the unique
    /// tail absorbs any merge at the seams). Pass a different `row_index` per send when repeated
    /// sends of one row must not share their tails.
    pub fn prompt(
        &self,
        row: &TraceRow,
        body_tokens: usize,
        row_index: u64,
    ) -> Result<BlockPrompt, PromptError> {
        let whole = row.blocks.len().min(body_tokens / self.block_size);
        let mut head = String::new();
        for &id in &row.blocks[..whole] {
            head.push_str(&self.block_text(id)?);
        }
        let shared_blocks_tokens = whole * self.block_size;
        let seed = derive_seed(self.run_salt, &[TAIL_DOMAIN, row_index]);
        let text = compose(&self.model, &head, shared_blocks_tokens, body_tokens, seed)?;
        Ok(BlockPrompt {
            text,
            tokens: body_tokens,
            shared_blocks_tokens,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BlockCache> {
        self.cache
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ReplayOffsets;
    use super::*;
    use crate::workload::prompt::tests::real_model;
    use std::time::Duration;

    fn row(blocks: &[u64]) -> TraceRow {
        TraceRow {
            at: Some(Duration::ZERO),
            delay: Duration::ZERO,
            input_length: 1000,
            output_length: 1,
            blocks: blocks.to_vec(),
            session: None,
        }
    }

    #[test]
    fn shared_block_ids_give_byte_identical_prompt_blocks() {
        for model in [real_model(), Arc::new(TokenModel::approximate())] {
            let prompts = BlockPrompts::new(model.clone(), 16, 7).expect("valid");
            let a = prompts.prompt(&row(&[1, 2, 3]), 60, 0).expect("builds");
            let b = prompts.prompt(&row(&[1, 2, 9]), 60, 1).expect("builds");
            for prompt in [&a, &b] {
                assert_eq!(model.count(&prompt.text), 60, "{model:?}");
                assert_eq!(prompt.tokens, 60);
                assert_eq!(prompt.shared_blocks_tokens, 48);
            }
            let two = format!(
                "{}{}",
                prompts.block_text(1).unwrap(),
                prompts.block_text(2).unwrap()
            );
            assert_eq!(model.count(&two), 32);
            assert!(a.text.starts_with(&two) && b.text.starts_with(&two));
            let (third_a, third_b) = (&a.text[two.len()..], &b.text[two.len()..]);
            assert!(third_a.starts_with(&*prompts.block_text(3).unwrap()));
            assert!(third_b.starts_with(&*prompts.block_text(9).unwrap()));
            assert_ne!(
                prompts.block_text(3).unwrap(),
                prompts.block_text(9).unwrap()
            );
            // A block is a pure function of (salt, id): a fresh builder agrees, another run not.
            let again = BlockPrompts::new(model.clone(), 16, 7).expect("valid");
            assert_eq!(again.prompt(&row(&[1, 2, 3]), 60, 0).expect("builds"), a);
            let other = BlockPrompts::new(model.clone(), 16, 8).expect("valid");
            assert_ne!(other.block_text(1).unwrap(), prompts.block_text(1).unwrap());
            // Equal ids on equal rows differ only in their unique tails.
            let tail = prompts.prompt(&row(&[1, 2, 3]), 60, 5).expect("builds");
            assert_eq!(tail.text[..two.len()], a.text[..two.len()]);
            assert_ne!(tail.text, a.text);
        }
    }

    #[test]
    fn prompts_trim_blocks_that_do_not_fit_and_extend_past_the_ids_exactly() {
        let model = real_model();
        let prompts = BlockPrompts::new(model.clone(), 16, 3).expect("valid");
        let blocks = [4, 5, 6];
        for (body, shared) in [
            (0, 0),
            (1, 0),
            (15, 0),
            (16, 16),
            (40, 32),
            (48, 48),
            (300, 48),
        ] {
            let prompt = prompts.prompt(&row(&blocks), body, 9).expect("builds");
            assert_eq!(model.count(&prompt.text), body, "body {body}");
            assert_eq!(prompt.shared_blocks_tokens, shared, "body {body}");
            let head: String = blocks[..shared / 16]
                .iter()
                .map(|&id| prompts.block_text(id).unwrap().to_string())
                .collect();
            assert!(prompt.text.starts_with(&head));
        }
        // Long blocks, as Mooncake's 512, compose exactly too.
        let wide = BlockPrompts::new(model.clone(), 512, 3).expect("valid");
        let prompt = wide.prompt(&row(&[1, 2]), 1000, 0).expect("builds");
        assert_eq!(model.count(&prompt.text), 1000);
        assert_eq!(prompt.shared_blocks_tokens, 512);
        assert!(matches!(
            BlockPrompts::new(model, 0, 0),
            Err(PromptError::ZeroBlockSize)
        ));
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<BlockPrompts>();
        assert_send_sync::<ReplayOffsets>();
    }
}
