// block graph: grid [2, 4, 1], block [128, 1, 1], forloop_range 4, 73728 bytes of shared memory, 4 pipeline stage(s)
extern "C" __global__ void __launch_bounds__(128) mi_k3_customized(const mi::f16* __restrict__ in0, const mi::f16* __restrict__ in1, const mi::f16* __restrict__ in2, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2) {
  mi::dep_enter();
  extern __shared__ __align__(1024) unsigned char mi_smem[];
  constexpr int NT = 128;
  const int tid = mi::lin_tid();
  (void)tid;
  mi::f16* const t0 = reinterpret_cast<mi::f16*>(mi_smem + 65536); // [1, 64, 64] float16
  mi::f16* const t1_st = reinterpret_cast<mi::f16*>(mi_smem + 0); // [1, 64, 64] float16
  mi::f16* const t2_st = reinterpret_cast<mi::f16*>(mi_smem + 32768); // [1, 64, 64] float16
  float* const t10 = reinterpret_cast<float*>(mi_smem + 0); // [1, 64, 64] float32
  float* const t11 = reinterpret_cast<float*>(mi_smem + 16384); // [1, 64, 1] float32
  float* const t12 = reinterpret_cast<float*>(mi_smem + 16640); // [1, 64, 1] float32
  { // input 0 -> t0
    const long long base = (long long)blockIdx.x * 4096LL;
    if (mi::aligned16(in0)) {
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in0 + base + i;
      auto* const dst = t0 + mi::swz<64, 8>(i);
      mi::cp_async16(dst + 0, src + 0LL);
      mi::cp_async16(dst + 1024, src + 1024LL);
      mi::cp_async16(dst + 2048, src + 2048LL);
      mi::cp_async16(dst + 3072, src + 3072LL);
    } else {
      for (int i = tid; i < 4096; i += NT) t0[mi::swz<64, 8>(i)] = in0[base + i];
    }
  }
  mi::cp_async_commit();
  mi::FlashWG<NT, 1, 64, 64, 64, 64, 1, 1, mi::f16, mi::f16, true, true> fa;
  fa.init();
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 256LL + (long long)(0) * 64LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 64) * 1024 + (i % 64);
      auto* const dst = (t1_st + 0) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 49152LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t1_st + 0)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 1024 + (i % 64)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 16384LL + (long long)(0) * 4096LL;
    if (mi::aligned16(in2)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
      auto* const dst = (t2_st + 0) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t2_st + 0)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 256LL + (long long)(1) * 64LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 64) * 1024 + (i % 64);
      auto* const dst = (t1_st + 4096) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 49152LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t1_st + 4096)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 1024 + (i % 64)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 16384LL + (long long)(1) * 4096LL;
    if (mi::aligned16(in2)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
      auto* const dst = (t2_st + 4096) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t2_st + 4096)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 256LL + (long long)(2) * 64LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 64) * 1024 + (i % 64);
      auto* const dst = (t1_st + 8192) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 49152LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t1_st + 8192)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 1024 + (i % 64)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 16384LL + (long long)(2) * 4096LL;
    if (mi::aligned16(in2)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
      auto* const dst = (t2_st + 8192) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
    } else {
      for (int i = tid; i < 4096; i += NT) (t2_st + 8192)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
#pragma unroll 2
  for (int it = 0; it < 4; ++it) {
    mi::cp_async_wait<1>();
    mi::fence_proxy_async();
    __syncthreads();
    mi::f16* const t1 = t1_st + (it % 4) * 4096;
    mi::f16* const t2 = t2_st + (it % 4) * 4096;
    if (it + 3 < 4) {
      { // input 1 -> t1
        const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 256LL + (long long)((it + 3)) * 64LL;
        if (mi::aligned16(in1)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in1 + base + (i / 64) * 1024 + (i % 64);
          auto* const dst = (t1_st + ((it + 3) % 4) * 4096) + mi::swz<64, 8>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 16384LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 32768LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 49152LL, mi_once);
        } else {
          for (int i = tid; i < 4096; i += NT) (t1_st + ((it + 3) % 4) * 4096)[mi::swz<64, 8>(i)] = in1[base + (i / 64) * 1024 + (i % 64)];
        }
      }
      { // input 2 -> t2
        const long long base = (long long)blockIdx.x * 65536LL + (long long)blockIdx.y * 16384LL + (long long)((it + 3)) * 4096LL;
        if (mi::aligned16(in2)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
          auto* const dst = (t2_st + ((it + 3) % 4) * 4096) + mi::swz<64, 8>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
        } else {
          for (int i = tid; i < 4096; i += NT) (t2_st + ((it + 3) % 4) * 4096)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
        }
      }
    }
    mi::cp_async_commit();
    fa.step<true>(t0, t1, t2, t1_st + ((it + 1) % 4) * 4096, it == 0, it + 1 == 4);
  }
  mi::cp_async_wait<0>();
  __syncthreads();
  fa.finish(nullptr, t10, t11, t12);
  __syncthreads();
  { // t10 -> output 0
    const long long base = (long long)blockIdx.x * 16384LL + (long long)blockIdx.y * 64LL;
    const bool vec = mi::aligned16(out0);
    for (int i = tid * 8; i < 4096; i += NT * 8) mi::store_n<8>(out0 + base + (i / 64) * 256 + (i % 64), t10 + i, vec);
  }
  { // t11 -> output 1
    const long long base = (long long)blockIdx.x * 256LL + (long long)blockIdx.y * 1LL;
    for (int i = tid; i < 64; i += NT) out1[base + i * 4] = mi::from_f32<float>(t11[i]);
  }
  { // t12 -> output 2
    const long long base = (long long)blockIdx.x * 256LL + (long long)blockIdx.y * 1LL;
    for (int i = tid; i < 64; i += NT) out2[base + i * 4] = mi::from_f32<float>(t12[i]);
  }
}
