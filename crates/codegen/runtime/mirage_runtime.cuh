// mirage runtime: device helpers shared by every generated kernel (element-wise ops, dtype
// conversion, block- and warp-level reductions, the tile matmul). Embedded in the generated
// source by mirage-codegen; every function is header-only and templated on compile-time
// sizes so that tile shapes are constants for the compiler.
//
// Conventions: tiles live in shared memory, row-major, in their storage type (__half,
// __nv_bfloat16 or float); arithmetic is in fp32; NT is the block's thread count.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace mi {

typedef __half f16;
typedef __nv_bfloat16 bf16;

template <class A, class B> struct same_type { static constexpr bool value = false; };
template <class A> struct same_type<A, A> { static constexpr bool value = true; };

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// ------------------------------------------------------------------ threads
__device__ __forceinline__ int lin_tid() {
  return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// --------------------------------------------------------------- conversion
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// ------------------------------------------------------------ tile copies
// Shared-memory index of element i of a tile stored with rows of INNER elements padded to LD.
template <int INNER, int LD>
__device__ __forceinline__ int pidx(int i) {
  if constexpr (INNER == LD) {
    return i;
  } else {
    return i / INNER * LD + i % INNER;
  }
}

// Whether a device pointer is 16-byte aligned (the vector copy path needs it).
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0ull;
}

// One 16-byte global -> shared copy: asynchronous (cp.async, L1 bypassed) on sm_80+.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N committed groups are still in flight (this thread's copies only:
// a barrier must follow before other threads read the data).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// --------------------------------------------------------- element-wise ops
// Accurate (not fast-math) fp32 versions: they match the interpreter's f32 semantics.
__device__ __forceinline__ float op_exp(float x) { return expf(x); }
__device__ __forceinline__ float op_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ float op_relu(float x) { return x > 0.0f ? x : 0.0f; }
__device__ __forceinline__ float op_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float op_square(float x) { return x * x; }
__device__ __forceinline__ float op_clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ float op_add(float a, float b) { return a + b; }
__device__ __forceinline__ float op_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float op_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float op_div(float a, float b) { return a / b; }
__device__ __forceinline__ float op_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ float op_max(float a, float b) { return fmaxf(a, b); }

// --------------------------------------------------------------- reductions
// Combine steps of the reductions.
struct SumOp {
  static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
};
struct MaxOp {
  static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
};

// Warp-wide reduction with `Op`; every lane gets the result.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction with `Op`; every thread gets the result. `scratch` holds 32 floats of
// shared memory. Contains barriers: call from every thread of the block.
template <int NT, class Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  static_assert(NT % 32 == 0 && NT > 0, "block reductions need whole warps");
  constexpr int NW = NT / 32;
  const int t = lin_tid();
  v = warp_reduce<Op>(v);
  __syncthreads();
  if ((t & 31) == 0) scratch[t >> 5] = v;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < NW; ++w) r = Op::apply(r, scratch[w]);
  return r;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<NT, SumOp>(v, scratch); }
template <int NT>
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<NT, MaxOp>(v, scratch); }

// Reduces a [OUTER, LEN, INNER] index space over LEN by the whole block.
// load(i) returns element i (row-major over [OUTER, LEN, INNER]) as float;
// store(o, v) receives output o (row-major over [OUTER, INNER]). IS_MAX picks max over sum.
// A warp per output when the reduced length is long, a thread per output otherwise.
template <int NT, int OUTER, int LEN, int INNER, bool IS_MAX, class Load, class Store>
__device__ __forceinline__ void reduce(Load load, Store store) {
  constexpr int NOUT = OUTER * INNER;
  const int t = lin_tid();
  if constexpr (NT % 32 == 0 && LEN >= 32) {
    constexpr int NW = NT / 32;
    const int lane = t & 31;
    for (int o = t >> 5; o < NOUT; o += NW) {
      const int oo = o / INNER, ii = o - (o / INNER) * INNER;
      const int base = oo * LEN * INNER + ii;
      float acc = IS_MAX ? neg_inf() : 0.0f;
      for (int l = lane; l < LEN; l += 32) {
        const float x = load(base + l * INNER);
        acc = IS_MAX ? fmaxf(acc, x) : acc + x;
      }
      acc = IS_MAX ? warp_max(acc) : warp_sum(acc);
      if (lane == 0) store(o, acc);
    }
  } else {
    for (int o = t; o < NOUT; o += NT) {
      const int oo = o / INNER, ii = o - (o / INNER) * INNER;
      const int base = oo * LEN * INNER + ii;
      float acc = load(base);
      for (int l = 1; l < LEN; ++l) {
        const float x = load(base + l * INNER);
        acc = IS_MAX ? fmaxf(acc, x) : acc + x;
      }
      store(o, acc);
    }
  }
}

