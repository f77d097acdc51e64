//! The flash-decoding kernels (`kernel-crate/src/tc/flash_decode.rs`): one
//! m-tile of 16 query rows per block whose warps split the keys of each
//! K/V block. They serve KV-cache calls with at most 16 query rows per
//! (sequence, head) as launched — one token, the `g` packed query heads of
//! a GQA group, or a few speculative tokens; calls with more rows take the
//! `fa2d` tile kernels.

use flash_attn_common::tc::{DEC_BR, dec_f8_smem_bytes, dec_smem_bytes};

/// One compiled flash-decoding configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecKernel {
    pub name: &'static str,
    pub bf16: bool,
    /// Head dim (compiled; the caller's may be smaller: zero-padded).
    pub d: usize,
    pub warps: usize,
    /// Keys per K/V block (`Bc`; `Bc / warps` per warp).
    pub bc: usize,
    /// Shared-memory stages of K/V blocks in flight.
    pub stages: usize,
    /// The entry taking the compact parameter block
    /// (`flash_attn_common::DecodeParams`, 184 bytes: launches 0.3–0.85 µs
    /// sooner than with the 336-byte `AttnParams`; docs/perf-notes.md decode
    /// step 17), compiled for the default configurations.
    pub compact: Option<&'static str>,
    /// Built with the ticket schedule beside the static loop
    /// (`AttnParams::split_tickets`, [`crate::decode::DecodeOptions::deterministic`]):
    /// the d = 128 kernels but the 4-warp Bc-64 3-stage one (the page-16
    /// default), which keeps the static loop alone (the ticket loop beside
    /// it cost it 2–4%: docs/perf-notes.md decode step 18).
    pub tickets: bool,
    /// Built with the k/v append fused in (`AttnParams::knew_ptr`: the kernel
    /// writes the new rows it reads; decode step 21): the kernels with
    /// `tickets`, and `_pga`, the append build of the `_pg` default over
    /// small pages, which a call with new rows runs instead
    /// ([`DecKernel::with_append`]; decode step 24). The others run after an
    /// append launch (the path's registers cost the 4-warp page-16 kernel
    /// 2.5–3.5% on every call, decode step 21: so calls without new rows
    /// keep the build without it).
    pub append: bool,
    /// Built for pages smaller than its key block (`PAGE_BATCH`): a thread
    /// looks up the pages of all its rows of a block before it issues their
    /// copies (decode step 22). The 3-stage 8-warp `_pg` build is the default
    /// over such pages where it fits.
    pub small_pages: bool,
    /// Reads an FP8 (e4m3) cache ([`DEC_F8_KERNELS`]): K/V codes staged in
    /// shared memory and converted there to the call's 16-bit type, the
    /// scales applied to the scores and to O (`F8` in
    /// `kernel-crate/src/tc/flash_decode.rs`).
    pub fp8: bool,
}

macro_rules! dec_table {
    ($( $name:ident $(/ $compact:ident)? $bf:literal $d:literal $w:literal $bc:literal $s:literal $tk:literal $ap:literal $pb:literal; )*) => {
        /// Every flash-decoding kernel compiled into the PTX (mirrors the
        /// `dec_kernels!` list of `kernel-crate/src/tc/mod.rs`), the default
        /// of each (dtype, head dim) first.
        pub const DEC_KERNELS: &[DecKernel] = &[$(
            DecKernel { name: stringify!($name), bf16: $bf, d: $d, warps: $w, bc: $bc, stages: $s, compact: dec_table!(@c $($compact)?), tickets: $tk, append: $ap, small_pages: $pb, fp8: false },
        )*];
    };
    (@c $c:ident) => { Some(stringify!($c)) };
    (@c) => { None };
}

