//! The plan of a decode call's attention launch, nothing enqueued yet: the
//! kernel (the flash-decoding kernel for at most 16 rows per (sequence,
//! head), else the `fa2d` tile; an FP8 cache's own), head packing, the
//! split count and schedule, the grid and the kernel parameters
//! ([`AttendPlan`]).

use flash_attn_common::{AttnParams, INTERLEAVE_PAGED};

use super::args::{DecodeOptions, OutSpec, SplitScratch};
use super::kernels::DecKernel;
use super::split::{MAX_SPLITS, decode_no_split_fill, decode_splits_heuristic, interleave_paged, num_splits_heuristic, split_tickets, tickets_pay_on};
use super::validate::{CacheGeom, invalid};
use crate::device::FlashAttention;
use crate::dispatch::{DispatchKey, Launch, Plan};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};
use crate::tensor::{AttnElem, Extras, TensorLayout, Varlen};
use crate::types::{DType, Dims, Features};
use crate::validate::{check_layout, check_output, check_stats};
use crate::varlen::{check_alibi, check_gqa};

/// The validated attention launch of a KV-cache call (nothing enqueued yet).
pub(super) struct AttendPlan {
    pub(super) main: Launch,
    pub(super) ns: usize,
    pub(super) grid: u32,
    /// Query heads and rows as the caller sees them (the launch may pack
    /// the `g` query heads of a KV head as rows of one tile).
    pub(super) nheads: usize,
    pub(super) sq: usize,
    pub(super) o_layout: TensorLayout,
    pub(super) lse_len: usize,
    /// Varlen q: `total_q`.
    pub(super) varlen: Option<usize>,
    /// The flash-decoding kernel that runs, if one does (split-KV: its fused
    /// combine can replace the combine launch; built with [`DecKernel::append`]:
    /// it appends new k/v itself).
    pub(super) dec: Option<&'static DecKernel>,
    /// The flash-decoding kernel whose compact entry may run, and whether
    /// the caller forced that entry (then a call it cannot carry is an error).
    pub(super) compact: Option<(&'static DecKernel, bool)>,
    pub(super) params: AttnParams,
}

impl FlashAttention {
    /// Whether this device takes the ticket schedule where a call allows it
    /// ([`DecodeOptions::deterministic`](super::DecodeOptions::deterministic), [`MAX_TICKET_BANDWIDTH_PER_SM`](super::MAX_TICKET_BANDWIDTH_PER_SM)):
    /// an H100 yes, an H200 no.
    pub fn split_tickets_pay(&self) -> bool {
        tickets_pay_on(self.peak_mem_bandwidth(), self.num_sms())
    }
    /// Validation and plan of the attention launch of a KV-cache call:
    /// q dense `(batch, sq, nheads, d)`, or packed with `varlen`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_attend<T: AttnElem>(
        &self,
        q_layout: &TensorLayout,
        q_len: usize,
        varlen: Option<&Varlen<'_>>,
        geom: &CacheGeom,
        cache_layout: &TensorLayout,
        s_new: usize,
        seqlens_len: usize,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: &DecodeOptions<'_>,
        out: Option<OutSpec>,
        fp8: bool,
    ) -> Result<AttendPlan> {
        let dtype = T::DTYPE;
        if dtype == DType::F32 {
            return Err(FlashAttnError::Unsupported {
                argument: "q",
                dtype: "f32",
                what: "the KV-cache calls (f16/bf16 tensor-core kernels; the CPU reference has f32/f64)",
            });
        }
        if params.loop_order != LoopOrder::Fa2 {
            return Err(FlashAttnError::Unsupported {
                argument: "params.loop_order",
                dtype: dtype.name(),
                what: "the KV-cache calls with FA1 or Standard (they run the FA2 loop order)",
            });
        }
        check_layout("q", q_layout, q_len)?;
        let [qb, q_rows, nheads, d] = q_layout.shape;
        let (batch, sq) = match varlen {
            Some(v) => {
                if qb != 1 {
                    return Err(invalid("q", format!("shape {:?}", q_layout.shape), "varlen q is packed (total_q, nheads, headdim): TensorLayout::varlen"));
                }
                (v.batch(), v.max_seqlen_q)
            }
            None => (qb, q_rows),
        };
        let nheads_k = geom.nheads_k;
        check_gqa(nheads, nheads_k)?;
        if seqlens_len != batch {
            let argument = if varlen.is_some() { "cu_seqlens_k" } else { "cache_seqlens" };
            return Err(invalid(argument, format!("length {seqlens_len}"), "must hold one i32 per sequence (q's batch)"));
        }
        // Keys per sequence: at most the capacity (and, varlen, max_seqlen_k).
        let seqlen_k = match varlen {
            Some(v) => v.max_seqlen_k.min(geom.capacity),
            None => geom.capacity,
        };
        let window_seqlen_k = varlen.map_or(geom.capacity, |v| v.max_seqlen_k);
        let opts_r = params.resolve(d, window_seqlen_k.max(1))?;
        if let Some(a) = &ext.alibi_slopes {
            check_alibi(a.shape, a.slopes.len(), batch, nheads)?;
        }
        let max_splits = opts.scratch.as_ref().map_or(MAX_SPLITS, |s| s.max_splits.min(MAX_SPLITS));
        if let Some(n) = opts.num_splits
            && (n == 0 || n > max_splits)
        {
            return Err(invalid("num_splits", n.to_string(), "must be in 1..=128 and at most the scratch's max_splits"));
        }

        // One query row per sequence (dense): a right window (or causal,
        // bottom-right) hides no key from the last row, so it is dropped —
        // and no longer stands in the way of head packing.
        let single_row = varlen.is_none() && sq == 1;
        let opts_r = if single_row { crate::params::Resolved { window_right: -1, ..opts_r } } else { opts_r };
        let causal = params.causal && !single_row;

        // ---- head packing (one token, GQA, no window/ALiBi) ---------------
        let group = nheads / nheads_k;
        let pack = varlen.is_none()
            && sq == 1
            && group > 1
            && opts_r.window_left < 0
            && opts_r.window_right < 0
            && ext.alibi_slopes.is_none();
        let o_layout = match (varlen, out) {
            (Some(_), _) => TensorLayout::varlen(q_rows, nheads, d),
            (None, None) => TensorLayout::contiguous([batch, sq, nheads, d]),
            (None, Some(c)) => {
                check_output(&c.o_layout, c.o_len, [batch, sq, nheads, d])?;
                c.o_layout
            }
        };
        let (rq, rh) = if pack { (group, nheads_k) } else { (sq, nheads) };
        let pack_strides = |s: [usize; 3]| if pack { [s[0], s[2], s[2] * group] } else { s };

        // ---- plan ----------------------------------------------------------
        let key = DispatchKey {
            dtype,
            headdim: d,
            causal: causal && !pack,
            loop_order: LoopOrder::Fa2,
            arch: self.compute_capability(),
            features: Features { varlen: false, mods: true, decode: true },
        };
        let dims = Dims { batch, nheads: rh, nheads_k, seqlen_q: rq, seqlen_k: seqlen_k.max(1), headdim: d };
        let Plan::TcFa2 { kernel, main } = crate::dispatch::plan(&key, &dims, None, &self.limits())? else {
            unreachable!("decode dispatch gives the tensor-core FA2 plan")
        };
        // At most 16 rows per (sequence, head) as launched: the
        // flash-decoding kernel (warps split the keys), else the fa2d tile.
        let page = geom.paged.then_some(geom.rows_per);
        let dec = if rq <= DecKernel::BR { DecKernel::default_fitting(dtype == DType::BF16, kernel.d, page, self.limits().max_smem_per_block) } else { None };
        let (dec, compact) = match opts.kernel {
            // An FP8 cache: its own kernel, no compact entry.
            _ if fp8 => (Some(fp8_kernel_for(dtype, kernel.d, rq, opts.kernel, page, self.limits().max_smem_per_block)?), None),
            // The compact entry where it pays (`DecKernel::compact_by_default`).
            // A call with new keys and values runs the default's build with
            // the append fused in where there is one (`_pga` over small
            // pages, decode step 24).
            None => {
                let dec = if s_new > 0 { dec.map(DecKernel::with_append) } else { dec };
                (dec, dec.filter(|k| k.compact_by_default(page)).map(|k| (k, false)))
            }
            Some(name) if name == kernel.name => (None, None),
            Some(name) => match DecKernel::by_name(name).map(|k| (k, None)).or_else(|| DecKernel::by_compact_name(name).map(|k| (k, Some((k, true))))) {
                Some((k, c)) if k.d == kernel.d && k.bf16 == (dtype == DType::BF16) && rq <= DecKernel::BR => (Some(k), c),
                _ => {
                    return Err(invalid(
                        "opts.kernel",
                        name.to_string(),
                        "must name a flash-decoding kernel of the call's dtype and head dim (at most 16 rows per sequence and head) or the call's fa2d kernel",
                    ));
                }
            },
        };
        let (main, br, bc) = match dec {
            Some(k) => {
                let grid = rq.div_ceil(k.br()) * batch * rh;
                let launch = Launch { kernel: k.name, grid: grid as u32, threads: k.threads(), smem_bytes: k.smem_bytes() as u32 };
                (launch, k.br(), k.bc)
            }
            None => (main, kernel.br(), kernel.bc),
        };
        let work = batch * rh * rq.div_ceil(br);
        let n_blocks = seqlen_k.div_ceil(bc);
        let per_sm = self.blocks_per_sm(&main).unwrap_or(2);
        let slots = self.num_sms() * per_sm;
        // Tickets pay, and half the SMs saturate the DRAM, on the same
        // devices (≤ 30 GB/s of peak bandwidth per SM).
        let device_pays = self.split_tickets_pay();
        // Pages smaller than the flash-decoding kernel's key block.
        let small_pages = dec.is_some_and(|k| page.is_some_and(|rows| !rows.is_multiple_of(k.bc)));
        let ns = opts.num_splits.unwrap_or_else(|| match dec {
            Some(k) => {
                let balanced = k.tickets && device_pays && !geom.paged && !opts.deterministic;
                let fill = decode_no_split_fill(small_pages, balanced, n_blocks, device_pays);
                decode_splits_heuristic(work, self.num_sms(), per_sm, n_blocks, max_splits, fill)
            }
            None => num_splits_heuristic(work, slots, n_blocks, max_splits),
        });
        // The ticket schedule (decode step 18), unless the caller asks for
        // reproducible bits.
        let split_tickets = dec.is_some_and(|k| split_tickets(ns, k.tickets, device_pays, geom.paged, n_blocks, opts.deterministic));
        // Fixed shares interleaved over whole-block pages where it pays
        // (decode step 38).
        let interleave_paged = dec.is_some() && interleave_paged(geom.paged, small_pages, device_pays);
        // A default call that draws no ticket and appends nothing runs the
        // build without the ticket loop (`DecKernel::without_tickets`, decode
        // step 29): same configuration, launch shape and split count.
        let (dec, compact, main) = match dec.map(|k| (k, k.without_tickets())) {
            Some((k, w)) if opts.kernel.is_none() && !split_tickets && s_new == 0 && w != k => (Some(w), w.compact_by_default(page).then_some((w, false)), Launch { kernel: w.name, ..main }),
            _ => (dec, compact, main),
        };
        let lse_len = nheads * if varlen.is_some() { q_rows } else { batch * sq };
        if let Some(c) = out {
            check_stats("lse", c.lse_len, lse_len)?;
        }
        let grid = (main.grid as u64)
            .checked_mul(ns as u64)
            .filter(|&g| g <= i32::MAX as u64)
            .ok_or(FlashAttnError::DimTooLarge { argument: "num_splits", axis: "grid blocks", value: ns, max: i32::MAX as usize })?
            as u32;
        if let Some(sc) = &opts.scratch
            && ns > 1
            && (sc.o_accum.len() < ns * lse_len * d || sc.lse_accum.len() < ns * lse_len)
        {
            return Err(invalid(
                "scratch",
                format!("{} / {} f32", sc.o_accum.len(), sc.lse_accum.len()),
                "too small for num_splits · batch · nheads · seqlen_q (· d)",
            ));
        }
        if let Some(SplitScratch { counters: Some(c), .. }) = &opts.scratch
            && dec.is_some()
            && ns > 1
            && c.len() < main.grid as usize
        {
            return Err(invalid("scratch.counters", format!("{} u32", c.len()), "too small: one u32 per tile, batch · nheads · ⌈seqlen_q / 16⌉"));
        }
        let u = |x: usize| x as u64;
        let mut q_stride = pack_strides(q_layout.strides).map(u);
        let mut o_stride = pack_strides(o_layout.strides).map(u);
        if varlen.is_some() {
            // Packed rows: the sequence's row offset comes from cu_seqlens_q.
            q_stride[0] = 0;
            o_stride[0] = 0;
        }
        let params = AttnParams {
            q_stride,
            k_stride: cache_layout.strides.map(u),
            v_stride: cache_layout.strides.map(u),
            o_stride,
            batch: batch as u32,
            nheads: rh as u32,
            nheads_k: nheads_k as u32,
            seqlen_q: rq as u32,
            seqlen_k: seqlen_k as u32,
            headdim: d as u32,
            causal: key.causal as u32,
            cache_batch: geom.n_rows as u32,
            seqlen_new: s_new as u32,
            page_size: if geom.paged { geom.rows_per as u32 } else { 0 },
            num_pages: if geom.paged { geom.n_rows as u32 } else { 0 },
            num_splits: ns as u32,
            total_q: if varlen.is_some() { q_rows as u32 } else { 0 },
            // Prefix sums of key lengths index pages, not rows: any value
            // is clamped to seqlen_k per sequence.
            total_k: if varlen.is_some() { i32::MAX as u32 } else { 0 },
            br: br as u32,
            bc: bc as u32,
            split_tickets: split_tickets as u32 | if interleave_paged { INTERLEAVE_PAGED } else { 0 },
            ..opts_r.kernel_params()
        };
        Ok(AttendPlan {
            main,
            ns,
            grid,
            nheads,
            sq,
            o_layout,
            lse_len,
            varlen: varlen.map(|_| q_rows),
            dec,
            compact,
            params,
        })
    }
}

