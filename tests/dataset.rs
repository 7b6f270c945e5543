//! The dataset workload against the simulator, under paused time: a ShareGPT file's
//! conversations are sent turn by turn with the dataset's own text, every turn carrying the
//! conversation's earlier messages (the replies the dataset recorded) in order, each turn after
//! the previous one's reply, with the ISL recorded for it equal to the configured tokenizer's
//! count of what was sent; a JSONL file of prompts is sent one request per row.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use llm_canary::client::{Prompt, Role};
use llm_canary::config::Config;
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Sink};
use llm_canary::schedule::{Recorder, plan_cycle};
use llm_canary::targets::Deployment;
use llm_canary::workload::dataset::{Dataset, Selection};
use llm_canary::workload::tokenizer::TokenModel;
use tokenizers::Tokenizer;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};
use tokio_util::sync::CancellationToken;

/// One request as the step sent it.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    request_id: String,
    turn: String,
    /// Role and text of every message sent.
    messages: Vec<(Role, String)>,
    isl: u32,
    osl: u32,
    prompt_tokens: Option<u64>,
    outcome: &'static str,
    sent: tokio::time::Instant,
    end: tokio::time::Instant,
}

#[derive(Default)]
struct Capture(Mutex<Vec<Seen>>);

impl Sink for Capture {
    fn request(&self, req: &Finished<'_>) {
        let messages = match &req.request.prompt {
            Prompt::Chat(m) => m.iter().map(|m| (m.role, m.content.clone())).collect(),
            Prompt::Text(t) => vec![(Role::User, t.clone())],
        };
        self.0.lock().unwrap().push(Seen {
            target: req.labels.target.clone(),
            request_id: req.record.request_id.clone(),
            turn: req.labels.turn.clone(),
            messages,
            isl: req.isl,
            osl: req.osl,
            prompt_tokens: req.record.prompt_tokens(),
            outcome: req.record.outcome.as_str(),
            sent: req.record.sent,
            end: req.record.end,
        });
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/datasets")
        .join(name)
}

/// A small byte-level BPE tokenizer trained here on the fixtures' own text (the hub is not
/// reachable in tests), saved as a tokenizer.json: its counts split words into pieces, so a
/// count of words would not pass for it.
fn tokenizer_file(dir: &Path) -> PathBuf {
    let corpus: Vec<String> = ["sharegpt-small.json", "prompts.jsonl"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(fixture(f))
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(400)
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
        .unwrap();
    tokenizer.train(&mut trainer, corpus.iter()).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string(false).unwrap()).unwrap();
    path
}

fn config(dataset: &Path, tokenizer: &Path, api: &str, extra: &str) -> Config {
    let yaml = format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, model: sim, api: {api}, simulated: {{ profile: default }} }}
  - {{ name: disagg, serving_mode: disaggregated, model: sim, api: {api}, simulated: {{ profile: default }} }}
tokenizer: "{}"
workloads:
  dataset:
    path: "{}"
    concurrency: 2
    shuffle: false
    step: 20s
    warmup: 0s
{extra}
"#,
        tokenizer.display(),
        dataset.display()
    );
    Config::parse(&yaml, "dataset.yaml", Path::new(".")).unwrap()
}

async fn run(cfg: &Config) -> Vec<Seen> {
    run_with_results(cfg).await.0
}

async fn run_with_results(cfg: &Config) -> (Vec<Seen>, Vec<llm_canary::model::StepResult>) {
    let steps = plan_cycle(cfg);
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].name(), "dataset concurrency=2");
    let deployment = Deployment::start(cfg, Path::new(".")).await.unwrap();
    let capture = Arc::new(Capture::default());
    let recorder = Arc::new(Recorder::new(vec![
        Arc::new(Metrics::new(&[])),
        capture.clone(),
    ]));
    let runner = Arc::new(deployment.runner(cfg, recorder, 7));
    let never = CancellationToken::new();
    let results = runner.run_step(&steps[0], 0, &never, &never).await;
    assert!(!results.is_empty());
    for r in &results {
        assert_eq!(r.labels.workload, "dataset");
        assert_eq!(r.labels.concurrency, "2");
        assert_eq!(r.measurements.errors, 0, "{r:?}");
    }
    deployment.stop().await;
    let seen = capture.0.lock().unwrap().clone();
    (seen, results)
}

