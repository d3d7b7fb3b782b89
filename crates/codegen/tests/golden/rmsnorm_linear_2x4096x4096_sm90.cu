// block graph: grid [128, 1, 1], block [128, 1, 1], forloop_range 16, 69776 bytes of shared memory, 4 pipeline stage(s)
extern "C" __global__ void __launch_bounds__(128) mi_k2_customized(const mi::f16* __restrict__ in0, const mi::f16* __restrict__ in1, mi::f16* __restrict__ out0) {
  { // L2 prefetch before the wait
    constexpr int NT = 128;
    const int tid = mi::lin_tid();
    { // input 0
      const long long base = (long long)(0) * 256LL;
      for (int c = tid; c < 8; c += NT) {
        const unsigned i = (unsigned)c * 64u;
        mi::prefetch_l2(in0 + base + (i / 256) * 4096 + (i % 256));
      }
    }
    { // input 1
      const long long base = (long long)blockIdx.x * 32LL + (long long)(0) * 1048576LL;
      for (int c = tid; c < 1024; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::prefetch_l2(in1 + base + (i / 32) * 4096 + (i % 32));
      }
    }
    { // input 0
      const long long base = (long long)(1) * 256LL;
      for (int c = tid; c < 8; c += NT) {
        const unsigned i = (unsigned)c * 64u;
        mi::prefetch_l2(in0 + base + (i / 256) * 4096 + (i % 256));
      }
    }
    { // input 1
      const long long base = (long long)blockIdx.x * 32LL + (long long)(1) * 1048576LL;
      for (int c = tid; c < 1024; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::prefetch_l2(in1 + base + (i / 32) * 4096 + (i % 32));
      }
    }
    { // input 0
      const long long base = (long long)(2) * 256LL;
      for (int c = tid; c < 8; c += NT) {
        const unsigned i = (unsigned)c * 64u;
        mi::prefetch_l2(in0 + base + (i / 256) * 4096 + (i % 256));
      }
    }
    { // input 1
      const long long base = (long long)blockIdx.x * 32LL + (long long)(2) * 1048576LL;
      for (int c = tid; c < 1024; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::prefetch_l2(in1 + base + (i / 32) * 4096 + (i % 32));
      }
    }
  }
  mi::dep_wait(); // the next kernel goes after this loop's last copies
  extern __shared__ __align__(16) unsigned char mi_smem[];
  constexpr int NT = 128;
  const int tid = mi::lin_tid();
  (void)tid;
  mi::f16* const t0_st = reinterpret_cast<mi::f16*>(mi_smem + 65536); // [2, 256] float16
  mi::f16* const t1_st = reinterpret_cast<mi::f16*>(mi_smem + 0); // [256, 32] float16
  float* const t3 = reinterpret_cast<float*>(mi_smem + 8192); // [2, 32] float32
  float* const t4 = reinterpret_cast<float*>(mi_smem + 69760); // [2, 1] float32
  float* const t5 = reinterpret_cast<float*>(mi_smem + 8192); // [2, 32] float32
  mi::MmaAcc<NT, 1, 2, 32, 256, 264, 32, mi::f16, true> mm3;
  mi::RowSumAcc<NT, 2, 256, 264, mi::f16, true> rs4;
  { // input 0 -> t0
    const long long base = (long long)(0) * 256LL;
    if (mi::aligned16(in0)) {
      for (int c = tid; c < 64; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::cp_async16((t0_st + 0) + mi::pidx<256, 264>(i), in0 + base + (i / 256) * 4096 + (i % 256));
      }
    } else {
      for (int i = tid; i < 512; i += NT) (t0_st + 0)[mi::pidx<256, 264>(i)] = in0[base + (i / 256) * 4096 + (i % 256)];
    }
  }
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 32LL + (long long)(0) * 1048576LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 32) * 4096 + (i % 32);
      auto* const dst = (t1_st + 0) + mi::swz<32, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 131072LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 262144LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 393216LL, mi_once);
      mi::cp_async16_pol(sdst + 8192u, src + 524288LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 655360LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 786432LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 917504LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 0)[mi::swz<32, 8>(i)] = in1[base + (i / 32) * 4096 + (i % 32)];
    }
  }
  mi::cp_async_commit();
  { // input 0 -> t0
    const long long base = (long long)(1) * 256LL;
    if (mi::aligned16(in0)) {
      for (int c = tid; c < 64; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::cp_async16((t0_st + 528) + mi::pidx<256, 264>(i), in0 + base + (i / 256) * 4096 + (i % 256));
      }
    } else {
      for (int i = tid; i < 512; i += NT) (t0_st + 528)[mi::pidx<256, 264>(i)] = in0[base + (i / 256) * 4096 + (i % 256)];
    }
  }
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 32LL + (long long)(1) * 1048576LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 32) * 4096 + (i % 32);
      auto* const dst = (t1_st + 8192) + mi::swz<32, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 131072LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 262144LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 393216LL, mi_once);
      mi::cp_async16_pol(sdst + 8192u, src + 524288LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 655360LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 786432LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 917504LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 8192)[mi::swz<32, 8>(i)] = in1[base + (i / 32) * 4096 + (i % 32)];
    }
  }
  mi::cp_async_commit();
  { // input 0 -> t0
    const long long base = (long long)(2) * 256LL;
    if (mi::aligned16(in0)) {
      for (int c = tid; c < 64; c += NT) {
        const unsigned i = (unsigned)c * 8u;
        mi::cp_async16((t0_st + 1056) + mi::pidx<256, 264>(i), in0 + base + (i / 256) * 4096 + (i % 256));
      }
    } else {
      for (int i = tid; i < 512; i += NT) (t0_st + 1056)[mi::pidx<256, 264>(i)] = in0[base + (i / 256) * 4096 + (i % 256)];
    }
  }
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 32LL + (long long)(2) * 1048576LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 32) * 4096 + (i % 32);
      auto* const dst = (t1_st + 16384) + mi::swz<32, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 131072LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 262144LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 393216LL, mi_once);
      mi::cp_async16_pol(sdst + 8192u, src + 524288LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 655360LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 786432LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 917504LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 16384)[mi::swz<32, 8>(i)] = in1[base + (i / 32) * 4096 + (i % 32)];
    }
  }
  mi::cp_async_commit();
  for (int it = 0; it < 16; ++it) {
    mi::cp_async_wait<2>();
    __syncthreads();
    mi::f16* const t0 = t0_st + (it % 4) * 528;
    mi::f16* const t1 = t1_st + (it % 4) * 8192;
    if (it + 3 < 16) {
      { // input 0 -> t0
        const long long base = (long long)((it + 3)) * 256LL;
        if (mi::aligned16(in0)) {
          for (int c = tid; c < 64; c += NT) {
            const unsigned i = (unsigned)c * 8u;
            mi::cp_async16((t0_st + ((it + 3) % 4) * 528) + mi::pidx<256, 264>(i), in0 + base + (i / 256) * 4096 + (i % 256));
          }
        } else {
          for (int i = tid; i < 512; i += NT) (t0_st + ((it + 3) % 4) * 528)[mi::pidx<256, 264>(i)] = in0[base + (i / 256) * 4096 + (i % 256)];
        }
      }
      { // input 1 -> t1
        const long long base = (long long)blockIdx.x * 32LL + (long long)((it + 3)) * 1048576LL;
        if (mi::aligned16(in1)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in1 + base + (i / 32) * 4096 + (i % 32);
          auto* const dst = (t1_st + ((it + 3) % 4) * 8192) + mi::swz<32, 8>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 131072LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 262144LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 393216LL, mi_once);
          mi::cp_async16_pol(sdst + 8192u, src + 524288LL, mi_once);
          mi::cp_async16_pol(sdst + 10240u, src + 655360LL, mi_once);
          mi::cp_async16_pol(sdst + 12288u, src + 786432LL, mi_once);
          mi::cp_async16_pol(sdst + 14336u, src + 917504LL, mi_once);
        } else {
          for (int i = tid; i < 8192; i += NT) (t1_st + ((it + 3) % 4) * 8192)[mi::swz<32, 8>(i)] = in1[base + (i / 32) * 4096 + (i % 32)];
        }
      }
    }
    mi::cp_async_commit();
    if (it == 12) mi::dep_launch(); // the last copies are issued
    mm3.step(t0, t1);
    rs4.step(t0);
  }
  mi::cp_async_wait<0>();
  __syncthreads();
  static_assert(decltype(mm3)::SCRATCH * 4 <= 8192, "finish scratch");
  mm3.finish(reinterpret_cast<float*>(mi_smem + 0), [&](int c) -> float& { return t3[c]; });
  static_assert(decltype(rs4)::SCRATCH * 4 <= 256, "finish scratch");
  rs4.finish(reinterpret_cast<float*>(mi_smem + 8448), [&](int r) -> float& { return t4[r]; });
  for (int i = tid; i < 2; i += NT) t4[i] = sqrtf(t4[i] / 4.096e3f);
  __syncthreads();
  for (int i = tid; i < 64; i += NT) { // fused element-wise -> t5
    const float r0 = t3[i];
    const float r1 = t4[(i / 32)];
    const float r2 = (r0 / r1);
    t5[i] = r2;
  }
  __syncthreads();
  { // t5 -> output 0
    const long long base = (long long)blockIdx.x * 32LL;
    const bool vec = mi::aligned16(out0);
    for (int i = tid * 8; i < 64; i += NT * 8) mi::store_n<8>(out0 + base + (i / 32) * 4096 + (i % 32), t5 + i, vec);
  }
}
