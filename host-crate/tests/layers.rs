//! The house in layers: no import cycle between the host crate's modules,
//! and the CPU reference beside the GPU code, importing none of it.
//!
//! Reads `src/**/*.rs` as text (no dependency, runs on any machine), finds
//! every path that starts with `crate::`, `super::` or `self::` (in `use`
//! lines and in code; comments and strings are skipped), resolves it to the
//! file that defines the item (following `pub use` re-exports of `lib.rs`
//! and of each folder's `mod.rs`), and builds the graph of files: one node
//! a file (`api`, `backward::plan`, …), one edge a file that names an item
//! of another. A folder's `mod.rs` naming its own children is not an edge
//! (it is their façade); a child naming its parent is.
//!
//! Calls to methods of a type defined elsewhere (`fa.launch_problem(…)`)
//! are no paths and so no edges: the test checks imports, as
//! `cargo modules dependencies --acyclic` would.
//!
//! [`ALLOWED_EDGES`] names the edges that still close a cycle and cannot be
//! moved yet (none today); an entry that no longer exists fails the test,
//! so the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Edges (`from`, `to`) that close a cycle today, each with the reason it
/// stays. Removing them from the graph must leave it acyclic. None since
/// `tc` was split into its table (below `dispatch`) and its launch helpers
/// (above `device`): a new entry needs a reason that the layers cannot
/// express yet.
const ALLOWED_EDGES: &[(&str, &str, &str)] = &[];

/// What the CPU reference may import: the error type, the parameter types,
/// the option rules (`validate::options`: `ForwardParams::resolve`, called
/// as a method, so no path names it) and the host-side rules on prefix sums
/// and head counts (`varlen`). Nothing that touches a GPU, plans or
/// launches.
const REFERENCE_MAY_USE: &[&str] = &["error", "params", "validate::options", "varlen"];

// ---------------------------------------------------------------- lexing

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of a Rust source with comments, strings and char literals
/// removed (lifetimes kept as punctuation + identifier), each with its line.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let skip_to = |i: &mut usize, line: &mut usize, end: usize| {
        while *i < end.min(c.len()) {
            if c[*i] == '\n' {
                *line += 1;
            }
            *i += 1;
        }
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let (mut depth, mut j) = (0usize, i);
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            skip_to(&mut i, &mut line, j);
        } else if ch == 'r' && (next == Some('"') || (next == Some('#') && matches!(c.get(i + 2), Some('"') | Some('#')))) {
            // Raw string r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            skip_to(&mut i, &mut line, j);
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            let mut j = if ch == 'b' { i + 2 } else { i + 1 };
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            skip_to(&mut i, &mut line, j + 1);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                out.push((Tok::Punct('\''), line));
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

// ------------------------------------------------------- paths of a file

/// A path a file names, made absolute (module segments from the crate
/// root, then the item), with the line it is on and whether it is a
/// `pub use` re-export (with the name it is exported under).
#[derive(Clone, Debug)]
struct Named {
    path: Vec<String>,
    line: usize,
    reexport_as: Option<String>,
}

struct Parser<'t> {
    t: &'t [(Tok, usize)],
    i: usize,
    /// The file's module path.
    module: Vec<String>,
    /// Known file modules (to resolve a bare first segment of a `use`).
    modules: &'t BTreeSet<Vec<String>>,
    out: Vec<Named>,
}