// RMS normalisation of ROWS rows of length LEN: store(i, x_i / sqrt(mean(x^2))) for every
// element i (row-major over [ROWS, LEN]); load(i) returns element i as float.
template <int NT, int ROWS, int LEN, class Load, class Store>
__device__ __forceinline__ void rms_norm_rows(Load load, Store store) {
  const int t = lin_tid();
  if constexpr (NT % 32 == 0 && LEN >= 32) {
    constexpr int NW = NT / 32;
    const int lane = t & 31;
    for (int r = t >> 5; r < ROWS; r += NW) {
      float ss = 0.0f;
      for (int l = lane; l < LEN; l += 32) {
        const float x = load(r * LEN + l);
        ss += x * x;
      }
      const float rms = sqrtf(warp_sum(ss) / (float)LEN);
      for (int l = lane; l < LEN; l += 32) store(r * LEN + l, load(r * LEN + l) / rms);
    }
  } else {
    for (int r = t; r < ROWS; r += NT) {
      float ss = 0.0f;
      for (int l = 0; l < LEN; ++l) {
        const float x = load(r * LEN + l);
        ss += x * x;
      }
      const float rms = sqrtf(ss / (float)LEN);
      for (int l = 0; l < LEN; ++l) store(r * LEN + l, load(r * LEN + l) / rms);
    }
  }
}

// -------------------------------------------------------------- tile matmul
// C[b][m][n] = sum_k A[b][m][k] * B[b][k][n] over BATCH x M x N x K tiles in shared memory
// (row-major, storage types TA and TB), accumulated in fp32. The result of output element
// (b, m, n) is handed to epi(c, v) with c = (b * M + m) * N + n, exactly once, by one thread:
// the epilogue stores, accumulates or rescales as the caller needs.
//
// This is the swap point for faster tile matmuls (ldmatrix, swizzled layouts, wgmma): callers
// only rely on the contract above.
template <typename T> struct is_16bit { static constexpr bool value = false; };
template <> struct is_16bit<f16> { static constexpr bool value = true; };
template <> struct is_16bit<bf16> { static constexpr bool value = true; };

