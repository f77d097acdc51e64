//! Hardware primitives, one file per instruction family. Every `asm!` of the
//! kernel crate lives below this module; everything above it is safe code
//! over tiles and fragments.
pub mod sreg;
pub mod shfl;
pub mod smem;
pub mod sync;
pub mod cp_async;
pub mod global;
pub mod cvt;
pub mod math;
pub mod ldmatrix;
pub mod mma;
pub mod opaque;
// Hopper (sm_90a) primitives: only the sm_90a build compiles them (the
// older targets' ptxas rejects wgmma and setmaxnreg).
#[cfg(fa_sm90a)]
pub mod mbarrier;
#[cfg(fa_sm90a)]
pub mod setmaxnreg;
#[cfg(fa_sm90a)]
pub mod tma;
#[cfg(fa_sm90a)]
pub mod wgmma;
#[cfg(fa_sm90a)]
pub mod named_barrier;
