//! The KV-cache call into caller-owned buffers
//! (`FlashAttention::forward_kvcache_into`): the allocating call's bits, O
//! at any strides with the elements between left alone, typed errors for
//! bad outputs raised before anything is enqueued (the cache untouched),
//! and a decode loop captured once in a CUDA graph and replayed step after
//! step, and a decode loop over an address-ordered block table
//! (`order_block_table`) — every step against the f64 reference (O within
//! 3 × the naive bf16 error, the logsumexp within 1e-4) and the cache
//! compared exactly.

use cudarc::driver::{CudaSlice, DevicePtrMut, sys};
use flash_attn::{
    BlockTable, DecodeOptions, Extras, FlashAttnError, ForwardParams, KvCache, KvCacheCall, KvCacheRef, SplitScratch, Tensor, TensorLayout,
    TensorMut, order_block_table,
};
use flash_attn_tests::features::{Spec, assert_matches_reference, random};
use flash_attn_tests::{Gpu, Rng, gpu};
use half::bf16;
use ndarray::{Array3, Array4, Axis, s};

/// A paged GQA decode state: 3 sequences, 8 query heads over 2 KV heads (one
/// query token: head packing), d = 128, 16-token pages of a pool with spare
/// pages in a random order; the host's model of the cache beside the
/// device's, and the current step's q and new keys and values.
struct PagedDecode {
    /// Keys cached per sequence (the model's).
    lens: Vec<usize>,
    k_log: Array4<bf16>,
    v_log: Array4<bf16>,
    table: Vec<i32>,
    q: Array4<bf16>,
    k_new: Array4<bf16>,
    v_new: Array4<bf16>,
    kc: CudaSlice<bf16>,
    vc: CudaSlice<bf16>,
    table_d: CudaSlice<i32>,
    seqlens_d: CudaSlice<i32>,
    q_d: CudaSlice<bf16>,
    knew_d: CudaSlice<bf16>,
    vnew_d: CudaSlice<bf16>,
}

impl PagedDecode {
    const B: usize = 3;
    const H: usize = 8;
    const HK: usize = 2;
    const D: usize = 128;
    const PAGE: usize = 16;
    /// Pages per sequence (capacity 512 keys).
    const PER: usize = 32;
    /// Pages of the pool (spare ones never in the table).
    const POOL: usize = Self::B * Self::PER + 5;

    fn new(g: &Gpu, rng: &mut Rng, lens: [usize; 3]) -> Self {
        let s = &g.stream;
        let (b, hk, d, cap) = (Self::B, Self::HK, Self::D, Self::PER * Self::PAGE);
        let mut perm: Vec<usize> = (0..Self::POOL).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let table: Vec<i32> = perm[..b * Self::PER].iter().map(|&x| x as i32).collect();
        let k_log = random::<bf16>(rng, (b, cap, hk, d));
        let v_log = random::<bf16>(rng, (b, cap, hk, d));
        let (q, k_new, v_new) = (random::<bf16>(rng, (b, 1, Self::H, d)), random::<bf16>(rng, (b, 1, hk, d)), random::<bf16>(rng, (b, 1, hk, d)));
        let up = |a: &Array4<bf16>| s.clone_htod(a.as_slice().unwrap()).unwrap();
        Self {
            kc: up(&Self::physical(&table, &k_log)),
            vc: up(&Self::physical(&table, &v_log)),
            table_d: s.clone_htod(&table).unwrap(),
            seqlens_d: s.clone_htod(&lens.map(|l| l as i32)).unwrap(),
            q_d: up(&q),
            knew_d: up(&k_new),
            vnew_d: up(&v_new),
            lens: lens.to_vec(),
            k_log,
            v_log,
            table,
            q,
            k_new,
            v_new,
        }
    }

    fn lens_i32(&self) -> Vec<i32> {
        self.lens.iter().map(|&l| l as i32).collect()
    }

