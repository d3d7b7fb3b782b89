// Streaming microbenchmark (the H100 / H200 GPU machine): how fast can a
// 4096x4096 fp16 W (row-major [K, N]) be read cold (6 rotated copies, 192 MiB > 3x L2), per
// access pattern: grid-stride vector loads, cp.async column strips (the generated GEMV loops'
// pattern), 1-D bulk copies and 2-D TMA tiles? One CUDA graph per variant, median µs per launch.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/stream_read \
//       benches/gpu/stream_read.cu -lcuda && /tmp/stream_read
//   RANDFILL=1: random weights instead of a byte pattern; NOBULK=1: skip the bulk/TMA variants.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
constexpr int K = 4096, N = 4096, SETS = 6;

__global__ void lin(const int4* __restrict__ w, size_t n16, int* out) {
  int acc = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    int4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = __ldg(w + i + u * stride);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].w;
  }
  for (; i < n16; i += stride) { int4 v = __ldg(w + i); acc ^= v.x; }
  if (acc == 0x12345678) out[0] = acc;
}

__device__ __forceinline__ void cp16(void* s, const void* g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g) : "memory");
}
template <int NW> __device__ __forceinline__ void cpwait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(NW) : "memory"); }
__device__ __forceinline__ void cpcommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// CTA (nt, kq): rows [kq*K/KS, ..), cols [nt*NT, +NT); tiles of KT rows; STAGES deep.
template <int NTILE, int KT, int STAGES, int KS, int NTHR>
__global__ void __launch_bounds__(NTHR) strip(const __half* __restrict__ w, int* out) {
  extern __shared__ __align__(16) unsigned char sm[];
  __half* st = reinterpret_cast<__half*>(sm);
  constexpr int TILE = KT * NTILE, PER = TILE / 8 / NTHR, ITS = K / KS / KT;
  static_assert(PER >= 1, "per");
  const int nt = blockIdx.x % (N / NTILE), kq = blockIdx.x / (N / NTILE);
  const __half* base = w + (size_t)kq * (K / KS) * N + nt * NTILE;
  auto load = [&](int it, int s) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      int i = (threadIdx.x + u * NTHR) * 8;
      int r = i / NTILE, c = i % NTILE;
      cp16(st + s * TILE + i, base + (size_t)(it * KT + r) * N + c);
    }
  };
  for (int s = 0; s < STAGES - 1; ++s) { if (s < ITS) load(s, s); cpcommit(); }
  int acc = 0;
  for (int it = 0; it < ITS; ++it) {
    cpwait<STAGES - 2>();
    __syncthreads();
    if (it + STAGES - 1 < ITS) load(it + STAGES - 1, (it + STAGES - 1) % STAGES);
    cpcommit();
    const int4* t = reinterpret_cast<const int4*>(st + (it % STAGES) * TILE);
    acc ^= t[threadIdx.x % (TILE / 8)].x;
  }
  if (acc == 0x12345678) out[0] = acc;
}

// ---- bulk copies completing on an mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(n));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned phase) {
  unsigned a = (unsigned)__cvta_generic_to_shared(b);
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(a), "r"(phase)
      : "memory");
}
__device__ __forceinline__ void bulk(void* s, const void* g, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   (unsigned)__cvta_generic_to_shared(s)),
               "l"(g), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(b))
               : "memory");
}
__device__ __forceinline__ void tma2d(void* s, const CUtensorMap* m, int c0, int c1, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          (unsigned)__cvta_generic_to_shared(s)),
      "l"(m), "r"(c0), "r"(c1), "r"((unsigned)__cvta_generic_to_shared(b))
      : "memory");
}

