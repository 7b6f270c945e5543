//! The help of every subcommand as a user sees it (`llm-canary SUB --help`, the subcommands
//! taken from the top-level help, so a new one is walked too): one layout for all (each option on
//! one line, `-h` and `--help` alike), every argument described, and the exit codes listed after
//! the options, each code the README lists too.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_llm-canary"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands the top-level help lists (`help` aside).
fn subcommands() -> Vec<String> {
    let top = help(&["--help"]);
    let commands = top
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands section")
        .split("\n\n")
        .next()
        .unwrap();
    let names: Vec<String> = commands
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    names
}

/// The lines of the `Options:` section.
fn options(help: &str) -> Vec<&str> {
    help.split("Options:\n")
        .nth(1)
        .expect("an Options section")
        .split("\n\n")
        .next()
        .unwrap()
        .lines()
        .collect()
}

/// The text after an option's flags (`-c, --config <CONFIG>`): its description.
fn description(line: &str) -> &str {
    let flags_end = line
        .trim_start()
        .find("  ")
        .map_or(line.len(), |i| i + line.len() - line.trim_start().len());
    line[flags_end..].trim()
}

/// The codes an `Exit codes:` list names, in order.
fn exit_codes(help: &str) -> Vec<u8> {
    let list = help
        .split("Exit codes:\n")
        .nth(1)
        .expect("an Exit codes list");
    list.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn every_subcommand_describes_every_argument_in_one_layout() {
    for sub in subcommands() {
        let long = help(&[&sub, "--help"]);
        let short = help(&[&sub, "-h"]);
        assert_eq!(
            long, short,
            "`{sub} --help` switched to clap's long layout (values or help on lines of their own)"
        );
        assert!(!long.contains("Possible values:"), "{sub}:\n{long}");
        let lines = options(&long);
        assert!(lines.len() >= 2, "{sub}:\n{long}");
        for line in lines {
            assert!(
                line.trim_start().starts_with('-'),
                "`{sub}`: an option's help runs over more than its line: {line:?}"
            );
            let text = description(line);
            assert!(
                !text.is_empty() && !text.starts_with('['),
                "`{sub}`: `{}` has no description",
                line.trim()
            );
        }
    }
}

#[test]
fn every_help_lists_its_exit_codes_and_the_readme_all_of_them() {
    let all = exit_codes(&help(&["--help"]));
    assert_eq!(all, [0, 1, 2, 3, 4, 5, 130]);
    for sub in subcommands() {
        let codes = exit_codes(&help(&[&sub, "--help"]));
        assert!(codes.starts_with(&[0, 1, 2]), "{sub}: {codes:?}");
        assert!(codes.iter().all(|c| all.contains(c)), "{sub}: {codes:?}");
    }
    assert_eq!(exit_codes(&help(&["check", "--help"])), [0, 1, 2, 3, 4]);
    assert_eq!(exit_codes(&help(&["compare", "--help"])), [0, 1, 2, 5]);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let listed = readme
        .split("\nExit codes")
        .nth(1)
        .expect("README lists the exit codes")
        .split("\n\n")
        .next()
        .unwrap();
    for code in all {
        assert!(
            listed.contains(&format!(" {code} ")),
            "README's exit codes miss {code}:\n{listed}"
        );
    }
}
