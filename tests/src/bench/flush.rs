//! The L2 flush between timed runs, in two kinds.
//!
//! * [`FlushKind::Read`] (the default of `fa-bench-decode`): a kernel reads
//!   a buffer of twice the L2's 50 MB and stores nothing, so the L2 holds
//!   clean lines of the flush buffer and no line of the inputs when the
//!   timed run starts — the state a decode step finds after the weight reads
//!   (GEMV) of the layer before it.
//! * [`FlushKind::Write`]: a 64 MB memset (`flush.zero_()` on the PyTorch
//!   side), the method of the earlier decode tables. It leaves ~50 MB of
//!   *dirty* lines in the L2, and their write-back to HBM happens inside the
//!   next timed run, charged to the kernel under test (≈ 17 µs at 3 TB/s):
//!   a cost of the flush, not of attention.
//!
//! Both sides of a comparison (ours, PyTorch) flush the same way in the
//! same run; the PyTorch peers get the kind in their config (`"flush"`).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::Res;

/// Bytes the read flush reads (2 × the H100's 50 MB L2).
pub const READ_BYTES: usize = 128 << 20;
/// Bytes the write flush zeroes (the earlier method).
pub const WRITE_BYTES: usize = 64 << 20;

/// How the L2 is flushed before each timed run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushKind {
    Read,
    Write,
}

impl FlushKind {
    pub fn name(self) -> &'static str {
        match self {
            FlushKind::Read => "read",
            FlushKind::Write => "write",
        }
    }
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "read" => Ok(FlushKind::Read),
            "write" | "memset" => Ok(FlushKind::Write),
            _ => Err(format!("`{s}`: read or write")),
        }
    }
    /// The method's words for a table caption.
    pub fn describe(self) -> String {
        match self {
            FlushKind::Read => format!(
                "the L2 flushed by a kernel reading {} MB (clean lines) before each",
                READ_BYTES >> 20
            ),
            FlushKind::Write => format!(
                "the L2 flushed by a {} MB memset (dirty lines, written back during the timed run) before each",
                WRITE_BYTES >> 20
            ),
        }
    }
}

/// A read of `n16` 16-byte words at `src`, grid-stride; the XOR of all words
/// is stored to `dst` only if it equals a constant no zero-filled buffer
/// gives, so the loads stay and nothing is written.
const READ_PTX: &str = r#"
.version 7.8
.target sm_80
.address_size 64

.visible .entry l2_read_flush(
    .param .u64 src,
    .param .u64 n16,
    .param .u64 dst
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [n16];
    ld.param.u64 %rd3, [dst];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    mov.u32 %r5, 0;
LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd1, %rd7;
    ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd8];
    xor.b32 %r5, %r5, %r6;
    xor.b32 %r5, %r5, %r7;
    xor.b32 %r5, %r5, %r8;
    xor.b32 %r5, %r5, %r9;
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    setp.ne.u32 %p2, %r5, 1592336981;
    @%p2 bra END;
    st.global.u32 [%rd3], %r5;
END:
    ret;
}
"#;

/// The flush of one kind with its buffer (and, reading, its kernel).
pub struct L2Flush {
    kind: FlushKind,
    buf: CudaSlice<u8>,
    sink: CudaSlice<u32>,
    read: Option<CudaFunction>,
}

impl L2Flush {
    pub fn new(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, kind: FlushKind) -> Res<Self> {
        let bytes = match kind {
            FlushKind::Read => READ_BYTES,
            FlushKind::Write => WRITE_BYTES,
        };
        let read = match kind {
            FlushKind::Read => Some(
                ctx.load_module(Ptx::from_src(READ_PTX))?
                    .load_function("l2_read_flush")?,
            ),
            FlushKind::Write => None,
        };
        Ok(L2Flush {
            kind,
            buf: stream.alloc_zeros(bytes)?,
            sink: stream.alloc_zeros(1)?,
            read,
        })
    }

    pub fn kind(&self) -> FlushKind {
        self.kind
    }

    /// Enqueues one flush on `stream`.
    pub fn run(&mut self, stream: &Arc<CudaStream>) -> Res<()> {
        match &self.read {
            None => stream.memset_zeros(&mut self.buf)?,
            Some(f) => {
                let n16 = (self.buf.len() / 16) as u64;
                let cfg = LaunchConfig {
                    grid_dim: (132 * 8, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: l2_read_flush(src, n16, dst): reads n16 16-byte
                // words of `buf` (its length, 16-byte aligned allocation),
                // writes at most one u32 of `sink`.
                unsafe {
                    stream
                        .launch_builder(f)
                        .arg(&self.buf)
                        .arg(&n16)
                        .arg(&mut self.sink)
                        .launch(cfg)
                }?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_describe_themselves() {
        assert_eq!(FlushKind::parse("read"), Ok(FlushKind::Read));
        assert_eq!(FlushKind::parse("memset"), Ok(FlushKind::Write));
        assert!(FlushKind::parse("x").is_err());
        assert!(FlushKind::Read.describe().contains("128 MB"));
        assert!(FlushKind::Write.describe().contains("64 MB memset"));
        assert!(READ_PTX.contains(".entry l2_read_flush"));
    }
}