// MODE 0: one 1-D bulk copy per row (issued by warp 0's lanes); MODE 1: one 2-D TMA per tile.
template <int NTILE, int KT, int STAGES, int KS, int NTHR, int MODE>
__global__ void __launch_bounds__(NTHR) bulkstrip(const __half* __restrict__ w, const __grid_constant__ CUtensorMap map, int* out) {
  extern __shared__ __align__(16) unsigned char sm[];
  // TMA destinations want 128-byte alignment (the launch adds 128 bytes of slack).
  __half* st = reinterpret_cast<__half*>((reinterpret_cast<uintptr_t>(sm) + 127) & ~uintptr_t(127));
  constexpr int TILE = KT * NTILE, ITS = K / KS / KT;
  __shared__ uint64_t bar[STAGES];
  const int nt = blockIdx.x % (N / NTILE), kq = blockIdx.x / (N / NTILE);
  const int row0 = kq * (K / KS);
  if (threadIdx.x == 0) { for (int s = 0; s < STAGES; ++s) mbar_init(&bar[s], 1); asm volatile("fence.mbarrier_init.release.cluster;"); }
  __syncthreads();
  auto load = [&](int it, int s) {
    if (MODE == 0) {
      if (threadIdx.x < 32) {
        if (threadIdx.x == 0) mbar_expect(&bar[s], TILE * 2);
        __syncwarp();
        for (int r = threadIdx.x; r < KT; r += 32)
          bulk(st + s * TILE + r * NTILE, w + (size_t)(row0 + it * KT + r) * N + nt * NTILE, NTILE * 2, &bar[s]);
      }
    } else if (threadIdx.x == 0) {
      mbar_expect(&bar[s], TILE * 2);
      tma2d(st + s * TILE, &map, nt * NTILE, row0 + it * KT, &bar[s]);
    }
  };
  for (int s = 0; s < STAGES - 1 && s < ITS; ++s) load(s, s);
  int acc = 0;
  for (int it = 0; it < ITS; ++it) {
    const int s = it % STAGES;
    if (it + STAGES - 1 < ITS) load(it + STAGES - 1, (it + STAGES - 1) % STAGES);
    mbar_wait(&bar[s], (it / STAGES) & 1);
    const int4* t = reinterpret_cast<const int4*>(st + s * TILE);
    acc ^= t[threadIdx.x % (TILE / 8)].x;
    __syncthreads();  // everyone done with stage s before it is refilled
  }
  if (acc == 0x12345678) out[0] = acc;
}

__global__ void tiny(int* out) { if (threadIdx.x == 1234) out[0] = 1; }

template <class F>
float timeit(F launch) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int r = 0; r < SETS; ++r) launch(r, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int i = 0; i < 40; ++i) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.f / SETS);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return ts[ts.size() / 2];
}

__half* W[SETS];
int* OUT;
CUtensorMap maps[SETS][4];

template <int NTILE, int KT, int STAGES, int KS, int NTHR>
void run_strip(int extra = 0) {
  auto k = strip<NTILE, KT, STAGES, KS, NTHR>;
  int smem = KT * NTILE * 2 * STAGES + extra;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int grid = (N / NTILE) * KS;
  float us = timeit([&](int r, cudaStream_t s) { k<<<grid, NTHR, smem, s>>>(W[r], OUT); });
  printf("strip  ntile %4d kt %4d stages %d ksplit %d thr %4d grid %4d smem %6d : %7.2f us  %6.0f GB/s\n", NTILE, KT, STAGES, KS, NTHR, grid,
         smem, us, K * (double)N * 2 / us / 1e3);
}

template <int NTILE, int KT, int STAGES, int KS, int NTHR, int MODE>
void run_bulk(int mi) {
  auto k = bulkstrip<NTILE, KT, STAGES, KS, NTHR, MODE>;
  int smem = KT * NTILE * 2 * STAGES + 128;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int grid = (N / NTILE) * KS;
  float us = timeit([&](int r, cudaStream_t s) { k<<<grid, NTHR, smem, s>>>(W[r], maps[r][mi], OUT); });
  printf("%s ntile %4d kt %4d stages %d ksplit %d thr %4d grid %4d smem %6d : %7.2f us  %6.0f GB/s\n", MODE ? "tma2d " : "bulk1d", NTILE, KT,
         STAGES, KS, NTHR, grid, smem, us, K * (double)N * 2 / us / 1e3);
}

