// compute-sanitizer racecheck and cp.async across a thread-block cluster (run on the H100 or
// H200 GPU machine). The interleaved warp-specialised attention
// form's epilogue in miniature. A cluster of two blocks; in each, 128 producer threads copy
// 16 bytes each into `buf`, wait for their own copies, arrive on a named barrier that the 128
// consumer threads sync on, and arrive on the cluster barrier with release. The consumers read
// `buf` and pass the cluster barrier (acquire). Rank 1's consumers then write into rank 0's
// `buf` (distributed shared memory); a second cluster barrier; rank 0 reads.
//
// The copies are cp.async (`cp_async`) or plain shared stores (`store`); the synchronisation is
// the same. racecheck reports "Potential WAW hazard (invalid memcpy_async synchronization)"
// for every byte with cp.async and none with stores. Results are right either way.
//
//   nvcc -O2 -arch=sm_90a -o /tmp/rc benches/gpu/racecheck_cluster_cp_async.cu
//   compute-sanitizer --tool racecheck --racecheck-report all /tmp/rc cp_async   # 385 errors
//   compute-sanitizer --tool racecheck --racecheck-report all /tmp/rc store      # 0 hazards
#include <cstdio>
#include <cstring>

template <bool CP_ASYNC>
__global__ void __cluster_dims__(2, 1, 1) epilogue(const int4* g, int* out) {
  __shared__ alignas(16) int4 buf[128];
  const int t = threadIdx.x;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (t >= 128) {  // the producer
    const int i = t - 128;
    if constexpr (CP_ASYNC) {
      const unsigned d = (unsigned)__cvta_generic_to_shared(&buf[i]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(g + i) : "memory");
      asm volatile("cp.async.wait_all;" ::: "memory");
    } else {
      buf[i] = g[i];
    }
    asm volatile("bar.arrive 1, 256;" ::: "memory");
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    return;
  }
  asm volatile("bar.sync 1, 256;" ::: "memory");
  const int v = buf[t].x;
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
  if (rank == 1) {
    int4* remote;
    asm volatile("mapa.u64 %0, %1, 0;" : "=l"(remote) : "l"(&buf[t]));
    *remote = make_int4(v + 1000, 0, 0, 0);
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (rank == 0) out[t] = buf[t].x;
}

int main(int argc, char** argv) {
  const bool cp = argc < 2 || std::strcmp(argv[1], "store") != 0;
  int4* g;
  int* out;
  cudaMalloc(&g, 128 * sizeof(int4));
  cudaMalloc(&out, 128 * sizeof(int));
  int4 h[128];
  for (int i = 0; i < 128; ++i) h[i] = make_int4(i, 0, 0, 0);
  cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice);
  if (cp) {
    epilogue<true><<<2, 256>>>(g, out);
  } else {
    epilogue<false><<<2, 256>>>(g, out);
  }
  int o[128];
  cudaMemcpy(o, out, sizeof o, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 128; ++i) bad += o[i] != i + 1000;
  std::printf("%s: %s (%d wrong; %s)\n", cp ? "cp_async" : "store", bad ? "WRONG" : "ok", bad,
              cudaGetErrorString(cudaGetLastError()));
  return bad != 0;
}