    /// The pool `(POOL, PAGE, HK, D)` holding a logical cache through
    /// `table` (spare pages 0).
    fn physical(table: &[i32], log: &Array4<bf16>) -> Array4<bf16> {
        let mut p = Array4::from_elem((Self::POOL, Self::PAGE, Self::HK, Self::D), bf16::ZERO);
        for b in 0..Self::B {
            for t in 0..Self::PER * Self::PAGE {
                let page = table[b * Self::PER + t / Self::PAGE] as usize;
                p.slice_mut(s![page, t % Self::PAGE, .., ..]).assign(&log.slice(s![b, t, .., ..]));
            }
        }
        p
    }

    /// Fresh q and new keys and values, written into the same device buffers.
    fn next_inputs(&mut self, g: &Gpu, rng: &mut Rng) {
        let s = &g.stream;
        self.q = random::<bf16>(rng, self.q.dim());
        self.k_new = random::<bf16>(rng, self.k_new.dim());
        self.v_new = random::<bf16>(rng, self.v_new.dim());
        s.memcpy_htod(self.q.as_slice().unwrap(), &mut self.q_d).unwrap();
        s.memcpy_htod(self.k_new.as_slice().unwrap(), &mut self.knew_d).unwrap();
        s.memcpy_htod(self.v_new.as_slice().unwrap(), &mut self.vnew_d).unwrap();
        s.memcpy_htod(&self.lens_i32(), &mut self.seqlens_d).unwrap();
    }

    /// The KV-cache call's cache (the new keys and values appended) and q.
    fn call_inputs(&mut self) -> (KvCache<'_, bf16>, &CudaSlice<bf16>) {
        let new_l = TensorLayout::contiguous([Self::B, 1, Self::HK, Self::D]);
        let Self { kc, vc, table_d, seqlens_d, knew_d, vnew_d, q_d, .. } = self;
        let cache = KvCache::new(kc, vc, Self::cache_layout(), &*seqlens_d)
            .with_block_table(BlockTable::new(&*table_d, Self::PER))
            .with_new(Tensor::new(&*knew_d, new_l), Tensor::new(&*vnew_d, new_l));
        (cache, &*q_d)
    }

    fn cache_layout() -> TensorLayout {
        TensorLayout::contiguous([Self::POOL, Self::PAGE, Self::HK, Self::D])
    }

    fn q_layout() -> TensorLayout {
        TensorLayout::contiguous([Self::B, 1, Self::H, Self::D])
    }

    fn lse_len() -> usize {
        Self::B * Self::H
    }

    /// The device cache, as the pool's bytes.
    fn cache_bits(&self, g: &Gpu) -> (Vec<u16>, Vec<u16>) {
        let bits = |c: &CudaSlice<bf16>| g.stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect();
        (bits(&self.kc), bits(&self.vc))
    }

    /// Checks a step's O `(B, 1, H, D)` and LSE `(B, H)` against the f64
    /// reference over each sequence's cached keys and its new one, and the
    /// device cache exactly (the new rows at `lens[b]`, the rest as before);
    /// then counts the new keys in the model.
    fn check_step(&mut self, g: &Gpu, label: &str, o: &Array4<bf16>, lse: &Array3<f32>) {
        for b in 0..Self::B {
            let t = self.lens[b];
            self.k_log.slice_mut(s![b, t, .., ..]).assign(&self.k_new.slice(s![b, 0, .., ..]));
            self.v_log.slice_mut(s![b, t, .., ..]).assign(&self.v_new.slice(s![b, 0, .., ..]));
        }
        let (kp, vp) = (Self::physical(&self.table, &self.k_log), Self::physical(&self.table, &self.v_log));
        let (kb, vb) = self.cache_bits(g);
        let want = |a: &Array4<bf16>| a.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        // Spare pages: zeros before and after (never written).
        assert!(kb == want(&kp) && vb == want(&vp), "{label}: the cache after the append");
        let spec = Spec { params: ForwardParams::default(), alibi: None, norm_seqlen_k: Some(Self::PER * Self::PAGE) };
        for b in 0..Self::B {
            let len = self.lens[b] + 1;
            let qb = self.q.slice(s![b..b + 1, .., .., ..]).to_owned();
            let kb = self.k_log.slice(s![b..b + 1, ..len, .., ..]).to_owned();
            let vb = self.v_log.slice(s![b..b + 1, ..len, .., ..]).to_owned();
            let ob = o.slice(s![b..b + 1, .., .., ..]);
            assert_matches_reference(&format!("{label} seq {b} ({len} keys)"), &qb, &kb, &vb, ob, lse.index_axis(Axis(0), b).iter().copied(), &spec, 3.0);
        }
        for l in &mut self.lens {
            *l += 1;
        }
    }
}

