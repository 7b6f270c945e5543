//! Token counting for prompt synthesis: a real Hugging Face tokenizer loaded from `tokenizer.json`,
//! or a built-in approximation when none is configured, plus the pool of single-token words the
//! prompt builder composes prompts from.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tokenizers::Tokenizer;

/// The most words kept in a tokenizer's word pool; thousands of distinct words already make two
/// salted prompts collide with negligible probability, and a bounded pool keeps loading fast.
const MAX_POOL_WORDS: usize = 4096;

/// Below this many single-token words the pool falls back to the built-in word list (whose words
/// may then cost more than one token each; the prompt builder's converge loop absorbs that).
const MIN_POOL_WORDS: usize = 32;

/// Letters per token the approximation charges for a long word: BPE vocabularies hold most common
/// English words of up to ~6 letters as one token and split longer ones into pieces of that order.
const APPROX_LETTERS_PER_TOKEN: usize = 6;

/// Digits per token the approximation charges (Llama-3-style tokenizers group up to three digits).
const APPROX_DIGITS_PER_TOKEN: usize = 3;

/// Common English words of at most [`APPROX_LETTERS_PER_TOKEN`] letters: every one counts as
/// exactly one token under the approximation, and almost every one is a single token in real BPE
/// vocabularies, so prompts made from them have nearly the same length on any server.
const BUILTIN_WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may",
    "these", "what", "them", "than", "some", "him", "time", "into", "only", "do", "could", "new",
    "about", "two", "then", "first", "any", "like", "my", "now", "over", "such", "our", "man",
    "me", "even", "most", "made", "after", "also", "did", "many", "off", "before", "must", "well",
    "back", "years", "where", "much", "your", "way", "down", "should", "each", "just", "those",
    "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own",
    "see", "men", "work", "long", "get", "here", "both", "life", "being", "under", "never", "day",
    "same", "know", "while", "last", "might", "us", "great", "old", "year", "come", "since", "go",
    "came", "right", "used", "take", "three", "states", "few", "house", "use", "during", "again",
    "place", "around", "home", "small", "found", "went", "say", "part", "once", "high", "upon",
    "school", "every", "don", "does", "got", "united", "left", "number", "course", "war", "until",
    "always", "away", "fact", "though", "water", "less", "public", "put", "think", "almost",
    "hand", "enough", "far", "took", "head", "yet", "system", "better", "set", "told", "night",
    "end", "why", "called", "didn", "eyes", "find", "going", "look", "asked", "later", "knew",
    "point", "next", "city", "give", "group", "toward", "young", "days", "let", "room", "side",
    "social", "given", "order", "second", "rather", "per", "face", "among", "form", "often",
    "things", "looked", "early", "white", "case", "john", "become", "large", "big", "need", "four",
    "within", "felt", "along", "saw", "best", "church", "ever", "least", "power", "thing", "light",
    "family", "action", "line", "seemed", "want", "area", "mind", "open", "kind", "love", "sense",
    "door", "half", "near", "stone", "river", "field", "plain", "green", "blue", "red", "black",
    "north", "south", "east", "west", "cold", "warm", "rain", "snow", "wind", "tree", "road",
    "hill", "lake", "sea", "ship", "boat", "bird", "horse", "dog", "cat", "fish", "bread", "milk",
    "salt", "iron", "gold", "paper", "book", "word", "song", "music", "voice", "story", "table",
    "chair", "window", "garden", "market", "town", "castle", "bridge", "tower", "letter", "summer",
    "winter", "spring", "autumn", "friend", "mother", "father", "sister", "king", "queen",
    "doctor", "farmer", "worker", "driver", "player", "writer", "reader",
];

/// Why a tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "tokenizer {path}: no such file or directory (give a tokenizer.json, a model directory \
         holding one, or a Hugging Face model id present in the local hub cache)"
    )]
    NotFound { path: PathBuf },
    #[error("tokenizer directory {dir} has no tokenizer.json")]
    NoTokenizerJson { dir: PathBuf },
    #[error("tokenizer {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    #[error("tokenizer {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One entry of the word pool: a token id and its text, which starts with a space so that words
