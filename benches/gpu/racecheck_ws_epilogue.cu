// compute-sanitizer racecheck and a warp-specialised block's epilogue over its pipeline stages
// (run on the H100 or H200 GPU machine). The warp-specialised attention's post-loop steps in
// miniature: 512 threads; the producer warpgroup (threads 384-511) fills `stage` and arrives on
// an mbarrier, then leaves; the three consumer warpgroups wait on the mbarrier, read the stage,
// meet at a 384-thread named barrier; warpgroup 0 writes its result rows over the same bytes
// (as the attention's O overlays the loop's stages); the third warpgroup leaves; a 256-thread
// named barrier; warpgroups 0 and 1 read the rows (the element-wise epilogue).
//
// The producer's fill is cp.async with `cp.async.mbarrier.arrive.noinc` (`cp_async`, the
// generated kernels' form) or plain shared stores and an mbarrier arrive (`store`); the
// synchronisation of the epilogue is the same. `cp_async_apart` puts the rows in bytes the
// producer never wrote. Outputs are checked either way.
//
//   nvcc -O2 -arch=sm_90a -o /tmp/rcws benches/gpu/racecheck_ws_epilogue.cu
//   for m in cp_async store cp_async_apart; do
//     compute-sanitizer --tool racecheck --racecheck-report all /tmp/rcws $m | tail -3; done
#include <cstdio>
#include <cstring>

constexpr int ROWS = 2048;  // floats the result rows take (8 KB; the stage is twice that)

template <int MODE>  // 0: cp.async over the stage, 1: plain stores, 2: cp.async, rows apart
__global__ void __launch_bounds__(512, 1) epilogue(const float4* g, float* out) {
  __shared__ alignas(128) float stage[2 * ROWS];
  __shared__ alignas(8) unsigned long long full;
  const int t = threadIdx.x;
  const unsigned fb = (unsigned)__cvta_generic_to_shared(&full);
  if (t == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"(fb) : "memory");
  __syncthreads();
  if (t >= 384) {  // the producer: 128 threads, 16 bytes at a time
    const int i = t - 384;
    for (int j = 0; j < 2 * ROWS / 4 / 128; ++j) {
      float4* d = reinterpret_cast<float4*>(stage) + j * 128 + i;
      if constexpr (MODE == 1) {
        *d = g[j * 128 + i];
      } else {
        const unsigned s = (unsigned)__cvta_generic_to_shared(d);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g + j * 128 + i) : "memory");
      }
    }
    if constexpr (MODE == 1) {
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fb) : "memory");
    } else {
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(fb) : "memory");
      asm volatile("cp.async.wait_all;" ::: "memory");
    }
    return;
  }
  asm volatile(
      "{\n.reg .pred p;\nRC_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra RC_WAIT_%=;\n}\n" ::"r"(fb)
      : "memory");
  float acc = 0.0f;  // the loop: every consumer reads a slice of the stage
  for (int j = 0; j < 2 * ROWS / 384 + 1; ++j) {
    const int k = j * 384 + t;
    if (k < 2 * ROWS) acc += stage[k];
  }
  asm volatile("bar.sync 1, 384;" ::: "memory");
  __shared__ alignas(16) float own[ROWS];
  float* const rows = MODE == 2 ? own : stage;  // mode 2: bytes the producer never wrote
  if (t < 128) {  // warpgroup 0 stores its rows, fragment-scattered like FlashRows::store
    for (int j = 0; j < ROWS / 128; ++j) rows[j * 128 + (t ^ (j & 31))] = acc + (float)j;
  }
  if (t >= 256) {
    out[t] = acc;
    return;
  }
  asm volatile("bar.sync 2, 256;" ::: "memory");
  float s = 0.0f;  // warpgroups 0 and 1 read 8 consecutive floats at a time
  for (int i8 = t * 8; i8 < ROWS; i8 += 256 * 8) {
    const float4 a = reinterpret_cast<const float4*>(rows + i8)[0];
    const float4 b = reinterpret_cast<const float4*>(rows + i8)[1];
    s += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
  }
  out[t] = acc + s;
}

int main(int argc, char** argv) {
  const char* m = argc > 1 ? argv[1] : "cp_async";
  const int mode = std::strcmp(m, "store") == 0 ? 1 : std::strcmp(m, "cp_async_apart") == 0 ? 2 : 0;
  float4* g;
  float* out;
  cudaMalloc(&g, 2 * ROWS * sizeof(float));
  cudaMalloc(&out, 512 * sizeof(float));
  static float h[2 * ROWS];
  for (int i = 0; i < 2 * ROWS; ++i) h[i] = (float)(i % 7);
  cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice);
  float o1[512], o2[512];
  for (int rep = 0; rep < 2; ++rep) {
    if (mode == 0) epilogue<0><<<1, 512>>>(g, out);
    if (mode == 1) epilogue<1><<<1, 512>>>(g, out);
    if (mode == 2) epilogue<2><<<1, 512>>>(g, out);
    cudaMemcpy(rep ? o2 : o1, out, sizeof o1, cudaMemcpyDeviceToHost);
  }
  // The host's expected values: each consumer's stage sum, then the rows' sums.
  float acc[384];
  for (int t = 0; t < 384; ++t) {
    acc[t] = 0.0f;
    for (int j = 0; j < 2 * ROWS / 384 + 1; ++j) {
      const int k = j * 384 + t;
      if (k < 2 * ROWS) acc[t] += h[k];
    }
  }
  static float rows[ROWS];
  for (int t = 0; t < 128; ++t)
    for (int j = 0; j < ROWS / 128; ++j) rows[j * 128 + (t ^ (j & 31))] = acc[t] + (float)j;
  int bad = 0;
  for (int t = 0; t < 384; ++t) {
    float want = acc[t];
    if (t < 256)
      for (int i8 = t * 8; i8 < ROWS; i8 += 256 * 8)
        for (int e = 0; e < 8; ++e) want += rows[i8 + e];
    bad += o1[t] != want || o2[t] != want;
  }
  std::printf("%s: %s (%d wrong; %s)\n", m, bad ? "WRONG" : "ok", bad, cudaGetErrorString(cudaGetLastError()));
  return bad != 0;
}
