//! Docs that cannot rot: the `keyorder` part of the CLI reference is the binary's `--help`,
//! every relative link of README.md, CHANGELOG.md and docs/ resolves, and every `keyorder`
//! command line in their fenced code blocks is one the CLI's parser accepts. (The
//! `keyorder-sim` part of the first and third is `sim/tests/docs.rs`.)
//!
//! `KEYORDER_BLESS_DOCS=1 cargo test --workspace --test docs` rewrites the reference.

use std::path::Path;

use clap::CommandFactory;

// The binary's own parser: the same module `src/main.rs` builds (it is not in the library).
#[allow(dead_code, unused_imports)]
#[path = "../src/cmd/mod.rs"]
mod cmd;

#[path = "doc_lint/mod.rs"]
mod doc_lint;

const PROGRAM: &str = "keyorder";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_cli_reference_is_the_binarys_help() {
    let tree = cmd::Cli::command();
    let expected = doc_lint::reference(PROGRAM, &tree, |args| {
        doc_lint::help_output(env!("CARGO_BIN_EXE_keyorder"), args)
    });
    assert!(expected.contains("`keyorder work`"), "the reference lists `work`:\n{expected}");
    if let Err(diff) = doc_lint::check_generated_region(root(), PROGRAM, &expected) {
        panic!("{diff}");
    }
}

#[test]
fn every_relative_link_resolves() {
    let files = doc_lint::markdown_files(root());
    assert!(files.len() > 10, "README.md, CHANGELOG.md and docs/ are read: {files:?}");
    let broken = doc_lint::broken_links(root());
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}

#[test]
fn every_keyorder_command_line_in_the_docs_parses() {
    let lines = doc_lint::command_lines(root(), PROGRAM);
    assert!(lines.len() > 20, "the docs' keyorder command lines are found: {lines:?}");
    let rejected: Vec<String> = lines
        .iter()
        .filter_map(|line| match <cmd::Cli as clap::Parser>::try_parse_from(&line.words) {
            Ok(_) => None,
            Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => None,
            Err(e) => Some(format!("{}: {}\n{}", line.at, line.words.join(" "), e.render())),
        })
        .collect();
    assert!(rejected.is_empty(), "command lines the parser rejects:\n{}", rejected.join("\n"));
}