/// O `(B, 1, H, D)` at `layout` in `buf`, and the LSE `(B, H, 1)`, to the host.
/// The graph tests switch cudarc's event tracking off for the whole context
/// while they allocate (a captured graph cannot wait on events recorded
/// outside it), and the tests of a binary share one context: run them one at
/// a time (concurrent, a capture met another test's events:
/// CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn download(g: &Gpu, buf: &CudaSlice<bf16>, layout: TensorLayout, lse: &CudaSlice<f32>) -> (Array4<bf16>, Array3<f32>) {
    let all = g.stream.clone_dtoh(buf).unwrap();
    let [sb, sn, sh] = layout.strides;
    let o = Array4::from_shape_fn((PagedDecode::B, 1, PagedDecode::H, PagedDecode::D), |(b, n, h, c)| all[b * sb + n * sn + h * sh + c]);
    let lse = Array3::from_shape_vec((PagedDecode::B, PagedDecode::H, 1), g.stream.clone_dtoh(lse).unwrap()).unwrap();
    (o, lse)
}

fn bits(a: &Array4<bf16>) -> Vec<u16> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// `forward_kvcache_into` against `forward_kvcache` on the same state
/// (deterministic, 3 splits, the library's scratch): the same bits, O at
/// padded head strides with the padding left as it was (and the same with
/// no split, and with 17 causal query rows, split or not: the tile kernel
/// after its own append launch); then every bad
/// output (shape, length, overlap, LSE length, alignment) a typed error,
/// and a misaligned q on the path whose append is a launch of its own (17
/// query rows: the tile kernel) too — each leaving the cache untouched; the
/// read-only call's short O the same error.
#[test]
fn gpu_kvcache_into() {
    let _serial = serial();
    let Some(g) = gpu("gpu_kvcache_into") else { return };
    let mut rng = Rng::fresh("gpu_kvcache_into");
    let s = &g.stream;
    let (b, h, d) = (PagedDecode::B, PagedDecode::H, PagedDecode::D);
    let mut st = PagedDecode::new(g, &mut rng, [0, 300, 77]);
    let opts = || DecodeOptions { num_splits: Some(3), deterministic: true, ..Default::default() };
    let params = ForwardParams::default();
    let ext = Extras::default();

    // The allocating call, then the same step into padded buffers (the
    // append writes the same rows again).
    let reference = {
        let (c, q) = st.call_inputs();
        g.fa.forward_kvcache::<bf16, _>(s, Tensor::new(q, PagedDecode::q_layout()), c, &params, &ext, opts()).unwrap()
    };
    let (ref_o, ref_lse) = download(g, &reference.o, reference.o_layout, &reference.lse);
    let padded = TensorLayout::new([b, 1, h, d], [h * (d + 8), h * (d + 8), d + 8]);
    const SENTINEL: u16 = 0x7fc1; // a NaN the kernels never write
    let mut o_buf: CudaSlice<bf16> = s.clone_htod(&vec![bf16::from_bits(SENTINEL); b * h * (d + 8)]).unwrap();
    let mut lse_buf: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; PagedDecode::lse_len()]).unwrap();
    {
        let (c, q) = st.call_inputs();
        g.fa.forward_kvcache_into::<bf16, _, _>(s, Tensor::new(q, PagedDecode::q_layout()), c, TensorMut::new(&mut o_buf, padded), &mut lse_buf, &params, &ext, opts()).unwrap();
    }
    let (o, lse) = download(g, &o_buf, padded, &lse_buf);
    assert_eq!(bits(&o), bits(&ref_o), "into padded O: the allocating call's bits");
    assert!(lse.iter().zip(ref_lse.iter()).all(|(x, y)| x.to_bits() == y.to_bits()), "into: the allocating call's LSE");
    let all = s.clone_dtoh(&o_buf).unwrap();
    assert!(all.chunks(d + 8).all(|head| head[d..].iter().all(|x| x.to_bits() == SENTINEL)), "the padding between heads left as it was");
    st.check_step(g, "into (padded O)", &o, &lse);

    // Bad outputs: typed errors, nothing enqueued (the cache as it was).
    let before = st.cache_bits(g);
    let dense = PagedDecode::q_layout();
    let mut short: CudaSlice<bf16> = s.alloc_zeros(b * h * d - 1).unwrap();
    let mut short_lse: CudaSlice<f32> = s.alloc_zeros(PagedDecode::lse_len() - 1).unwrap();
    let mut o_big: CudaSlice<bf16> = s.alloc_zeros(b * h * (d + 8) + 64).unwrap();
    type Check = fn(&FlashAttnError) -> bool;
    let cases: [(&str, TensorLayout, usize, bool, Check); 6] = [
        ("O of another shape", TensorLayout::contiguous([b, 1, h + 1, d]), 0, false, |e| matches!(e, FlashAttnError::ShapeMismatch { argument: "o", .. })),
        ("O's buffer too short", dense, 0, true, |e| matches!(e, FlashAttnError::BufferTooShort { argument: "o", .. })),
        ("O's heads at one address", TensorLayout::new([b, 1, h, d], [h * d, h * d, 0]), 0, false, |e| matches!(e, FlashAttnError::OverlappingOutput { argument: "o", .. })),
        ("O misaligned (8 bytes in)", dense, 4, false, |e| matches!(e, FlashAttnError::Misaligned { argument: "o", .. })),
        ("O's head stride not a multiple of 8", TensorLayout::new([b, 1, h, d], [h * (d + 4), h * (d + 4), d + 4]), 0, false, |e| matches!(e, FlashAttnError::Misaligned { argument: "o", .. })),
        ("LSE too short", dense, 0, false, |e| matches!(e, FlashAttnError::StatsTooShort { argument: "lse", .. })),
    ];
    for (what, layout, offset, use_short, ok) in cases {
        let e = {
            let (c, q) = st.call_inputs();
            let lse: &mut dyn DevicePtrMut<f32> = if what == "LSE too short" { &mut short_lse } else { &mut lse_buf };
            let qt = Tensor::new(q, PagedDecode::q_layout());
            let r = if use_short {
                g.fa.forward_kvcache_into::<bf16, _, _>(s, qt, c, TensorMut::new(&mut short, layout), lse, &params, &ext, opts())
            } else {
                let mut view = o_big.slice_mut(offset..);
                g.fa.forward_kvcache_into::<bf16, _, _>(s, qt, c, TensorMut::new(&mut view, layout), lse, &params, &ext, opts())
            };
            r.expect_err(what)
        };
        assert!(ok(&e), "{what}: {e}");
        assert!(st.cache_bits(g) == before, "{what}: the cache untouched");
    }
    // Other paths into padded O give the allocating call's bits too: no
    // split, and 17 causal query rows per sequence (the fa2d tile kernel, the
    // append its own launch, the split combine a launch of its own).
    let q17 = s.clone_htod(random::<bf16>(&mut rng, (b, 17, h, d)).as_slice().unwrap()).unwrap();
    for (sq, causal, ns) in [(1, false, Some(1)), (17, true, None), (17, true, Some(2))] {
        let what = format!("{sq} query rows, causal {causal}, num_splits {ns:?}");
        let p = ForwardParams { causal, ..Default::default() };
        let ql = TensorLayout::contiguous([b, sq, h, d]);
        let o_opts = || DecodeOptions { num_splits: ns, deterministic: true, ..Default::default() };
        let (want_o, want_lse) = {
            let (c, q1) = st.call_inputs();
            let q: &CudaSlice<bf16> = if sq == 1 { q1 } else { &q17 };
            let out = g.fa.forward_kvcache::<bf16, _>(s, Tensor::new(q, ql), c, &p, &ext, o_opts()).unwrap();
            (s.clone_dtoh(&out.o).unwrap(), s.clone_dtoh(&out.lse).unwrap())
        };
        let pad = TensorLayout::new([b, sq, h, d], [sq * h * (d + 8), h * (d + 8), d + 8]);
        let mut o_pad: CudaSlice<bf16> = s.clone_htod(&vec![bf16::from_bits(SENTINEL); b * sq * h * (d + 8)]).unwrap();
        let mut l_pad: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; b * h * sq]).unwrap();
        {
            let (c, q1) = st.call_inputs();
            let q: &CudaSlice<bf16> = if sq == 1 { q1 } else { &q17 };
            g.fa.forward_kvcache_into::<bf16, _, _>(s, Tensor::new(q, ql), c, TensorMut::new(&mut o_pad, pad), &mut l_pad, &p, &ext, o_opts()).unwrap();
        }
        let got = s.clone_dtoh(&o_pad).unwrap();
        let rows: Vec<u16> = got.chunks(d + 8).flat_map(|head| head[..d].iter().map(|x| x.to_bits())).collect();
        assert_eq!(rows, want_o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{what}: into padded O, the allocating call's bits");
        assert!(got.chunks(d + 8).all(|head| head[d..].iter().all(|x| x.to_bits() == SENTINEL)), "{what}: the padding left as it was");
        let got_l = s.clone_dtoh(&l_pad).unwrap();
        assert!(got_l.iter().zip(&want_lse).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: the allocating call's LSE");
    }
    // The read-only call checks its outputs the same way.
    let e = {
        let PagedDecode { kc, vc, table_d, seqlens_d, q_d, .. } = &st;
        let cache = KvCacheRef::new(kc, vc, PagedDecode::cache_layout(), seqlens_d).with_block_table(BlockTable::new(table_d, PagedDecode::PER));
        g.fa.forward_kvcache_ref_into::<bf16, _, _>(s, Tensor::new(q_d, dense), cache, TensorMut::new(&mut short, dense), &mut lse_buf, &params, &ext, opts()).unwrap_err()
    };
    assert!(matches!(e, FlashAttnError::BufferTooShort { argument: "o", .. }), "forward_kvcache_ref_into, O too short: {e}");
    // A misaligned q where the append is its own launch (17 query rows per
    // sequence: the fa2d tile kernel), allocating and into: the error comes
    // before the append.
    let q17: CudaSlice<bf16> = s.alloc_zeros(b * 17 * h * d + 4).unwrap();
    let q17_view = q17.slice(4..);
    let l17 = TensorLayout::contiguous([b, 17, h, d]);
    let mut o17: CudaSlice<bf16> = s.alloc_zeros(b * 17 * h * d).unwrap();
    let mut lse17: CudaSlice<f32> = s.alloc_zeros(b * h * 17).unwrap();
    for into in [false, true] {
        let e = {
            let (c, _) = st.call_inputs();
            let qt = Tensor::new(&q17_view, l17);
            if into {
                g.fa.forward_kvcache_into::<bf16, _, _>(s, qt, c, TensorMut::new(&mut o17, l17), &mut lse17, &params, &ext, opts()).unwrap_err()
            } else {
                g.fa.forward_kvcache::<bf16, _>(s, qt, c, &params, &ext, opts()).unwrap_err()
            }
        };
        assert!(matches!(e, FlashAttnError::Misaligned { argument: "q", .. }), "misaligned q (into: {into}): {e}");
        assert!(st.cache_bits(g) == before, "misaligned q (into: {into}): the cache untouched");
    }
}

