// block graph: grid [2, 4, 1], block [128, 1, 1], forloop_range 4, 139264 bytes of shared memory, 4 pipeline stage(s)
extern "C" __global__ void __launch_bounds__(128) mi_k3_customized(const mi::f16* __restrict__ in0, const mi::f16* __restrict__ in1, const mi::f16* __restrict__ in2, float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2) {
  mi::dep_enter();
  extern __shared__ __align__(1024) unsigned char mi_smem[];
  constexpr int NT = 128;
  const int tid = mi::lin_tid();
  (void)tid;
  mi::f16* const t1_st = reinterpret_cast<mi::f16*>(mi_smem + 0); // [1, 64, 128] float16
  mi::f16* const t2_st = reinterpret_cast<mi::f16*>(mi_smem + 65536); // [1, 128, 64] float16
  mi::f16* const t3 = reinterpret_cast<mi::f16*>(mi_smem + 131072); // [1, 64, 64] float16
  float* const t12 = reinterpret_cast<float*>(mi_smem + 0); // [1, 64, 64] float32
  float* const t13 = reinterpret_cast<float*>(mi_smem + 16384); // [1, 64, 1] float32
  float* const t14 = reinterpret_cast<float*>(mi_smem + 16640); // [1, 64, 1] float32
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 512LL + (long long)(0) * 128LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 128) * 2048 + (i % 128);
      auto* const dst = (t1_st + 0) + mi::swzb<128, 64>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 1024u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 3072u, src + 49152LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 65536LL, mi_once);
      mi::cp_async16_pol(sdst + 5120u, src + 81920LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 98304LL, mi_once);
      mi::cp_async16_pol(sdst + 7168u, src + 114688LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 0)[mi::swzb<128, 64>(i)] = in1[base + (i / 128) * 2048 + (i % 128)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 32768LL + (long long)(0) * 8192LL;
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
      mi::cp_async16_pol(sdst + 8192u, src + 4096LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 5120LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 6144LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 7168LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t2_st + 0)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 512LL + (long long)(1) * 128LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 128) * 2048 + (i % 128);
      auto* const dst = (t1_st + 8192) + mi::swzb<128, 64>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 1024u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 3072u, src + 49152LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 65536LL, mi_once);
      mi::cp_async16_pol(sdst + 5120u, src + 81920LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 98304LL, mi_once);
      mi::cp_async16_pol(sdst + 7168u, src + 114688LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 8192)[mi::swzb<128, 64>(i)] = in1[base + (i / 128) * 2048 + (i % 128)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 32768LL + (long long)(1) * 8192LL;
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
      mi::cp_async16_pol(sdst + 8192u, src + 4096LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 5120LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 6144LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 7168LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t2_st + 8192)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  { // input 1 -> t1
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 512LL + (long long)(2) * 128LL;
    if (mi::aligned16(in1)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in1 + base + (i / 128) * 2048 + (i % 128);
      auto* const dst = (t1_st + 16384) + mi::swzb<128, 64>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 1024u, src + 16384LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 32768LL, mi_once);
      mi::cp_async16_pol(sdst + 3072u, src + 49152LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 65536LL, mi_once);
      mi::cp_async16_pol(sdst + 5120u, src + 81920LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 98304LL, mi_once);
      mi::cp_async16_pol(sdst + 7168u, src + 114688LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t1_st + 16384)[mi::swzb<128, 64>(i)] = in1[base + (i / 128) * 2048 + (i % 128)];
    }
  }
  { // input 2 -> t2
    const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 32768LL + (long long)(2) * 8192LL;
    if (mi::aligned16(in2)) {
      const unsigned long long mi_once = mi::l2_policy<false>();
      const unsigned i = (unsigned)tid * 8u;
      const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
      auto* const dst = (t2_st + 16384) + mi::swz<64, 8>(i);
      const unsigned sdst = mi::smem_lane(dst);
      mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
      mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
      mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
      mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
      mi::cp_async16_pol(sdst + 8192u, src + 4096LL, mi_once);
      mi::cp_async16_pol(sdst + 10240u, src + 5120LL, mi_once);
      mi::cp_async16_pol(sdst + 12288u, src + 6144LL, mi_once);
      mi::cp_async16_pol(sdst + 14336u, src + 7168LL, mi_once);
    } else {
      for (int i = tid; i < 8192; i += NT) (t2_st + 16384)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
    }
  }
  mi::cp_async_commit();
  if (mi::aligned16(in0)) {
    mi::rms_norm_rows_ld<NT, 64, 64, mi::f16>([&](int r) { return in0 + (long long)blockIdx.x * 4096LL + ((r) * 64); }, [&](int i, float v) { t3[mi::swz<64, 8>(i)] = mi::from_f32<mi::f16>(v); });
  } else {
    mi::rms_norm_rows<NT, 64, 64>([&](int i) { return mi::to_f32(in0[(long long)blockIdx.x * 4096LL + (i)]); }, [&](int i, float v) { t3[mi::swz<64, 8>(i)] = mi::from_f32<mi::f16>(v); });
  }
  mi::FlashWG<NT, 1, 64, 64, 128, 64, 1, 1, mi::f16, mi::f16, true, true> fa;
  fa.init();