// The 8-warp d = 128 kernels issue their K/V copies with an `L2::128B`
// prefetch hint in the sm_90 builds (`pf = 128` in the kernel list; H100,
// decode-tune: 1–2% faster on long caches, docs/perf-notes.md decode step 10).
// Their 3-stage build comes first (196 KB of shared memory: the H100's
// default; with the ticket schedule on long caches and alone on GQA 32k it
// streamed 1–2% faster than 2 stages, decode step 18); where it does not fit
// (an A100's 164 KB) the 2-stage build is the first that does. The 8-warp
// page-batched `_pg` build (small pages, and every call without tickets or new
// k/v: `DecKernel::without_tickets`) holds Q's fragments in registers
// (`qreg = true` in the kernel list: 0.2–0.8 µs faster on GQA calls than
// re-reading them from shared memory every block, decode step 31).
dec_table! {
    flash_fwd_tc_dec_f16_d32_w4_bc64_s3 / flash_fwd_tc_dec_f16_d32_w4_bc64_s3_c false 32 4 64 3 false false false;
    flash_fwd_tc_dec_bf16_d32_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d32_w4_bc64_s3_c true 32 4 64 3 false false false;
    flash_fwd_tc_dec_f16_d64_w4_bc64_s3 / flash_fwd_tc_dec_f16_d64_w4_bc64_s3_c false 64 4 64 3 false false false;
    flash_fwd_tc_dec_bf16_d64_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d64_w4_bc64_s3_c true 64 4 64 3 false false false;
    flash_fwd_tc_dec_f16_d96_w4_bc64_s3 / flash_fwd_tc_dec_f16_d96_w4_bc64_s3_c false 96 4 64 3 false false false;
    flash_fwd_tc_dec_bf16_d96_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d96_w4_bc64_s3_c true 96 4 64 3 false false false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3 / flash_fwd_tc_dec_f16_d128_w8_bc128_s3_c false 128 8 128 3 true true false;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3 / flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_c true 128 8 128 3 true true false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s2 / flash_fwd_tc_dec_f16_d128_w8_bc128_s2_c false 128 8 128 2 true true false;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s2 / flash_fwd_tc_dec_bf16_d128_w8_bc128_s2_c true 128 8 128 2 true true false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pg / flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pg_c false 128 8 128 3 false false true;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pg / flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pg_c true 128 8 128 3 false false true;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pga false 128 8 128 3 false true true;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pga true 128 8 128 3 false true true;
    flash_fwd_tc_dec_f16_d128_w4_bc64_s2 false 128 4 64 2 true true false;
    flash_fwd_tc_dec_bf16_d128_w4_bc64_s2 true 128 4 64 2 true true false;
    flash_fwd_tc_dec_f16_d128_w4_bc64_s3 / flash_fwd_tc_dec_f16_d128_w4_bc64_s3_c false 128 4 64 3 false false true;
    flash_fwd_tc_dec_bf16_d128_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d128_w4_bc64_s3_c true 128 4 64 3 false false true;
    flash_fwd_tc_dec_f16_d128_w4_bc128_s2 false 128 4 128 2 true true false;
    flash_fwd_tc_dec_bf16_d128_w4_bc128_s2 true 128 4 128 2 true true false;
    flash_fwd_tc_dec_f16_d160_w4_bc64_s2 / flash_fwd_tc_dec_f16_d160_w4_bc64_s2_c false 160 4 64 2 false false false;
    flash_fwd_tc_dec_bf16_d160_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d160_w4_bc64_s2_c true 160 4 64 2 false false false;
    flash_fwd_tc_dec_f16_d192_w4_bc64_s2 / flash_fwd_tc_dec_f16_d192_w4_bc64_s2_c false 192 4 64 2 false false false;
    flash_fwd_tc_dec_bf16_d192_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d192_w4_bc64_s2_c true 192 4 64 2 false false false;
    flash_fwd_tc_dec_f16_d224_w4_bc64_s2 / flash_fwd_tc_dec_f16_d224_w4_bc64_s2_c false 224 4 64 2 false false false;
    flash_fwd_tc_dec_bf16_d224_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d224_w4_bc64_s2_c true 224 4 64 2 false false false;
    flash_fwd_tc_dec_f16_d256_w4_bc64_s2 / flash_fwd_tc_dec_f16_d256_w4_bc64_s2_c false 256 4 64 2 false false false;
    flash_fwd_tc_dec_bf16_d256_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d256_w4_bc64_s2_c true 256 4 64 2 false false false;
}

