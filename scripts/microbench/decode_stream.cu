// Decode streaming floor (perf notes, decode step 14): how fast can a kernel
// *only read* the K/V cache of a batch-1 decode step with each access pattern
// and pipeline shape, no attention math? Built and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o decode_stream decode_stream.cu && ./decode_stream
// bf16 K and V (seqlen, nheads_k, 128), L2 flushed by a 128 MB read before
// every timed run (as fa-bench-decode), CUDA events, median of 30 runs.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(uint32_t s, const void* g) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" :: "r"(s), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// The S-stage loop both decompositions share: block j waited for, a barrier,
// block j + S − 1 issued, one 16-byte chunk of block j read.
template <int S, class Issue>
__device__ __forceinline__ unsigned pipeline(int nblk, Issue issue, const uint4* sm, int stage_chunks) {
    for (int s = 0; s < S - 1; ++s) { if (s < nblk) issue(s); commit(); }
    unsigned acc = 0;
    for (int j = 0; j < nblk; ++j) {
        wait_group<S - 2>();
        __syncthreads();
        if (j + S - 1 < nblk) issue(j + S - 1);
        commit();
        uint4 x = sm[(j % S) * stage_chunks + threadIdx.x];
        acc ^= x.x ^ x.w;
    }
    return acc;
}

// (a) Our decomposition: a block per (kv head, split); rows of 256 B at the
// head's offset, BC keys per stage, S stages, NT threads; the "compute" reads
// one 16-byte chunk per thread per stage (keeps the copies live). With TAIL
// > 0, TAIL straight-line FFMAs run once after the loop (code never run
// before in this launch: instruction-fetch misses after an L2 flush) — what
// cold code at the end of a decode kernel costs.
template <int N>
__device__ __forceinline__ float cold_code(float x) {
    float a = x, b = x + 1.f, c = x + 2.f, d = x + 3.f;
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(a));
        asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(b));
        asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(c));
        asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(d));
    }
    return a + b + c + d;
}

