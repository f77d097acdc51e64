// Decode streaming floor, part 2 (perf notes, decode step 18): does handing a
// tile's key blocks to its splits one at a time (a per-tile ticket) shorten
// the pure stream, and does a TMA copy (one tensor-map instruction per K or V
// block, an mbarrier per stage) stream faster than 16-byte cp.async? No
// attention math: each block reads one 16-byte chunk per thread per stage.
// Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o decode_balance decode_balance.cu && ./decode_balance
// bf16 K and V (seqlen, nheads_k, 128); the L2 flushed by a 128 MB read before
// every timed run (the flush kernel also zeroes the tickets); CUDA events,
// median of 30 runs. Per block, %globaltimer at start and at the loop's end
// (the last run's records): the spread of loop ends is what balancing targets.
#include <cuda.h>
#include <cudaTypedefs.h>
#include "microbench.cuh"

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { printf("driver error %d at %s:%d\n", (int)e, __FILE__, __LINE__); exit(1); } } while (0)

__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

// Which key block a split consumes j-th. Static: its own contiguous range.
// Dynamic: the first S − 1 blocks fixed (split + i·splits), then tickets of
// the tile's counter in order (ticket t → key block t + (S − 1)·splits).
struct Sched {
    int nblk, splits, split, first, end; // static range [first, end)
    __device__ int fixed(int i, bool dyn) const {
        if (dyn) { int kb = split + i * splits; return kb < nblk ? kb : -1; }
        int kb = first + i; return kb < end ? kb : -1;
    }
};

// cp.async pipeline, S stages of BC keys (K and V), NT threads.
template <int S, int BC, int NT, bool DYN>
__global__ void __launch_bounds__(NT) stream_cp(const uint4* K, const uint4* V, int nkeys, int hk, int splits,
                                                unsigned* ctr, unsigned long long* rec, unsigned* sink) {
    extern __shared__ uint4 sm[];
    __shared__ int s_tk[2];
    unsigned long long t0 = gtime();
    const int cpr = 16, stage = 2 * BC * cpr;
    int tile = blockIdx.x / splits, split = blockIdx.x % splits, h = tile;
    int nblk = nkeys / BC, per = nblk / splits;
    Sched sc{nblk, splits, split, split * per, split * per + per};
    const size_t rs = (size_t)hk * cpr;
    auto issue = [&](int kb, int slot) {
        uint4* sk = sm + slot * stage;
        uint4* sv = sk + BC * cpr;
#pragma unroll 4
        for (int i = threadIdx.x; i < BC * cpr; i += NT) {
            int r = i / cpr, c = i % cpr;
            size_t off = (size_t)(kb * BC + r) * rs + h * cpr + c;
            cp16(saddr(sk + i), K + off);
            cp16(saddr(sv + i), V + off);
        }
    };
    int kbq[S];
#pragma unroll
    for (int i = 0; i < S - 1; ++i) { kbq[i] = sc.fixed(i, DYN); if (kbq[i] >= 0) issue(kbq[i], i); commit(); }
    if (DYN && threadIdx.x == 0) s_tk[0] = (int)atomicAdd(ctr + tile, 1u) + (S - 1) * splits;
    unsigned acc = 0;
    for (int j = 0;; ++j) {
        wait_group<S - 2>();
        __syncthreads();
        int kb = kbq[0];
        if (kb < 0) break;
        int kn;
        if (DYN) {
            kn = s_tk[j & 1];
            kn = kn < nblk ? kn : -1;
            if (threadIdx.x == 0) s_tk[(j + 1) & 1] = kn >= 0 ? (int)atomicAdd(ctr + tile, 1u) + (S - 1) * splits : nblk;
        } else {
            kn = sc.fixed(j + S - 1, false);
        }
        if (kn >= 0) issue(kn, (j + S - 1) % S);
        commit();
#pragma unroll
        for (int i = 0; i < S - 2; ++i) kbq[i] = kbq[i + 1];
        kbq[S - 2] = kn;
        uint4 x = sm[(j % S) * stage + threadIdx.x];
        acc ^= x.x ^ x.w;
    }
    if (threadIdx.x == 0) { rec[3 * blockIdx.x] = t0; rec[3 * blockIdx.x + 1] = gtime(); rec[3 * blockIdx.x + 2] = smid(); }
    if (acc == 0x12345678u) sink[0] = acc;
}