/// concatenate into prompt text at pre-tokenizer boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    /// The token id in the loaded tokenizer; for the approximation, the index in the built-in list.
    pub id: u32,
    /// The decoded text, with its leading space.
    pub text: Box<str>,
}

/// How prompt lengths are counted. Cheap to share: wrap it in an `Arc`; it is `Send + Sync`.
pub struct TokenModel {
    counter: Counter,
    words: Vec<Word>,
    source: String,
}

enum Counter {
    Exact(Box<Tokenizer>),
    Approximate,
}

impl fmt::Debug for TokenModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenModel")
            .field("source", &self.source)
            .field("exact", &self.is_exact())
            .field("pool_words", &self.words.len())
            .finish()
    }
}

impl TokenModel {
    /// Loads the configured tokenizer: `None` gives the built-in approximation; `Some(path)` is a
    /// `tokenizer.json`, a directory holding one, or a Hugging Face model id (`org/name`) that is
    /// already in the local hub cache (nothing is downloaded).
    pub fn load(path: Option<&Path>) -> Result<Self, TokenizerError> {
        match path {
            None => Ok(Self::approximate()),
            Some(path) => Self::from_path(path),
        }
    }

    /// [`TokenModel::load`], read once per process for as long as the file stays the same
    /// (by modification time): `check`'s validation of a dataset and a run's start-up share one
    /// reading of what may be a tokenizer.json of tens of megabytes.
    pub fn load_shared(path: Option<&Path>) -> Result<Arc<Self>, TokenizerError> {
        type Kept = Vec<(PathBuf, Option<SystemTime>, Arc<TokenModel>)>;
        static KEPT: Mutex<Kept> = Mutex::new(Vec::new());
        let Some(path) = path else {
            return Ok(Arc::new(Self::approximate()));
        };
        let file = resolve_tokenizer_file(path)?;
        let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
        let kept = || KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, t)) = kept().iter().find(|(f, m, _)| *f == file && *m == modified) {
            return Ok(Arc::clone(t));
        }
        let loaded = Arc::new(Self::from_path(&file)?);
        let mut kept = kept();
        // One tokenizer is configured at a time; the one before a reload's is kept beside it.
        if kept.len() >= 2 {
            kept.remove(0);
        }
        kept.push((file, modified, Arc::clone(&loaded)));
        Ok(loaded)
    }

    /// The built-in approximation, for when no tokenizer is configured. Its counts are estimates;
    /// the real prompt length comes back in the server's `usage.prompt_tokens`, and
    /// `prompt::OverheadLearner` corrects the average error.
    pub fn approximate() -> Self {
        Self {
            counter: Counter::Approximate,
            words: builtin_words(),
            source: "built-in approximation".to_owned(),
        }
    }

    /// Loads a tokenizer from a path (see [`TokenModel::load`]).
    pub fn from_path(path: &Path) -> Result<Self, TokenizerError> {
        let file = resolve_tokenizer_file(path)?;
        let text =
            crate::files::read_text(&file, crate::files::MAX_TOKENIZER_BYTES).map_err(|e| {
                TokenizerError::Read {
                    path: file.clone(),
                    source: match e {
                        crate::files::FileError::Io(source) => source,
                        other => std::io::Error::other(other.to_string()),
                    },
                }
            })?;
        let tokenizer =
            Tokenizer::from_bytes(text.as_bytes()).map_err(|source| TokenizerError::Parse {
                path: file.clone(),
                source,
            })?;
        Ok(Self::from_tokenizer(tokenizer, file.display().to_string()))
    }

    /// Wraps an already built tokenizer; `source` names it in logs.
    pub fn from_tokenizer(tokenizer: Tokenizer, source: impl Into<String>) -> Self {
        let words = tokenizer_words(&tokenizer);
        let words = if words.len() >= MIN_POOL_WORDS {
            words
        } else {
            tracing::warn!(
                found = words.len(),
                "tokenizer has few single-token words; composing prompts from the built-in list"
            );
            builtin_words()
        };
        Self {
            counter: Counter::Exact(Box::new(tokenizer)),
            words,
            source: source.into(),
        }
    }

    /// Whether counts are exact (a real tokenizer) rather than the approximation.
    pub fn is_exact(&self) -> bool {
        matches!(self.counter, Counter::Exact(_))
    }

    /// Where the tokenizer came from, for logs and status.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The number of tokens `text` encodes to, without special tokens (the chat template's own
    /// tokens are learned separately from the server's usage).
    pub fn count(&self, text: &str) -> usize {
        match &self.counter {
            Counter::Exact(tokenizer) => match tokenizer.encode_fast(text, false) {
                Ok(encoding) => encoding.len(),
                Err(error) => {
                    // Only exotic normalizers fail to encode; an estimate keeps measuring going.
                    tracing::warn!(%error, "tokenizer failed to encode; counting approximately");
                    approximate_count(text)
                }
            },
            Counter::Approximate => approximate_count(text),
        }
    }

    /// The words prompts are composed from: each is (almost always) one token on its own and
    /// starts with a space. Never empty.
    pub fn words(&self) -> &[Word] {
        &self.words
    }

    /// Replaces the word pool, so tests can exercise prompt composition with words that cost
    /// several tokens.
    #[cfg(test)]
    pub(crate) fn with_words(mut self, words: Vec<Word>) -> Self {
        assert!(!words.is_empty(), "a word pool is never empty");
        self.words = words;
        self
    }
}