macro_rules! dec_f8_table {
    ($( $name:ident $bf:literal $d:literal $w:literal $bc:literal $s:literal; )*) => {
        /// The flash-decoding kernels over an FP8 (e4m3) KV cache (mirrors
        /// the `dec_f8_kernels!` list of `kernel-crate/src/tc/mod.rs`; in the
        /// sm_90 builds only), the default of each (dtype, head dim) first:
        /// the static split schedule, no fused append, no compact entry,
        /// stages of one-byte codes. At d = 128, 4 warps × Bc 128 with three
        /// stages (two blocks per SM) streams 3.3–4.0 TB/s of codes on
        /// contiguous caches and pages of whole blocks (H200, bf16 q, 32k and
        /// 131k keys), 4 warps × Bc 64 with four 2.8–3.3, 8 warps × Bc 128
        /// 2.7–3.0; pages smaller than a block go to Bc 64, whose copies
        /// look pages up per row in batches (2.3–2.6 TB/s over 16-token
        /// pages, Bc 128: 1.9–2.1; docs/perf-notes.md, FP8 KV cache step 5).
        pub const DEC_F8_KERNELS: &[DecKernel] = &[$(
            DecKernel { name: stringify!($name), bf16: $bf, d: $d, warps: $w, bc: $bc, stages: $s, compact: None, tickets: false, append: false, small_pages: false, fp8: true },
        )*];
    };
}

dec_f8_table! {
    flash_fwd_tc_dec_f16_e4m3_d32_w4_bc64_s4 false 32 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d32_w4_bc64_s4 true 32 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d64_w4_bc64_s4 false 64 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d64_w4_bc64_s4 true 64 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d96_w4_bc64_s4 false 96 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d96_w4_bc64_s4 true 96 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d128_w4_bc128_s3 false 128 4 128 3;
    flash_fwd_tc_dec_bf16_e4m3_d128_w4_bc128_s3 true 128 4 128 3;
    flash_fwd_tc_dec_f16_e4m3_d128_w4_bc64_s4 false 128 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d128_w4_bc64_s4 true 128 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d128_w8_bc128_s4 false 128 8 128 4;
    flash_fwd_tc_dec_bf16_e4m3_d128_w8_bc128_s4 true 128 8 128 4;
    flash_fwd_tc_dec_f16_e4m3_d160_w4_bc64_s4 false 160 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d160_w4_bc64_s4 true 160 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d192_w4_bc64_s4 false 192 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d192_w4_bc64_s4 true 192 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d224_w4_bc64_s4 false 224 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d224_w4_bc64_s4 true 224 4 64 4;
    flash_fwd_tc_dec_f16_e4m3_d256_w4_bc64_s4 false 256 4 64 4;
    flash_fwd_tc_dec_bf16_e4m3_d256_w4_bc64_s4 true 256 4 64 4;
}

impl DecKernel {
    /// Query rows per block.
    pub const BR: usize = DEC_BR;

    pub const fn br(&self) -> usize {
        DEC_BR
    }

    pub const fn threads(&self) -> u32 {
        32 * self.warps as u32
    }

    pub const fn smem_bytes(&self) -> usize {
        if self.fp8 { dec_f8_smem_bytes(self.d, self.warps, self.bc, self.stages) } else { dec_smem_bytes(self.d, self.warps, self.bc, self.stages) }
    }

