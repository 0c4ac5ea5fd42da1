//! The module boundaries of both crates, checked from their source text: no two files import
//! each other, and no function is over [`MAX_FUNCTION_LINES`] lines.
//!
//! An import circle is counted as `docs/design/architecture.md` states the rule: file A names
//! an item defined in file B (a `use`, or a path such as `crate::a::b::Item` or `super::Item`)
//! and B names an item defined in A. A path is followed through `pub use` re-exports to the
//! file that defines the item, so `crate::Epoch` names `src/ids.rs`, not `src/lib.rs`. A module
//! and its own submodules are one unit, not a circle: a `mod.rs` that declares and re-exports
//! its children while they name its items through `super::` is the module tree itself.
//!
//! The scanner is deliberately simple (a token walk over the source with comments and literals
//! blanked, not a Rust parser); its unit tests below show it finding a circle and a long
//! function in two in-memory files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest function either crate may hold, in lines from `fn` to its closing brace.
const MAX_FUNCTION_LINES: usize = 100;

/// Functions over the limit that other branches of issue #46 are splitting (the simulator's
/// `run_until`, the checker, the SQLite store and the simulated store and client): they are
/// reported but do not fail this test until those land.
const PENDING_LONG_FUNCTIONS: &[&str] = &[
    "src/check/",
    "src/store/sqlite/mod.rs",
    "sim/src/hosts/store.rs",
    "sim/src/hosts/store_client.rs",
    "sim/src/simulator/mod.rs::run_until",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_two_files_import_each_other() {
    let files = read_tree(root(), &["src", "sim/src"]);
    let circles = Crates::scan(&files).circles();
    let report: Vec<String> = circles.iter().map(Circle::describe).collect();
    assert!(report.is_empty(), "{} import circle(s):\n{}", report.len(), report.join("\n"));
}

#[test]
fn no_function_is_over_the_limit() {
    let files = read_tree(root(), &["src", "sim/src"]);
    let mut over = Vec::new();
    for (path, text) in &files {
        for f in long_functions(text, MAX_FUNCTION_LINES) {
            let named = format!("{path}::{}", f.name);
            if PENDING_LONG_FUNCTIONS.iter().any(|p| named.starts_with(p)) {
                eprintln!("pending (another branch splits it): {named} is {} lines", f.lines);
            } else {
                over.push(format!("{named} (line {}) is {} lines", f.line, f.lines));
            }
        }
    }
    assert!(over.is_empty(), "functions over {MAX_FUNCTION_LINES} lines:\n{}", over.join("\n"));
}

/// Every `.rs` file under each of `dirs`, as (path relative to `root`, text), sorted.
fn read_tree(root: &Path, dirs: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let rel = dir.join(entry.file_name());
            if entry.file_type().expect("a file type").is_dir() {
                stack.push(rel);
            } else if rel.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(root.join(&rel)).expect("a source file");
                out.push((rel.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    out.sort();
    out
}

// ---- the lexer: code tokens with their line, comments and literals dropped ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(&'static str),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

/// The tokens of `text` that matter here: identifiers and `::`, `{`, `}`, `(`, `)`, `[`,
/// `]`, `,`, `;`, `*`, `#`, `!`, `<`, `>`, `=`. Comments, strings and character literals are
/// skipped; other punctuation is dropped.
fn lex(text: &str) -> Vec<Token> {
    let b = text.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let count_lines = |from: usize, to: usize| b[from..to].iter().filter(|&&c| c == b'\n').count();
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = skip_block_comment(b, i);
            line += count_lines(start, i);
        } else if c == b'"' || (c == b'b' && b.get(i + 1) == Some(&b'"')) {
            i = skip_string(b, if c == b'b' { i + 1 } else { i });
            line += count_lines(start, i);
        } else if let Some(end) = raw_string_end(b, i) {
            i = end;
            line += count_lines(start, i);
        } else if c == b'\'' {
            i = skip_char_or_lifetime(b, i);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let word = word.strip_prefix("r#").unwrap_or(word);
            out.push(Token { tok: Tok::Ident(word.to_string()), line });
        } else if b[i..].starts_with(b"::") {
            out.push(Token { tok: Tok::Punct("::"), line });
            i += 2;
        } else {
            const PUNCT: &[&str] =
                &["{", "}", "(", ")", "[", "]", ",", ";", "*", "#", "!", "<", ">", "="];
            if let Some(p) = PUNCT.iter().find(|p| p.as_bytes()[0] == c) {
                out.push(Token { tok: Tok::Punct(p), line });
            }
            i += 1;
        }
    }
    out
}

fn skip_block_comment(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if b[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// `b[i]` is the opening quote; returns the index after the closing one.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br#"…"#`) starting at `i`, if one does.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i + usize::from(b[i] == b'b');
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    j += 1;
    while j < b.len() && !b[j..].starts_with(&close) {
        j += 1;
    }
    Some(j + close.len())
}

/// `b[i]` is `'`: skips a character literal (`'a'`, `'\n'`, `'\u{1F600}'`) or a lifetime's
/// quote.
fn skip_char_or_lifetime(b: &[u8], i: usize) -> usize {
    if b.get(i + 1) == Some(&b'\\') {
        let mut j = i + 2;
        while j < b.len() && b[j] != b'\'' {
            j += 1;
        }
        return j + 1;
    }
    // One character (possibly multi-byte) and a closing quote: a literal.
    let mut j = i + 1;
    if j < b.len() {
        j += 1;
        while j < b.len() && (b[j] & 0xC0) == 0x80 {
            j += 1;
        }
        if b.get(j) == Some(&b'\'') {
            return j + 1;
        }
    }
    i + 1
}

// ---- per-file facts: modules, definitions, references, re-exports ----

/// A path as written in one module of a file: `ctx` is the module it appears in (relative to
/// the crate root), `segments` the path itself.
#[derive(Debug, Clone)]
struct Reference {
    ctx: Vec<String>,
    segments: Vec<String>,
    line: usize,
}

#[derive(Debug, Default)]
struct FileFacts {
    /// Inline modules (`mod tests { … }`), as module paths.
    inline_modules: Vec<Vec<String>>,
    /// Names defined at each module of the file.
    defined: BTreeSet<(Vec<String>, String)>,
    /// `pub use` re-exports: (module, exported name) -> the path it re-exports.
    reexports: BTreeMap<(Vec<String>, String), Reference>,
    /// Every path the file names that may be the crate's own.
    references: Vec<Reference>,
}

const ITEM_KEYWORDS: &[&str] =
    &["fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod"];
const PATH_STARTS: &[&str] = &["crate", "self", "super", "keyorder", "keyorder_sim"];

fn ident(t: Option<&Token>) -> Option<&str> {
    match t.map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&Token>, p: &str) -> bool {
    matches!(t.map(|t| &t.tok), Some(Tok::Punct(q)) if *q == p)
}

impl FileFacts {
    fn scan(module: &[String], text: &str) -> FileFacts {
        let toks = lex(text);
        let mut facts = FileFacts::default();
        let mut ctx = module.to_vec();
        // (brace depth at which each inline module opened)
        let mut opened: Vec<usize> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < toks.len() {
            let t = &toks[i];
            match &t.tok {
                Tok::Punct("{") => depth += 1,
                Tok::Punct("}") => {
                    depth -= 1;
                    if opened.last() == Some(&depth) {
                        opened.pop();
                        ctx.pop();
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    let public = i > 0 && is_pub_before(&toks, i);
                    i = facts.scan_use(&toks, i + 1, &ctx, public);
                    continue;
                }
                Tok::Ident(w)
                    if ITEM_KEYWORDS.contains(&w.as_str()) && !is(toks.get(i + 1), "::") =>
                {
                    if let Some(name) = ident(toks.get(i + 1)) {
                        facts.defined.insert((ctx.clone(), name.to_string()));
                        if w == "mod" && is(toks.get(i + 2), "{") {
                            ctx.push(name.to_string());
                            facts.inline_modules.push(ctx.clone());
                            opened.push(depth);
                            depth += 1;
                            i += 3;
                            continue;
                        }
                    }
                }
                Tok::Ident(w) if w == "macro_rules" => {
                    if let Some(name) = ident(toks.get(i + 2)) {
                        facts.defined.insert((ctx.clone(), name.to_string()));
                    }
                }
                Tok::Ident(w) if PATH_STARTS.contains(&w.as_str()) && is(toks.get(i + 1), "::") => {
                    let prev_is_path = i > 0 && is(toks.get(i - 1), "::");
                    if !prev_is_path {
                        let (segments, next) = read_path(&toks, i);
                        facts.references.push(Reference {
                            ctx: ctx.clone(),
                            segments,
                            line: t.line,
                        });
                        i = next;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        facts
    }

    /// Reads a use tree from `i` to its `;`, recording every leaf path; returns the index
    /// after the `;`.
    fn scan_use(&mut self, toks: &[Token], mut i: usize, ctx: &[String], public: bool) -> usize {
        let mut prefix_stack: Vec<usize> = Vec::new();
        let mut current: Vec<String> = Vec::new();
        let line = toks.get(i).map_or(0, |t| t.line);
        let leaf = |current: &Vec<String>, alias: Option<&str>, facts: &mut FileFacts| {
            let mut segments = current.clone();
            if segments.last().is_some_and(|s| s == "self") {
                segments.pop();
            }
            if segments.is_empty() {
                return;
            }
            let reference = Reference { ctx: ctx.to_vec(), segments, line };
            if public {
                let name = alias.map(str::to_string).or_else(|| reference.segments.last().cloned());
                if let Some(name) = name.filter(|n| n != "*" && n != "_") {
                    facts.reexports.insert((ctx.to_vec(), name), reference.clone());
                }
            }
            facts.references.push(reference);
        };
        let mut pending_leaf = false;
        while i < toks.len() && !is(toks.get(i), ";") {
            match &toks[i].tok {
                Tok::Ident(w) if w == "as" => {
                    let alias = ident(toks.get(i + 1));
                    leaf(&current, alias, self);
                    pending_leaf = false;
                    i += 1;
                }
                Tok::Ident(w) => {
                    current.push(w.clone());
                    pending_leaf = true;
                }
                Tok::Punct("*") => {
                    current.push("*".into());
                    pending_leaf = true;
                }
                Tok::Punct("{") => {
                    prefix_stack.push(current.len());
                    pending_leaf = false;
                }
                Tok::Punct(",") | Tok::Punct("}") => {
                    if pending_leaf {
                        leaf(&current, None, self);
                    }
                    pending_leaf = false;
                    let keep = prefix_stack.last().copied().unwrap_or(0);
                    current.truncate(keep);
                    if is(toks.get(i), "}") {
                        prefix_stack.pop();
                        let keep = prefix_stack.last().copied().unwrap_or(0);
                        current.truncate(keep);
                    }
                }
                _ => {}
            }
            i += 1;
        }
        if pending_leaf {
            leaf(&current, None, self);
        }
        i + 1
    }
}

/// Whether the `use` at `i` is `pub use` or `pub(…) use`.
fn is_pub_before(toks: &[Token], i: usize) -> bool {
    if ident(toks.get(i - 1)) == Some("pub") {
        return true;
    }
    i >= 4 && is(toks.get(i - 1), ")") && ident(toks.get(i - 4)) == Some("pub")
        || i >= 3 && is(toks.get(i - 1), ")") && ident(toks.get(i - 3)) == Some("pub")
}

/// Reads `a::b::c` from `i`; returns the segments and the index after the path.
fn read_path(toks: &[Token], mut i: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    while let Some(w) = ident(toks.get(i)) {
        segments.push(w.to_string());
        if is(toks.get(i + 1), "::") && ident(toks.get(i + 2)).is_some() {
            i += 2;
        } else {
            i += 1;
            break;
        }
    }
    (segments, i)
}

// ---- the crates: module tree, resolution, edges ----

/// Which crate directory a file belongs to, its module path and whether it belongs to a
/// binary (`main.rs` and the modules it declares) rather than the library.
#[derive(Debug, Clone)]
struct Place {
    dir: &'static str,
    module: Vec<String>,
    binary: bool,
}

const CRATE_DIRS: &[(&str, &str)] = &[("sim/src", "keyorder_sim"), ("src", "keyorder")];

fn place(path: &str, binary_modules: &BTreeSet<(String, String)>) -> Option<Place> {
    let (dir, _) = CRATE_DIRS.iter().find(|(d, _)| path.starts_with(&format!("{d}/")))?;
    let rel = path[dir.len() + 1..].trim_end_matches(".rs");
    let mut module: Vec<String> = rel.split('/').map(str::to_string).collect();
    let last = module.last().cloned().unwrap_or_default();
    if last == "mod" || ((last == "lib" || last == "main") && module.len() == 1) {
        module.pop();
    }
    let binary = rel == "main"
        || module.first().is_some_and(|m| binary_modules.contains(&(dir.to_string(), m.clone())));
    Some(Place { dir, module, binary })
}

struct Crates<'a> {
    files: Vec<(&'a str, Place, FileFacts)>,
    /// (dir, binary, module path) -> index into `files`.
    modules: BTreeMap<(&'static str, bool, Vec<String>), usize>,
}

/// One reference from a file to another file.
#[derive(Debug, Clone)]
struct Edge {
    line: usize,
    path: String,
}

#[derive(Debug)]
struct Circle {
    a: String,
    b: String,
    a_to_b: Edge,
    b_to_a: Edge,
}

impl Circle {
    fn describe(&self) -> String {
        format!(
            "{} <-> {}: {}:{} names {}, {}:{} names {}",
            self.a,
            self.b,
            self.a,
            self.a_to_b.line,
            self.a_to_b.path,
            self.b,
            self.b_to_a.line,
            self.b_to_a.path
        )
    }
}

impl<'a> Crates<'a> {
    fn scan(files: &'a [(String, String)]) -> Crates<'a> {
        // The top modules each binary root declares (`mod cmd;` in src/main.rs).
        let mut binary_modules = BTreeSet::new();
        for (path, text) in files {
            if let Some((dir, _)) = CRATE_DIRS.iter().find(|(d, _)| *path == format!("{d}/main.rs"))
            {
                let toks = lex(text);
                for w in toks.windows(3) {
                    if ident(Some(&w[0])) == Some("mod") && is(Some(&w[2]), ";") {
                        if let Some(name) = ident(Some(&w[1])) {
                            binary_modules.insert((dir.to_string(), name.to_string()));
                        }
                    }
                }
            }
        }
        let mut crates = Crates { files: Vec::new(), modules: BTreeMap::new() };
        for (path, text) in files {
            let Some(place) = place(path, &binary_modules) else { continue };
            let facts = FileFacts::scan(&place.module, text);
            let index = crates.files.len();
            crates.modules.insert((place.dir, place.binary, place.module.clone()), index);
            for inline in &facts.inline_modules {
                crates.modules.insert((place.dir, place.binary, inline.clone()), index);
            }
            crates.files.push((path, place, facts));
        }
        crates
    }

    /// The file that defines what `reference`, written in file `from`, names.
    fn resolve(&self, from: usize, reference: &Reference, hops: usize) -> Option<usize> {
        let place = &self.files[from].1;
        let mut segs = reference.segments.iter();
        let first = segs.next()?;
        let (dir, binary, mut module): (&'static str, bool, Vec<String>) = match first.as_str() {
            "crate" => (place.dir, place.binary, Vec::new()),
            "self" => (place.dir, place.binary, reference.ctx.clone()),
            "super" => {
                let mut m = reference.ctx.clone();
                m.pop();
                (place.dir, place.binary, m)
            }
            name => {
                if let Some((dir, _)) = CRATE_DIRS.iter().find(|(_, n)| *n == name) {
                    (dir, false, Vec::new())
                } else {
                    // A relative path: a child module of the current one.
                    let mut m = reference.ctx.clone();
                    m.push(name.to_string());
                    if !self.modules.contains_key(&(place.dir, place.binary, m.clone())) {
                        return None;
                    }
                    (place.dir, place.binary, m)
                }
            }
        };
        let mut item = None;
        for seg in segs {
            if seg == "super" {
                module.pop();
                continue;
            }
            let mut child = module.clone();
            child.push(seg.clone());
            if item.is_none() && self.modules.contains_key(&(dir, binary, child.clone())) {
                module = child;
            } else {
                item.get_or_insert_with(|| seg.clone());
            }
        }
        let target = *self.modules.get(&(dir, binary, module.clone()))?;
        let Some(item) = item else { return Some(target) };
        let facts = &self.files[target].2;
        if facts.defined.contains(&(module.clone(), item.clone())) || hops > 8 {
            return Some(target);
        }
        match facts.reexports.get(&(module, item)) {
            Some(next) => self.resolve(target, next, hops + 1).or(Some(target)),
            None => Some(target),
        }
    }

    /// Whether one of files `a` and `b` is a module the other lies inside.
    fn one_unit(&self, a: usize, b: usize) -> bool {
        let (pa, pb) = (&self.files[a].1, &self.files[b].1);
        let inside = |outer: &Place, inner: &Place| {
            outer.dir == inner.dir
                && outer.binary == inner.binary
                && inner.module.starts_with(&outer.module)
        };
        inside(pa, pb) || inside(pb, pa)
    }

    /// Every pair of files that name each other, each with one reference per direction.
    fn circles(&self) -> Vec<Circle> {
        let mut edges: BTreeMap<(usize, usize), Edge> = BTreeMap::new();
        for (from, (_, _, facts)) in self.files.iter().enumerate() {
            for r in &facts.references {
                if let Some(to) = self.resolve(from, r, 0).filter(|&to| to != from) {
                    edges
                        .entry((from, to))
                        .or_insert_with(|| Edge { line: r.line, path: r.segments.join("::") });
                }
            }
        }
        let mut out = Vec::new();
        for ((a, b), a_to_b) in &edges {
            if a < b && !self.one_unit(*a, *b) {
                if let Some(b_to_a) = edges.get(&(*b, *a)) {
                    out.push(Circle {
                        a: self.files[*a].0.to_string(),
                        b: self.files[*b].0.to_string(),
                        a_to_b: a_to_b.clone(),
                        b_to_a: b_to_a.clone(),
                    });
                }
            }
        }
        out
    }
}

// ---- function lengths ----

#[derive(Debug)]
struct LongFunction {
    name: String,
    line: usize,
    lines: usize,
}

/// Every function of `text` whose body (from the `fn` line to its closing brace) is over
/// `max` lines.
fn long_functions(text: &str, max: usize) -> Vec<LongFunction> {
    let toks = lex(text);
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if ident(Some(t)) != Some("fn") {
            continue;
        }
        let Some(name) = ident(toks.get(i + 1)) else { continue };
        // The body opens at the first `{` outside parentheses and brackets, unless a `;`
        // comes first (a declaration without a body).
        let mut j = i + 2;
        let mut nesting = 0i32;
        while j < toks.len() {
            match toks[j].tok {
                Tok::Punct("(") | Tok::Punct("[") => nesting += 1,
                Tok::Punct(")") | Tok::Punct("]") => nesting -= 1,
                Tok::Punct(";") if nesting == 0 => break,
                Tok::Punct("{") if nesting == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if !is(toks.get(j), "{") {
            continue;
        }
        let mut depth = 0;
        let mut end = j;
        while end < toks.len() {
            match toks[end].tok {
                Tok::Punct("{") => depth += 1,
                Tok::Punct("}") => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let lines = toks.get(end).map_or(0, |e| e.line) + 1 - t.line;
        if lines > max {
            out.push(LongFunction { name: name.to_string(), line: t.line, lines });
        }
    }
    out
}

// ---- the scanner's own tests: it must be able to fail ----

fn in_memory(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect()
}

#[test]
fn a_deliberate_circle_is_found_both_ways() {
    let files = in_memory(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\n"),
        ("src/a.rs", "use crate::b::Bee;\npub struct Ay;\n"),
        ("src/b.rs", "pub struct Bee;\nfn f() -> crate::a::Ay { crate::a::Ay }\n"),
    ]);
    let circles = Crates::scan(&files).circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    let c = &circles[0];
    assert_eq!((c.a.as_str(), c.b.as_str()), ("src/a.rs", "src/b.rs"));
    assert_eq!((c.a_to_b.path.as_str(), c.b_to_a.path.as_str()), ("crate::b::Bee", "crate::a::Ay"));
}

#[test]
fn one_way_references_and_own_tests_are_not_circles() {
    let files = in_memory(&[
        ("src/lib.rs", "mod ids;\npub mod a;\npub mod b;\npub use ids::Epoch;\n"),
        ("src/ids.rs", "pub struct Epoch;\n"),
        // `crate::Epoch` is followed through lib.rs's re-export to ids.rs; the inline
        // `mod tests`' `super::*` is a.rs itself; strings and comments name nothing.
        ("src/a.rs", "use crate::Epoch;\nuse super::b::{self, Bee};\n// crate::b::x\nconst S: &str = \"crate::lib\";\n#[cfg(test)]\nmod tests { use super::*; }\n"),
        ("src/b.rs", "pub struct Bee;\nuse crate::Epoch;\n"),
    ]);
    let circles = Crates::scan(&files).circles();
    assert!(circles.is_empty(), "{circles:?}");
}

#[test]
fn a_parent_and_child_are_one_unit_and_siblings_via_super_are_not() {
    let files = in_memory(&[
        ("sim/src/lib.rs", "pub mod hosts;\n"),
        ("sim/src/hosts/mod.rs", "mod worker;\npub(crate) use worker::Clock;\npub struct Host;\n"),
        ("sim/src/hosts/worker.rs", "pub struct Clock;\nfn f(h: super::Host) {}\n"),
    ]);
    let circles = Crates::scan(&files).circles();
    assert!(circles.is_empty(), "a module and its submodule are one unit: {circles:?}");
    // Two siblings that name each other through `super::` are a circle.
    let mut files = files;
    files.push((
        "sim/src/hosts/store.rs".into(),
        "fn g(c: super::worker::Clock) {}\npub struct S;\n".into(),
    ));
    files[2].1.push_str("fn h(s: super::store::S) {}\n");
    let circles = Crates::scan(&files).circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(
        (circles[0].a.as_str(), circles[0].b.as_str()),
        ("sim/src/hosts/worker.rs", "sim/src/hosts/store.rs")
    );
}

#[test]
fn a_long_function_is_measured_from_fn_to_its_brace() {
    let body: String = (0..101).map(|i| format!("    let x{i} = '{{';\n")).collect();
    let text = format!("fn short() {{}}\ntrait T {{ fn decl(&self); }}\nfn long() {{\n{body}}}\n");
    let long = long_functions(&text, MAX_FUNCTION_LINES);
    assert_eq!(long.len(), 1, "{long:?}");
    assert_eq!((long[0].name.as_str(), long[0].line, long[0].lines), ("long", 3, 103));
}