impl Parser<'_> {
    fn ident(&self, at: usize) -> Option<&str> {
        match self.t.get(at) {
            Some((Tok::Ident(s), _)) => Some(s),
            _ => None,
        }
    }
    fn is(&self, at: usize, t: &Tok) -> bool {
        self.t.get(at).map(|x| &x.0) == Some(t)
    }
    fn line(&self, at: usize) -> usize {
        self.t.get(at).or(self.t.last()).map_or(0, |x| x.1)
    }

    /// `base` (the current module, inline modules included) with a leading
    /// `crate` / `super` / `self` applied; `None` for any other first segment.
    fn anchor(&self, first: &str, base: &[String]) -> Option<Vec<String>> {
        match first {
            "crate" => Some(Vec::new()),
            "self" => Some(base.to_vec()),
            "super" => Some(base[..base.len().saturating_sub(1)].to_vec()),
            _ => None,
        }
    }

    fn run(mut self) -> Vec<Named> {
        // Inline modules (`mod tests { … }`): (name, brace depth inside).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        while self.i < self.t.len() {
            let base: Vec<String> = self.module.iter().cloned().chain(inline.iter().map(|m| m.0.clone())).collect();
            match &self.t[self.i].0 {
                Tok::Punct('{') => {
                    depth += 1;
                    self.i += 1;
                }
                Tok::Punct('}') => {
                    if inline.last().is_some_and(|m| m.1 == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                    self.i += 1;
                }
                Tok::Ident(kw) if kw == "mod" => {
                    if let Some(name) = self.ident(self.i + 1).map(str::to_string) {
                        if self.is(self.i + 2, &Tok::Punct('{')) {
                            depth += 1;
                            inline.push((name, depth));
                            self.i += 3;
                            continue;
                        }
                    }
                    self.i += 1;
                }
                Tok::Ident(kw) if kw == "use" => {
                    let public = self.i > 0 && self.is_pub_before(self.i);
                    self.i += 1;
                    // A leading `::` (`use ::std::…`) is external.
                    let Some(first) = self.ident(self.i).map(str::to_string) else {
                        self.i += 1;
                        continue;
                    };
                    let start = match self.anchor(&first, &base) {
                        Some(p) => {
                            self.i += 1;
                            // `use super::{…}` / `use crate::x`: expect `::`.
                            if self.is(self.i, &Tok::Path) {
                                self.i += 1;
                            }
                            Some(p)
                        }
                        None => {
                            // A bare first segment is a child module of
                            // this one (2018 paths), else an external crate.
                            let mut child = base.clone();
                            child.push(first.clone());
                            self.modules.contains(&child).then_some(base.clone())
                        }
                    };
                    let mut leaves = Vec::new();
                    let anchored = start.is_some();
                    self.use_tree(start.unwrap_or_default(), &mut leaves);
                    if anchored {
                        for (path, line, alias) in leaves {
                            let reexport_as = public.then(|| alias.clone());
                            self.out.push(Named { path, line, reexport_as });
                        }
                    }
                }
                Tok::Ident(first) if matches!(first.as_str(), "crate" | "super" | "self") => {
                    let prev_is_path = self.i > 0 && self.is(self.i - 1, &Tok::Path);
                    if !prev_is_path && self.is(self.i + 1, &Tok::Path) {
                        let line = self.line(self.i);
                        let mut path = self.anchor(first, &base).unwrap();
                        self.i += 1;
                        // `super::super::…`
                        while self.is(self.i, &Tok::Path) && self.ident(self.i + 1) == Some("super") {
                            path.pop();
                            self.i += 2;
                        }
                        while self.is(self.i, &Tok::Path) {
                            match self.ident(self.i + 1) {
                                Some(s) => {
                                    path.push(s.to_string());
                                    self.i += 2;
                                }
                                None => break, // `::<T>`, `::{`
                            }
                        }
                        self.out.push(Named { path, line, reexport_as: None });
                    } else {
                        self.i += 1;
                    }
                }
                _ => self.i += 1,
            }
        }
        self.out
    }

    /// Whether `use` at `at` is preceded by `pub` (or `pub(…)`).
    fn is_pub_before(&self, at: usize) -> bool {
        if self.ident(at - 1) == Some("pub") {
            return true;
        }
        // pub(crate) use / pub(super) use / pub(in path) use
        if self.is(at - 1, &Tok::Punct(')')) {
            let mut j = at - 1;
            while j > 0 && !self.is(j, &Tok::Punct('(')) {
                j -= 1;
            }
            return j > 0 && self.ident(j - 1) == Some("pub");
        }
        false
    }

    /// One use tree from the current token, under `prefix`: pushes each
    /// leaf `(path, line, name it binds)`. Stops after the tree (at `,`,
    /// `}` or `;`).
    fn use_tree(&mut self, prefix: Vec<String>, leaves: &mut Vec<(Vec<String>, usize, String)>) {
        let mut path = prefix;
        loop {
            let line = self.line(self.i);
            if self.is(self.i, &Tok::Punct('{')) {
                self.i += 1;
                loop {
                    if self.is(self.i, &Tok::Punct('}')) {
                        self.i += 1;
                        break;
                    }
                    if self.i >= self.t.len() {
                        return;
                    }
                    self.use_tree(path.clone(), leaves);
                    if self.is(self.i, &Tok::Punct(',')) {
                        self.i += 1;
                    }
                }
                return;
            }
            if self.is(self.i, &Tok::Punct('*')) {
                self.i += 1;
                leaves.push((path.clone(), line, "*".into()));
                return;
            }
            let Some(seg) = self.ident(self.i).map(str::to_string) else {
                self.i += 1;
                return;
            };
            self.i += 1;
            match seg.as_str() {
                "self" => {}
                "super" => {
                    path.pop();
                }
                _ => path.push(seg.clone()),
            }
            if self.is(self.i, &Tok::Path) {
                self.i += 1;
                continue;
            }
            let mut name = path.last().cloned().unwrap_or_default();
            if self.ident(self.i) == Some("as") {
                name = self.ident(self.i + 1).unwrap_or("_").to_string();
                self.i += 2;
            }
            leaves.push((path, line, name));
            return;
        }
    }
}