#pragma unroll 2
  for (int it = 0; it < 4; ++it) {
    mi::cp_async_wait<1>();
    mi::fence_proxy_async();
    __syncthreads();
    mi::f16* const t1 = t1_st + (it % 4) * 8192;
    mi::f16* const t2 = t2_st + (it % 4) * 8192;
    if (it + 3 < 4) {
      { // input 1 -> t1
        const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 512LL + (long long)((it + 3)) * 128LL;
        if (mi::aligned16(in1)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in1 + base + (i / 128) * 2048 + (i % 128);
          auto* const dst = (t1_st + ((it + 3) % 4) * 8192) + mi::swzb<128, 64>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 1024u, src + 16384LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 32768LL, mi_once);
          mi::cp_async16_pol(sdst + 3072u, src + 49152LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 65536LL, mi_once);
          mi::cp_async16_pol(sdst + 5120u, src + 81920LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 98304LL, mi_once);
          mi::cp_async16_pol(sdst + 7168u, src + 114688LL, mi_once);
        } else {
          for (int i = tid; i < 8192; i += NT) (t1_st + ((it + 3) % 4) * 8192)[mi::swzb<128, 64>(i)] = in1[base + (i / 128) * 2048 + (i % 128)];
        }
      }
      { // input 2 -> t2
        const long long base = (long long)blockIdx.x * 131072LL + (long long)blockIdx.y * 32768LL + (long long)((it + 3)) * 8192LL;
        if (mi::aligned16(in2)) {
          const unsigned long long mi_once = mi::l2_policy<false>();
          const unsigned i = (unsigned)tid * 8u;
          const auto* const src = in2 + base + (i / 64) * 64 + (i % 64);
          auto* const dst = (t2_st + ((it + 3) % 4) * 8192) + mi::swz<64, 8>(i);
          const unsigned sdst = mi::smem_lane(dst);
          mi::cp_async16_pol(sdst + 0u, src + 0LL, mi_once);
          mi::cp_async16_pol(sdst + 2048u, src + 1024LL, mi_once);
          mi::cp_async16_pol(sdst + 4096u, src + 2048LL, mi_once);
          mi::cp_async16_pol(sdst + 6144u, src + 3072LL, mi_once);
          mi::cp_async16_pol(sdst + 8192u, src + 4096LL, mi_once);
          mi::cp_async16_pol(sdst + 10240u, src + 5120LL, mi_once);
          mi::cp_async16_pol(sdst + 12288u, src + 6144LL, mi_once);
          mi::cp_async16_pol(sdst + 14336u, src + 7168LL, mi_once);
        } else {
          for (int i = tid; i < 8192; i += NT) (t2_st + ((it + 3) % 4) * 8192)[mi::swz<64, 8>(i)] = in2[base + (i / 64) * 64 + (i % 64)];
        }
      }
    }
    mi::cp_async_commit();
    if (it == 0) {
      mi::rms_norm_rows_frag<NT, 128, 64, 64, true, mi::f16>(t2);
      mi::fence_proxy_async();
      __syncthreads();
    }
    fa.step<true>(t3, t1, t2, t1_st + ((it + 1) % 4) * 8192, it == 0, it + 1 == 4, [&](int j) { if (it + 1 < 4) mi::rms_norm_rows_frag<NT, 128, 64, 64, true, mi::f16, decltype(fa)::NB>(t2_st + ((it + 1) % 4) * 8192, j); });
  }
  mi::cp_async_wait<0>();
  __syncthreads();
  fa.finish(nullptr, t12, t13, t14);
  __syncthreads();
  { // t12 -> output 0
    const long long base = (long long)blockIdx.x * 16384LL + (long long)blockIdx.y * 64LL;
    const bool vec = mi::aligned16(out0);
    for (int i = tid * 8; i < 4096; i += NT * 8) mi::store_n<8>(out0 + base + (i / 64) * 256 + (i % 64), t12 + i, vec);
  }
  { // t13 -> output 1
    const long long base = (long long)blockIdx.x * 256LL + (long long)blockIdx.y * 1LL;
    for (int i = tid; i < 64; i += NT) out1[base + i * 4] = mi::from_f32<float>(t13[i]);
  }
  { // t14 -> output 2
    const long long base = (long long)blockIdx.x * 256LL + (long long)blockIdx.y * 1LL;
    for (int i = tid; i < 64; i += NT) out2[base + i * 4] = mi::from_f32<float>(t14[i]);
  }
}