    /// The FP8-cache kernel for a dtype and compiled head dim whose shared
    /// memory fits `max_smem_bytes`, or the one named `name`: the first of
    /// [`DEC_F8_KERNELS`] whose key block a page holds whole (`page`: the
    /// page size of a paged cache; any block for a contiguous cache), else
    /// (smaller or unaligned pages) the first with Bc = 64, whose copies
    /// look their rows' pages up together, else the first that fits.
    pub fn fp8_fitting(bf16: bool, d: usize, name: Option<&str>, page: Option<usize>, max_smem_bytes: usize) -> Option<&'static DecKernel> {
        let fits = move |k: &&'static DecKernel| k.bf16 == bf16 && k.d == d && k.smem_bytes() <= max_smem_bytes && name.is_none_or(|n| n == k.name);
        DEC_F8_KERNELS
            .iter()
            .filter(fits)
            .find(|k| page.is_none_or(|ps| ps % k.bc == 0))
            .or_else(|| DEC_F8_KERNELS.iter().filter(fits).find(|k| k.bc == 64))
            .or_else(|| DEC_F8_KERNELS.iter().find(fits))
    }

    /// Whether a call without an explicit kernel runs this kernel's compact
    /// entry over a cache layout (`page`: the page size of a paged cache):
    /// where one is compiled, except for the 4-warp page-16 build over
    /// pages smaller than its key block, whose compact build streams 0.5–1%
    /// slower on long caches there than its launch saves (a page lookup per
    /// row; docs/perf-notes.md decode step 17). The 8-warp page-batched
    /// build runs compact over small pages (measured so, decode step 22).
    pub fn compact_by_default(&self, page: Option<usize>) -> bool {
        self.compact.is_some() && page.is_none_or(|rows| rows % self.bc == 0 || (self.small_pages && self.warps == 8))
    }

    /// Looks a configuration up by kernel name.
    pub fn by_name(name: &str) -> Option<&'static DecKernel> {
        DEC_KERNELS.iter().find(|k| k.name == name)
    }

    /// Looks a configuration up by the name of its compact entry.
    pub fn by_compact_name(name: &str) -> Option<&'static DecKernel> {
        DEC_KERNELS.iter().find(|k| k.compact == Some(name))
    }

    /// The default for a dtype, compiled head dim and cache layout (`page`:
    /// the page size of a paged cache) whose shared memory fits
    /// `max_smem_bytes`. Measured on the H100 (bf16, d = 128, `decode-tune`,
    /// docs/bench/decode/tune.md): contiguous caches prefer 8 warps × Bc =
    /// 128 (2.57 TB/s at 32k keys, MHA, batch 1; 4 warps × Bc = 64: 2.47);
    /// so do paged caches whose pages hold whole blocks (page size a
    /// multiple of Bc: one page lookup per block; page 256: 2.57), while
    /// smaller pages look a page up per 16-byte chunk and prefer 4 warps ×
    /// Bc = 64 with three stages (two blocks per SM: page 16, 131k keys,
    /// MHA: 2.79 TB/s; two stages 2.49, 8 warps × Bc 128 2.19 — more warps
    /// issuing, more blocks in flight hide the lookups; one block per SM
    /// with four stages: 1.59).
    pub fn default_fitting(bf16: bool, d: usize, page: Option<usize>, max_smem_bytes: usize) -> Option<&'static DecKernel> {
        let fits = move |k: &&'static DecKernel| k.bf16 == bf16 && k.d == d && k.smem_bytes() <= max_smem_bytes;
        let first = DEC_KERNELS.iter().find(fits);
        let Some(ps) = page else { return first };
        DEC_KERNELS
            .iter()
            .filter(fits)
            .find(|k| ps % k.bc == 0 && !k.small_pages)
            .or_else(|| DEC_KERNELS.iter().filter(fits).find(|k| k.small_pages))
            .or_else(|| DEC_KERNELS.iter().filter(fits).find(|k| k.warps == 4 && k.bc == 64 && k.stages == 3))
            .or_else(|| DEC_KERNELS.iter().filter(fits).find(|k| k.warps == 4 && k.bc == 64))
            .or(first)
    }

    /// This kernel, or the build of its configuration without the ticket
    /// loop and the fused append (the page-batched one, whose copies of a
    /// contiguous cache take the same path) when it has them and one exists:
    /// what a call runs that draws no ticket and appends nothing. Since the
    /// K/V stages are swizzled (decode step 29) the ticket build runs GQA
    /// 32/8 at 32k keys (16 key blocks per split: no ticket) 1 µs behind
    /// it on a contiguous cache (54.5 against 53.5 µs, H100).
    pub fn without_tickets(&'static self) -> &'static DecKernel {
        if !self.tickets && !self.append {
            return self;
        }
        DEC_KERNELS
            .iter()
            .find(|k| !k.tickets && !k.append && k.small_pages && k.bf16 == self.bf16 && k.d == self.d && k.warps == self.warps && k.bc == self.bc && k.stages == self.stages)
            .unwrap_or(self)
    }

    /// This kernel, or its build with the k/v append fused in (the same
    /// configuration and page handling) when it has none and one exists:
    /// what a call with new keys and values runs (decode step 24).
    pub fn with_append(&'static self) -> &'static DecKernel {
        if self.append {
            return self;
        }
        DEC_KERNELS
            .iter()
            .find(|k| k.append && k.bf16 == self.bf16 && k.d == self.d && k.warps == self.warps && k.bc == self.bc && k.stages == self.stages && k.small_pages == self.small_pages)
            .unwrap_or(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flash_attn_common::decode_params::DECODE_PARAMS_BYTES;
    use flash_attn_common::{AttnParams, DecodeParams};

    #[test]
    fn d128_defaults_follow_the_page_size() {
        let pick = |page| DecKernel::default_fitting(true, 128, page, 227 * 1024).unwrap();
        assert_eq!((pick(None).warps, pick(None).bc, pick(None).stages), (8, 128, 3));
        // An A100's 164 KB: the 2-stage build.
        let a100 = DecKernel::default_fitting(true, 128, None, 164 * 1024).unwrap();
        assert_eq!((a100.warps, a100.bc, a100.stages), (8, 128, 2));
        assert_eq!((pick(Some(256)).warps, pick(Some(256)).bc), (8, 128));
        assert!(!pick(Some(256)).small_pages && pick(Some(16)).small_pages && pick(Some(48)).small_pages);
        assert_eq!((pick(Some(64)).warps, pick(Some(64)).bc), (4, 64));
        assert_eq!((pick(Some(16)).warps, pick(Some(16)).bc, pick(Some(16)).stages), (8, 128, 3));
        assert_eq!((pick(Some(48)).warps, pick(Some(48)).bc), (8, 128));
        // An A100: the 4-warp page-batched build over 16-token pages.
        let a100 = DecKernel::default_fitting(true, 128, Some(16), 164 * 1024).unwrap();
        assert_eq!((a100.warps, a100.bc, a100.stages, a100.small_pages), (4, 64, 3, true));
    }

    #[test]
    fn calls_without_tickets_run_the_build_without_the_ticket_loop() {
        for bf16 in [false, true] {
            let k = DecKernel::default_fitting(bf16, 128, None, 227 * 1024).unwrap();
            assert!(k.tickets && k.append);
            let s = k.without_tickets();
            assert_eq!((s.bf16, s.d, s.warps, s.bc, s.stages), (k.bf16, k.d, k.warps, k.bc, k.stages));
            assert!(!s.tickets && !s.append && s.small_pages && s.compact.is_some());
            // Kernels without the loop stay; so does a configuration with no
            // such sibling (the A100's 2-stage default).
            assert_eq!(s.without_tickets(), s);
            let a100 = DecKernel::default_fitting(bf16, 128, None, 164 * 1024).unwrap();
            assert_eq!(a100.without_tickets(), a100);
        }
    }

    #[test]
    fn compact_entries_by_layout() {
        let pick = |page| DecKernel::default_fitting(true, 128, page, 227 * 1024).unwrap();
        // Contiguous, pages holding whole blocks, and the 8-warp page-batched
        // build over small pages: compact.
        assert!(pick(None).compact_by_default(None));
        assert!(pick(Some(256)).compact_by_default(Some(256)));
        assert!(pick(Some(16)).compact_by_default(Some(16)));
        // The 4-warp page-batched build over pages smaller than its block: not.
        let a100 = DecKernel::default_fitting(true, 128, Some(16), 164 * 1024).unwrap();
        assert!(!a100.compact_by_default(Some(16)) && a100.compact_by_default(Some(64)));
        // Builds without a compact entry: never.
        let pga = pick(Some(16)).with_append();
        assert!(pga.compact.is_none() && !pga.compact_by_default(Some(16)));
    }

    #[test]
    fn calls_with_new_rows_take_the_append_build() {
        let pick = |page| DecKernel::default_fitting(true, 128, page, 227 * 1024).unwrap();
        // Contiguous and whole-block pages: the default appends itself.
        assert_eq!(pick(None).with_append(), pick(None));
        assert!(pick(Some(256)).with_append().append);
        // 16-token pages: the `_pg` default has no append path; its `_pga`
        // build has, with the same configuration and page batching.
        let (pg, pga) = (pick(Some(16)), pick(Some(16)).with_append());
        assert!(!pg.append && pga.append && pga.name == format!("{}a", pg.name));
        assert_eq!((pga.warps, pga.bc, pga.stages, pga.small_pages, pga.bf16, pga.d), (pg.warps, pg.bc, pg.stages, pg.small_pages, pg.bf16, pg.d));
        assert!(pga.compact.is_none(), "the compact block cannot carry new rows");
        // No append build: itself (the call appends in a launch first).
        let a100 = DecKernel::default_fitting(true, 128, Some(16), 164 * 1024).unwrap();
        assert_eq!(a100.with_append(), a100);
        let d64 = DecKernel::default_fitting(false, 64, None, 227 * 1024).unwrap();
        assert_eq!(d64.with_append(), d64);
    }

    #[test]
    fn every_head_dim_has_a_default_that_fits_an_a100() {
        for &d in crate::tc::TC_HEAD_DIMS {
            for (bf16, page) in [(false, None), (false, Some(16)), (true, Some(256)), (true, Some(48))] {
                let k = DecKernel::default_fitting(bf16, d, page, 163 * 1024).unwrap_or_else(|| panic!("d = {d}"));
                assert!(k.bc.is_multiple_of(16 * k.warps) && k.stages >= 2, "{k:?}");
                assert!(k.name.contains(if bf16 { "_bf16_" } else { "_f16_" }) && k.name.contains(&format!("_d{d}_")), "{k:?}");
                assert_eq!(k.compact.map(String::from), Some(format!("{}_c", k.name)), "every default has a compact entry: {k:?}");
            }
        }
    }


    /// A plain paged GQA split-KV decode call's block, as the host fills it.
    fn plain() -> AttnParams {
        AttnParams {
            q_ptr: 0x7f00_0000_1000,
            k_ptr: 0x7f00_1000_0000,
            v_ptr: 0x7f00_2000_0000,
            o_ptr: 0x7f00_0000_2000,
            lse_ptr: 0x7f00_0000_3000,
            o_accum_ptr: 0x7f00_0000_4000,
            q_stride: [4096, 128, 512],
            k_stride: [16 * 8 * 128, 8 * 128, 128],
            v_stride: [16 * 8 * 128, 8 * 128, 128],
            o_stride: [4096, 128, 512],
            batch: 3,
            nheads: 8,
            seqlen_q: 4,
            seqlen_k: 5000,
            headdim: 128,
            causal: 0,
            softmax_scale: 0.088388,
            softmax_scale_log2: 0.127516,
            br: 16,
            bc: 64,
            nheads_k: 8,
            window_left: -1,
            window_right: -1,
            cache_seqlens_ptr: 0x7f00_0000_5000,
            cache_batch: 3,
            seqlen_new: 1,
            block_table_ptr: 0x7f00_0000_6000,
            block_table_stride: 313,
            page_size: 16,
            num_pages: 939,
            num_splits: 7,
            lse_accum_ptr: 0x7f00_0000_7000,
            split_counter_ptr: 0x7f00_0000_8000,
            ..AttnParams::default()
        }
    }

    #[test]
    fn a_plain_call_round_trips_in_184_bytes() {
        assert_eq!(DECODE_PARAMS_BYTES, 184);
        // The flags word carries causal and the ticket schedule.
        for (causal, split_tickets) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let p = AttnParams { causal, split_tickets, ..plain() };
            let c = DecodeParams::from_attn(&p, 16, 64).expect("a plain call is compact");
            assert_eq!(c.to_attn(16, 64), p);
        }
    }

    #[test]
    fn what_the_block_cannot_carry_is_refused() {
        let base = plain();
        let refused: [(&str, AttnParams); 16] = [
            ("alibi", AttnParams { alibi_ptr: 8, ..base }),
            ("alibi stride", AttnParams { alibi_batch_stride: 1, ..base }),
            ("softcap", AttnParams { softcap: 30.0, ..base }),
            ("softcap_pre", AttnParams { softcap_pre: -0.0, ..base }),
            ("varlen q", AttnParams { cu_seqlens_q_ptr: 8, total_q: 9, ..base }),
            ("varlen k", AttnParams { cu_seqlens_k_ptr: 8, ..base }),
            ("seqused_k", AttnParams { seqused_k_ptr: 8, ..base }),
            ("cache_batch_idx", AttnParams { cache_batch_idx_ptr: 8, ..base }),
            ("timeline", AttnParams { scratch_ptr: 8, ..base }),
            ("fa1 m", AttnParams { m_ptr: 8, ..base }),
            ("wide stride", AttnParams { k_stride: [1 << 32, 1024, 128], ..base }),
            ("many heads", AttnParams { nheads: 1 << 16, ..base }),
            ("big page", AttnParams { page_size: 1 << 16, ..base }),
            ("other bc", AttnParams { bc: 128, ..base }),
            ("causal not a flag", AttnParams { causal: 2, ..base }),
            ("tickets not two flags", AttnParams { split_tickets: 4, ..base }),
        ];
        for (what, p) in refused {
            assert!(DecodeParams::from_attn(&p, 16, 64).is_none(), "{what}");
        }
    }
}