/// The FP8-cache kernel of a call (`rq` rows per (sequence, head) as
/// launched; `forced`: `DecodeOptions::kernel`, which may name one of
/// [`DEC_F8_KERNELS`](super::kernels::DEC_F8_KERNELS) of the call's dtype and head dim;
/// `page`: the page size of a paged cache).
fn fp8_kernel_for(dtype: DType, d: usize, rq: usize, forced: Option<&str>, page: Option<usize>, max_smem: usize) -> Result<&'static DecKernel> {
    if rq > DecKernel::BR {
        return Err(FlashAttnError::Unsupported {
            argument: "q",
            dtype: dtype.name(),
            what: "an FP8 KV cache with more than 16 query rows per (sequence, head) as launched (the FP8 cache is read by the flash-decoding kernels only)",
        });
    }
    if let Some(name) = forced {
        return DecKernel::fp8_fitting(dtype == DType::BF16, d, Some(name), page, max_smem)
            .ok_or_else(|| invalid("opts.kernel", name.to_string(), "an FP8 cache runs an FP8 flash-decoding kernel (DEC_F8_KERNELS) of its dtype and head dim that fits the device"));
    }
    DecKernel::fp8_fitting(dtype == DType::BF16, d, None, page, max_smem).ok_or(FlashAttnError::Unsupported {
        argument: "k_cache",
        dtype: dtype.name(),
        what: "an FP8 KV cache on this device (no FP8 flash-decoding kernel of this head dim fits its shared memory)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_kernels_cover_every_16_multiple_head_dim_and_fit_hopper() {
        for d in [32, 64, 96, 128, 160, 192, 224, 256] {
            for bf16 in [false, true] {
                let dt = if bf16 { DType::BF16 } else { DType::F16 };
                for page in [None, Some(16), Some(48), Some(256)] {
                    let k = fp8_kernel_for(dt, d, 1, None, page, 227 * 1024).unwrap();
                    assert!(k.fp8 && k.d == d && k.bf16 == bf16);
                    assert!(fp8_kernel_for(dt, d, 1, Some(k.name), page, 227 * 1024).is_ok());
                    assert!(fp8_kernel_for(dt, d, 1, Some("flash_fwd_tc_dec_bf16_d128_w8_bc128_s3"), page, 227 * 1024).is_err());
                }
            }
        }
        assert!(fp8_kernel_for(DType::BF16, 128, 17, None, None, 227 * 1024).is_err());
    }

    /// d = 128: Bc 128 (three stages) on contiguous caches and pages of
    /// whole blocks; pages smaller than a block or unaligned to it go to
    /// Bc 64 (lookups per row in batches); a forced kernel stays forced.
    #[test]
    fn fp8_kernel_by_page_size() {
        let pick = |page| fp8_kernel_for(DType::BF16, 128, 1, None, page, 227 * 1024).unwrap();
        for page in [None, Some(128), Some(256), Some(1024)] {
            let k = pick(page);
            assert_eq!((k.warps, k.bc, k.stages), (4, 128, 3), "{page:?}");
        }
        for page in [Some(16), Some(64), Some(48), Some(192)] {
            assert_eq!(pick(page).bc, 64, "{page:?}");
        }
        let forced = fp8_kernel_for(DType::BF16, 128, 1, Some("flash_fwd_tc_dec_bf16_e4m3_d128_w4_bc64_s4"), None, 227 * 1024).unwrap();
        assert_eq!(forced.bc, 64);
        // A device whose blocks get less shared memory (the Bc 128 build's
        // 101 KB do not fit): the next build that does.
        assert_eq!(fp8_kernel_for(DType::BF16, 128, 1, None, None, 99 * 1024).unwrap().bc, 64);
    }
}
