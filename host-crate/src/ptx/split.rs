//! One PTX build split into a self-contained module per kernel entry.
//!
//! The driver JIT-compiles every function of a module it loads: handing it
//! the whole build (every kernel of every family, ~23 MB of PTX per target)
//! costs minutes on a machine with an empty JIT cache. Each entry's own
//! module — the header (`.version`, `.target`, `.address_size`), the
//! module-scope variables and `.func` declarations/definitions it uses,
//! transitively, then the entry — compiles in a fraction of a second, so
//! kernels are loaded one by one on first use (`ptx::load`).
//!
//! The split runs at run time, once per build and process (a single pass
//! over the text, then per-entry work on first use): the build script stays
//! a plain PTX producer, and the split always matches the text it splits.
//!
//! This file uses nothing but `std` (xtask includes it with `#[path]` to
//! assemble the split modules with ptxas).

use std::collections::{HashMap, HashSet};

/// What one top-level item of a PTX text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `.version`, `.target`, `.address_size`, `.file`: in every module.
    Header,
    /// A `.func` (prototype or definition) or a module-scope variable
    /// (`.global`, `.const`, `.shared`, `.extern`, …): in the modules that
    /// use its name.
    Symbol,
    /// A kernel `.entry`.
    Entry,
    /// Anything else at module scope (`.pragma`, sections): kept in every
    /// module, as it may apply to any function.
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Item<'a> {
    text: &'a str,
    kind: Kind,
    name: &'a str,
}

/// The top-level items of one PTX text, indexed by the names they declare.
#[derive(Debug)]
pub struct SplitPtx<'a> {
    items: Vec<Item<'a>>,
    /// Symbol name → every item declaring or defining it.
    symbols: HashMap<&'a str, Vec<usize>>,
    /// Entry name → its item.
    entries: HashMap<&'a str, usize>,
    /// Entry names in file order.
    entry_order: Vec<&'a str>,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$' || b == b'%'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// The end of the comment or string literal starting at `i`, if one does.
fn skip_comment_or_string(s: &[u8], i: usize) -> Option<usize> {
    match (s[i], s.get(i + 1)) {
        (b'/', Some(b'/')) => Some(s[i..].iter().position(|&b| b == b'\n').map_or(s.len(), |p| i + p + 1)),
        (b'/', Some(b'*')) => Some(s[i + 2..].windows(2).position(|w| w == b"*/").map_or(s.len(), |p| i + 2 + p + 2)),
        (b'"', _) => {
            let mut j = i + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            Some((j + 1).min(s.len()))
        }
        _ => None,
    }
}

/// Every identifier token of `text` outside comments and strings (register
/// names included; numbers skipped), in order.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    let s = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < s.len() {
            if let Some(end) = skip_comment_or_string(s, i) {
                i = end;
            } else if is_ident_start(s[i]) {
                let start = i;
                i += 1;
                while i < s.len() && is_ident_char(s[i]) {
                    i += 1;
                }
                return Some(&text[start..i]);
            } else if s[i].is_ascii_digit() {
                while i < s.len() && is_ident_char(s[i]) {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        None
    })
}