#[tokio::test(start_paused = true)]
async fn sharegpt_conversations_are_replayed_turn_by_turn_with_their_recorded_history() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = tokenizer_file(dir.path());
    let path = fixture("sharegpt-small.json");
    let cfg = config(&path, &tok_path, "chat", "");
    let seen = run(&cfg).await;
    let tokens = TokenModel::from_path(&tok_path).unwrap();
    let tokenizer = Tokenizer::from_file(&tok_path).unwrap();
    let count = |text: &str| tokenizer.encode_fast(text, false).unwrap().len() as u32;
    let selection = Selection {
        osl: None,
        isl: None,
        max_rows: None,
        max_turns: 10,
        shuffle: false,
        seed: cfg.seed,
    };
    let dataset = Dataset::load(&path, None, &tokens, &selection).unwrap();
    assert_eq!(
        dataset.conversations.len(),
        4,
        "the unanswered one is dropped"
    );
    assert!(
        seen.len() > 20,
        "the step loops over the dataset: {}",
        seen.len()
    );
    for s in &seen {
        assert_eq!(s.outcome, "ok", "{s:?}");
        // The dataset's own text: a conversation's messages up to this turn, in order, the
        // recorded replies included.
        let c = dataset
            .conversations
            .iter()
            .find(|c| c.messages.iter().any(|m| m.text == s.messages[0].1))
            .unwrap_or_else(|| panic!("not the dataset's text: {s:?}"));
        let turn: usize = s.turn.parse().unwrap();
        let t = c.turns[turn - 1];
        let want: Vec<(Role, String)> = c.messages[..t.upto]
            .iter()
            .map(|m| {
                let role = match m.speaker {
                    llm_canary::workload::dataset::Speaker::System => Role::System,
                    llm_canary::workload::dataset::Speaker::User => Role::User,
                    llm_canary::workload::dataset::Speaker::Assistant => Role::Assistant,
                };
                (role, m.text.clone())
            })
            .collect();
        assert_eq!(s.messages, want, "turn {turn}");
        let users = s.messages.iter().filter(|m| m.0 == Role::User).count();
        assert_eq!(users, turn, "turn k sends k user messages");
        assert_eq!(s.messages.last().unwrap().0, Role::User);
        // The ISL recorded is the configured tokenizer's count of what was sent (the simulator
        // counts words, with its chat template, in its usage).
        let sent: u32 = s.messages.iter().map(|m| count(&m.1)).sum();
        assert_eq!(s.isl, sent, "{s:?}");
        assert!(s.prompt_tokens.is_some());
        // The OSL is the recorded reply's length (the last turn's reply is measured, not kept).
        assert_eq!(s.osl, t.osl);
        if let Some(reply) = c.messages.get(t.upto) {
            assert_eq!(s.osl, count(&reply.text).max(1));
        }
    }
    assert!(
        !seen
            .iter()
            .any(|s| s.messages.iter().any(|m| m.1 == "Is anyone there?")),
        "a message without a reply is never sent"
    );
    // Each conversation's turns go in order, each after the previous turn's reply.
    for target in ["agg", "disagg"] {
        let mut mine: Vec<&Seen> = seen.iter().filter(|s| s.target == target).collect();
        mine.sort_by_key(|s| s.sent);
        let conversation = |s: &Seen| s.request_id.rsplitn(3, '-').nth(2).unwrap().to_owned();
        for (i, s) in mine.iter().enumerate() {
            let turn: usize = s.turn.parse().unwrap();
            if turn == 1 {
                continue;
            }
            let before = mine[..i]
                .iter()
                .rev()
                .find(|p| conversation(p) == conversation(s))
                .unwrap_or_else(|| panic!("turn {turn} of {} came first", s.request_id));
            assert_eq!(before.turn, (turn - 1).to_string(), "{}", s.request_id);
            assert!(before.end <= s.sent);
        }
        // Several turns were sent: the labels number them.
        assert!(mine.iter().any(|s| s.turn == "3"));
    }
    // Paired: conversation k of the step is the same on both targets.
    let conversations = |t: &str| -> std::collections::BTreeMap<String, String> {
        seen.iter()
            .filter(|s| s.target == t)
            .map(|s| {
                let k = s.request_id.rsplitn(3, '-').nth(2).unwrap().to_owned();
                (k, s.messages[0].1.clone())
            })
            .collect()
    };
    let (agg, disagg) = (conversations("agg"), conversations("disagg"));
    assert!(agg.len() > 4);
    for (k, first) in &agg {
        if let Some(other) = disagg.get(k) {
            assert_eq!(first, other, "conversation {k}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn jsonl_prompts_are_sent_one_request_per_row_with_the_configured_osl() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = tokenizer_file(dir.path());
    let path = fixture("prompts.jsonl");
    let cfg = config(&path, &tok_path, "completions", "    osl: 7");
    let seen = run(&cfg).await;
    let tokenizer = Tokenizer::from_file(&tok_path).unwrap();
    let count = |text: &str| tokenizer.encode_fast(text, false).unwrap().len() as u32;
    assert!(!seen.is_empty());
    let rows: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    for s in &seen {
        assert_eq!(s.outcome, "ok", "{s:?}");
        assert_eq!(s.turn, "1");
        assert_eq!(s.osl, 7);
        // A completions prompt: the row's texts, a line each, from the file.
        let text = &s.messages[0].1;
        assert!(
            text.lines().all(|l| rows.iter().any(|r| r.contains(l))),
            "{text:?}"
        );
        let isl: u32 = text.lines().map(count).sum();
        assert_eq!(s.isl, isl, "{text:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn bench_search_probes_send_the_datasets_prompts() {
    use llm_canary::report::search::{SearchOptions, run_search};
    use llm_canary::setup::Setup;
    use llm_canary::shutdown::Shutdown;
    let yaml = format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, model: sim, simulated: {{ profile: default }} }}
workloads:
  dataset: {{ path: "{}", shuffle: false, step: 4s, warmup: 1s }}
"#,
        fixture("sharegpt-small.json").display()
    );
    let setup = Setup::parse(&yaml, "search.yaml", Path::new(".")).unwrap();
    let result = run_search(
        SearchOptions {
            setup,
            condition: "p99(ttft) < 10s".into(),
            max_level: 4,
            out: None,
            live_progress: false,
        },
        &Shutdown::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        result.dataset.as_deref(),
        Some(
            fixture("sharegpt-small.json")
                .display()
                .to_string()
                .as_str()
        )
    );
    let target = &result.targets[0];
    assert_eq!(target.max_concurrency, Some(4), "{target:?}");
    assert!(
        target
            .probes
            .iter()
            .all(|p| p.requests > 0 && p.errors == 0)
    );
}

#[tokio::test(start_paused = true)]
async fn turns_above_the_targets_context_length_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = tokenizer_file(dir.path());
    let path = fixture("sharegpt-small.json");
    let mut cfg = config(&path, &tok_path, "chat", "");
    // A bound that holds the first turns but not the longer histories of the later ones.
    for t in &mut cfg.targets {
        t.max_input_tokens = Some(llm_canary::config::At::dflt(120));
    }
    let (seen, results) = run_with_results(&cfg).await;
    assert!(!seen.is_empty());
    for s in &seen {
        assert!(s.isl + s.osl <= 120, "sent above the bound: {s:?}");
    }
    // Counted per turn (the step's total, where there is one, sums them again).
    let skipped: u64 = results
        .iter()
        .filter(|r| !r.total)
        .map(|r| {
            r.measurements
                .skipped
                .get("context_length")
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert!(skipped > 0, "{results:?}");
}
