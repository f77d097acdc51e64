// Decode step 43 (session 16): what cold instruction fetch costs a kernel's
// last steps. The flash-decoding kernel's fused combine runs ~20 KB of SASS
// once per tile at the very end, after the benchmark's L2 flush has evicted
// the kernel's code (as a real decode step's GEMMs would). Here one block
// (or 132, one per SM) runs a straight-line body of N independent FMA
// instructions (16 bytes of SASS each) three times in a loop; thread 0
// stamps %globaltimer around each pass. Pass 1 fetches the body cold (from
// DRAM, or from the L2 when another SM fetched it first), passes 2–3 run it
// from the instruction caches: pass 1 − pass 3 is the fetch cost of N·16
// bytes of code.
//   nvcc -O3 -arch=sm_90a -o icache_cold icache_cold.cu && ./icache_cold
#include "microbench.cuh"

template <int N>
__global__ void __launch_bounds__(128) body_k(float* out, unsigned long long* tl, float seed) {
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = seed + threadIdx.x + i;
    unsigned long long t[4];
    for (int pass = 0; pass < 3; ++pass) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[pass]) :: "memory");
#pragma unroll
        for (int i = 0; i < N; ++i) asm volatile("fma.rn.f32 %0, %0, %0, 0f3F800000;" : "+f"(a[i & 7]));
        __syncthreads();
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[3]) :: "memory");
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += a[i];
    if (s == 1234.5f) out[0] = s;
    if (threadIdx.x == 0)
        for (int k = 0; k < 3; ++k) tl[blockIdx.x * 3 + k] = t[k + 1] - t[k];
}

template <int N>
void run(Bench& b, float* out, unsigned long long* tl, int blocks) {
    auto k = body_k<N>;
    std::vector<double> p1, p2, p3;
    for (int r = 0; r < 20; ++r) {
        flush_read<<<132 * 4, 512>>>(b.flush, b.flush_n, b.sink, nullptr);
        k<<<blocks, 128>>>(out, tl, (float)r);
        CK(cudaDeviceSynchronize());
        std::vector<unsigned long long> h(blocks * 3);
        CK(cudaMemcpy(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost));
        // the slowest block's passes
        unsigned long long m[3] = {0, 0, 0};
        for (int i = 0; i < blocks; ++i)
            for (int k2 = 0; k2 < 3; ++k2) m[k2] = std::max(m[k2], h[i * 3 + k2]);
        if (r >= 2) { p1.push_back(m[0] / 1e3); p2.push_back(m[1] / 1e3); p3.push_back(m[2] / 1e3); }
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("| %d | %d KB | %d | %.2f | %.2f | %.2f | %.2f |\n", N, N * 16 / 1024, blocks, med(p1), med(p2), med(p3), med(p1) - med(p3));
}

int main() {
    Bench b; b.flush_n = (128u << 20) / 16;
    CK(cudaMalloc(&b.flush, b.flush_n * 16)); CK(cudaMemset(b.flush, 1, b.flush_n * 16));
    CK(cudaMalloc(&b.sink, 64));
    float* out; CK(cudaMalloc(&out, 64));
    unsigned long long* tl; CK(cudaMalloc(&tl, 132 * 3 * 8));
    printf("| FMA instructions | SASS | blocks | pass 1 µs (cold) | pass 2 | pass 3 | cold − warm |\n|---|---|---|---|---|---|---|\n");
    for (int blocks : {1, 132}) {
        run<256>(b, out, tl, blocks);
        run<1024>(b, out, tl, blocks);
        run<2048>(b, out, tl, blocks);
        run<4096>(b, out, tl, blocks);
    }
    return 0;
}