// TMA pipeline: one 3-D tensor-map copy per K or V block (box 128 × 1 × BC),
// one mbarrier per stage; thread 0 issues, every thread waits on the parity.
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(saddr(b)), "r"(n)); }
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" :: "r"(saddr(b)), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma3(void* dst, const CUtensorMap* m, int c0, int c1, int c2, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(saddr(dst)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(saddr(bar)) : "memory");
}

template <int S, int BC, bool DYN>
__global__ void __launch_bounds__(256) stream_tma(const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                                                  int nkeys, int hk, int splits, unsigned* ctr, unsigned long long* rec, unsigned* sink) {
    extern __shared__ __align__(1024) uint4 sm_raw[];
    uint4* sm = sm_raw + ((1024 - (saddr(sm_raw) & 1023)) & 1023) / 16; // TMA destinations 1024-aligned
    __shared__ __align__(8) uint64_t full[S];
    __shared__ int s_tk[2];
    unsigned long long t0 = gtime();
    const int stage = 2 * BC * 16;
    int tile = blockIdx.x / splits, split = blockIdx.x % splits, h = tile;
    int nblk = nkeys / BC, per = nblk / splits;
    Sched sc{nblk, splits, split, split * per, split * per + per};
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) mbar_init(&full[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int kb, int slot) {
        uint4* sk = sm + slot * stage;
        mbar_expect(&full[slot], 2 * BC * 256);
        tma3(sk, &tk, 0, h, kb * BC, &full[slot]);
        tma3(sk + BC * 16, &tv, 0, h, kb * BC, &full[slot]);
    };
    int kbq[S];
#pragma unroll
    for (int i = 0; i < S - 1; ++i) { kbq[i] = sc.fixed(i, DYN); if (threadIdx.x == 0 && kbq[i] >= 0) issue(kbq[i], i); }
    if (DYN && threadIdx.x == 0) s_tk[0] = (int)atomicAdd(ctr + tile, 1u) + (S - 1) * splits;
    unsigned acc = 0;
    for (int j = 0;; ++j) {
        __syncthreads(); // slot (j − 1) % S consumed by every thread; s_tk[j & 1] written
        int kb = kbq[0];
        if (kb < 0) break;
        int kn;
        if (DYN) {
            kn = s_tk[j & 1];
            kn = kn < nblk ? kn : -1;
        } else {
            kn = sc.fixed(j + S - 1, false);
        }
        if (threadIdx.x == 0) {
            if (kn >= 0) issue(kn, (j + S - 1) % S);
            if (DYN) s_tk[(j + 1) & 1] = kn >= 0 ? (int)atomicAdd(ctr + tile, 1u) + (S - 1) * splits : nblk;
        }
#pragma unroll
        for (int i = 0; i < S - 2; ++i) kbq[i] = kbq[i + 1];
        kbq[S - 2] = kn;
        mbar_wait(&full[j % S], (j / S) & 1);
        uint4 x = sm[(j % S) * stage + threadIdx.x];
        acc ^= x.x ^ x.w;
    }
    if (threadIdx.x == 0) { rec[3 * blockIdx.x] = t0; rec[3 * blockIdx.x + 1] = gtime(); rec[3 * blockIdx.x + 2] = smid(); }
    if (acc == 0x12345678u) sink[0] = acc;
}




