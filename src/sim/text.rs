//! Prompt tokenisation and output text of the simulator: an optional real tokenizer, else one
//! token per whitespace-separated word with a stable id; the fixed chat template; and the words the
//! simulated model "generates".

use std::path::Path;

use tokenizers::Tokenizer;

/// The words of simulated output, one token each. Short common words keep chunks small.
const WORDS: [&str; 32] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were",
];

/// Stable id of a word: the same word always gets the same token id, so identical prompt prefixes
/// share block hashes across requests and runs.
pub fn word_id(word: &str) -> u32 {
    // FNV-1a, 32-bit.
    let mut h: u32 = 0x811c_9dc5;
    for b in word.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The word of output token `index` of a request whose output starts at `offset`.
pub fn output_word(offset: u32, index: u32) -> &'static str {
    WORDS[(offset.wrapping_add(index) as usize) % WORDS.len()]
}

/// The token id of output token `index`, equal to what the prompt tokenizer gives its word, so a
/// multi-turn history that repeats the reply hits the blocks the reply filled.
pub fn output_token_id(offset: u32, index: u32) -> u32 {
    word_id(output_word(offset, index))
}

/// Turns prompt text into token ids.
#[derive(Debug, Clone)]
pub enum PromptTokenizer {
    /// One token per whitespace-separated word.
    Words,
    /// A Hugging Face `tokenizer.json`.
    Hf(Box<Tokenizer>),
}

/// A tokenizer file that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {message}")]
pub struct TokenizerError {
    pub path: String,
    pub message: String,
}

impl PromptTokenizer {
    /// Loads `tokenizer.json` (or a directory containing it).
    pub fn from_path(path: &Path) -> Result<Self, TokenizerError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        Tokenizer::from_file(&file)
            .map(|t| PromptTokenizer::Hf(Box::new(t)))
            .map_err(|e| TokenizerError {
                path: file.display().to_string(),
                message: e.to_string(),
            })
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            PromptTokenizer::Words => text.split_whitespace().map(word_id).collect(),
            PromptTokenizer::Hf(t) => match t.encode(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                // An encode failure on arbitrary input falls back to the word approximation rather
                // than failing the request: the simulator only needs plausible counts.
                Err(_) => text.split_whitespace().map(word_id).collect(),
            },
        }
    }
}

/// Flattens chat messages with a small ChatML-style template, ending with the assistant turn
/// header. The markers are separate words so they cost tokens, like a real template's overhead.
pub fn chat_template<'a>(messages: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|im_start|> ");
        out.push_str(role);
        out.push('\n');
        out.push_str(&content);
        out.push_str(" <|im_end|>\n");
    }
    out.push_str("<|im_start|> assistant\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_tokenise_to_stable_ids() {
        let t = PromptTokenizer::Words;
        let a = t.encode("hello world  again");
        assert_eq!(a.len(), 3);
        assert_eq!(a, t.encode("hello\nworld again"));
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn template_costs_a_fixed_overhead_per_message() {
        let t = PromptTokenizer::Words;
        let one = t.encode(&chat_template([("user", "a b c".to_string())]));
        let two = t.encode(&chat_template([
            ("system", "x".to_string()),
            ("user", "a b c".to_string()),
        ]));
        assert_eq!(
            one.len(),
            3 + 3 + 2,
            "content + role header + end + assistant header"
        );
        assert_eq!(two.len() - one.len(), 1 + 3);
    }

    #[test]
    fn generated_ids_match_the_tokenised_reply() {
        let reply: String = (0..5).map(|i| format!(" {}", output_word(7, i))).collect();
        let ids: Vec<u32> = (0..5).map(|i| output_token_id(7, i)).collect();
        assert_eq!(PromptTokenizer::Words.encode(&reply), ids);
    }
}
