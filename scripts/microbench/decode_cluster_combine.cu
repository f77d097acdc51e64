// Decode step 43 (session 16): can the split-KV combine leave the critical
// path's global round trips? Our fused combine (step 7, 34, 36): every split
// stores its normalized partial (f32) and LSE to global memory, one thread
// counts the split with an acq_rel atomic, and the tile's last split loads
// every partial back and merges them — store, atomic and loads are three
// dependent L2 round trips after the last split's loop (the timeline's
// ~3.6 µs "after the last loop end" at GQA 32k). With a thread-block
// cluster of all splits of a tile (sm_90), the partials can stay in shared
// memory: a cluster barrier, then each block merges 1/CL of the tile's
// outputs from the others' shared memory (DSMEM) and stores them.
//
// The streaming floor of decode_floor_prologue.cu with our loop's reads and
// chain (WORK 1: ldmatrix.x4 from swizzled rows, a 400-FMA chain per
// block), 3 stages of 2 × 32 KB, 128 blocks = 8 tiles (KV heads) × 16
// splits, 256 threads, then a warp merge of 4 rows × 128 f32 per warp (GQA
// 32/8 packs 4 rows) through shared memory, and one of these epilogues:
//   EPI 0  the merged partial stored, nothing else (no combine);
//   EPI 1  ours: partial + LSE stored, acq_rel count, the last split
//          merges the 16 partials (a warp per row);
//   EPI 2  a cluster of the tile's 16 splits: partial kept in shared
//          memory, barrier.cluster, each block merges 32 of the tile's 512
//          outputs from the 16 blocks' shared memory, barrier.cluster;
//   EPI 3  EPI 1's epilogue in a cluster launch of 16 (what the cluster
//          placement alone does to the stream);
//   EPI 4  the count drawn (relaxed) by thread 0 as the split's last block
//          starts, off the critical path; the split that draws the tile's
//          last count merges: the others store their partial and release a
//          flag, the merging split acquires the flags and loads the
//          partials — the store's MEMBAR and the atomic's round trip leave
//          the last split's path (a split that has drawn is running, so the
//          wait cannot deadlock);
//   EPI 5  EPI 1 without the merge's loads (the count's share of the tail).
// Session 16 call 1 ran EPI 0–3 (a cluster of 16 with 192 KB per block:
// at most 7 clusters active on the H100, so the 8th ran in a second wave);
// call 2 EPI 0, 1, 4, 5 (but launched EPI 4 and 5 in clusters of 16 by
// mistake); call 3 again, with a per-block timeline (EPI 1, 4, 5 then held
// a 16-byte static shared word and their loops ran 2–5% slower than EPI
// 0's); call 4 with the words in dynamic shared memory and EPI 4's flags
// polled by one lane per split; call 5: EPI 1 with its stages at an offset
// in the dynamic shared memory (ours: after a 4352-byte padded Q tile);
// call 12: EPI 1 with each block's rows LA = 1, 2, 4 blocks beyond the
// stages prefetched into the L2 (does a deeper DRAM queue help random
// 16-token pages?).
// The partial values and LSEs are fixed functions of (tile, split, row,
// column); every variant's O is checked against the host's merge.
// Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o dcc decode_cluster_combine.cu && ./dcc
// bf16 K and V (seqlen, 8, 128); L2 flushed by a 128 MB read before every
// timed run (the flush also zeroes the counters); CUDA events, median of 30.
#include "microbench.cuh"
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cmath>
namespace cg = cooperative_groups;

constexpr int S = 3, NT = 256, BC = 128, ROWS = 4, D = 128, NSPLIT = 16;

__device__ __forceinline__ uint32_t ldm4s(uint32_t a) {
    uint32_t r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
    return r0 ^ r1 ^ r2 ^ r3;
}
__host__ __device__ inline float val_of(int tile, int split, int row, int col) { return (float)((tile * 131 + split * 17 + row * 5 + col) % 97) * 0.01f; }
__host__ __device__ inline float lse_of(int tile, int split, int row) { return (float)((tile * 29 + split * 13 + row * 7) % 23) * 0.1f; }