/// Resolves a configured path to a `tokenizer.json` file.
fn resolve_tokenizer_file(path: &Path) -> Result<PathBuf, TokenizerError> {
    if path.is_file() {
        return Ok(path.to_owned());
    }
    if path.is_dir() {
        let file = path.join("tokenizer.json");
        return if file.is_file() {
            Ok(file)
        } else {
            Err(TokenizerError::NoTokenizerJson {
                dir: path.to_owned(),
            })
        };
    }
    hub_cache_file(path).ok_or_else(|| TokenizerError::NotFound {
        path: path.to_owned(),
    })
}

/// Looks a model id such as `Qwen/Qwen3-30B-A3B-FP8` up in the local Hugging Face hub cache
/// (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), so a config can name
/// the model the way the serving deployment does when its files are already on disk.
fn hub_cache_file(model_id: &Path) -> Option<PathBuf> {
    let cache = std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|home| PathBuf::from(home).join("hub")))
        .or_else(|| {
            std::env::var_os("HOME").map(|home| {
                PathBuf::from(home)
                    .join(".cache")
                    .join("huggingface")
                    .join("hub")
            })
        })?;
    hub_cache_file_in(&cache, model_id)
}

/// The hub cache layout: `models--{org}--{name}/snapshots/{revision}/tokenizer.json`.
fn hub_cache_file_in(cache: &Path, model_id: &Path) -> Option<PathBuf> {
    let id = model_id.to_str()?;
    let (org, name) = id.split_once('/')?;
    if org.is_empty() || name.is_empty() || name.contains('/') {
        return None;
    }
    let snapshots = cache
        .join(format!("models--{org}--{name}"))
        .join("snapshots");
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(snapshots)
        .ok()?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join("tokenizer.json"))
        .filter(|file| file.is_file())
        .collect();
    // Several snapshots may exist; sorting makes the pick independent of directory order.
    candidates.sort();
    candidates.pop()
}

/// The built-in list as a word pool.
fn builtin_words() -> Vec<Word> {
    BUILTIN_WORDS
        .iter()
        .zip(0u32..)
        .map(|(word, id)| Word {
            id,
            text: format!(" {word}").into_boxed_str(),
        })
        .collect()
}