/// A decode loop in a CUDA graph: one step eagerly, the same step captured
/// (`begin_capture` … `end_capture`: nothing runs), then five replays, each
/// after fresh q and new keys and values and the advanced `cache_seqlens`
/// were written into the captured buffers; every step against the f64
/// reference and the cache exactly (sequence 0 starts without keys), 4
/// splits with the fused combine through the caller's scratch and counters
/// (no allocation in the call). Then the last step again eagerly: the
/// replay's bits (deterministic splits). The step is one
/// `forward_kvcache_into` call (the append fused), or (`two_step`)
/// `append_kv` for K and for V, then `forward_kvcache_ref_into`.
fn graph_loop(g: &Gpu, rng: &mut Rng, two_step: bool) {
    let s = &g.stream;
    let (b, h, d) = (PagedDecode::B, PagedDecode::H, PagedDecode::D);
    const NS: usize = 4;
    // The captured call's buffers carry no cudarc events: a graph cannot
    // wait on an event recorded outside it.
    // SAFETY: every buffer below is used on `s` alone.
    unsafe { g.ctx.disable_event_tracking() };
    let mut st = PagedDecode::new(g, rng, [0, 45, 200]);
    let mut o_buf: CudaSlice<bf16> = s.alloc_zeros(b * h * d).unwrap();
    let mut lse_buf: CudaSlice<f32> = s.alloc_zeros(PagedDecode::lse_len()).unwrap();
    let mut o_acc: CudaSlice<f32> = s.alloc_zeros(NS * b * h * d).unwrap();
    let mut lse_acc: CudaSlice<f32> = s.alloc_zeros(NS * b * h).unwrap();
    let mut counters: CudaSlice<u32> = s.alloc_zeros(b * h).unwrap();
    // SAFETY: as above (slices created from here on track their events again).
    unsafe { g.ctx.enable_event_tracking() };
    let o_l = PagedDecode::q_layout();
    let mode = if two_step { "append_kv + forward_kvcache_ref_into" } else { "forward_kvcache_into" };
    let step = |st: &mut PagedDecode, o_buf: &mut CudaSlice<bf16>, lse_buf: &mut CudaSlice<f32>, o_acc: &mut CudaSlice<f32>, lse_acc: &mut CudaSlice<f32>, counters: &mut CudaSlice<u32>| {
        let scratch = SplitScratch { o_accum: o_acc, lse_accum: lse_acc, max_splits: NS, counters: Some(counters) };
        let opts = DecodeOptions { num_splits: Some(NS), scratch: Some(scratch), deterministic: true, ..Default::default() };
        let (params, ext) = (ForwardParams::default(), Extras::default());
        if !two_step {
            let (cache, q) = st.call_inputs();
            return g.fa.forward_kvcache_into::<bf16, _, _>(s, Tensor::new(q, PagedDecode::q_layout()), cache, TensorMut::new(o_buf, o_l), lse_buf, &params, &ext, opts);
        }
        let PagedDecode { kc, vc, table_d, seqlens_d, knew_d, vnew_d, q_d, .. } = st;
        let (layout, new_l) = (PagedDecode::cache_layout(), TensorLayout::contiguous([b, 1, PagedDecode::HK, d]));
        let table = BlockTable::new(&*table_d, PagedDecode::PER);
        g.fa.append_kv::<bf16>(s, kc, layout, Tensor::new(&*knew_d, new_l), &*seqlens_d, None, Some(table))?;
        g.fa.append_kv::<bf16>(s, vc, layout, Tensor::new(&*vnew_d, new_l), &*seqlens_d, None, Some(table))?;
        let cache = KvCacheRef::new(&*kc, &*vc, layout, &*seqlens_d).with_block_table(table).with_seqlen_new(1);
        g.fa.forward_kvcache_ref_into::<bf16, _, _>(s, Tensor::new(&*q_d, PagedDecode::q_layout()), cache, TensorMut::new(o_buf, o_l), lse_buf, &params, &ext, opts)
    };

    // Step 0, eagerly (loads the kernels before the capture).
    step(&mut st, &mut o_buf, &mut lse_buf, &mut o_acc, &mut lse_acc, &mut counters).unwrap();
    let (o, lse) = download(g, &o_buf, o_l, &lse_buf);
    st.check_step(g, &format!("{mode}: eager step 0"), &o, &lse);

    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let captured = step(&mut st, &mut o_buf, &mut lse_buf, &mut o_acc, &mut lse_acc, &mut counters);
    let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
    captured.expect("the decode step under stream capture");
    let graph = graph.expect("end_capture").expect("a graph with the step's launches");

    let mut last = None;
    for k in 1..=5 {
        st.next_inputs(g, rng);
        graph.launch().unwrap();
        s.synchronize().unwrap();
        let (o, lse) = download(g, &o_buf, o_l, &lse_buf);
        st.check_step(g, &format!("{mode}: graph replay {k}"), &o, &lse);
        last = Some((bits(&o), lse));
    }
    let left: Vec<u32> = s.clone_dtoh(&counters).unwrap();
    assert!(left.iter().all(|&c| c == 0), "{mode}: every replay puts the fused combine's counts back to 0: {left:?}");

    // The last step again, eagerly (the same rows appended again): the bits
    // of the replay.
    for l in &mut st.lens {
        *l -= 1;
    }
    s.memcpy_htod(&st.lens_i32(), &mut st.seqlens_d).unwrap();
    step(&mut st, &mut o_buf, &mut lse_buf, &mut o_acc, &mut lse_acc, &mut counters).unwrap();
    let (o, lse) = download(g, &o_buf, o_l, &lse_buf);
    let (o_last, lse_last) = last.unwrap();
    assert_eq!(bits(&o), o_last, "{mode}: eager call after the replays: the replay's O");
    assert!(lse.iter().zip(lse_last.iter()).all(|(x, y)| x.to_bits() == y.to_bits()), "{mode}: eager call after the replays: the replay's LSE");
    drop(graph);
}