template <int S, int BC, int NT, int TAIL = 0>
__global__ void __launch_bounds__(NT) per_head(const uint4* K, const uint4* V, int nkeys, int hk, int splits, unsigned* sink) {
    extern __shared__ uint4 sm[];
    const int cpr = 16;
    int h = blockIdx.x / splits, split = blockIdx.x % splits;
    int kps = nkeys / splits, k0 = split * kps, nblk = kps / BC;
    const size_t rs = (size_t)hk * cpr;
    auto issue = [&](int j) {
        uint4* sk = sm + (j % S) * 2 * BC * cpr;
        uint4* sv = sk + BC * cpr;
        for (int i = threadIdx.x; i < BC * cpr; i += NT) {
            int r = i / cpr, c = i % cpr;
            size_t off = (size_t)(k0 + j * BC + r) * rs + h * cpr + c;
            cp16(saddr(sk + i), K + off);
            cp16(saddr(sv + i), V + off);
        }
    };
    unsigned acc = pipeline<S>(nblk, issue, sm, 2 * BC * cpr);
    if (TAIL > 0) {
        float f = cold_code<TAIL>(__uint_as_float(acc & 0x3f000000u));
        if (f == 1234.5f) sink[1] = acc;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

// (b) A block per key range reading every KV head of a row (2 KB contiguous
// per row at hk = 8): same pipeline, BC rows of all heads per stage.
template <int S, int BC, int NT>
__global__ void __launch_bounds__(NT) all_heads(const uint4* K, const uint4* V, int nkeys, int hk, int splits, unsigned* sink) {
    extern __shared__ uint4 sm[];
    const int cpr = 16 * hk;
    int split = blockIdx.x;
    // Uneven splits allowed (grid = any count): keys [k0, k1).
    int k0 = (int)((long long)nkeys * split / splits), k1 = (int)((long long)nkeys * (split + 1) / splits);
    int nblk = (k1 - k0 + BC - 1) / BC;
    auto issue = [&](int j) {
        uint4* sk = sm + (j % S) * 2 * BC * cpr;
        uint4* sv = sk + BC * cpr;
        for (int i = threadIdx.x; i < BC * cpr; i += NT) {
            int r = i / cpr;
            int t = k0 + j * BC + r;
            if (t < k1) {
                size_t off = (size_t)t * cpr + i % cpr;
                cp16(saddr(sk + i), K + off);
                cp16(saddr(sv + i), V + off);
            }
        }
    };
    unsigned acc = pipeline<S>(nblk, issue, sm, 2 * BC * cpr);
    if (acc == 0x12345678u) sink[0] = acc;
}

// (c) Plain vector loads, grid-stride over K then V: the device's read ceiling.
__global__ void plain_read(const uint4* K, const uint4* V, size_t n, unsigned* sink) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 a[8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            size_t k = i + u * stride;
            a[u] = k < n ? __ldcg(K + k) : make_uint4(0, 0, 0, 0);
            a[4 + u] = k < n ? __ldcg(V + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= a[u].x ^ a[u].w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void flush_read(const uint4* p, size_t n, unsigned* sink) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) acc ^= __ldcg(p + i).y;
    if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void empty_kernel() {}

struct Bench {
    uint4* flush; size_t flush_n; unsigned* sink; cudaEvent_t e0, e1;
    template <class F> float time(F launch, int reps = 30) {
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
            flush_read<<<132 * 4, 512>>>(flush, flush_n, sink);
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 3) t.push_back(ms * 1000.f);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

template <class Kern> void set_smem(Kern k, int bytes) { CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); }

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Bench b; b.flush_n = (128u << 20) / 16;
    CK(cudaMalloc(&b.flush, b.flush_n * 16)); CK(cudaMemset(b.flush, 1, b.flush_n * 16));
    CK(cudaMalloc(&b.sink, 64));
    CK(cudaEventCreate(&b.e0)); CK(cudaEventCreate(&b.e1));
    printf("| cache | kv heads | MB | pattern | blocks | µs | TB/s |\n|---|---|---|---|---|---|---|\n");
    float te = b.time([&] { empty_kernel<<<1, 32>>>(); });
    printf("| - | - | 0 | empty kernel | 1 | %.1f | - |\n", te);
    for (int nkeys : {4096, 32768, 131072}) for (int hk : {8, 32}) {
        size_t n = (size_t)nkeys * hk * 16; // uint4 per tensor
        uint4 *K, *V;
        CK(cudaMalloc(&K, n * 16)); CK(cudaMalloc(&V, n * 16));
        CK(cudaMemset(K, 3, n * 16)); CK(cudaMemset(V, 5, n * 16));
        double mb = 2.0 * n * 16 / 1e6;
        auto row = [&](const char* name, int blocks, float us) { printf("| %d | %d | %.1f | %s | %d | %.1f | %.2f |\n", nkeys, hk, mb, name, blocks, us, mb / us); };
        row("plain ld.cg, 4 blocks/SM", sms * 4, b.time([&] { plain_read<<<sms * 4, 512>>>(K, V, n, b.sink); }));
        row("plain ld.cg, 16 blocks/SM", sms * 16, b.time([&] { plain_read<<<sms * 16, 256>>>(K, V, n, b.sink); }));
        // per-head splits: as many as fill one wave with 1 block/SM
        int splits1 = std::max(1, sms / hk);
        while (nkeys % (splits1 * 128) != 0 && splits1 > 1) --splits1;
        {
            auto k = per_head<2, 128, 256>; int sm = 2 * 2 * 128 * 256; set_smem(k, sm);
            row("per head w8 Bc128 S2", hk * splits1, b.time([&] { k<<<hk * splits1, 256, sm>>>(K, V, nkeys, hk, splits1, b.sink); }));
        }
        {
            auto k = per_head<3, 128, 256>; int sm = 3 * 2 * 128 * 256; set_smem(k, sm);
            row("per head w8 Bc128 S3", hk * splits1, b.time([&] { k<<<hk * splits1, 256, sm>>>(K, V, nkeys, hk, splits1, b.sink); }));
        }
        {
            auto k = per_head<4, 64, 256>; int sm = 4 * 2 * 64 * 256; set_smem(k, sm);
            row("per head w8 Bc64 S4", hk * splits1, b.time([&] { k<<<hk * splits1, 256, sm>>>(K, V, nkeys, hk, splits1, b.sink); }));
        }
        if (nkeys != 131072) {
            auto k1 = per_head<2, 128, 256, 512>; int sm = 2 * 2 * 128 * 256; set_smem(k1, sm);
            row("per head w8 Bc128 S2 + 512 cold FFMA", hk * splits1, b.time([&] { k1<<<hk * splits1, 256, sm>>>(K, V, nkeys, hk, splits1, b.sink); }));
            auto k2 = per_head<2, 128, 256, 2048>; set_smem(k2, sm);
            row("per head w8 Bc128 S2 + 2048 cold FFMA", hk * splits1, b.time([&] { k2<<<hk * splits1, 256, sm>>>(K, V, nkeys, hk, splits1, b.sink); }));
        }
        {
            int splits2 = std::max(1, 2 * sms / hk);
            while (nkeys % (splits2 * 64) != 0 && splits2 > 1) --splits2;
            auto k = per_head<3, 64, 128>; int sm = 3 * 2 * 64 * 256; set_smem(k, sm);
            row("per head w4 Bc64 S3, 2/SM", hk * splits2, b.time([&] { k<<<hk * splits2, 128, sm>>>(K, V, nkeys, hk, splits2, b.sink); }));
        }
        // all heads per block: BC rows of hk·256 B per stage (64 KB per K+V stage at hk = 8, BC = 16)
        for (int blocks : {128, sms}) {
            if (hk == 8) {
                auto k = all_heads<2, 16, 256>; int sm = 2 * 2 * 16 * 2048; set_smem(k, sm);
                row("all heads Bc16 S2", blocks, b.time([&] { k<<<blocks, 256, sm>>>(K, V, nkeys, hk, blocks, b.sink); }));
                auto k3 = all_heads<3, 16, 256>; int sm3 = 3 * 2 * 16 * 2048; set_smem(k3, sm3);
                row("all heads Bc16 S3", blocks, b.time([&] { k3<<<blocks, 256, sm3>>>(K, V, nkeys, hk, blocks, b.sink); }));
                auto k8 = all_heads<6, 8, 256>; int sm8 = 6 * 2 * 8 * 2048; set_smem(k8, sm8);
                row("all heads Bc8 S6", blocks, b.time([&] { k8<<<blocks, 256, sm8>>>(K, V, nkeys, hk, blocks, b.sink); }));
            } else {
                auto k = all_heads<3, 4, 256>; int sm = 3 * 2 * 4 * 8192; set_smem(k, sm);
                row("all heads Bc4 S3", blocks, b.time([&] { k<<<blocks, 256, sm>>>(K, V, nkeys, hk, blocks, b.sink); }));
            }
        }
        CK(cudaFree(K)); CK(cudaFree(V));
    }
    return 0;
}
