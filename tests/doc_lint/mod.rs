//! What the docs tests of both crates share: reading the Markdown of README.md, CHANGELOG.md
//! and docs/, its relative links, the command lines in its fenced code blocks, and the
//! generated regions of the CLI reference. Included with `#[path]` by `tests/docs.rs` and
//! `sim/tests/docs.rs`; each uses part of it.
#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The file generated from clap's `--help` output (between the markers of
/// [`generated_region`]): every other fenced command line is checked against the parser.
pub const CLI_REFERENCE: &str = "docs/guide/cli.md";

/// Set to regenerate the CLI reference instead of comparing it.
pub const BLESS: &str = "KEYORDER_BLESS_DOCS";

/// README.md, CHANGELOG.md and every `.md` under docs/, sorted, relative to `root`.
pub fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("CHANGELOG.md")];
    files.retain(|f| root.join(f).is_file());
    let mut stack = vec![PathBuf::from("docs")];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let rel = dir.join(entry.file_name());
            if entry.file_type().expect("a file type").is_dir() {
                stack.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                files.push(rel);
            }
        }
    }
    files.sort();
    files
}

/// Reads `rel` under `root`.
pub fn read(root: &Path, rel: &Path) -> String {
    std::fs::read_to_string(root.join(rel))
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", rel.display()))
}

/// A line of a Markdown file with whether it lies inside a fenced code block (the fence
/// lines themselves count as inside), and if so the block's language (`""` when untagged).
struct Line<'a> {
    number: usize,
    text: &'a str,
    fenced: bool,
    lang: &'a str,
}

fn lines(text: &str) -> Vec<Line<'_>> {
    let mut fence: Option<(&str, &str)> = None;
    let mut out = Vec::new();
    for (i, text) in text.lines().enumerate() {
        let trimmed = text.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        let (fenced, lang) = match (fence, marker) {
            (None, Some(m)) => {
                let lang = trimmed[m.len()..].split_whitespace().next().unwrap_or("");
                fence = Some((m, lang));
                (true, lang)
            }
            (Some((open, lang)), Some(m)) if open == m && trimmed.trim_end() == m => {
                fence = None;
                (true, lang)
            }
            (Some((_, lang)), _) => (true, lang),
            (None, None) => (false, ""),
        };
        out.push(Line { number: i + 1, text, fenced, lang });
    }
    out
}

/// Languages whose every line is a command; in any other block (`text`, `console`, output)
/// only a line with a `$ ` prompt is.
const SHELL_LANGUAGES: [&str; 5] = ["", "sh", "bash", "shell", "zsh"];

/// Text outside inline code spans (so that `[a](b)` written as code is not a link).
fn outside_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links and images `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let line = outside_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to hyphens.
pub fn slug(heading: &str) -> String {
    outside_code_spans_keeping_text(heading)
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn outside_code_spans_keeping_text(heading: &str) -> String {
    heading.replace('`', "")
}

/// The anchors of a Markdown file's headings (`-1`, `-2` … for repeated ones).
pub fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in lines(text).iter().filter(|l| !l.fenced) {
        let hashes = line.text.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line.text[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line.text[hashes..].trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// Every relative link of the Markdown files that does not resolve: `file:line: target (why)`.
/// A link resolves when its file exists (relative to the linking file; a bare `#anchor` is
/// the linking file) and, for a Markdown file, when the anchor is one of its headings'.
pub fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for rel in markdown_files(root) {
        let text = read(root, &rel);
        let dir = rel.parent().unwrap_or(Path::new(""));
        for line in lines(&text).iter().filter(|l| !l.fenced) {
            for target in link_targets(line.text) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() { rel.clone() } else { normalise(&dir.join(path)) };
                let at = format!("{}:{}: {target}", rel.display(), line.number);
                if !root.join(&file).exists() {
                    broken.push(format!("{at} (no file {})", file.display()));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if file.extension().is_some_and(|e| e == "md")
                        && !anchors(&read(root, &file)).contains(anchor)
                    {
                        broken.push(format!("{at} (no heading #{anchor} in {})", file.display()));
                    }
                }
            }
        }
    }
    broken
}

/// `a/b/../c` as `a/c` (the path need not exist).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A command line found in the docs: where, and its words (the program's name first).
#[derive(Debug)]
pub struct CommandLine {
    /// `file:line`.
    pub at: String,
    /// The words as a shell would pass them, starting with the program.
    pub words: Vec<String>,
}

