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

/// Every embedded build, newest first.
pub const ALL: &[PtxBuild] = &[SM90, SM80];

/// The best embedded build for a device of compute capability
/// `(major, minor)`, or `None` below sm_80.
pub fn for_compute_capability(major: i32, minor: i32) -> Option<PtxBuild> {
    ALL.iter().copied().find(|b| (major, minor) >= b.min_cc)
}
