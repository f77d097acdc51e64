//! The PTX built by `build.rs` from `kernel-crate`, embedded in the library.

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