/// [`graph_loop`] with the append fused into the KV-cache call.
#[test]
fn gpu_decode_cuda_graph() {
    let _serial = serial();
    let Some(g) = gpu("gpu_decode_cuda_graph") else { return };
    graph_loop(g, &mut Rng::fresh("gpu_decode_cuda_graph"), false);
}

/// [`graph_loop`] in two steps: `append_kv` (K, then V), then
/// `forward_kvcache_ref_into`, all three captured.
#[test]
fn gpu_decode_cuda_graph_two_step() {
    let _serial = serial();
    let Some(g) = gpu("gpu_decode_cuda_graph_two_step") else { return };
    graph_loop(g, &mut Rng::fresh("gpu_decode_cuda_graph_two_step"), true);
}

/// A decode loop over an address-ordered block table
/// (`FlashAttention::order_block_table` on the device table, the same order
/// as the host's `order_block_table`): the kernels read the ordered table while the
/// pages hold the logical table's keys. Each step (the new key appended in
/// the call, 4 deterministic splits and the library's default schedule in
/// turn) matches the f64 reference over the logical keys, and the cache is
/// exactly the logical model's — the appends land in the same slots — as
/// the sequences grow across page boundaries (300 → 306 crosses 304, 77 →
/// 83 crosses 80) without ordering again.
#[test]
fn gpu_decode_ordered_table() {
    let _serial = serial();
    let Some(g) = gpu("gpu_decode_ordered_table") else { return };
    let mut rng = Rng::fresh("gpu_decode_ordered_table");
    let s = &g.stream;
    let mut st = PagedDecode::new(g, &mut rng, [0, 300, 77]);
    let params = ForwardParams::default();
    // The call as the decode call's own arguments give it: one query token,
    // one key appended.
    let call = KvCacheCall::new(&PagedDecode::q_layout(), &st.call_inputs().0, &params, &Extras::default());
    let mut ordered = st.table.clone();
    let n = order_block_table(&mut ordered, PagedDecode::PER, PagedDecode::PAGE, &st.lens_i32(), &call).unwrap();
    assert_eq!(n, 300 / 16 + 77 / 16, "the full pages of the cached keys");
    assert_ne!(ordered, st.table, "the random table reordered");
    // The device's sort of the device table: the host's order.
    g.fa.order_block_table(s, &mut st.table_d, PagedDecode::PER, PagedDecode::PAGE, &st.seqlens_d, &call).unwrap();
    assert_eq!(s.clone_dtoh(&st.table_d).unwrap(), ordered, "order_block_table on the device");
    for k in 0..6 {
        let opts = if k % 2 == 0 { DecodeOptions { num_splits: Some(4), deterministic: true, ..Default::default() } } else { DecodeOptions::default() };
        let out = {
            let (c, q) = st.call_inputs();
            g.fa.forward_kvcache::<bf16, _>(s, Tensor::new(q, PagedDecode::q_layout()), c, &params, &Extras::default(), opts).unwrap()
        };
        let (o, lse) = download(g, &out.o, out.o_layout, &out.lse);
        st.check_step(g, &format!("ordered table, step {k}"), &o, &lse);
        st.next_inputs(g, &mut rng);
    }
    assert_eq!(st.lens, vec![6, 306, 83]);
}