/// Every invocation of `program` in the fenced code blocks of the Markdown files (the CLI
/// reference excepted: it is clap's own output). In a shell block (`sh`, `bash`, untagged)
/// every line counts; in any other block (`text`: output) only a line with a `$ ` prompt. A
/// logical line (`\` continuations joined) is split into words as a shell would (quotes,
/// escapes), a trailing `# comment` dropped; each part between `|`, `&&`, `||` and `;` that
/// starts with the program (after `NAME=value` assignments and `time`) is one invocation,
/// its redirections removed.
pub fn command_lines(root: &Path, program: &str) -> Vec<CommandLine> {
    let mut found = Vec::new();
    for rel in markdown_files(root) {
        if rel == Path::new(CLI_REFERENCE) {
            continue;
        }
        let text = read(root, &rel);
        let all = lines(&text);
        let mut i = 0;
        while i < all.len() {
            let start = &all[i];
            i += 1;
            if !start.fenced || start.text.trim_start().starts_with("```") {
                continue;
            }
            let mut logical = start.text.trim().to_owned();
            while logical.ends_with('\\') && i < all.len() && all[i].fenced {
                logical.pop();
                logical.push(' ');
                logical.push_str(all[i].text.trim());
                i += 1;
            }
            let logical = match logical.strip_prefix("$ ") {
                Some(command) => command,
                None if SHELL_LANGUAGES.contains(&start.lang) => &logical,
                None => continue,
            };
            if !logical.split_whitespace().any(|w| w == program) {
                continue;
            }
            let at = format!("{}:{}", rel.display(), start.number);
            for words in invocations(&shell_words(logical), program) {
                found.push(CommandLine { at: at.clone(), words });
            }
        }
    }
    found
}

/// A word of a shell line: its text, and whether it is an operator (`|`, `&&`, `>` …).
#[derive(Debug, PartialEq)]
enum Word {
    Text(String),
    Operator(String),
}

/// Splits a line as a POSIX shell would, enough for documentation: single and double quotes,
/// backslash escapes, `#` comments, the operators `| || & && ; > >> < 2>`.
fn shell_words(line: &str) -> Vec<Word> {
    let mut words = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = current.get_or_insert_with(String::new);
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    w.push(d);
                }
            }
            '"' => {
                let w = current.get_or_insert_with(String::new);
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        d => w.push(d),
                    }
                }
            }
            '\\' => current.get_or_insert_with(String::new).extend(chars.next()),
            '#' if current.is_none() => break,
            c if c.is_whitespace() => words.extend(current.take().map(Word::Text)),
            '|' | '&' | ';' | '>' | '<' => {
                let digit_redirect = c == '>' && current.as_deref() == Some("2");
                if !digit_redirect {
                    words.extend(current.take().map(Word::Text));
                } else {
                    current = None;
                }
                let mut op = c.to_string();
                if let Some(&d) = chars.peek() {
                    if (d == c && c != ';') || (c == '>' && d == '&') {
                        op.push(d);
                        chars.next();
                    }
                }
                words.push(Word::Operator(op));
            }
            c => current.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(current.take().map(Word::Text));
    words
}

/// The invocations of `program` in a line's words: each command of a pipeline or list that
/// starts with it, after `NAME=value` assignments, with its redirections removed.
fn invocations(words: &[Word], program: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut command: Vec<String> = Vec::new();
    let mut skip_next = false;
    let mut finish = |command: &mut Vec<String>| {
        let args: Vec<String> = command
            .drain(..)
            .skip_while(|w| w == "time" || (w.contains('=') && !w.starts_with('-')))
            .collect();
        if args.first().is_some_and(|p| p == program) {
            out.push(args);
        }
    };
    for word in words {
        match word {
            Word::Operator(op) if ["|", "||", "&&", ";", "&"].contains(&op.as_str()) => {
                finish(&mut command);
            }
            Word::Operator(_) => skip_next = true,
            Word::Text(_) if skip_next => skip_next = false,
            Word::Text(w) => command.push(w.clone()),
        }
    }
    finish(&mut command);
    out
}