// The last split's merge of row `r` of `tile` (one warp; lane `l` reads split
// `l`'s LSE, every lane 4 columns of the 16 partials), as our fused combine.
__device__ __forceinline__ void merge_row(const float* lacc, const float* oacc, __nv_bfloat16* O, int tile, int ntiles, int r, int lane) {
    float l = lane < NSPLIT ? __ldcg(lacc + ((size_t)lane * ntiles + tile) * ROWS + r) : -INFINITY;
    float M = l;
#pragma unroll
    for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(~0u, M, o));
    float w = lane < NSPLIT ? __expf(l - M) : 0.f, sum = w;
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    w /= sum;
    float4 a = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int s0 = 0; s0 < NSPLIT; s0 += 8) {
        float4 x[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) x[k] = __ldcg((const float4*)(oacc + (((size_t)(s0 + k) * ntiles + tile) * ROWS + r) * D) + lane);
#pragma unroll
        for (int k = 0; k < 8; ++k) { float ws = __shfl_sync(~0u, w, s0 + k); a.x += ws * x[k].x; a.y += ws * x[k].y; a.z += ws * x[k].z; a.w += ws * x[k].w; }
    }
    __nv_bfloat16* o = O + ((size_t)tile * ROWS + r) * D + 4 * lane;
    o[0] = __float2bfloat16(a.x); o[1] = __float2bfloat16(a.y); o[2] = __float2bfloat16(a.z); o[3] = __float2bfloat16(a.w);
}

template <int EPI, int PG, int OFF = 0, int LA = 0>
__global__ void __launch_bounds__(256) dec_k(const uint4* K, const uint4* V, int nkeys, int hk, float* oacc, float* lacc, unsigned* ctr, __nv_bfloat16* O, unsigned* sink, const int* table, unsigned* flags, unsigned long long* tl) {
    auto stamp = [&](int k) { if (threadIdx.x == 0) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); tl[blockIdx.x * 4 + k] = t; } };
    stamp(0);
    constexpr int CPT = 16;
    extern __shared__ uint4 sm[];
    const uint32_t tile_b = 128 * 256;
    const int tile = blockIdx.x / NSPLIT, split = blockIdx.x % NSPLIT, ntiles = gridDim.x / NSPLIT;
    const uint32_t base = saddr(sm) + OFF; // the stages' offset in the dynamic shared memory
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const size_t rs = (size_t)hk * 16;
    auto row_of = [&](int t) -> size_t {
        if constexpr (PG > 0) return (size_t)__ldg(table + t / PG) * PG + t % PG;
        return (size_t)t;
    };
    auto issue = [&](int jb, int s) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int i = tid + k * NT, t = jb * BC + i / CPT, c = i % CPT;
            size_t off = row_of(t) * rs + tile * CPT + c;
            uint32_t so = (uint32_t)(i / CPT) * (CPT * 16) + (c ^ ((i / CPT) & 7)) * 16;
            cp16(base + 2 * s * tile_b + so, K + off);
            cp16(base + (2 * s + 1) * tile_b + so, V + off);
        }
    };
    // LA > 0: block jb's 128 K and V row pieces (256 bytes each) prefetched
    // into the L2, LA blocks beyond the last one in the stages.
    auto prefetch = [&](int jb) {
        const int t = jb * BC + (tid & 127);
        const uint4* p = (tid < 128 ? K : V) + row_of(t) * rs + tile * CPT;
        asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
        asm volatile("prefetch.global.L2 [%0];" :: "l"(p + 8));
    };
    const int per = nkeys / BC / NSPLIT;
    for (int s = 0; s < S - 1; ++s) { issue(split * per + s, s); commit(); }
    if (LA > 0)
        for (int a = 1; a <= LA; ++a)
            if (S - 2 + a < per) prefetch(split * per + S - 2 + a);
    unsigned acc = 0;
    float f = (float)(tid & 31);
    unsigned early = 0; // EPI 4: thread 0's count, drawn as the last block starts
    for (int j = 0; j < per; ++j) {
        wait_group<S - 2>();
        __syncthreads();
        if (EPI == 4 && tid == 0 && j == per - 1) asm volatile("atom.add.relaxed.gpu.u32 %0, [%1], 1;" : "=r"(early) : "l"(ctr + tile) : "memory");
        if (j + S - 1 < per) issue(split * per + j + S - 1, (j + S - 1) % S);
        commit();
        if (LA > 0 && j + S - 1 + LA < per) prefetch(split * per + j + S - 1 + LA);
        const int s = j % S;
        const int row = warp * 16 + lane % 16;
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            uint32_t o = row * (CPT * 16) + (((kk * 2 + lane / 16) ^ (row & 7)) * 16);
            acc ^= ldm4s(base + 2 * s * tile_b + o);
            acc ^= ldm4s(base + (2 * s + 1) * tile_b + o);
        }
        float a = f + (float)(acc & 1);