/// `FlashAttention::order_block_table` against the host's
/// `order_block_table` over random tables (rows of 1 to 8192 slots, powers
/// of two and not), lengths from 0 to the capacity and, on the device only,
/// out of range (clamped: −5 as 0, past the capacity as the capacity), for
/// plain decode and for 4 causal query rows without new keys; the
/// position-dependent calls and bad shapes typed errors, the table
/// untouched.
#[test]
fn gpu_order_block_table() {
    let _serial = serial();
    let Some(g) = gpu("gpu_order_block_table") else { return };
    let mut rng = Rng::fresh("gpu_order_block_table");
    let s = &g.stream;
    let plain = ForwardParams::default();
    let causal = ForwardParams { causal: true, ..Default::default() };
    for (batch, max_blocks, page) in [(3, 1, 16), (4, 5, 16), (2, 1000, 16), (3, 3000, 1), (1, 8192, 16), (5, 64, 256)] {
        let cap = (max_blocks * page) as i64;
        let table: Vec<i32> = (0..batch * max_blocks).map(|_| rng.below(1 << 20) as i32 - 7).collect();
        let mut lens: Vec<i64> = (0..batch).map(|_| rng.below(cap as usize + 1) as i64).collect();
        lens[0] = cap;
        if batch > 2 {
            lens[1] = -5;
            lens[2] = cap + 40;
        }
        let lens_d: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let lens_h: Vec<i32> = lens.iter().map(|&l| l.clamp(0, cap) as i32).collect();
        for (p, sq) in [(&plain, 1), (&causal, 4)] {
            let call = KvCacheCall::from_shape(p, false, sq, 0);
            let what = format!("batch {batch}, {max_blocks} slots of {page}, causal {}, {sq} rows", p.causal);
            let mut want = table.clone();
            order_block_table(&mut want, max_blocks, page, &lens_h, &call).unwrap();
            let mut t_d = s.clone_htod(&table).unwrap();
            let l_d = s.clone_htod(&lens_d).unwrap();
            g.fa.order_block_table(s, &mut t_d, max_blocks, page, &l_d, &call).unwrap();
            assert_eq!(s.clone_dtoh(&t_d).unwrap(), want, "{what}");
            if max_blocks >= 64 {
                // lens[0] is the capacity: ≥ 63 random entries sorted.
                assert_ne!(want, table, "{what}: a random table reordered");
            }
        }
    }
    // Typed errors, nothing enqueued.
    let table: Vec<i32> = (0..64).rev().collect();
    let mut t_d = s.clone_htod(&table).unwrap();
    let l_d = s.clone_htod(&[512i32, 512]).unwrap();
    let window = ForwardParams { causal: true, window_left: Some(100), ..Default::default() };
    let with = |p| KvCacheCall::from_shape(p, false, 1, 0);
    let cases: [(&str, usize, usize, KvCacheCall); 5] = [
        ("a left window", 32, 16, with(&window)),
        ("ALiBi", 32, 16, KvCacheCall::from_shape(&plain, true, 1, 0)),
        ("page size 0", 32, 0, with(&plain)),
        ("a table of another length", 31, 16, with(&plain)),
        ("no query row", 32, 16, KvCacheCall::from_shape(&plain, false, 0, 0)),
    ];
    for (what, max_blocks, page, call) in cases {
        let e = g.fa.order_block_table(s, &mut t_d, max_blocks, page, &l_d, &call).expect_err(what);
        assert!(matches!(e, FlashAttnError::InvalidArgument { .. } | FlashAttnError::ShapeMismatch { .. }), "{what}: {e}");
    }
    let mut big: CudaSlice<i32> = s.alloc_zeros(2 * (1 << 16)).unwrap();
    let e = g.fa.order_block_table(s, &mut big, 1 << 16, 16, &l_d, &with(&plain)).expect_err("a row past the device sort");
    assert!(matches!(e, FlashAttnError::DimTooLarge { .. }), "{e}");
    assert_eq!(s.clone_dtoh(&t_d).unwrap(), table, "the table untouched by the refused calls");
}
