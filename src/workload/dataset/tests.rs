use super::*;
use crate::workload::tokenizer::tests::trained_tokenizer;

fn everything() -> Selection {
    Selection {
        osl: None,
        isl: None,
        max_rows: None,
        max_turns: MAX_TURNS,
        shuffle: false,
        seed: 1,
    }
}

fn exact() -> TokenModel {
    TokenModel::from_tokenizer(trained_tokenizer(), "trained")
}

fn file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

const SHAREGPT: &str = r#"[
  {"id": "a", "conversations": [
    {"from": "system", "value": "You are a helpful farmer."},
    {"from": "human", "value": "How do I keep my horse warm in winter?"},
    {"from": "gpt", "value": "Give the horse a blanket and a dry stall out of the wind."},
    {"from": "human", "value": "And in the rain?"},
    {"from": "gpt", "value": "A waterproof sheet."}
  ]},
  {"id": "b", "conversations": [
    {"from": "human", "value": "Name a river in the north."},
    {"from": "gpt", "value": "The Tees."}
  ]},
  {"id": "c", "conversations": [
    {"from": "human", "value": "Is anyone there?"}
  ]}
]"#;

#[test]
fn sharegpt_conversations_become_turns_with_their_history_and_recorded_replies() {
    let tokens = exact();
    let (_d, path) = file("chat.json", SHAREGPT);
    let d = Dataset::load(&path, None, &tokens, &everything()).unwrap();
    assert_eq!(d.format, DatasetFormat::Sharegpt);
    // The third has no reply: no output length, no turn.
    assert_eq!(d.conversations.len(), 2);
    assert_eq!(d.report.without_turn, 1);
    assert_eq!(d.report.rows, 3);
    let c = &d.conversations[0];
    assert_eq!(c.place, Place::Index(0));
    assert_eq!(c.turns.len(), 2);
    let count = |i: usize| tokens.count(&c.messages[i].text) as u32;
    // Turn 1: the system prompt and the first question; its OSL is the recorded reply's.
    assert_eq!(c.turns[0].upto, 2);
    assert_eq!(c.turns[0].isl, count(0) + count(1));
    assert_eq!(c.turns[0].osl, count(2));
    // Turn 2 carries the recorded reply as history.
    assert_eq!(c.turns[1].upto, 4);
    assert_eq!(c.turns[1].isl, count(0) + count(1) + count(2) + count(3));
    assert_eq!(c.turns[1].osl, tokens.count("A waterproof sheet.") as u32);
    assert_eq!(c.messages[2].speaker, Speaker::Assistant);
    assert_eq!(c.messages.len(), 4, "the last reply is not sent");
}

#[test]
fn jsonl_rows_are_one_request_each_with_their_output_tokens() {
    let text = r#"{"prompt": "Write a song about the sea.", "output_tokens": 40}

{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is salt?"}], "max_tokens": 12}
{"conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi"}]}
"#;
    let tokens = exact();
    let (_d, path) = file("prompts.jsonl", text);
    let d = Dataset::load(&path, None, &tokens, &everything()).unwrap();
    assert_eq!(d.format, DatasetFormat::Jsonl);
    let c: Vec<_> = d
        .conversations
        .iter()
        .map(|c| (c.place, c.turns.clone()))
        .collect();
    let song = tokens.count("Write a song about the sea.") as u32;
    let salt = (tokens.count("Be brief.") + tokens.count("What is salt?")) as u32;
    let hello = tokens.count("Hello there") as u32;
    let hi = tokens.count("Hi") as u32;
    assert_eq!(
        c,
        vec![
            (
                Place::Line(1),
                vec![Turn {
                    upto: 1,
                    isl: song,
                    osl: 40
                }]
            ),
            (
                Place::Line(3),
                vec![Turn {
                    upto: 2,
                    isl: salt,
                    osl: 12
                }]
            ),
            (
                Place::Line(4),
                vec![Turn {
                    upto: 1,
                    isl: hello,
                    osl: hi
                }]
            ),
        ]
    );
}

#[test]
fn bad_jsonl_rows_are_each_named_by_their_line() {
    let text = "{\"prompt\": \"fine\", \"output_tokens\": 3}\nnot json\n{\"prompt\": \"x\", \"output_tokens\": 0}\n{\"text\": \"x\"}\n{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}], \"output_tokens\": 2}\n{\"prompt\": \"no length\"}\n";
    let (_d, path) = file("bad.jsonl", text);
    let err = Dataset::load(&path, None, &TokenModel::approximate(), &everything()).unwrap_err();
    let DatasetError::Rows { rows, more, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(more, 0);
    let places: Vec<Place> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        places,
        vec![
            Place::Line(2),
            Place::Line(3),
            Place::Line(4),
            Place::Line(5)
        ],
        "{rows:?}"
    );
    assert!(matches!(rows[0].1, RowProblem::NotJson(_)));
    assert_eq!(
        rows[1].1,
        RowProblem::Osl {
            field: "output_tokens",
            value: 0
        }
    );
    assert!(matches!(
        rows[2].1,
        RowProblem::NotRow { .. } | RowProblem::NoPrompt
    ));
    assert!(matches!(&rows[3].1, RowProblem::Speaker { field, .. } if field == "messages[0].role"));
    // Line 6 lacks an output length: told once the structure is right, as its own problem.
    let (_d, path) = file("nolen.jsonl", "{\"prompt\": \"no length\"}\n");
    let err = Dataset::load(&path, None, &TokenModel::approximate(), &everything()).unwrap_err();
    assert!(
        err.to_string().contains("line 1: has no output length"),
        "{err}"
    );
}

