// Shared pieces of the decode streaming microbenchmarks (decode_stream.cu,
// decode_balance.cu): error checks, cp.async wrappers, the L2 flush by a
// 128 MB read and the CUDA-event timing loop (median of `reps` runs, each
// after a flush).
#pragma once
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

// Reads `n` uint4 through the L2 (evicting what a timed run would find);
// block 0 also zeroes 64 counters at `ctr` when given.
__global__ void flush_read(const uint4* p, size_t n, unsigned* sink, unsigned* ctr) {
    unsigned acc = 0;
    if (ctr && blockIdx.x == 0 && threadIdx.x < 64) ctr[threadIdx.x] = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) acc ^= __ldcg(p + i).y;
    if (acc == 0x12345678u) sink[0] = acc;
}

struct Bench {
    uint4* flush; size_t flush_n; unsigned* sink; cudaEvent_t e0, e1;
    unsigned* ctr = nullptr; // zeroed by every flush when set
    template <class F> float time(F launch, int reps = 30) {
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
            flush_read<<<132 * 4, 512>>>(flush, flush_n, sink, ctr);
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