#pragma unroll
        for (int i = 0; i < 400; ++i) asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(a));
        f = a;
    }
    wait_group<0>();
    __syncthreads();
    stamp(1);
    if (acc == 0x12345678u && f == 1234.5f) sink[0] = acc; // keeps the loop; never true
    // ---- the warps' merge (as ours: live rows through shared memory) ----
    float* ow = (float*)((char*)sm + OFF); // 8 warps × 4 rows × 128
    float* part = ow + 8 * ROWS * D;       // the block's merged partial: 4 × 128, then 4 LSEs
    float* plse = part + ROWS * D;
    if (lane < 16) {
        const int r = lane / 4, t = lane % 4;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = n * 8 + 2 * t;
            const float d = (warp - 3.5f) * 0.001f;
            *(float2*)(ow + (warp * ROWS + r) * D + col) = make_float2(val_of(tile, split, r, col) + d, val_of(tile, split, r, col + 1) + d);
        }
    }
    __syncthreads();
    const int mrow = tid / 64, mcol = 2 * (tid % 64);
    float2 m = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < 8; ++w) { float2 x = *(float2*)(ow + (w * ROWS + mrow) * D + mcol); m.x += x.x; m.y += x.y; }
    m.x *= 0.125f; m.y *= 0.125f;
    const float my_lse = lse_of(tile, split, mrow);
    const size_t lrow = ((size_t)split * ntiles + tile) * ROWS + mrow; // (split, tile, row)
    if (EPI == 0) {
        *(float2*)(oacc + lrow * D + mcol) = m;
        if (mcol == 0) lacc[lrow] = my_lse;
        __syncthreads(); stamp(2);
        return;
    }
    if (EPI == 4) {
        // The split that drew the tile's last count merges; every other split
        // has drawn, so it is running and publishes its partial without
        // waiting for anything (no deadlock whatever the residency).
        unsigned& comb = *(unsigned*)(plse + 8); // no static shared memory (see call 3)
        if (tid == 0) {
            comb = early + 1 == NSPLIT;
            if (comb) asm volatile("st.relaxed.gpu.u32 [%0], 0;" :: "l"(ctr + tile) : "memory");
        }
        *(float2*)(oacc + lrow * D + mcol) = m;
        if (mcol == 0) lacc[lrow] = my_lse;
        __syncthreads(); // the block's partial, then (non-merging) its flag
        if (!comb) {
            if (tid == 0) asm volatile("st.release.gpu.u32 [%0], 1;" :: "l"(flags + tile * NSPLIT + split) : "memory");
            stamp(2);
            return;
        }
        // Lanes 0–15 of warp 0 wait for the other splits' flags (acquire:
        // the strong load and an L1 invalidate, no MEMBAR), then the
        // barrier hands the other splits' partials to every warp (as ours).
        if (warp == 0 && lane < NSPLIT && lane != split) {
            for (;;) {
                unsigned v;
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(flags + tile * NSPLIT + lane) : "memory");
                if (v) break;
                __nanosleep(64);
            }
        }
        __syncthreads();
        if (warp < ROWS) {
            const int r = warp;
            merge_row(lacc, oacc, O, tile, ntiles, r, lane);
        }
        __syncthreads(); // every warp has read the flags: back to 0 for the next launch
        if (tid < NSPLIT && tid != split) asm volatile("st.relaxed.gpu.u32 [%0], 0;" :: "l"(flags + tile * NSPLIT + tid) : "memory");
        stamp(3);
        return;
    }
    if (EPI == 1 || EPI == 3 || EPI == 5) {
        *(float2*)(oacc + lrow * D + mcol) = m;
        if (mcol == 0) lacc[lrow] = my_lse;
        __syncthreads();
        unsigned& flag = *(unsigned*)(plse + 8);
        if (tid == 0) {
            unsigned old;
            asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(ctr + tile) : "memory");
            const bool last = old + 1 == NSPLIT;
            if (last) asm volatile("st.relaxed.gpu.u32 [%0], 0;" :: "l"(ctr + tile) : "memory");
            flag = last;
        }
        __syncthreads();
        if (!flag) { stamp(2); return; }
        if (warp >= ROWS) return;
        const int r = warp;
        if (EPI == 5) { O[((size_t)tile * ROWS + r) * D + lane] = __float2bfloat16(0.f); stamp(3); return; }
        merge_row(lacc, oacc, O, tile, ntiles, r, lane);
        stamp(3);
        return;
    }
    // EPI 2: the cluster's shared memory.
    cg::cluster_group cl = cg::this_cluster();
    *(float2*)(part + mrow * D + mcol) = m;
    if (mcol == 0) plse[mrow] = my_lse;
    cl.sync(); // barrier.cluster.arrive.release + wait.acquire: every split's partial in place
    const int rank = (int)cl.block_rank(); // = split
    if (tid < 32) {
        const int oi = rank * 32 + tid, r = oi / D, col = oi % D;
        float ls[NSPLIT], xs[NSPLIT];
#pragma unroll
        for (int s = 0; s < NSPLIT; ++s) {
            const float* pr = cl.map_shared_rank(part, s);
            ls[s] = pr[ROWS * D + r];
            xs[s] = pr[r * D + col];
        }
        float M = ls[0];
#pragma unroll
        for (int s = 1; s < NSPLIT; ++s) M = fmaxf(M, ls[s]);
        float sum = 0.f, a = 0.f;
#pragma unroll
        for (int s = 0; s < NSPLIT; ++s) { float w = __expf(ls[s] - M); sum += w; a += w * xs[s]; }
        O[((size_t)tile * ROWS + r) * D + col] = __float2bfloat16(a / sum);
    }
    cl.sync(); // no block leaves while another reads its shared memory
    stamp(3);
}