#[test]
fn bad_sharegpt_entries_are_each_named_by_their_index() {
    let text = r#"[
      {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
      {"conversation": []},
      {"conversations": [{"from": "robot", "value": "a"}]},
      {"conversations": [{"from": "human", "value": 3}]}
    ]"#;
    let (_d, path) = file("bad.json", text);
    let err = Dataset::load(&path, None, &TokenModel::approximate(), &everything()).unwrap_err();
    let DatasetError::Rows { rows, .. } = &err else {
        panic!("{err}");
    };
    let places: Vec<Place> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        places,
        vec![Place::Index(1), Place::Index(2), Place::Index(3)]
    );
    assert!(
        matches!(&rows[1].1, RowProblem::Speaker { field, value } if field == "conversations[0].from" && value == "robot")
    );
    assert!(err.to_string().contains("entry [1]"), "{err}");
    // A file that is not an array at all is one problem at its line and column.
    let (_d, path) = file("broken.json", "[ {\"conversations\": [] }, ");
    let err = Dataset::load(&path, None, &TokenModel::approximate(), &everything()).unwrap_err();
    let DatasetError::Rows { rows, .. } = &err else {
        panic!("{err}");
    };
    assert!(matches!(
        rows[0],
        (Place::Position { line: 1, .. }, RowProblem::NotArray(_))
    ));
}

#[test]
fn a_missing_file_names_its_path() {
    let err = Dataset::load(
        Path::new("/no/such/dataset.json"),
        None,
        &TokenModel::approximate(),
        &everything(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/no/such/dataset.json"), "{err}");
}

#[test]
fn the_isl_range_drops_rows_and_cuts_later_turns_and_max_rows_takes_a_seeded_sample() {
    let tokens = TokenModel::approximate();
    let mut rows = String::new();
    for n in 1..=20 {
        let words = vec!["word"; n * 10].join(" ");
        rows.push_str(&format!(
            "{{\"conversations\": [{{\"from\": \"human\", \"value\": \"{words}\"}}, {{\"from\": \"gpt\", \"value\": \"ok\"}}, {{\"from\": \"human\", \"value\": \"{words}\"}}, {{\"from\": \"gpt\", \"value\": \"ok\"}}]}}\n"
        ));
    }
    let (_d, path) = file("lengths.jsonl", &rows);
    let selection = Selection {
        isl: Some((50, 150)),
        ..everything()
    };
    let d = Dataset::load(&path, None, &tokens, &selection).unwrap();
    // First turns of 10..=200 words: 50..=150 kept (11 rows), the others dropped.
    assert_eq!(d.report.kept, 11);
    assert_eq!(d.report.outside_isl, 9);
    // A second turn of 2n+1 tokens above 150 is cut: rows of 80..=150 words lose it.
    assert_eq!(d.report.turns_cut, 8);
    assert!(
        d.conversations
            .iter()
            .all(|c| c.turns[0].isl >= 50 && c.turns[0].isl <= 150)
    );
    let sample = |seed| {
        let s = Selection {
            max_rows: Some(5),
            shuffle: true,
            seed,
            ..everything()
        };
        let d = Dataset::load(&path, None, &tokens, &s).unwrap();
        d.conversations.iter().map(|c| c.place).collect::<Vec<_>>()
    };
    assert_eq!(sample(7).len(), 5);
    assert_eq!(sample(7), sample(7), "the same seed takes the same rows");
    assert_ne!(sample(7), sample(8));
    let osl = Selection {
        osl: Some(33),
        max_turns: 1,
        ..everything()
    };
    let d = Dataset::load(&path, None, &tokens, &osl).unwrap();
    assert!(
        d.conversations
            .iter()
            .all(|c| c.turns.len() == 1 && c.turns[0].osl == 33)
    );
    assert_eq!(d.report.turns_cut, 20);
}

#[test]
fn nothing_left_is_an_error_with_the_report() {
    let (_d, path) = file(
        "short.jsonl",
        "{\"prompt\": \"tiny\", \"output_tokens\": 4}\n",
    );
    let selection = Selection {
        isl: Some((100, 200)),
        ..everything()
    };
    let err = Dataset::load(&path, None, &TokenModel::approximate(), &selection).unwrap_err();
    assert!(matches!(err, DatasetError::Empty { .. }), "{err}");
    assert!(err.to_string().contains("1 outside the ISL range"), "{err}");
}

#[test]
fn a_shared_reading_is_read_once_until_the_file_changes() {
    let tokens = TokenModel::approximate();
    let (_d, path) = file(
        "once.jsonl",
        "{\"prompt\": \"one two\", \"output_tokens\": 4}\n",
    );
    let a = Dataset::load_shared(&path, None, &tokens, &everything()).unwrap();
    let b = Dataset::load_shared(&path, None, &tokens, &everything()).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    std::fs::write(
        &path,
        "{\"prompt\": \"one two three four\", \"output_tokens\": 4}\n",
    )
    .unwrap();
    let c = Dataset::load_shared(&path, None, &tokens, &everything()).unwrap();
    assert_eq!(c.conversations[0].turns[0].isl, 4);
}