// ----------------------------------------------------------------- graph

/// The module path of a source file relative to `src/`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let last = segs.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        segs.push(stem.to_string());
    }
    segs
}

fn name(m: &[String]) -> String {
    if m.is_empty() { "crate".into() } else { m.join("::") }
}

/// The files of a crate: module path → source text.
type Sources = BTreeMap<Vec<String>, String>;

/// An edge and where it comes from (`file:line`).
type Edges = BTreeMap<(String, String), Vec<String>>;

/// The file-level import graph of `sources`.
fn graph(sources: &Sources) -> Edges {
    let modules: BTreeSet<Vec<String>> = sources.keys().cloned().collect();
    let named: BTreeMap<Vec<String>, Vec<Named>> = sources
        .iter()
        .map(|(m, src)| {
            let t = tokens(src);
            let p = Parser { t: &t, i: 0, module: m.clone(), modules: &modules, out: Vec::new() };
            (m.clone(), p.run())
        })
        .collect();
    // Re-exports: (module, exported name) → absolute path it stands for.
    let mut reexports: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
    for (m, list) in &named {
        for n in list {
            if let Some(alias) = &n.reexport_as {
                reexports.insert((m.clone(), alias.clone()), n.path.clone());
            }
        }
    }
    // The file that defines what `path` names: the longest prefix that is
    // a file, through re-exports (bounded: a re-export loop is a bug the
    // compiler reports, not this test).
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let k = (0..=path.len()).rev().find(|&k| modules.contains(&path[..k]))?;
            let file = path[..k].to_vec();
            match path.get(k) {
                Some(item) => match reexports.get(&(file.clone(), item.clone())) {
                    Some(target) if *target != path[..=k] => {
                        let mut p = target.clone();
                        p.extend_from_slice(&path[k + 1..]);
                        path = p;
                    }
                    _ => return Some(file),
                },
                None => return Some(file),
            }
        }
        None
    };
    let mut edges = Edges::new();
    for (m, list) in &named {
        if m.is_empty() {
            continue; // lib.rs: the façade of the whole crate
        }
        for n in list {
            let Some(to) = resolve(&n.path) else { continue };
            // Self, the crate root (items it defines itself), and a
            // parent naming its own children are no edges.
            if to == *m || to.is_empty() || to.starts_with(m) {
                continue;
            }
            let file = if sources.keys().any(|k| k.len() > m.len() && k.starts_with(m)) { "mod.rs" } else { "" };
            let at = format!("{}{}:{}", name(m), if file.is_empty() { String::new() } else { format!("/{file}") }, n.line);
            let list = edges.entry((name(m), name(&to))).or_default();
            if !list.contains(&at) {
                list.push(at);
            }
        }
    }
    edges
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        adj.entry(a).or_default().push(b);
        adj.entry(b).or_default();
    }
    struct St<'a> {
        adj: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in &s.adj[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St { adj: &adj, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for &v in adj.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The problems of a graph: cycles (after the allowed edges are taken
/// out), allowed edges that are gone, and reference imports outside
/// `may_use`.
fn problems(edges: &Edges, allowed: &[(&str, &str, &str)], may_use: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (a, b, _) in allowed {
        if !edges.contains_key(&(a.to_string(), b.to_string())) {
            out.push(format!("allowed edge {a} -> {b} no longer exists: remove it from ALLOWED_EDGES"));
        }
    }
    let kept: BTreeSet<(String, String)> =
        edges.keys().filter(|(a, b)| !allowed.iter().any(|(x, y, _)| a == x && b == y)).cloned().collect();
    for comp in cycles(&kept) {
        let inside: Vec<String> = edges
            .iter()
            .filter(|((a, b), _)| comp.contains(a) && comp.contains(b) && kept.contains(&(a.clone(), b.clone())))
            .map(|((a, b), at)| format!("    {a} -> {b} ({})", at.join(", ")))
            .collect();
        out.push(format!("import cycle between {}:\n{}", comp.join(", "), inside.join("\n")));
    }
    let in_reference = |m: &str| m == "reference" || m.starts_with("reference::");
    for ((a, b), at) in edges {
        let ok = in_reference(b) || may_use.iter().any(|u| b == u || b.starts_with(&format!("{u}::")));
        if in_reference(a) && !ok {
            out.push(format!("the CPU reference imports {b} ({}); it may use only {may_use:?}", at.join(", ")));
        }
    }
    out
}

fn read_sources(dir: &Path, root: &Path, out: &mut Sources) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            read_sources(&p, root, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.insert(module_of(p.strip_prefix(root).unwrap()), std::fs::read_to_string(&p).unwrap());
        }
    }
}

#[test]
fn host_crate_has_no_import_cycle_and_the_reference_imports_no_gpu_code() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Sources::new();
    read_sources(&src, &src, &mut sources);
    let edges = graph(&sources);
    if std::env::var_os("LAYERS_PRINT").is_some() {
        for ((a, b), at) in &edges {
            println!("{a} -> {b}  ({})", at.join(", "));
        }
    }
    assert!(edges.len() > 20, "the parser found only {} edges: is it still reading the sources?", edges.len());
    let p = problems(&edges, ALLOWED_EDGES, REFERENCE_MAY_USE);
    assert!(p.is_empty(), "{}", p.join("\n"));
}