struct Bufs { const uint4 *K, *V; float *oacc, *lacc; unsigned* ctr; __nv_bfloat16* O; const int* table; unsigned* flags; unsigned long long* tl; };

template <int EPI, int PG, int OFF = 0, int LA = 0>
void run(Bench& b, const char* name, const Bufs& u, int nkeys, int hk, double mb, int round, const std::vector<float>& want) {
    auto k = dec_k<EPI, PG, OFF, LA>;
    const int smb = 2 * S * 128 * 256 + OFF;
    set_smem(k, smb);
    const int cl = (EPI == 2 || EPI == 3) ? NSPLIT : 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(hk * NSPLIT); cfg.blockDim = dim3(NT); cfg.dynamicSmemBytes = smb;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension; at[0].val.clusterDim.x = cl; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    int nclusters = -1;
    if (cl > 1) {
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        CK(cudaOccupancyMaxActiveClusters(&nclusters, k, &cfg));
    }
    CK(cudaMemset(u.O, 0, hk * ROWS * D * 2)); CK(cudaMemset(u.tl, 0, hk * NSPLIT * 32));
    float us = b.time([&] { CK(cudaLaunchKernelEx(&cfg, k, u.K, u.V, nkeys, hk, u.oacc, u.lacc, u.ctr, u.O, b.sink, u.table, u.flags, u.tl)); });
    double err = 0;
    if (EPI != 0 && EPI != 5) {
        std::vector<__nv_bfloat16> o(hk * ROWS * D);
        CK(cudaMemcpy(o.data(), u.O, o.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < o.size(); ++i) err = std::max(err, (double)fabsf(__bfloat162float(o[i]) - want[i]));
    }
    // The last timed run's timeline, µs from the first block's start: loop
    // end median / max, the last block's exit (stamp 2 or 3).
    const int nb = hk * NSPLIT;
    std::vector<unsigned long long> tl(nb * 4);
    CK(cudaMemcpy(tl.data(), u.tl, tl.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < nb; ++i) t0 = std::min(t0, tl[i * 4]);
    std::vector<double> le; double ex = 0, mex = 0;
    for (int i = 0; i < nb; ++i) {
        le.push_back((tl[i * 4 + 1] - t0) / 1e3);
        double e = std::max(tl[i * 4 + 2] > t0 ? (tl[i * 4 + 2] - t0) / 1e3 : 0.0, tl[i * 4 + 3] > t0 ? (tl[i * 4 + 3] - t0) / 1e3 : 0.0);
        ex = std::max(ex, e);
        if (tl[i * 4 + 3] > t0) mex = std::max(mex, (tl[i * 4 + 3] - t0) / 1e3);
    }
    std::sort(le.begin(), le.end());
    printf("| %d | %d | %s | %s, stages at +%d B, L2 prefetch %d ahead | %d | %.1f | %.2f | %.4f | %.1f / %.1f | %.1f | %.1f |\n", round, nkeys, PG ? "16-token pages, random" : "contiguous", name, OFF, LA, nclusters, us, mb / us, err, le[nb / 2], le[nb - 1], mex, ex);
}

int main() {
    Bench b; b.flush_n = (128u << 20) / 16;
    CK(cudaMalloc(&b.flush, b.flush_n * 16)); CK(cudaMemset(b.flush, 1, b.flush_n * 16));
    CK(cudaMalloc(&b.sink, 64));
    CK(cudaEventCreate(&b.e0)); CK(cudaEventCreate(&b.e1));
    const int hk = 8;
    Bufs u{};
    CK(cudaMalloc(&u.oacc, NSPLIT * hk * ROWS * D * 4)); CK(cudaMalloc(&u.lacc, NSPLIT * hk * ROWS * 4));
    CK(cudaMalloc(&u.ctr, 256)); CK(cudaMemset(u.ctr, 0, 256)); b.ctr = u.ctr;
    CK(cudaMalloc(&u.O, hk * ROWS * D * 2));
    CK(cudaMalloc(&u.tl, hk * NSPLIT * 4 * 8)); CK(cudaMemset(u.tl, 0, hk * NSPLIT * 32));
    CK(cudaMalloc(&u.flags, hk * NSPLIT * 4)); CK(cudaMemset(u.flags, 0, hk * NSPLIT * 4));
    // The host's merge of the fixed partials.
    std::vector<float> want(hk * ROWS * D);
    for (int t = 0; t < hk; ++t)
        for (int r = 0; r < ROWS; ++r) {
            double M = -1e30, sum = 0;
            for (int s = 0; s < NSPLIT; ++s) M = std::max(M, (double)lse_of(t, s, r));
            for (int s = 0; s < NSPLIT; ++s) sum += exp(lse_of(t, s, r) - M);
            for (int c = 0; c < D; ++c) {
                double a = 0;
                for (int s = 0; s < NSPLIT; ++s) a += exp(lse_of(t, s, r) - M) / sum * val_of(t, s, r, c);
                want[(t * ROWS + r) * D + c] = (float)a;
            }
        }
    printf("| round | cache | layout | epilogue | max active clusters | µs | TB/s | max abs err (bf16 O) | loop end median / max | last merge end | last exit |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int nkeys : {32768, 131072}) {
        size_t n = (size_t)nkeys * hk * 16;
        uint4 *K, *V;
        CK(cudaMalloc(&K, n * 16)); CK(cudaMalloc(&V, n * 16));
        CK(cudaMemset(K, 3, n * 16)); CK(cudaMemset(V, 5, n * 16));
        u.K = K; u.V = V;
        double mb = 2.0 * n * 16 / 1e6;
        std::vector<int> t(nkeys / 16);
        for (int i = 0; i < (int)t.size(); ++i) t[i] = i;
        unsigned x = 12345u;
        for (int i = (int)t.size() - 1; i > 0; --i) { x = x * 1664525u + 1013904223u; std::swap(t[i], t[(x >> 8) % (i + 1)]); }
        int* dt; CK(cudaMalloc(&dt, t.size() * 4)); CK(cudaMemcpy(dt, t.data(), t.size() * 4, cudaMemcpyHostToDevice));
        u.table = dt;
        for (int round = 1; round <= 2; ++round) {
            run<1, 0>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 0, 0, 1>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 0, 0, 2>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 16>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 16, 0, 1>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 16, 0, 2>(b, "ours", u, nkeys, hk, mb, round, want);
            run<1, 16, 0, 4>(b, "ours", u, nkeys, hk, mb, round, want);
        }
        CK(cudaFree(K)); CK(cudaFree(V)); CK(cudaFree(dt));
    }
    return 0;
}
