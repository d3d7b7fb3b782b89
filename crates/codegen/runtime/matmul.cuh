// mirage runtime, a part of the header a generated source inlines where its kernels use it
// (after mirage_runtime.cuh and the parts this one needs: codegen's runtime.rs).
// The tile matmul: SIMT, and tensor cores through ldmatrix + mma.sync.

namespace mi {

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

// Two 16-bit ones packed in a word (an mma operand of ones).
template <typename T>
__device__ __forceinline__ unsigned one_x2() {
  return same_type<T, f16>::value ? 0x3C003C00u : 0x3F803F80u;
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

// By shared-window address (bytes), so that constant offsets fold into the instruction.
__device__ __forceinline__ void ldsm_x4_at(unsigned* r, unsigned s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
  ldsm_x4_at(r, (unsigned)__cvta_generic_to_shared(p));
}

// Lane `lane`'s row address (element offset) for ldmatrix of a transposed B ([n][k], rows LDB
// apart) at rows n0.. and depth k0: matrices (n0, k0), (n0, k0 + 8), then (n0 + 8, k0),
// (n0 + 8, k0 + 8) (lanes 16.. only for .x4: an .x2 passes lane & 15), each the mma's column
// operand untransposed.
template <int LDB>
__device__ __forceinline__ int trans_b_row(int n0, int k0, int lane) {
  return (n0 + (lane & 7) + (lane >> 4) * 8) * LDB + k0 + ((lane >> 3) & 1) * 8;
}

__device__ __forceinline__ void ldsm_x2(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
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

// The transposed form, by shared-window address too.
__device__ __forceinline__ void ldsm_x4_trans_at(unsigned* r, unsigned s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned* r, const void* p) {
  ldsm_x4_trans_at(r, (unsigned)__cvta_generic_to_shared(p));
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
//
// SWA / SWB: A / B stored unpadded (LDA == K, LDB == N) with each row's 16-byte chunks
// XOR-swizzled by the row over the whole [BATCH * rows] tile (`swz<LD, 8>`), so that their
// cp.async copies write whole 32-byte sectors; read through ldmatrix or word loads only.
// TRB: B stored transposed, [BATCH][N][K] with rows LDB apart (`tidx`): the mma's column
// operand as it is, read with ldmatrix untransposed.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, bool SWA, bool SWB, bool TRB, class Epi>
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
  static_assert(!SWA || (LDA == K && (A_LDSM || A_WORD)), "matmul_mma: swizzled A");
  static_assert(!SWB || (LDB == N && B_LDSM), "matmul_mma: swizzled B");
  static_assert(!(SWB && TRB), "matmul_mma: a transposed B is not swizzled");
  const int t = lin_tid();
  const int lane = t & 31;
  const int g = lane >> 2, q = lane & 3;

  // Accumulates k-steps [s_lo, s_hi) of task f into d[0..NF).
  auto compute = [&](int f, int s_lo, int s_hi, float (*d)[4]) {
    const int b = f / (MT * NG);
    const int mt = (f / NG) % MT, ng = f % NG;
    const T* Ab = A + b * M * LDA;
    const T* Bb = B + b * (TRB ? N : K) * LDB;
    const int ar = b * M, br = b * K;  // the batch item's first rows in A and B
    const int r0 = mt * 16 + g, r1 = r0 + 8;
    float dc[KC * NF][4];
#pragma unroll
    for (int j = 0; j < KC * NF; ++j) dc[j][0] = dc[j][1] = dc[j][2] = dc[j][3] = 0.0f;
    auto kstep = [&](int k0, float (*dd)[4]) {
      const int ka = k0 + q * 2, kb = ka + 8;
      unsigned a[4], bq[4];
      (void)bq;
      if constexpr (A_LDSM) {
        ldsm_x4(a, A + tile_at<LDA, SWA>(ar + mt * 16 + (lane & 15), k0 + (lane >> 4) * 8));
      } else if constexpr (A_WORD) {
        a[0] = r0 < M ? *reinterpret_cast<const unsigned*>(A + tile_at<LDA, SWA>(ar + r0, ka)) : 0u;
        a[1] = r1 < M ? *reinterpret_cast<const unsigned*>(A + tile_at<LDA, SWA>(ar + r1, ka)) : 0u;
        a[2] = r0 < M ? *reinterpret_cast<const unsigned*>(A + tile_at<LDA, SWA>(ar + r0, kb)) : 0u;
        a[3] = r1 < M ? *reinterpret_cast<const unsigned*>(A + tile_at<LDA, SWA>(ar + r1, kb)) : 0u;
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
        if constexpr (TRB && B_LDSM && NF % 2 == 0) {
          // Two n-fragments per ldmatrix.x4, as below.
          if (j % 2 == 0) {
            ldsm_x4(bq, Bb + trans_b_row<LDB>(n0, k0, lane));
            bb[0] = bq[0];
            bb[1] = bq[1];
          } else {
            bb[0] = bq[2];
            bb[1] = bq[3];
          }
        } else if constexpr (TRB && B_LDSM) {
          ldsm_x2(bb, Bb + trans_b_row<LDB>(n0, k0, lane & 15));
        } else if constexpr (TRB) {
          const int col = n0 + g;
          bb[0] = pack2(Bb, col < N && ka < K, col < N && ka + 1 < K, col * LDB + ka, col * LDB + ka + 1);
          bb[1] = pack2(Bb, col < N && kb < K, col < N && kb + 1 < K, col * LDB + kb, col * LDB + kb + 1);
        } else if constexpr (B_LDSM && NF % 2 == 0) {
          // Two n-fragments per ldmatrix.x4: load at even j, use the upper half at odd j.
          if (j % 2 == 0) {
            ldsm_x4_trans(bq, B + tile_at<LDB, SWB>(br + k0 + (lane & 15), n0 + (lane >> 4) * 8));
            bb[0] = bq[0];
            bb[1] = bq[1];
          } else {
            bb[0] = bq[2];
            bb[1] = bq[3];
          }
        } else if constexpr (B_LDSM) {
          ldsm_x2_trans(bb, B + tile_at<LDB, SWB>(br + k0 + (lane & 15), n0));
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

// The A fragment of an m16n8k16 mma: rows mt*16.. and columns k0..k0+15 of a 16-bit tile with
// rows LD elements apart; rows at or past M read as zero. LDSM: whole rows of 16-byte
// vectors (M % 16 == 0, LD % 8 == 0), read with one ldmatrix. SW: the rows are unpadded
// (LD elements) and their chunks swizzled (`swz<LD, 8>`); BLK: stored as column blocks of
// 64 instead (`swzb<LD, M>`, M the tile's rows).
template <int M, int LD, bool LDSM, typename T, bool SW = false, bool BLK = false>
__device__ __forceinline__ void a_frag(unsigned* a, const T* A, int mt, int k0, int lane) {
  const auto at = [&](int r, int c) {
    if constexpr (BLK) {
      return swzb<LD, M>(r * LD + c);
    } else if constexpr (SW) {
      return swz<LD, 8>(r, c);
    } else {
      return r * LD + c;
    }
  };
  if constexpr (LDSM) {
    ldsm_x4(a, A + at(mt * 16 + (lane & 15), k0 + (lane >> 4) * 8));
  } else {
    const int r0 = mt * 16 + (lane >> 2), r1 = r0 + 8, ka = k0 + (lane & 3) * 2, kb = ka + 8;
    a[0] = r0 < M ? *reinterpret_cast<const unsigned*>(A + at(r0, ka)) : 0u;
    a[1] = r1 < M ? *reinterpret_cast<const unsigned*>(A + at(r1, ka)) : 0u;
    a[2] = r0 < M ? *reinterpret_cast<const unsigned*>(A + at(r0, kb)) : 0u;
    a[3] = r1 < M ? *reinterpret_cast<const unsigned*>(A + at(r1, kb)) : 0u;
  }
}

// A loop matmul whose product only feeds a plain for-loop sum, C = sum over iterations of A B,
// accumulated in registers: warp w keeps fragments gi, gi + G, ... of C (gi = w % G) over the
// k-steps s = slice, slice + KS, ... of every iteration (slice = w / G, G = NW / KS warp groups),
// so an iteration has no barrier and no shared-memory traffic for C. `finish` adds the KS slices
// into C once, after the loop. A and B: 16-bit tiles in shared memory, K % 16 == 0, N % 8 == 0,
// LDB a multiple of 8 (ldmatrix rows); A rows past M read as zero. SWB: B is stored unpadded
// with its rows' chunks swizzled (`swz`, LDB == N); SWA: A likewise (`swz<LDA, 8>`, LDA == K).
// TRB: B stored transposed, [BATCH][N][K] with rows LDB apart (`tidx`), read untransposed.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, bool SWB = false, bool SWA = false, bool TRB = false>
struct MmaAcc {
  static constexpr int NW = NT / 32, MT = (M + 15) / 16, N8 = N / 8, KSTEPS = K / 16;
  static constexpr int FR = BATCH * MT * N8;
  static_assert(K % 16 == 0 && N % 8 == 0 && LDB % 8 == 0 && LDA % 2 == 0, "MmaAcc tile shape");
  static_assert(!(SWB && TRB), "MmaAcc: a transposed B is not swizzled");
  // K slices: the most (a power of two dividing NW, at most KSTEPS) that keep every warp at
  // <= 16 fragments (64 registers).
  __host__ __device__ static constexpr int pick_ks() {
    int ks = 1;
    while (NW % (ks * 2) == 0 && ks * 2 <= KSTEPS && (FR + NW / (ks * 2) - 1) / (NW / (ks * 2)) <= 16) ks *= 2;
    return ks;
  }
  // The fragment whose B columns fragment j shares within a k-step (j itself: none before
  // it): with one batch item, fragments j and p < j of a warp cover the same 8 columns when
  // (j - p) G is a multiple of N8, whatever the warp (their rows differ), so the later one
  // reuses the B registers instead of loading them again with ldmatrix.
  __host__ __device__ static constexpr int b_src(int j) {
    if (BATCH == 1)
      for (int p = 0; p < j; ++p)
        if ((j - p) * G % N8 == 0) return p;
    return j;
  }
  static constexpr int KS = pick_ks(), G = NW / KS, FPW = (FR + G - 1) / G;
  static constexpr bool A_LDSM = M % 16 == 0 && LDA % 8 == 0;
  float d[FPW][4];

  __device__ __forceinline__ MmaAcc() {
#pragma unroll
    for (int j = 0; j < FPW; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
  }

  // One iteration: adds this warp's share of A B.
  __device__ __forceinline__ void step(const T* A, const T* B) {
    const int t = lin_tid(), w = t >> 5, lane = t & 31;
    const int gi = w % G, slice = w / G;
    // A compile-time trip count: the k-steps unroll and their offsets fold into the loads.
#pragma unroll
    for (int i = 0; i < (KSTEPS + KS - 1) / KS; ++i) {
      const int s = slice + i * KS;
      if (KSTEPS % KS != 0 && s >= KSTEPS) break;
      const int k0 = s * 16;
      unsigned a[4];
      int am = -1;
      unsigned bb[FPW][2];
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int f = gi + j * G;
        if (FR % G == 0 || f < FR) {
          const int bm = f / N8, n8 = f % N8;  // bm = b * MT + mt
          const int b = bm / MT, mt = bm % MT;
          if (bm != am) {
            am = bm;
            a_frag<M, LDA, A_LDSM, T, SWA>(a, A + b * M * LDA, mt, k0, lane);
          }
          if (b_src(j) == j) {
            const int br = b * K + k0 + (lane & 15);
            if constexpr (TRB) {
              ldsm_x2(bb[j], B + trans_b_row<LDB>(b * N + n8 * 8, k0, lane & 15));
            } else if constexpr (SWB) {
              ldsm_x2_trans(bb[j], B + swz<N, 8>(br, n8 * 8));
            } else {
              ldsm_x2_trans(bb[j], B + br * LDB + n8 * 8);
            }
          }
          mma_16816<T>(d[j], a, bb[b_src(j)]);
        }
      }
    }
  }

  // Floats of shared scratch `finish` needs: a float4 per lane, fragment and K slice (none
  // with one slice).
  static constexpr int SCRATCH = KS > 1 ? KS * FR * 128 : 0;

  // After the loop: C = this block's sums, where ref(c) is element c = (b * M + m) * N + n of C
  // (a float&). With K slices, every warp stores its fragments to `scratch` (SCRATCH floats),
  // and after one barrier the threads add the slices of each fragment in slice order, in
  // parallel; with at most 8 rows (M <= 8, one row tile) only the lanes and values holding
  // real rows (a sixteenth of them for M = 2: RMSNorm+Linear at b=1 took 448-576 ns from its
  // loop's end to its finishes' on the H200). Call from every thread; the caller orders what
  // follows.
  template <class Ref>
  __device__ __forceinline__ void finish(float* scratch, Ref ref) {
    const int t = lin_tid(), w = t >> 5, lane = t & 31;
    const int gi = w % G, slice = w / G;
    // Element (r, c) pairs of fragment f in lane ln: rows r0, r0 + 8, columns c0, c0 + 1.
    const auto put = [&](int f, int ln, const float* v) {
      const int bm = f / N8, n8 = f % N8, b = bm / MT, mt = bm % MT;
      const int r0 = mt * 16 + (ln >> 2), r1 = r0 + 8, c0 = n8 * 8 + (ln & 3) * 2;
      if (r0 < M) {
        ref((b * M + r0) * N + c0) = v[0];
        ref((b * M + r0) * N + c0 + 1) = v[1];
      }
      if (r1 < M) {
        ref((b * M + r1) * N + c0) = v[2];
        ref((b * M + r1) * N + c0 + 1) = v[3];
      }
    };
    if constexpr (KS == 1) {
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int f = gi + j * G;
        if (FR % G == 0 || f < FR) put(f, lane, d[j]);
      }
    } else if constexpr (MT == 1 && M <= 8) {
      // Rows 8.. of every fragment are padding: only the lanes holding rows below M pass
      // their first two values (a float2), and only those are added.
      float2* const sc = reinterpret_cast<float2*>(scratch);
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int f = gi + j * G;
        if ((FR % G == 0 || f < FR) && (lane >> 2) < M) sc[(slice * FR + f) * 32 + lane] = make_float2(d[j][0], d[j][1]);
      }
      __syncthreads();
      for (int x = t; x < FR * 32; x += NT) {
        if (((x & 31) >> 2) >= M) continue;
        float2 v = sc[x];
#pragma unroll
        for (int s = 1; s < KS; ++s) {
          const float2 u = sc[s * FR * 32 + x];
          v.x += u.x;
          v.y += u.y;
        }
        const float e[4] = {v.x, v.y, 0.0f, 0.0f};
        put(x >> 5, x & 31, e);
      }
    } else {
      float4* const sc = reinterpret_cast<float4*>(scratch);
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int f = gi + j * G;
        if (FR % G == 0 || f < FR) sc[(slice * FR + f) * 32 + lane] = make_float4(d[j][0], d[j][1], d[j][2], d[j][3]);
      }
      __syncthreads();
      for (int x = t; x < FR * 32; x += NT) {
        float4 v = sc[x];
#pragma unroll
        for (int s = 1; s < KS; ++s) {
          const float4 u = sc[s * FR * 32 + x];
          v.x += u.x;
          v.y += u.y;
          v.z += u.z;
          v.w += u.w;
        }
        const float e[4] = {v.x, v.y, v.z, v.w};
        put(x >> 5, x & 31, e);
      }
    }
  }
};

// Row sums (SQ = false) or row sums of squares (SQ = true) of a loop's 16-bit tile, accumulated
// in registers over the iterations on the tensor cores: for every 16 x 16 block of A (rows
// LD elements apart), one m16n8k16 mma with B = ones gives the row sums; with SQ, two mma with
// B = the block's own rows (the A fragment registers, reused) give A A^T, whose diagonal holds
// the sums of squares. Products of 16-bit values are exact in fp32, so the result is that of
// fp32 accumulation. Warps split row groups and 16-column steps like MmaAcc; `finish` adds the
// slices once, after the loop. Rows past ROWS read as zero. SW: the rows are unpadded and
// their chunks swizzled (`swz<LD, 8>`, LD == LEN); BLK: in column blocks of 64 (`swzb`).
template <int NT, int ROWS, int LEN, int LD, typename T, bool SQ, bool SW = false, bool BLK = false>
struct RowSumAcc {
  static constexpr int NW = NT / 32, MT = (ROWS + 15) / 16, KSTEPS = LEN / 16;
  static constexpr int G = MT < NW ? MT : NW;
  static constexpr int KS = (NW / G) < KSTEPS ? (NW / G) : KSTEPS, FPW = (MT + G - 1) / G;
  static constexpr int NB = SQ ? 2 : 1;
  static constexpr bool A_LDSM = ROWS % 16 == 0 && LD % 8 == 0;
  static_assert(LEN % 16 == 0 && LD % 2 == 0 && sizeof(T) == 2, "RowSumAcc tile shape");
  float d[FPW][NB][4];

  __device__ __forceinline__ RowSumAcc() {
#pragma unroll
    for (int j = 0; j < FPW; ++j)
#pragma unroll
      for (int h = 0; h < NB; ++h) d[j][h][0] = d[j][h][1] = d[j][h][2] = d[j][h][3] = 0.0f;
  }

  // One iteration: adds this warp's share of the tile.
  __device__ __forceinline__ void step(const T* A) {
    const int t = lin_tid(), w = t >> 5, lane = t & 31;
    const int gi = w % G, slice = w / G;
    if (slice >= KS) return;
    const unsigned one = one_x2<T>();
    const unsigned ones[2] = {one, one};
#pragma unroll
    for (int i = 0; i < (KSTEPS + KS - 1) / KS; ++i) {
      const int s = slice + i * KS;
      if (KSTEPS % KS != 0 && s >= KSTEPS) break;
      const int k0 = s * 16;
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int mt = gi + j * G;
        if (MT % G == 0 || mt < MT) {
          unsigned a[4];
          a_frag<ROWS, LD, A_LDSM, T, SW, BLK>(a, A, mt, k0, lane);
          if constexpr (SQ) {
            const unsigned b0[2] = {a[0], a[2]}, b1[2] = {a[1], a[3]};
            mma_16816<T>(d[j][0], a, b0);
            mma_16816<T>(d[j][NB - 1], a, b1);
          } else {
            mma_16816<T>(d[j][0], a, ones);
          }
        }
      }
    }
  }

  // Floats of shared scratch `finish` needs: a row's sum per K slice (none with one slice).
  static constexpr int SCRATCH = KS > 1 ? KS * MT * 16 : 0;

  // After the loop: row r of the sums = this block's sums, where ref(r) is that row's float&.
  // With K slices, each slice's row sums go to `scratch` (SCRATCH floats) and after one
  // barrier a thread per row adds them in slice order. Call from every thread; the caller
  // orders what follows.
  template <class Ref>
  __device__ __forceinline__ void finish(float* scratch, Ref ref) {
    const int t = lin_tid(), w = t >> 5, lane = t & 31;
    const int gi = w % G, slice = w / G;
    const int g = lane >> 2, q = lane & 3;
    if (slice < KS) {
#pragma unroll
      for (int j = 0; j < FPW; ++j) {
        const int mt = gi + j * G;
        if (MT % G == 0 || mt < MT) {
          const int r0 = mt * 16 + g, r1 = r0 + 8;
          float v0, v1;
          bool mine;
          if constexpr (SQ) {
            // Diagonal of A A^T: (g, g) sits in lane (g, g / 2), element g % 2 of each half.
            mine = q == g / 2;
            v0 = (g & 1) ? d[j][0][1] : d[j][0][0];
            v1 = (g & 1) ? d[j][1][3] : d[j][1][2];
          } else {
            mine = q == 0;
            v0 = d[j][0][0];
            v1 = d[j][0][2];
          }
          if (KS == 1) {
            if (mine && r0 < ROWS) ref(r0) = v0;
            if (mine && r1 < ROWS) ref(r1) = v1;
          } else if (mine) {
            scratch[slice * MT * 16 + r0] = v0;
            scratch[slice * MT * 16 + r1] = v1;
          }
        }
      }
    }
    if constexpr (KS > 1) {
      __syncthreads();
      for (int r = t; r < ROWS; r += NT) {
        float v = scratch[r];
#pragma unroll
        for (int s = 1; s < KS; ++s) v += scratch[s * MT * 16 + r];
        ref(r) = v;
      }
    }
  }
};

// CUDA-core path, fp32 fused multiply-adds (SWA / SWB / TRB as `matmul_mma`'s): a thread per
// output element, or, where the outputs are fewer than half the threads (a GEMV's few rows),
// G adjacent lanes per output, each summing every G-th k, added by shuffles.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, bool SWA, bool SWB, bool TRB, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_simt(const TA* A, const TB* B, Epi epi) {
  constexpr int OUTS = BATCH * M * N;
  constexpr int G0 = NT / OUTS;
  constexpr int G = G0 >= 32 ? 32 : G0 >= 16 ? 16 : G0 >= 8 ? 8 : G0 >= 4 ? 4 : G0 >= 2 ? 2 : 1;
  // Output c's sum over k = k0, k0 + step, ...
  const auto dot = [&](int c, int k0, int step) {
    const int b = c / (M * N);
    const int m = (c / N) % M, n = c % N;
    float acc = 0.0f;
    for (int k = k0; k < K; k += step) {
      const int bi = TRB ? (b * N + n) * LDB + k : tile_at<LDB, SWB>(b * K + k, n);
      acc = fmaf(to_f32(A[tile_at<LDA, SWA>(b * M + m, k)]), to_f32(B[bi]), acc);
    }
    return acc;
  };
  if constexpr (G > 1 && NT % 32 == 0) {
    // Every thread meets the shuffles (whole warps); those past the outputs add zeros.
    const int t = lin_tid(), c = t / G, sub = t % G;
    float acc = c < OUTS ? dot(c, sub, G) : 0.0f;
#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (c < OUTS && sub == 0) epi(c, acc);
    return;
  }
  for (int c = lin_tid(); c < OUTS; c += NT) epi(c, dot(c, 0, 1));
}

// LDA / LDB: row pitch of A and B in elements (K and N when unpadded). SWA / SWB: A / B
// unpadded with their rows' chunks swizzled (`swz<LD, 8>`, 16-bit, rows of 2, 4 or a multiple
// of 8 chunks). `scratch`: NT * 16 bytes of shared memory for split-K partial sums.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, bool SWA = false, bool SWB = false, bool TRB = false, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_tile(const TA* A, const TB* B, float* scratch, Epi epi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (NT % 32 == 0 && same_type<TA, TB>::value && is_16bit<TA>::value) {
    matmul_mma<NT, BATCH, M, N, K, LDA, LDB, TA, SWA, SWB, TRB>(A, B, scratch, epi);
    return;
  }
#endif
  matmul_simt<NT, BATCH, M, N, K, LDA, LDB, SWA, SWB, TRB, TA, TB>(A, B, epi);
}

}  // namespace mi