int main() {
  for (int r = 0; r < SETS; ++r) {
    CK(cudaMalloc(&W[r], (size_t)K * N * 2));
    CK(cudaMemset(W[r], r + 1, (size_t)K * N * 2));
    if (getenv("RANDFILL")) { std::vector<unsigned> h((size_t)K * N / 2); unsigned x = 12345 + r; for (auto& v : h) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; v = x & 0x3bff3bffu; } CK(cudaMemcpy(W[r], h.data(), (size_t)K * N * 2, cudaMemcpyHostToDevice)); }
  }
  CK(cudaMalloc(&OUT, 64));
  typedef CUresult (*Enc)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                          const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  Enc enc = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&enc, cudaEnableDefault, &q));
  const int boxes[4][2] = {{128, 64}, {256, 32}, {64, 128}, {128, 128}};
  for (int r = 0; r < SETS; ++r)
    for (int m = 0; m < 4; ++m) {
      cuuint64_t dims[2] = {N, K}, strides[1] = {N * 2};
      cuuint32_t box[2] = {(cuuint32_t)boxes[m][0], (cuuint32_t)boxes[m][1]}, es[2] = {1, 1};
      CUresult e = enc(&maps[r][m], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, W[r], dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (e != CUDA_SUCCESS) { printf("encode failed %d (box %d)\n", (int)e, m); }
    }
  printf("tiny kernel: %.2f us\n", timeit([&](int, cudaStream_t s) { tiny<<<1, 32, 0, s>>>(OUT); }));
  for (int g : {132, 264, 528, 1056}) {
    float us = timeit([&](int r, cudaStream_t s) { lin<<<g, 256, 0, s>>>((const int4*)W[r], (size_t)K * N / 8, OUT); });
    printf("linear grid %4d : %7.2f us  %6.0f GB/s\n", g, us, K * (double)N * 2 / us / 1e3);
  }
  run_strip<32, 256, 4, 1, 128>();   // ours today (b=1)
  run_strip<32, 256, 6, 1, 128>();
  run_strip<32, 128, 8, 1, 128>();
  run_strip<32, 256, 4, 1, 256>();
  run_strip<64, 128, 4, 2, 128>();
  run_strip<128, 64, 4, 4, 128>();
  run_strip<128, 64, 8, 4, 128>();
  run_strip<128, 64, 8, 4, 256>();
  run_strip<256, 32, 8, 8, 256>();
  run_strip<128, 32, 8, 8, 128>();   // 256 CTAs
  run_strip<512, 16, 8, 16, 256>();
  run_strip<32, 256, 4, 1, 128>(94464);
  run_strip<64, 128, 4, 2, 256>();   // RMSNorm+Linear b=1's H200 winner's shape (K split over a cluster of 2)
  run_strip<64, 128, 8, 2, 256>();
  run_strip<32, 256, 4, 1, 256>(98368);  // b=8's winner's shape and shared memory
  run_strip<32, 128, 12, 1, 256>();
  if (getenv("NOBULK")) return 0;
  run_bulk<128, 64, 4, 4, 128, 0>(0);
  run_bulk<128, 64, 8, 4, 128, 0>(0);
  run_bulk<256, 32, 8, 8, 128, 0>(1);
  run_bulk<32, 256, 4, 1, 128, 0>(0);
  run_bulk<128, 64, 4, 4, 128, 1>(0);
  run_bulk<128, 64, 8, 4, 128, 1>(0);
  run_bulk<256, 32, 8, 8, 128, 1>(1);
  run_bulk<64, 128, 8, 2, 128, 1>(2);
  run_bulk<128, 128, 4, 4, 128, 1>(3);
  return 0;
}