// K or V (nkeys, hk, 128) bf16 as a 3-D tensor map, box 128 × 1 × BC.
CUtensorMap make_map(const void* base, int nkeys, int hk, int bc) {
    CUtensorMap m;
    cuuint64_t dims[3] = {128, (cuuint64_t)hk, (cuuint64_t)nkeys};
    cuuint64_t strides[2] = {256, (cuuint64_t)hk * 256};
    cuuint32_t box[3] = {128, 1, (cuuint32_t)bc};
    cuuint32_t es[3] = {1, 1, 1};
    // The driver's entry point through the runtime (no -lcuda at link time).
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess) { printf("no cuTensorMapEncodeTiled\n"); exit(1); }
    }
    CU(encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, es,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    return m;
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Bench b; b.flush_n = (128u << 20) / 16;
    CK(cudaMalloc(&b.flush, b.flush_n * 16)); CK(cudaMemset(b.flush, 1, b.flush_n * 16));
    CK(cudaMalloc(&b.sink, 64)); CK(cudaMalloc(&b.ctr, 64 * 4));
    CK(cudaEventCreate(&b.e0)); CK(cudaEventCreate(&b.e1));
    unsigned long long* rec; CK(cudaMalloc(&rec, 4096 * 3 * 8));
    printf("| cache | kv heads | MB | variant | blocks | µs | TB/s | loop end min / median / max (µs from first start) | SMs of the 5 latest |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int nkeys : {4096, 32768, 131072}) for (int hk : {8, 32}) {
        if (hk == 32 && nkeys != 32768) continue;
        size_t n = (size_t)nkeys * hk * 16; // uint4 per tensor
        uint4 *K, *V;
        CK(cudaMalloc(&K, n * 16)); CK(cudaMalloc(&V, n * 16));
        CK(cudaMemset(K, 3, n * 16)); CK(cudaMemset(V, 5, n * 16));
        double mb = 2.0 * n * 16 / 1e6;
        int splits = std::max(1, sms / hk);
        while (nkeys % (splits * 128) != 0 && splits > 1) --splits;
        int blocks = hk * splits;
        auto row = [&](const char* name, float us) {
            std::vector<unsigned long long> r(3 * blocks);
            CK(cudaMemcpy(r.data(), rec, r.size() * 8, cudaMemcpyDeviceToHost));
            unsigned long long t0 = ~0ull;
            for (int i = 0; i < blocks; ++i) t0 = std::min(t0, r[3 * i]);
            std::vector<std::pair<double, int>> ends;
            for (int i = 0; i < blocks; ++i) ends.push_back({(r[3 * i + 1] - t0) / 1000.0, (int)r[3 * i + 2]});
            std::sort(ends.begin(), ends.end());
            char late[64]; int p = 0;
            for (int i = 0; i < 5 && i < blocks; ++i) p += snprintf(late + p, sizeof late - p, "%s%d", i ? " " : "", ends[blocks - 1 - i].second);
            printf("| %d | %d | %.1f | %s | %d | %.1f | %.2f | %.1f / %.1f / %.1f | %s |\n", nkeys, hk, mb, name, blocks, us, mb / us,
                   ends[0].first, ends[blocks / 2].first, ends[blocks - 1].first, late);
        };
        auto cp = [&](const char* name, auto k, int bc, int stages) {
            int smb = stages * 2 * bc * 256; set_smem(k, smb);
            row(name, b.time([&] { k<<<blocks, 256, smb>>>(K, V, nkeys, hk, splits, b.ctr, rec, b.sink); }));
        };
        for (int round = 0; round < 2; ++round) {
            cp("cp.async Bc128 S2 static", stream_cp<2, 128, 256, false>, 128, 2);
            cp("cp.async Bc128 S2 tickets", stream_cp<2, 128, 256, true>, 128, 2);
            cp("cp.async Bc64 S4 static", stream_cp<4, 64, 256, false>, 64, 4);
            cp("cp.async Bc64 S4 tickets", stream_cp<4, 64, 256, true>, 64, 4);
            cp("cp.async Bc32 S6 tickets", stream_cp<6, 32, 256, true>, 32, 6);
            auto tma = [&](const char* name, auto k, int bc, int stages) {
                CUtensorMap mk = make_map(K, nkeys, hk, bc), mv = make_map(V, nkeys, hk, bc);
                int smb = stages * 2 * bc * 256 + 1024; set_smem(k, smb);
                row(name, b.time([&] { k<<<blocks, 256, smb>>>(mk, mv, nkeys, hk, splits, b.ctr, rec, b.sink); }));
            };
            tma("TMA Bc128 S2 static", stream_tma<2, 128, false>, 128, 2);
            tma("TMA Bc128 S2 tickets", stream_tma<2, 128, true>, 128, 2);
            tma("TMA Bc64 S4 static", stream_tma<4, 64, false>, 64, 4);
            tma("TMA Bc64 S4 tickets", stream_tma<4, 64, true>, 64, 4);
            tma("TMA Bc32 S6 tickets", stream_tma<6, 32, true>, 32, 6);
        }
        CK(cudaFree(K)); CK(cudaFree(V));
    }
    return 0;
}
