// block graph: grid [8, 8, 1], block [128, 1, 1], forloop_range 2, 24976 bytes of shared memory, 2 pipeline stage(s)
extern "C" __global__ void __launch_bounds__(128) mi_k2_customized(const mi::f16* __restrict__ in0, const mi::f16* __restrict__ in1, mi::f16* __restrict__ out0) {
  { // L2 prefetch before the wait
    constexpr int NT = 128;
    const int tid = mi::lin_tid();
    { // input 0
      const long long base = (long long)blockIdx.y * 128LL + (long long)(0) * 64LL;
      for (int c = tid; c < 4; c += NT) {
        const unsigned i = (unsigned)c * 64u;
        mi::prefetch_l2(in0 + base + (i / 64) * 1024 + (i % 64));
      }
    }
    { // input 1
      const long long base = (long long)blockIdx.x * 64LL + (long long)blockIdx.y * 65536LL + (long long)(0) * 32768LL;
      for (int c = tid; c < 64; c += NT) {
        const unsigned i = (unsigned)c * 64u;
        mi::prefetch_l2(in1 + base + (i / 64) * 512 + (i % 64));
      }
    }
  }
  mi::dep_wait(); // the next kernel goes after this loop's last copies
  extern __shared__ __align__(16) unsigned char mi_smem[];
  constexpr int NT = 128;
  const int tid = mi::lin_tid();
  (void)tid;
  unsigned long long* const mi_merge_bar = reinterpret_cast<unsigned long long*>(mi_smem + 23664); // the merge's pushes land
  if (mi::cluster_rank() == 0 && tid == 0) mi::cluster_merge_init(mi_merge_bar);
  mi::cluster_arrive_relaxed(); // its merge waits for every block of the cluster to start
  float* const mi_recv = reinterpret_cast<float*>(mi_smem + 16384); // the cluster merge's receive area
  mi::f16* const t0_st = reinterpret_cast<mi::f16*>(mi_smem + 23680); // [4, 64] float16
  mi::f16* const t1_st = reinterpret_cast<mi::f16*>(mi_smem + 0); // [64, 64] float16
  float* const t3 = reinterpret_cast<float*>(mi_smem + 23680); // [4, 64] float32
  float* const t4 = reinterpret_cast<float*>(mi_smem + 24960); // [4, 1] float32
  float* const t5 = reinterpret_cast<float*>(mi_smem + 23680); // [4, 64] float32
  mi::MmaAcc<NT, 1, 4, 64, 64, 72, 64, mi::f16, true> mm3;
  mi::RowSumAcc<NT, 4, 64, 72, mi::f16, true> rs4;
  { // input 0 -> t0
    const long long base = (long long)blockIdx.y * 128LL + (long long)(0) * 64LL;
    if (mi::aligned16(in0)) {
      for (int c = tid; c < 32; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::cp_async16((t0_st + 0) + mi::pidx<64, 72>(i), in0 + base + (i / 64) * 1024 + (i % 64));
      }
    } else {
      for (int i = tid; i < 256; i += NT) (t0_st + 0)[mi::pidx<64, 72>(i)] = in0[base + (i / 64) * 1024 + (i % 64)];
    }
  }
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 64LL + (long long)blockIdx.y * 65536LL + (long long)(0) * 32768LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 64) * 512 + (i % 64);
      auto* const dst = (t1_st + 0) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 8192LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 24576LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t1_st + 0)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 512 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  for (int it = 0; it < 2; ++it) {
    mi::cp_async_wait<0>();
    __syncthreads();
    mi::f16* const t0 = t0_st + (it % 2) * 288;
    mi::f16* const t1 = t1_st + (it % 2) * 4096;
    if (it + 1 < 2) {
      { // input 0 -> t0
        const long long base = (long long)blockIdx.y * 128LL + (long long)((it + 1)) * 64LL;
        if (mi::aligned16(in0)) {
          for (int c = tid; c < 32; c += NT) {
            const unsigned i = (unsigned)c * 8u;
            mi::cp_async16((t0_st + ((it + 1) % 2) * 288) + mi::pidx<64, 72>(i), in0 + base + (i / 64) * 1024 + (i % 64));
          }
        } else {
          for (int i = tid; i < 256; i += NT) (t0_st + ((it + 1) % 2) * 288)[mi::pidx<64, 72>(i)] = in0[base + (i / 64) * 1024 + (i % 64)];
        }
      }
      { // input 1 -> t1
        const long long base = (long long)blockIdx.x * 64LL + (long long)blockIdx.y * 65536LL + (long long)((it + 1)) * 32768LL;
        if (mi::aligned16(in1)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in1 + base + (i / 64) * 512 + (i % 64);
          auto* const dst = (t1_st + ((it + 1) % 2) * 4096) + mi::swz<64, 8>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 8192LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 16384LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 24576LL, mi_once);
        } else {
          for (int i = tid; i < 4096; i += NT) (t1_st + ((it + 1) % 2) * 4096)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 512 + (i % 64)];
        }
      }
    }
    mi::cp_async_commit();
    if (it == 0) mi::dep_launch(); // the last copies are issued
    mm3.step(t0, t1);
    rs4.step(t0);
  }
  mi::cp_async_wait<0>();
  __syncthreads();
  static_assert(decltype(mm3)::SCRATCH * 4 <= 16384, "finish scratch");
  mm3.finish(reinterpret_cast<float*>(mi_smem + 0), [&](int c) -> float& { return t3[c]; });
  static_assert(decltype(rs4)::SCRATCH * 4 <= 256, "finish scratch");
  rs4.finish(reinterpret_cast<float*>(mi_smem + 24704), [&](int r) -> float& { return t4[r]; });
  __syncthreads();
  { // the cluster's sums into its first block's receive area, added where read
  mi::cluster_wait(); // every block of the cluster has started
  if (mi::cluster_rank() != 0) {
    mi::cluster_push_async<NT>(t3, mi_recv + 0, 260, 256, mi_merge_bar);
    mi::cluster_push_async<NT>(t4, mi_recv + 256, 260, 4, mi_merge_bar);
    return;
  }
  if (tid == 0) mi::cluster_merge_arm(mi_merge_bar, 7280u);
  mi::mbar_wait(mi_merge_bar, 0);
  }
  if (mi::cluster_rank() != 0) return; // merged into the cluster's first block
  __syncthreads();
  for (int i = tid; i < 256; i += NT) { // fused element-wise -> t5
    const float r0 = (t3[i] + mi_recv[0 + (i)] + mi_recv[260 + (i)] + mi_recv[520 + (i)] + mi_recv[780 + (i)] + mi_recv[1040 + (i)] + mi_recv[1300 + (i)] + mi_recv[1560 + (i)]);
    const float r1 = sqrtf((t4[(i / 64)] + mi_recv[256 + ((i / 64))] + mi_recv[516 + ((i / 64))] + mi_recv[776 + ((i / 64))] + mi_recv[1036 + ((i / 64))] + mi_recv[1296 + ((i / 64))] + mi_recv[1556 + ((i / 64))] + mi_recv[1816 + ((i / 64))]) / 1.024e3f);
    const float r2 = (r0 / r1);
    t5[i] = r2;
  }
  __syncthreads();
  { // t5 -> output 0
    const long long base = (long long)blockIdx.x * 64LL;
    const bool vec = mi::aligned16(out0);
    for (int i = tid * 8; i < 256; i += NT * 8) mi::store_n<8>(out0 + base + (i / 64) * 512 + (i % 64), t5 + i, vec);
  }
}