/// The tokenizer's own one-token words: ids whose decoded text is a short lowercase ASCII word `w`
/// such that appending `" w"` to text ending in a word adds exactly one token (checked as
/// count(" w w") = count(" w") + 1). That holds for byte-level BPE (GPT-2, Llama 3, Qwen) and for
/// SentencePiece-style tokenizers alike, and makes the prompt builder's first guess (nearly) exact.
fn tokenizer_words(tokenizer: &Tokenizer) -> Vec<Word> {
    let special: HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect();
    let mut seen = HashSet::new();
    let mut words = Vec::new();
    let vocab_size = u32::try_from(tokenizer.get_vocab_size(true)).unwrap_or(u32::MAX);
    for id in 0..vocab_size {
        if words.len() >= MAX_POOL_WORDS {
            break;
        }
        if special.contains(&id) {
            continue;
        }
        let Ok(decoded) = tokenizer.decode(&[id], false) else {
            continue;
        };
        let letters = decoded.trim_start();
        let plausible = (2..=12).contains(&letters.len())
            && letters.bytes().all(|byte| byte.is_ascii_lowercase());
        if !plausible || !seen.insert(letters.to_owned()) {
            continue;
        }
        let text = format!(" {letters}");
        let count = |text: &str| {
            tokenizer
                .encode_fast(text, false)
                .map(|encoding| encoding.len())
                .ok()
        };
        let once = count(&text);
        let twice = count(&format!("{text}{text}"));
        if once.is_some() && twice == once.map(|once| once + 1) {
            words.push(Word {
                id,
                text: text.into_boxed_str(),
            });
        }
    }
    words
}