/// The start and end markers of the region of the CLI reference generated for `program`.
pub fn markers(program: &str) -> (String, String) {
    (
        format!("<!-- generated from `{program} --help`: do not edit; {BLESS}=1 cargo test --workspace --test docs rewrites it -->"),
        format!("<!-- end of the generated `{program}` reference -->"),
    )
}

/// Compares the region of [`CLI_REFERENCE`] generated for `program` with `expected`, or,
/// with [`BLESS`] set, writes `expected` there. Returns what differs, if anything.
pub fn check_generated_region(root: &Path, program: &str, expected: &str) -> Result<(), String> {
    let path = root.join(CLI_REFERENCE);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{CLI_REFERENCE}: {e}"))?;
    let (start, end) = markers(program);
    let (Some(a), Some(b)) = (text.find(&start), text.find(&end)) else {
        return Err(format!(
            "{CLI_REFERENCE} lacks the markers of {program}'s region:\n{start}\n{end}"
        ));
    };
    let body_start = a + start.len();
    let actual = text[body_start..b].trim_matches('\n');
    let expected = expected.trim_matches('\n');
    if actual == expected {
        return Ok(());
    }
    if std::env::var_os(BLESS).is_some() {
        let rewritten = format!("{}\n\n{expected}\n\n{}", &text[..body_start], &text[b..]);
        std::fs::write(&path, rewritten).map_err(|e| format!("{CLI_REFERENCE}: {e}"))?;
        return Ok(());
    }
    let first = actual
        .lines()
        .zip(expected.lines())
        .position(|(x, y)| x != y)
        .unwrap_or(actual.lines().count().min(expected.lines().count()));
    Err(format!(
        "{CLI_REFERENCE}'s `{program}` region differs from the binary's --help, first at its line {}:\n  doc:    {:?}\n  --help: {:?}\nRegenerate it with {BLESS}=1 cargo test --workspace --test docs",
        first + 1,
        actual.lines().nth(first).unwrap_or("<end>"),
        expected.lines().nth(first).unwrap_or("<end>"),
    ))
}

/// The reference text for a command tree: each command's `--help` (run by `help_of`, given
/// the words after the program) under a heading, depth first, in the order clap lists them.
pub fn reference(
    program: &str,
    tree: &clap::Command,
    help_of: impl Fn(&[String]) -> String,
) -> String {
    let mut out = String::new();
    let mut stack: Vec<(Vec<String>, &clap::Command)> = vec![(Vec::new(), tree)];
    while let Some((path, command)) = stack.pop() {
        let title =
            std::iter::once(program.to_owned()).chain(path.iter().cloned()).collect::<Vec<_>>();
        let level = "#".repeat((path.len() + 2).min(4));
        out.push_str(&format!("{level} `{}`\n\n```text\n", title.join(" ")));
        out.push_str(help_of(&path).trim_end());
        out.push_str("\n```\n\n");
        let children: Vec<_> =
            command.get_subcommands().filter(|c| c.get_name() != "help").collect();
        for child in children.into_iter().rev() {
            let mut p = path.clone();
            p.push(child.get_name().to_owned());
            stack.push((p, child));
        }
    }
    out
}

/// Runs `binary` with `args` and `--help`; its standard output (clap prints help there).
pub fn help_output(binary: &str, args: &[String]) -> String {
    let out = std::process::Command::new(binary)
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(
        out.status.success(),
        "{binary} {args:?} --help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_lines_split_into_invocations() {
        let words = shell_words(
            "KEY=v keyorder enqueue --partitions 64 'a b.jsonl' 2>/dev/null && keyorder work --deliver URL | tee x # note",
        );
        assert_eq!(
            invocations(&words, "keyorder"),
            vec![
                vec!["keyorder", "enqueue", "--partitions", "64", "a b.jsonl"],
                vec!["keyorder", "work", "--deliver", "URL"],
            ]
        );
        assert!(invocations(&shell_words("printf 'x' | cargo run -- route"), "keyorder").is_empty());
        assert_eq!(
            invocations(&shell_words("time keyorder lag"), "keyorder"),
            vec![vec!["keyorder", "lag"]]
        );
    }

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(slug("Delivering over HTTP(S)"), "delivering-over-https");
        assert_eq!(slug("The `keyorder work` loop"), "the-keyorder-work-loop");
        let a = anchors("# A\n```sh\n# not a heading\n```\n## A\n");
        assert!(a.contains("a") && a.contains("a-1") && !a.contains("not-a-heading"));
    }
}