// ------------------------------------------------ the test can fail

fn synthetic(files: &[(&str, &str)]) -> Sources {
    files.iter().map(|(path, src)| (module_of(Path::new(path)), src.to_string())).collect()
}

#[test]
fn finds_a_cycle_in_a_synthetic_graph() {
    let e = |list: &[(&str, &str)]| list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<BTreeSet<_>>();
    assert_eq!(cycles(&e(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])), vec![vec!["a", "b", "c"]]);
    assert!(cycles(&e(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
}

#[test]
fn finds_cycles_and_reference_imports_in_synthetic_sources() {
    let sources = synthetic(&[
        ("lib.rs", "mod api; mod device; mod reference; pub use device::Device;"),
        // api -> device through the crate root's re-export, in a use group.
        ("api.rs", "use crate::{Device, error::E};\n// crate::reference::x in a comment is no edge\nfn f() {}"),
        // device -> api by a path in code; a string naming crate::reference is none.
        ("device.rs", "pub struct Device;\nfn g() { let _ = \"crate::reference::r\"; crate::api::f(); }"),
        ("error.rs", "pub struct E;"),
        ("reference/mod.rs", "pub mod cpu; pub use cpu::r;"),
        ("reference/cpu.rs", "use super::super::device::Device;\npub fn r() {}"),
    ]);
    let edges = graph(&sources);
    let keys: Vec<_> = edges.keys().cloned().collect();
    assert_eq!(
        keys,
        [("api", "device"), ("api", "error"), ("device", "api"), ("reference::cpu", "device")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let p = problems(&edges, &[], &["error"]);
    assert!(p.iter().any(|m| m.starts_with("import cycle between api, device")), "{p:?}");
    assert!(p.iter().any(|m| m.starts_with("the CPU reference imports device")), "{p:?}");
    // Allowing the edge breaks the cycle; an allowed edge that is gone is reported.
    let p = problems(&edges, &[("device", "api", ""), ("api", "nowhere", "")], &["error", "device"]);
    assert_eq!(p, vec!["allowed edge api -> nowhere no longer exists: remove it from ALLOWED_EDGES".to_string()]);
    // An inline `mod tests` resolves `super::` to its file.
    let sources = synthetic(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "pub fn x() {}\n#[cfg(test)]\nmod tests { use super::*; use super::super::b::y; }"),
        ("b.rs", "pub fn y() {}"),
    ]);
    assert_eq!(graph(&sources).keys().cloned().collect::<Vec<_>>(), vec![("a".to_string(), "b".to_string())]);
}