/// The approximation: a letter run costs one token per started [`APPROX_LETTERS_PER_TOKEN`]
/// letters (a single space before it is free, as in BPE vocabularies), a digit run one per started
/// [`APPROX_DIGITS_PER_TOKEN`] digits, every other ASCII symbol one, every non-ASCII character one
/// (CJK and Hangul are about a token per character), and a run of whitespace other than a single
/// space one.
pub fn approximate_count(text: &str) -> usize {
    // Over bytes, not chars: it counts every word of every prompt composed (a fifth of the
    // client's CPU with 1024-token prompts when it decoded chars). Letters and digits are ASCII,
    // so their runs are byte runs; anything else is decoded as the char it starts.
    let bytes = text.as_bytes();
    let run_end = |mut i: usize, class: fn(&u8) -> bool| {
        while bytes.get(i).is_some_and(class) {
            i += 1;
        }
        i
    };
    // The char starting at byte `i`, which the loop keeps on a char boundary.
    let char_at = |i: usize| text[i..].chars().next();
    let mut tokens = 0;
    let mut i = 0;
    while let Some(b) = bytes.get(i) {
        if b.is_ascii_alphabetic() {
            let end = run_end(i + 1, u8::is_ascii_alphabetic);
            tokens += (end - i).div_ceil(APPROX_LETTERS_PER_TOKEN);
            i = end;
        } else if b.is_ascii_digit() {
            let end = run_end(i + 1, u8::is_ascii_digit);
            tokens += (end - i).div_ceil(APPROX_DIGITS_PER_TOKEN);
            i = end;
        } else {
            let Some(c) = char_at(i) else { break };
            i += c.len_utf8();
            if c.is_whitespace() {
                let mut single_space = c == ' ';
                while let Some(next) = char_at(i).filter(|n| n.is_whitespace()) {
                    single_space = false;
                    i += next.len_utf8();
                }
                if !single_space {
                    tokens += 1;
                }
            } else {
                tokens += 1;
            }
        }
    }
    tokens
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, TokenizerBuilder};

    /// Builds a small but real byte-level BPE tokenizer, trained on text made here, so tests
    /// exercise real merges without downloading anything.
    pub(crate) fn trained_tokenizer() -> Tokenizer {
        let corpus = training_corpus();
        let mut trainer = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(1200)
            .min_frequency(2)
            .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
            .build();
        let mut tokenizer = TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None::<tokenizers::NormalizerWrapper>)
            .with_pre_tokenizer(Some(ByteLevel::default()))
            .with_post_processor(None::<tokenizers::PostProcessorWrapper>)
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .expect("tokenizer builds");
        tokenizer
            .train(&mut trainer, corpus.iter())
            .expect("training succeeds");
        // The trained tokenizer is typed by its concrete parts; its JSON loads as the dynamic
        // `Tokenizer` the application uses, the same path a real tokenizer.json takes.
        let json = tokenizer.to_string(false).expect("tokenizer serialises");
        Tokenizer::from_bytes(json.as_bytes()).expect("tokenizer json loads")
    }

    /// A few dozen KB of varied English-like text with punctuation and digits.
    fn training_corpus() -> Vec<String> {
        let mut lines = Vec::new();
        for (i, window) in BUILTIN_WORDS.windows(9).enumerate() {
            let mut line = window.join(" ");
            line.push_str(&format!(
                ", {} {}. ",
                i * 37 % 1000,
                window[0].to_uppercase()
            ));
            let compound: Vec<&str> = (0..3)
                .map(|k| BUILTIN_WORDS[(i * 13 + k) % BUILTIN_WORDS.len()])
                .collect();
            line.push_str(&compound.join("-"));
            lines.push(line);
        }
        let mut shuffled = lines.clone();
        shuffled.reverse();
        lines.extend(shuffled);
        lines
    }

    /// The approximation's definition, char by char as its doc comment reads.
    fn approximate_count_by_chars(text: &str) -> usize {
        let mut tokens = 0;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c.is_ascii_alphabetic() {
                let mut run = 1usize;
                while chars.next_if(char::is_ascii_alphabetic).is_some() {
                    run += 1;
                }
                tokens += run.div_ceil(APPROX_LETTERS_PER_TOKEN);
            } else if c.is_ascii_digit() {
                let mut run = 1usize;
                while chars.next_if(char::is_ascii_digit).is_some() {
                    run += 1;
                }
                tokens += run.div_ceil(APPROX_DIGITS_PER_TOKEN);
            } else if c.is_whitespace() {
                let mut run = String::from(c);
                while let Some(next) = chars.next_if(|n| n.is_whitespace()) {
                    run.push(next);
                }
                tokens += usize::from(run != " ");
            } else {
                tokens += 1;
            }
        }
        tokens
    }

    proptest::proptest! {
        /// The byte scan counts what the definition does, for any text: ASCII, Unicode
        /// whitespace (NBSP, U+3000, NEL, vertical tab), CJK, emoji and mixes of them.
        #[test]
        fn the_byte_scan_counts_as_the_definition(
            text in r"([a-zA-Z]{1,12}|[0-9]{1,7}|[ \t\n\r\x0b\x0c]{1,3}|[\u{a0}\u{85}\u{3000}\u{2028}]|[.,;!?-]|[가-힣一-龥]{1,3}|[😀-🙏]|\PC){0,40}"
        ) {
            proptest::prop_assert_eq!(approximate_count(&text), approximate_count_by_chars(&text));
        }
    }

    #[test]
    fn approximation_counts_short_words_as_one_token() {
        assert_eq!(approximate_count(""), 0);
        assert_eq!(approximate_count(" the"), 1);
        assert_eq!(approximate_count("the cat sat"), 3);
        assert_eq!(approximate_count("internationalization"), 4);
        assert_eq!(approximate_count("12345"), 2);
        assert_eq!(approximate_count("a, b."), 4);
        assert_eq!(approximate_count("one\n\ntwo"), 3);
        assert_eq!(approximate_count("한국어"), 3);
        let model = TokenModel::approximate();
        assert!(!model.is_exact());
        for word in model.words() {
            assert_eq!(model.count(&word.text), 1, "{:?}", word.text);
        }
    }

    #[test]
    fn builtin_pool_has_unique_words() {
        let words = builtin_words();
        let unique: HashSet<_> = words.iter().map(|word| word.text.clone()).collect();
        assert_eq!(unique.len(), words.len());
        assert!(words.len() >= 200);
    }

    #[test]
    fn real_tokenizer_pool_words_are_single_tokens() {
        let model = TokenModel::from_tokenizer(trained_tokenizer(), "test");
        assert!(model.is_exact());
        assert!(model.words().len() >= MIN_POOL_WORDS);
        for word in model.words() {
            assert!(word.text.starts_with(' '));
            // Byte-level BPE: one token alone, and one more token after another word.
            assert_eq!(model.count(&word.text), 1, "{:?}", word.text);
            assert_eq!(
                model.count(&format!(" the{}", word.text)),
                2,
                "{:?}",
                word.text
            );
        }
        // A word outside the training text splits into several tokens, unlike the approximation.
        assert!(model.count(" zyxwvutsrq") > 1);
    }

    #[test]
    fn load_resolves_files_and_directories_and_reports_missing_paths() {
        let dir = std::env::temp_dir().join(format!("llm-canary-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("tokenizer.json");
        trained_tokenizer()
            .save(&file, false)
            .expect("tokenizer saves");

        let from_dir = TokenModel::load(Some(&dir)).expect("directory loads");
        let from_file = TokenModel::load(Some(&file)).expect("file loads");
        assert!(from_dir.is_exact() && from_file.is_exact());
        assert_eq!(from_dir.count(" the cat"), from_file.count(" the cat"));

        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).expect("empty dir");
        assert!(matches!(
            TokenModel::load(Some(&empty)),
            Err(TokenizerError::NoTokenizerJson { .. })
        ));
        let garbage = dir.join("garbage.json");
        std::fs::write(&garbage, "{not json").expect("write");
        assert!(matches!(
            TokenModel::load(Some(&garbage)),
            Err(TokenizerError::Parse { .. })
        ));
        let missing = dir.join("missing/tokenizer.json");
        let error = TokenModel::load(Some(&missing)).expect_err("missing path fails");
        assert!(error.to_string().contains("no such file"), "{error}");
        std::fs::remove_dir_all(&dir).expect("cleanup");

        assert!(!TokenModel::load(None).expect("approximation").is_exact());
    }

    #[test]
    fn model_ids_resolve_through_the_hub_cache_layout() {
        let cache = std::env::temp_dir().join(format!("llm-canary-hub-{}", std::process::id()));
        let snapshot = cache.join("models--Org--Model-1B/snapshots/abc123");
        std::fs::create_dir_all(&snapshot).expect("snapshot dir");
        let id = Path::new("Org/Model-1B");
        assert_eq!(hub_cache_file_in(&cache, id), None, "no tokenizer.json yet");
        std::fs::write(snapshot.join("tokenizer.json"), "{}").expect("write");
        assert_eq!(
            hub_cache_file_in(&cache, id),
            Some(snapshot.join("tokenizer.json"))
        );
        assert_eq!(hub_cache_file_in(&cache, Path::new("Org/Other")), None);
        assert_eq!(hub_cache_file_in(&cache, Path::new("a/b/c")), None);
        std::fs::remove_dir_all(&cache).expect("cleanup");
    }

    #[test]
    fn a_shared_tokenizer_is_read_once_per_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokenizer.json");
        let json = trained_tokenizer().to_string(false).expect("serialises");
        std::fs::write(&file, json).expect("write");
        let a = TokenModel::load_shared(Some(&file)).expect("loads");
        // The directory names the same file.
        let b = TokenModel::load_shared(Some(dir.path())).expect("loads");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.is_exact());
        assert!(
            !TokenModel::load_shared(None)
                .expect("approximation")
                .is_exact()
        );
    }

    #[test]
    fn token_model_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TokenModel>();
    }
}
