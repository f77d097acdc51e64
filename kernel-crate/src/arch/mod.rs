//! Hardware primitives, one file per instruction family. Every `asm!` of the
//! kernel crate lives below this module; everything above it is safe code
//! over tiles and fragments.
pub mod sreg;
pub mod shfl;
pub mod smem;
pub mod sync;
pub mod cp_async;
pub mod cvt;
pub mod ldmatrix;
pub mod mma;