__device__ __forceinline__ unsigned short bits16(f16 x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short bits16(bf16 x) { return __bfloat16_as_ushort(x); }

template <typename T>
__device__ __forceinline__ unsigned pack2(const T* p, bool ok0, bool ok1, int i0, int i1) {
  const unsigned lo = ok0 ? (unsigned)bits16(p[i0]) : 0u;
  const unsigned hi = ok1 ? (unsigned)bits16(p[i1]) : 0u;
  return lo | (hi << 16);
}

template <typename T>
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (same_type<T, f16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

__device__ __forceinline__ void ldsm_x2_trans(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

// Tensor-core path: each warp owns fragments of 16 x (8*NF) outputs, m16n8k16 with fp32
// accumulators. A is [BATCH][M][K] with rows LDA elements apart, B is [BATCH][K][N] with rows
// LDB apart (padding against bank conflicts). Whole 16-row / 16-deep / 8-column fragments
// are read with ldmatrix; ragged edges with predicated element loads (zero padding), so any
// M, N, K work.
//
// When there are fewer output fragments than warps, KSL warps share each fragment, each
// taking a slice of K; slices 1.. hand their partial sums to slice 0 through `scratch`
// (NT * 16 bytes of shared memory) around a barrier.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, class Epi>
__device__ __forceinline__ void matmul_mma(const T* A, const T* B, float* scratch, Epi epi) {
  constexpr int NW = NT / 32;
  constexpr int MT = (M + 15) / 16, NT8 = (N + 7) / 8;
  // Column fragments per warp task: reuse each A fragment across up to 4 n-fragments, but
  // keep enough tasks to occupy every warp.
  constexpr int NF = (NT8 % 4 == 0 && BATCH * MT * (NT8 / 4) >= NW) ? 4
                     : (NT8 % 2 == 0 && BATCH * MT * (NT8 / 2) >= NW) ? 2
                                                                         : 1;
  constexpr int NG = NT8 / NF;
  constexpr bool A_LDSM = (M % 16 == 0) && (K % 16 == 0) && ((LDA * 2) % 16 == 0);
  constexpr bool A_WORD = (K % 16 == 0) && (LDA % 2 == 0);
  constexpr bool B_LDSM = (N % 8 == 0) && (K % 16 == 0) && ((LDB * 2) % 16 == 0);
  constexpr int TASKS = BATCH * MT * NG;
  constexpr int KSTEPS = (K + 15) / 16;
  constexpr int KSL0 = TASKS < NW ? NW / TASKS : 1;
  constexpr int KSL = KSL0 < KSTEPS ? KSL0 : KSTEPS;
  // KC independent accumulator chains over alternating k-steps: a lone fragment's mma
  // sequence is latency-bound otherwise.
  constexpr int KC = (NF == 1 && K / KSL >= 64) ? 2 : 1;
  const int t = lin_tid();
  const int lane = t & 31;
  const int g = lane >> 2, q = lane & 3;

  // Accumulates k-steps [s_lo, s_hi) of task f into d[0..NF).
  auto compute = [&](int f, int s_lo, int s_hi, float (*d)[4]) {
    const int b = f / (MT * NG);
    const int mt = (f / NG) % MT, ng = f % NG;
    const T* Ab = A + b * M * LDA;
    const T* Bb = B + b * K * LDB;
    const int r0 = mt * 16 + g, r1 = r0 + 8;
    float dc[KC * NF][4];
#pragma unroll
    for (int j = 0; j < KC * NF; ++j) dc[j][0] = dc[j][1] = dc[j][2] = dc[j][3] = 0.0f;
    auto kstep = [&](int k0, float (*dd)[4]) {
      const int ka = k0 + q * 2, kb = ka + 8;
      unsigned a[4], bq[4];
      (void)bq;
      if constexpr (A_LDSM) {
        ldsm_x4(a, Ab + (mt * 16 + (lane & 15)) * LDA + k0 + (lane >> 4) * 8);
      } else if constexpr (A_WORD) {
        a[0] = r0 < M ? *reinterpret_cast<const unsigned*>(Ab + r0 * LDA + ka) : 0u;
        a[1] = r1 < M ? *reinterpret_cast<const unsigned*>(Ab + r1 * LDA + ka) : 0u;
        a[2] = r0 < M ? *reinterpret_cast<const unsigned*>(Ab + r0 * LDA + kb) : 0u;
        a[3] = r1 < M ? *reinterpret_cast<const unsigned*>(Ab + r1 * LDA + kb) : 0u;
      } else {
        a[0] = pack2(Ab, r0 < M && ka < K, r0 < M && ka + 1 < K, r0 * LDA + ka, r0 * LDA + ka + 1);
        a[1] = pack2(Ab, r1 < M && ka < K, r1 < M && ka + 1 < K, r1 * LDA + ka, r1 * LDA + ka + 1);
        a[2] = pack2(Ab, r0 < M && kb < K, r0 < M && kb + 1 < K, r0 * LDA + kb, r0 * LDA + kb + 1);
        a[3] = pack2(Ab, r1 < M && kb < K, r1 < M && kb + 1 < K, r1 * LDA + kb, r1 * LDA + kb + 1);
      }
#pragma unroll
      for (int j = 0; j < NF; ++j) {
        const int n0 = (ng * NF + j) * 8;
        unsigned bb[2];
        if constexpr (B_LDSM && NF % 2 == 0) {
          // Two n-fragments per ldmatrix.x4: load at even j, use the upper half at odd j.
          if (j % 2 == 0) {
            ldsm_x4_trans(bq, Bb + (k0 + (lane & 15)) * LDB + n0 + (lane >> 4) * 8);
            bb[0] = bq[0];
            bb[1] = bq[1];
          } else {
            bb[0] = bq[2];
            bb[1] = bq[3];
          }
        } else if constexpr (B_LDSM) {
          ldsm_x2_trans(bb, Bb + (k0 + (lane & 15)) * LDB + n0);
        } else {
          const int col = n0 + g;
          bb[0] = pack2(Bb, col < N && ka < K, col < N && ka + 1 < K, ka * LDB + col, (ka + 1) * LDB + col);
          bb[1] = pack2(Bb, col < N && kb < K, col < N && kb + 1 < K, kb * LDB + col, (kb + 1) * LDB + col);
        }
        mma_16816<T>(dd[j], a, bb);
      }
    };
#pragma unroll 2
    for (int s = s_lo; s + KC <= s_hi; s += KC) {
#pragma unroll
      for (int c = 0; c < KC; ++c) kstep((s + c) * 16, dc + c * NF);
    }
    if constexpr (KC > 1) {
      if ((s_hi - s_lo) % KC != 0) kstep((s_hi - 1) * 16, dc);
    }
#pragma unroll
    for (int j = 0; j < NF; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = dc[j][e];
#pragma unroll
        for (int c = 1; c < KC; ++c) v += dc[c * NF + j][e];
        d[j][e] = v;
      }
    }
  };
  // Hands task f's finished fragments to the epilogue.
  auto finish = [&](int f, float (*d)[4]) {
    const int b = f / (MT * NG);
    const int mt = (f / NG) % MT, ng = f % NG;
    const int r0 = mt * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      const int c0 = (ng * NF + j) * 8 + q * 2;
      if (r0 < M && c0 < N) epi((b * M + r0) * N + c0, d[j][0]);
      if (r0 < M && c0 + 1 < N) epi((b * M + r0) * N + c0 + 1, d[j][1]);
      if (r1 < M && c0 < N) epi((b * M + r1) * N + c0, d[j][2]);
      if (r1 < M && c0 + 1 < N) epi((b * M + r1) * N + c0 + 1, d[j][3]);
    }
  };

  if constexpr (KSL == 1) {
    for (int f = t >> 5; f < TASKS; f += NW) {
      float d[NF][4];
      compute(f, 0, KSTEPS, d);
      finish(f, d);
    }
  } else {
    // One task per warp; slices 1.. pass their partials to slice 0 through scratch. Every
    // thread meets both barriers.
    static_assert(NF == 1, "split-K runs with one n-fragment per warp");
    const int f = (t >> 5) % TASKS, slice = (t >> 5) / TASKS;
    float d[NF][4];
    if (slice < KSL) {
      compute(f, slice * KSTEPS / KSL, (slice + 1) * KSTEPS / KSL, d);
      if (slice > 0) {
        float* mine = scratch + (((slice - 1) * TASKS + f) * 32 + lane) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[e] = d[0][e];
      }
    }
    __syncthreads();
    if (slice == 0) {
#pragma unroll
      for (int o = 1; o < KSL; ++o) {
        const float* other = scratch + (((o - 1) * TASKS + f) * 32 + lane) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) d[0][e] += other[e];
      }
      finish(f, d);
    }
    __syncthreads();
  }
}

// CUDA-core path: a thread per output element, fp32 fused multiply-adds.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_simt(const TA* A, const TB* B, Epi epi) {
  for (int c = lin_tid(); c < BATCH * M * N; c += NT) {
    const int b = c / (M * N);
    const int m = (c / N) % M, n = c % N;
    const TA* a = A + b * M * LDA + m * LDA;
    const TB* bp = B + b * K * LDB + n;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(to_f32(a[k]), to_f32(bp[k * LDB]), acc);
    epi(c, acc);
  }
}

// LDA / LDB: row pitch of A and B in elements (K and N when unpadded).
// `scratch`: NT * 16 bytes of shared memory for split-K partial sums.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_tile(const TA* A, const TB* B, float* scratch, Epi epi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (NT % 32 == 0 && same_type<TA, TB>::value && is_16bit<TA>::value) {
    matmul_mma<NT, BATCH, M, N, K, LDA, LDB, TA>(A, B, scratch, epi);
    return;
  }
#endif
  matmul_simt<NT, BATCH, M, N, K, LDA, LDB, TA, TB>(A, B, epi);
}

}  // namespace mi