/// The declared name of a `.func`/`.entry` item: the identifier after the
/// directive, past an optional return-parameter list `(…)`.
fn name_after(text: &str, directive: &str) -> Option<usize> {
    let s = text.as_bytes();
    let mut i = find_word(text, directive)? + directive.len();
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    if s.get(i) == Some(&b'(') {
        let mut depth = 0;
        while i < s.len() {
            match s[i] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
    }
    (i < s.len() && is_ident_start(s[i])).then_some(i)
}

/// Position of `word` in `text` as a whole token (not followed by an
/// identifier character), before any `(`, `{`, `=` or `;`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let head = &text[..text.find(['(', '{', '=', ';']).unwrap_or(text.len())];
    let mut from = 0;
    while let Some(p) = head[from..].find(word) {
        let at = from + p;
        let after = head.as_bytes().get(at + word.len()).copied();
        let before = at.checked_sub(1).map(|b| head.as_bytes()[b]);
        if !after.is_some_and(is_ident_char) && !before.is_some_and(|b| is_ident_char(b) || b == b'.') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

fn ident_at(text: &str, i: usize) -> &str {
    let s = text.as_bytes();
    let mut j = i + 1;
    while j < s.len() && is_ident_char(s[j]) {
        j += 1;
    }
    &text[i..j]
}

/// Classifies one top-level item and finds the name it declares.
fn classify(text: &str) -> Result<Item<'_>, String> {
    let first = text.split_ascii_whitespace().next().unwrap_or("");
    if matches!(first, ".version" | ".target" | ".address_size" | ".file") {
        return Ok(Item { text, kind: Kind::Header, name: "" });
    }
    for (directive, kind) in [(".entry", Kind::Entry), (".func", Kind::Symbol)] {
        if find_word(text, directive).is_some() {
            let at = name_after(text, directive)
                .ok_or_else(|| format!("no name after `{directive}` in `{}`", excerpt(text)))?;
            return Ok(Item { text, kind, name: ident_at(text, at) });
        }
    }
    // A variable: its name is the last identifier before `[`, `=`, `;` or
    // a parameterized-name `<`.
    let is_var = [".global", ".const", ".shared", ".local", ".extern", ".tex", ".surfref", ".texref", ".samplerref"]
        .iter()
        .any(|d| find_word(text, d).is_some());
    if is_var {
        let head = &text[..text.find(['[', '=', ';', '<']).unwrap_or(text.len())];
        let name = identifiers(head)
            .filter(|id| {
                let at = id.as_ptr() as usize - head.as_ptr() as usize;
                at == 0 || head.as_bytes()[at - 1] != b'.'
            })
            .last()
            .ok_or_else(|| format!("no variable name in `{}`", excerpt(text)))?;
        return Ok(Item { text, kind: Kind::Symbol, name });
    }
    Ok(Item { text, kind: Kind::Other, name: "" })
}

fn excerpt(text: &str) -> &str {
    let end = text.char_indices().nth(80).map_or(text.len(), |(i, _)| i);
    &text[..end]
}

impl<'a> SplitPtx<'a> {
    /// Splits `ptx` into its top-level items: header directives end at
    /// their line's end, declarations at a `;` outside parentheses and
    /// braces, functions and entries at the `}` closing their body.
    pub fn parse(ptx: &'a str) -> Result<Self, String> {
        let s = ptx.as_bytes();
        let mut items = Vec::new();
        let mut i = 0;
        while i < s.len() {
            if s[i].is_ascii_whitespace() {
                i += 1;
                continue;
            }
            if let Some(end) = skip_comment_or_string(s, i) {
                i = end;
                continue;
            }
            let start = i;
            let first = ptx[start..].split_ascii_whitespace().next().unwrap_or("");
            let end = if matches!(first, ".version" | ".target" | ".address_size" | ".file") {
                s[start..].iter().position(|&b| b == b'\n').map_or(s.len(), |p| start + p)
            } else {
                let (mut paren, mut brace, mut initializer) = (0i32, 0i32, false);
                let mut end = None;
                while i < s.len() {
                    if let Some(e) = skip_comment_or_string(s, i) {
                        i = e;
                        continue;
                    }
                    match s[i] {
                        b'(' => paren += 1,
                        b')' => paren -= 1,
                        b'{' => brace += 1,
                        b'=' if paren == 0 && brace == 0 => initializer = true,
                        b'}' => {
                            brace -= 1;
                            if brace == 0 && paren == 0 && !initializer {
                                end = Some(i + 1);
                                break;
                            }
                        }
                        b';' if paren == 0 && brace == 0 => {
                            end = Some(i + 1);
                            break;
                        }
                        _ => {}
                    }
                    if paren < 0 || brace < 0 {
                        return Err(format!("unbalanced `)` or `}}` at byte {i}: `{}`", excerpt(&ptx[start..])));
                    }
                    i += 1;
                }
                end.ok_or_else(|| format!("unterminated item at byte {start}: `{}`", excerpt(&ptx[start..])))?
            };
            items.push(classify(&ptx[start..end])?);
            i = end;
        }
        let mut symbols: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut entries = HashMap::new();
        let mut entry_order = Vec::new();
        for (k, item) in items.iter().enumerate() {
            match item.kind {
                Kind::Symbol => symbols.entry(item.name).or_default().push(k),
                Kind::Entry => {
                    if entries.insert(item.name, k).is_some() {
                        return Err(format!("entry `{}` defined twice", item.name));
                    }
                    entry_order.push(item.name);
                }
                Kind::Header | Kind::Other => {}
            }
        }
        if !items.iter().any(|it| it.kind == Kind::Header && it.text.starts_with(".version")) {
            return Err("no `.version` directive".into());
        }
        Ok(Self { items, symbols, entries, entry_order })
    }

    /// The kernel entries, in file order.
    pub fn entries(&self) -> &[&'a str] {
        &self.entry_order
    }

    /// Whether `entry` is a kernel of this build.
    pub fn contains(&self, entry: &str) -> bool {
        self.entries.contains_key(entry)
    }

    /// The module-scope symbols (`.func`s and variables) of this build.
    pub fn symbols(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.symbols.keys().copied()
    }

    /// The self-contained PTX module of `entry`: the header, the other
    /// module-scope directives, every symbol the entry uses (transitively:
    /// a `.func` it calls, a variable such a function reads), then the
    /// entry, all in their order in the build (so each declaration still
    /// precedes its uses). `None` if the build has no such entry.
    pub fn module(&self, entry: &str) -> Option<String> {
        let &root = self.entries.get(entry)?;
        let mut keep = vec![false; self.items.len()];
        keep[root] = true;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut work = vec![root];
        while let Some(k) = work.pop() {
            for id in identifiers(self.items[k].text) {
                if let Some(defs) = self.symbols.get(id)
                    && seen.insert(id)
                {
                    for &d in defs {
                        keep[d] = true;
                        work.push(d);
                    }
                }
            }
        }
        let mut out = String::new();
        for (k, item) in self.items.iter().enumerate() {
            if keep[k] || matches!(item.kind, Kind::Header | Kind::Other) {
                out.push_str(item.text);
                out.push_str(if item.kind == Kind::Header { "\n" } else { "\n\n" });
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 8.0\n.target sm_90a\n.address_size 64\n\n\t// .globl\tk1\n.func panic_fmt\n()\n.noreturn;\n.extern .shared .align 4 .b8 smem[];\n.global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n.const .align 8 .u64 ptr_to_table = generic(table);\n.func  (.param .b32 func_retval0) helper(\n\t.param .b32 helper_param_0\n);\n\n.visible .entry k1(\n\t.param .u64 k1_param_0\n)\n.maxntid 384, 1, 1\n{\n\t.reg .b32 %r<3>;\n\t{ // callseq 0\n\tcall.uni (retval0), helper, (param0);\n\t}\n\tld.shared.b32 %r1, [smem];\n\tret;\n}\n\n.visible .entry k2(\n)\n{\n\tcall.uni panic_fmt, ();\n\tret;\n}\n\t// .globl k3\n.visible .entry k3()\n{\n\tret; // no } here\n}\n.func  (.param .b32 func_retval0) helper(\n\t.param .b32 helper_param_0\n)\n{\n\tld.const.u64 %rd1, [ptr_to_table];\n\tst.param.b32 [func_retval0], 0;\n\tret;\n}\n.func panic_fmt()\n.noreturn\n{\n\ttrap;\n}\n";

    #[test]
    fn splits_items_and_names() {
        let s = SplitPtx::parse(PTX).unwrap();
        assert_eq!(s.entries(), ["k1", "k2", "k3"]);
        let mut syms: Vec<_> = s.symbols().collect();
        syms.sort();
        assert_eq!(syms, ["helper", "panic_fmt", "ptr_to_table", "smem", "table"]);
        assert!(s.contains("k2") && !s.contains("helper") && s.module("nope").is_none());
    }

    #[test]
    fn module_keeps_what_the_entry_uses_transitively() {
        let s = SplitPtx::parse(PTX).unwrap();
        let k1 = s.module("k1").unwrap();
        assert!(k1.starts_with(".version 8.0\n.target sm_90a\n.address_size 64\n"), "{k1}");
        // helper (prototype and definition), the variable it reads, the
        // variable that one points to, and the shared array the entry uses.
        assert_eq!(k1.matches(") helper(").count(), 2, "{k1}");
        for needed in [".const .align 8 .u64 ptr_to_table", ".global .align 4 .b8 table[8]", ".b8 smem[]", ".maxntid 384"] {
            assert!(k1.contains(needed), "{needed} missing:\n{k1}");
        }
        assert!(!k1.contains("panic_fmt") && !k1.contains("entry k2") && !k1.contains("entry k3"), "{k1}");
        // Declarations precede the entry, the definition follows it (file order).
        assert!(k1.find("table[8]").unwrap() < k1.find(".entry k1").unwrap());
        assert!(k1.rfind(") helper(").unwrap() > k1.find(".entry k1").unwrap());

        let k2 = s.module("k2").unwrap();
        assert_eq!(k2.matches(".func panic_fmt").count(), 2, "{k2}");
        assert!(!k2.contains("helper") && !k2.contains("table") && !k2.contains("smem"), "{k2}");
        let k3 = s.module("k3").unwrap();
        assert!(k3.contains("ret; // no } here\n}") && !k3.contains(".func"), "{k3}");
    }

    #[test]
    fn rejects_broken_text() {
        assert!(SplitPtx::parse(".version 8.0\n.visible .entry k(\n)\n{\n\tret;\n").is_err());
        assert!(SplitPtx::parse(".version 8.0\n.visible .entry k()\n{\n}\n.visible .entry k()\n{\n}\n").is_err());
        assert!(SplitPtx::parse(".target sm_80\n").is_err());
    }
}
