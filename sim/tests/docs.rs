//! Docs that cannot rot, for `keyorder-sim`: its part of the CLI reference is the binary's
//! `--help`, and every `keyorder-sim` command line in the fenced code blocks of README.md,
//! CHANGELOG.md and docs/ is one its parser accepts. (`tests/docs.rs` at the root checks
//! `keyorder` and the links.)
//!
//! `KEYORDER_BLESS_DOCS=1 cargo test --workspace --test docs` rewrites the reference.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

// The binary's own parser: the same module `src/main.rs` builds (it is not in the library).
#[allow(dead_code, unused_imports)]
#[path = "../src/cli/mod.rs"]
mod cli;

#[path = "../../tests/doc_lint/mod.rs"]
mod doc_lint;

const PROGRAM: &str = "keyorder-sim";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_cli_reference_is_the_binarys_help() {
    let tree = cli::Cli::command();
    let expected = doc_lint::reference(PROGRAM, &tree, |args| {
        doc_lint::help_output(env!("CARGO_BIN_EXE_keyorder-sim"), args)
    });
    assert!(expected.contains("`keyorder-sim sweep`"), "the reference lists `sweep`:\n{expected}");
    if let Err(diff) = doc_lint::check_generated_region(&root(), PROGRAM, &expected) {
        panic!("{diff}");
    }
}

#[test]
fn every_keyorder_sim_command_line_in_the_docs_parses() {
    let lines = doc_lint::command_lines(&root(), PROGRAM);
    assert!(lines.len() > 5, "the docs' keyorder-sim command lines are found: {lines:?}");
    let rejected: Vec<String> = lines
        .iter()
        .filter_map(|line| match <cli::Cli as clap::Parser>::try_parse_from(&line.words) {
            Ok(_) => None,
            Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => None,
            Err(e) => Some(format!("{}: {}\n{}", line.at, line.words.join(" "), e.render())),
        })
        .collect();
    assert!(rejected.is_empty(), "command lines the parser rejects:\n{}", rejected.join("\n"));
}
