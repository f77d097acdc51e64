//! The PTX built by `build.rs` from `kernel-crate`, embedded in the library,
//! split per kernel entry ([`split`]) and loaded kernel by kernel on first
//! use (`load`), from the cubins assembled from it ahead of time (`cubin`,
//! in the format of `pack`) where they run on the device.

pub(crate) mod cubin;
pub(crate) mod load;
pub(crate) mod pack;
pub mod split;

use std::sync::{Mutex, OnceLock};

pub use split::SplitPtx;

/// A PTX build of the kernel crate for one target family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxBuild {
    /// The `-C target-cpu` it was built for (`"sm_80"`, `"sm_90"`).
    pub arch: &'static str,
    /// Minimum compute capability `(major, minor)` that can load it.
    pub min_cc: (i32, i32),
    /// The PTX text.
    pub ptx: &'static str,
}

/// Portable build: Ampere (sm_80) and later, PTX ISA 7.1.
pub const SM80: PtxBuild =
    PtxBuild { arch: "sm_80", min_cc: (8, 0), ptx: include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_80.ptx")) };

/// Hopper build (sm_90), PTX ISA 8.0.
pub const SM90: PtxBuild =
    PtxBuild { arch: "sm_90", min_cc: (9, 0), ptx: include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90.ptx")) };

/// Hopper-native build (sm_90a, PTX ISA 8.0): everything of [`SM90`] plus the
/// wgmma/TMA kernels (`kernel-crate/src/hopper`). Loads on compute
/// capability 9.0 only (arch-specific code does not run on later GPUs).
pub const SM90A: PtxBuild =
    PtxBuild { arch: "sm_90a", min_cc: (9, 0), ptx: include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90a.ptx")) };

/// Every embedded build, newest first.
pub const ALL: &[PtxBuild] = &[SM90A, SM90, SM80];

impl PtxBuild {
    /// Whether a device of compute capability `(major, minor)` can load it.
    pub fn runs_on(&self, major: i32, minor: i32) -> bool {
        if self.arch.ends_with('a') { (major, minor) == self.min_cc } else { (major, minor) >= self.min_cc }
    }
}

/// The best embedded build for a device of compute capability
/// `(major, minor)` (sm_90a on 9.0), or `None` below sm_80.
pub fn for_compute_capability(major: i32, minor: i32) -> Option<PtxBuild> {
    ALL.iter().copied().find(|b| b.runs_on(major, minor))
}

/// The best build without the arch-specific (sm_90a) kernels.
pub fn portable_for_compute_capability(major: i32, minor: i32) -> Option<PtxBuild> {
    ALL.iter().copied().find(|b| !b.arch.ends_with('a') && b.runs_on(major, minor))
}

impl PtxBuild {
    /// This build split per kernel entry ([`SplitPtx`]), parsed on first use
    /// and kept for the process (one pass over the text, a few ms in
    /// release builds).
    pub fn split(&self) -> Result<&'static SplitPtx<'static>, String> {
        type Cache = Mutex<Vec<((usize, usize), &'static SplitPtx<'static>)>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let key = (self.ptx.as_ptr() as usize, self.ptx.len());
        let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(s);
        }
        let s: &'static SplitPtx<'static> = Box::leak(Box::new(SplitPtx::parse(self.ptx)?));
        cache.push((key, s));
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The callee of a `call` instruction line: `call.uni (retval0), f, (…);`
    /// or `call f, (…);` (independent of the splitter's own tokenizer).
    fn callee(line: &str) -> Option<&str> {
        let rest = line.trim().strip_prefix("call")?;
        let rest = rest.split_once(char::is_whitespace)?.1.trim_start();
        let rest = if rest.starts_with('(') { rest.split_once("),")?.1.trim_start() } else { rest };
        Some(rest.split([',', ';', ' ']).next()?.trim())
    }

    /// Each embedded build: every `.entry` of the text is in the index
    /// exactly once, and each entry's module holds that entry alone, the
    /// header, a declaration of every function it calls and of every
    /// module-scope symbol of the build it names.
    #[test]
    fn every_embedded_build_splits_into_self_contained_modules() {
        for build in ALL {
            let split = build.split().unwrap();
            let declared: Vec<&str> =
                build.ptx.lines().filter_map(|l| l.split_once(".entry ").map(|(_, r)| r.split(['(', ' ']).next().unwrap())).collect();
            assert!(declared.len() > 100, "{}: only {} entries", build.arch, declared.len());
            let mut indexed = split.entries().to_vec();
            indexed.sort_unstable();
            let mut sorted = declared.clone();
            sorted.sort_unstable();
            assert_eq!(indexed, sorted, "{}: the index differs from the text's `.entry` lines", build.arch);
            indexed.dedup();
            assert_eq!(indexed.len(), declared.len(), "{}: an entry is defined twice", build.arch);
            let symbols: Vec<&str> = split.symbols().collect();
            for &entry in &declared {
                let m = split.module(entry).unwrap();
                let target = build.ptx.lines().find(|l| l.starts_with(".target")).unwrap();
                assert!(m.starts_with(".version ") && m.contains(&format!("\n{target}\n")), "{entry}: header");
                let entries: Vec<&str> = m.lines().filter(|l| l.contains(".entry ")).collect();
                assert_eq!(entries.len(), 1, "{}: {entry}'s module has entries {entries:?}", build.arch);
                assert!(entries[0].contains(&format!(".entry {entry}(")), "{entry}: {entries:?}");
                for f in m.lines().filter_map(callee) {
                    let is_declared = m.lines().any(|l| {
                        let l = l.trim_start();
                        (l.starts_with(".func") || l.contains(" .func")) && l.split(['(', ')', ' ']).any(|w| w == f)
                    });
                    assert!(is_declared, "{}: {entry} calls `{f}`, undeclared in its module", build.arch);
                }
                let reparsed = SplitPtx::parse(&m).unwrap();
                let declared_here: Vec<&str> = reparsed.symbols().collect();
                for s in &symbols {
                    let used = m.match_indices(s).any(|(i, _)| {
                        let b = m.as_bytes();
                        let ok = |c: Option<&u8>| !c.is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$');
                        ok(i.checked_sub(1).and_then(|j| b.get(j))) && ok(b.get(i + s.len()))
                    });
                    if used {
                        assert!(declared_here.contains(s), "{}: {entry}'s module uses `{s}` without declaring it", build.arch);
                    }
                }
                if build.arch == "sm_90a" && entry.starts_with("flash_fwd_hopper_") {
                    assert!(m.contains(".maxntid"), "{entry}: the launch bounds stay with the entry");
                }
            }
        }
    }

    #[test]
    fn split_is_cached_per_build() {
        assert!(std::ptr::eq(SM80.split().unwrap(), SM80.split().unwrap()));
        assert!(!std::ptr::eq(SM80.split().unwrap(), SM90.split().unwrap()));
    }
}
