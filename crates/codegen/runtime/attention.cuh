// mirage runtime, a part of the header a generated source inlines where its kernels use it
// (after mirage_runtime.cuh and the parts this one needs: codegen's runtime.rs).
// Register-resident attention: the online-softmax loop with scores and accumulators in
// registers.

namespace mi {

// ------------------------------------------------------ register-resident attention
// The online-softmax loop of attention with S = Q K, the running max, P = exp(S - m), the row
// sums and O = sum P V in registers (FlashAttention-2's schedule; codegen's flash.rs matches
// the block graph). Per batch item b < BATCH: Q is [M][D] (row pitch LDQ, type TQ: 16-bit T
// or fp32, converted once), each iteration's K is [D][N] (LDK) and V is [N][DV] (LDV), 16-bit
// T, all in shared memory. The warps split evenly over batch items; within one, warp w takes
// RG row groups of 16 rows (group (w % WR) * RG + r) and key slice w / WR of width N / KS,
// updated in chunks of CW keys; each slice keeps its own running max (codegen's flash.rs
// picks RG, KS and CW), and `finish` combines the slices once, after the
// loop, into
//   O[b][m][j] = sum_n exp(S[m][n] - X[m]) V[n][j],  L[b][m] = sum_n exp(S[m][n] - X[m]),
//   X[b][m] = max_n S[m][n]   (n over every iteration's keys; fp32, row-major).
__device__ __forceinline__ unsigned pack_f32x2(float lo, float hi, f16*) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}
__device__ __forceinline__ unsigned pack_f32x2(float lo, float hi, bf16*) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// Q's A fragments of rows row0 .. row0 + 15 (16-bit T through ldmatrix, or fp32 converted).
template <int KQ, int LDQ, typename T, typename TQ>
__device__ __forceinline__ void flash_load_q(unsigned (&q)[KQ][4], const TQ* Q, int row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < KQ; ++kk) {
    if constexpr (same_type<TQ, T>::value) {
      ldsm_x4(q[kk], Q + (row0 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8);
    } else {
      const int g = lane >> 2, c = kk * 16 + (lane & 3) * 2;
      const TQ* q0 = Q + (row0 + g) * LDQ + c;
      const TQ* q1 = q0 + 8 * LDQ;
      q[kk][0] = pack_f32x2(to_f32(q0[0]), to_f32(q0[1]), (T*)nullptr);
      q[kk][1] = pack_f32x2(to_f32(q1[0]), to_f32(q1[1]), (T*)nullptr);
      q[kk][2] = pack_f32x2(to_f32(q0[8]), to_f32(q0[9]), (T*)nullptr);
      q[kk][3] = pack_f32x2(to_f32(q1[8]), to_f32(q1[9]), (T*)nullptr);
    }
  }
}

// A callable that does nothing (default hooks).
struct NoOp {
  template <class... A>
  __device__ __forceinline__ void operator()(A...) const {}
};

// Two 16-bit values times two others (packed words), rounded to T.
template <typename T>
__device__ __forceinline__ unsigned mul_x2(unsigned a, unsigned b) {
  unsigned d = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (same_type<T, f16>::value) {
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  }
#elif defined(__CUDA_ARCH__)
  const T* x = reinterpret_cast<const T*>(&a);
  const T* y = reinterpret_cast<const T*>(&b);
  T* z = reinterpret_cast<T*>(&d);
  z[0] = from_f32<T>(to_f32(x[0]) * to_f32(y[0]));
  z[1] = from_f32<T>(to_f32(x[1]) * to_f32(y[1]));
#endif
  return d;
}

// ------------------------------------------------------ attention variants
// What an attention loop computes beyond softmax(Q K) V is its variant: a struct passed as
// one template parameter (`FlashWG`'s VARIANT) with static properties and hooks that the loop
// calls at fixed points, all inlined; the plain variant's hooks do nothing, so its loop is
// the plain one. Properties:
//   q_factors  Q's rows are normalised inside the softmax: each row's exponent is scaled by
//              its factor (`FlashRows::qs`, `softmax<..., QS>`; `unscale` before the merges)
//   v_factors  V's rows are normalised: P's key columns are scaled by V's row factors
//              before P V (the row sums stay those of unscaled P); every consumer thread reads
//              V, so every one releases the stage
// Hooks (A: the attention object, `FlashWG`; called in `run_ws`):
//   query(a)                       after the first S is issued: Q's row factors (`q_scales`)
//   value_factors(a, V, slot)      a stage's V row factors into a slot of 16-bit factors
//                                  (beside the softmax, or a step ahead with 64-key steps)
//   load_value_factors(slot, l, w) after the warpgroup's turn: lane l's factors of the stage
//   scale_p(p, w)                  before P V: P's fragments times the factors
struct PlainAttention {
  static constexpr bool q_factors = false, v_factors = false;
  template <class A>
  __device__ __forceinline__ static void query(A&) {}
  template <class A, class T>
  __device__ __forceinline__ static void value_factors(A&, const T*, T*) {}
  template <class T, int NW>
  __device__ __forceinline__ static void load_value_factors(const T*, int, unsigned (&)[NW]) {}
  template <class T, int NP, int NW>
  __device__ __forceinline__ static void scale_p(unsigned (&)[NP][4], const unsigned (&)[NW]) {}
};

// Q's rows normalised (QK-norm) by the softmax: Q stays as copied, each row's factor (1 / rms
// of the raw row) scales its exponent.
struct QRowScales : PlainAttention {
  static constexpr bool q_factors = true;
  template <class A>
  __device__ __forceinline__ static void query(A& a) { a.q_scales(); }
};

// V's rows normalised (QK-norm): P V over normalised rows is P with each key's column scaled
// by its row's 1 / rms times V, so V is read, not rewritten.
struct VRowFactors : PlainAttention {
  static constexpr bool v_factors = true;
  template <class A, class T>
  __device__ __forceinline__ static void value_factors(A& a, const T* V, T* slot) { a.v_factor(V, slot); }
  // NW factors (packed pairs of 16-bit values) of quad position lane % 4, in 16-byte loads.
  template <class T, int NW>
  __device__ __forceinline__ static void load_value_factors(const T* slot, int lane, unsigned (&w)[NW]) {
    const uint4* const f = reinterpret_cast<const uint4*>(slot) + (lane & 3) * (NW / 4);
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
      const uint4 x = f[i];
      w[4 * i] = x.x;
      w[4 * i + 1] = x.y;
      w[4 * i + 2] = x.z;
      w[4 * i + 3] = x.w;
    }
  }
  // Word e of P's pair jj holds fragment 2 jj + e / 2 (rows g and g + 8 alike).
  template <class T, int NP, int NW>
  __device__ __forceinline__ static void scale_p(unsigned (&p)[NP][4], const unsigned (&w)[NW]) {
#pragma unroll
    for (int jj = 0; jj < NP; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) p[jj][e] = mul_x2<T>(p[jj][e], w[2 * jj + e / 2]);
  }
};

// Two variants' effects together: properties of either, each hook the first's then the
// second's (orthogonal variants touch different state).
template <class V1, class V2>
struct BothAttention {
  static constexpr bool q_factors = V1::q_factors || V2::q_factors, v_factors = V1::v_factors || V2::v_factors;
  template <class A>
  __device__ __forceinline__ static void query(A& a) {
    V1::query(a);
    V2::query(a);
  }
  template <class A, class T>
  __device__ __forceinline__ static void value_factors(A& a, const T* V, T* slot) {
    V1::value_factors(a, V, slot);
    V2::value_factors(a, V, slot);
  }
  template <class T, int NW>
  __device__ __forceinline__ static void load_value_factors(const T* slot, int lane, unsigned (&w)[NW]) {
    V1::template load_value_factors<T>(slot, lane, w);
    V2::template load_value_factors<T>(slot, lane, w);
  }
  template <class T, int NP, int NW>
  __device__ __forceinline__ static void scale_p(unsigned (&p)[NP][4], const unsigned (&w)[NW]) {
    V1::template scale_p<T>(p, w);
    V2::template scale_p<T>(p, w);
  }
};

// QK-norm with both norms inside the loop: Q's in the softmax, V's as P's factors.
using QkNormAttention = BothAttention<QRowScales, VRowFactors>;

// The rows of a [ROWS][LEN] 16-bit tile normalised in place (x / sqrt(mean(x^2)) per row):
// element (r, c) at tile_at<LD, SW>(r, c). Each warp takes 16 rows at a time as ldmatrix
// fragments (a thread holds 16 values of row i and of row 8 + i of the group, a quad a row),
// sums their squares in fp32 (FFMA, then two quad shuffles), scales the fragments by the
// 16-bit 1 / rms (one packed multiply a word: within an ulp of the fp32 product) and stores
// them back where they came from with stmatrix. The attention step's normalised V (QK-norm
// attention). With PARTS > 1, only part `part` of each warp's groups: a pass split over calls.
// Every thread must call it; ROWS and LEN multiples of 16.
template <int NT, int ROWS, int LEN, int LD, bool SW, class T, int PARTS = 1>
__device__ __forceinline__ void rms_norm_rows_frag(T* t, int part = 0) {
  static_assert(ROWS % 16 == 0 && LEN % 16 == 0 && LD % 8 == 0 && (!SW || LD == LEN) && sizeof(T) == 2,
                "rms_norm_rows_frag: 16-row groups of 16-column steps, 16-byte row pitches, 16-bit values");
  constexpr int NW = NT / 32, KQ = LEN / 16, G = ROWS / 16, GW = (G + NW - 1) / NW;
  const int lane = lin_tid() & 31, col = (lane >> 4) * 8;
  const unsigned base = (unsigned)__cvta_generic_to_shared(t);
  // A warp's groups and column steps are independent until the shuffles: every load is issued
  // before the first sum needs it.
  unsigned a[GW][KQ][4];
#pragma unroll
  for (int p = 0; p < GW; ++p) {
    const int g = (lin_tid() >> 5) + p * NW;
    if ((PARTS > 1 && p * PARTS / GW != part) || (G % NW != 0 && g >= G)) continue;
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) ldsm_x4_at(a[p][kk], base + 2u * (unsigned)tile_at<LD, SW>(g * 16 + (lane & 15), kk * 16 + col));
  }
#pragma unroll
  for (int p = 0; p < GW; ++p) {
    const int g = (lin_tid() >> 5) + p * NW;
    if ((PARTS > 1 && p * PARTS / GW != part) || (G % NW != 0 && g >= G)) continue;
    // a[0], a[2]: row i of the group; a[1], a[3]: row 8 + i.
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      const T* h = reinterpret_cast<const T*>(a[p][kk]);
      float x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = to_f32(h[e]);
      d0 = fmaf(x[0], x[0], fmaf(x[1], x[1], fmaf(x[4], x[4], fmaf(x[5], x[5], d0))));
      d1 = fmaf(x[2], x[2], fmaf(x[3], x[3], fmaf(x[6], x[6], fmaf(x[7], x[7], d1))));
    }
    d0 += __shfl_xor_sync(0xffffffffu, d0, 1);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 1);
    d0 += __shfl_xor_sync(0xffffffffu, d0, 2);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 2);
    const float r0 = rsqrtf(d0 / (float)LEN), r1 = rsqrtf(d1 / (float)LEN);
    const unsigned m0 = pack_f32x2(r0, r0, (T*)nullptr), m1 = pack_f32x2(r1, r1, (T*)nullptr);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      unsigned* const f = a[p][kk];
      f[0] = mul_x2<T>(f[0], m0);
      f[2] = mul_x2<T>(f[2], m0);
      f[1] = mul_x2<T>(f[1], m1);
      f[3] = mul_x2<T>(f[3], m1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(
                       base + 2u * (unsigned)tile_at<LD, SW>(g * 16 + (lane & 15), kk * 16 + col)),
                   "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3])
                   : "memory");
#else
      const int i = lane >> 2;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<unsigned*>(t + tile_at<LD, SW>(g * 16 + i + 8 * (j & 1), kk * 16 + 8 * (j >> 1) + 2 * (lane & 3))) = f[j];
#endif
    }
  }
}

// Per-half unsigned max of two pairs of 16-bit values (for non-negative fp16/bf16 pairs,
// the larger value of each half).
__device__ __forceinline__ unsigned max_u16x2(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vmaxu2(a, b);
#endif
}

// The running softmax state of a warp's RG row groups (rows g and g + 8 of 16 each) and
// their O accumulators, in the mma accumulator layout (wgmma's per warp is the same).
// m is the reference max the exponentials use; x, the true running max (kept only with
// XMAX, where the running max is an output); l, the row sum relative to m. m trails the
// rows' max by at most TH (natural log units): O and l are rescaled only when a row's max
// passes m + TH, so P = exp(S - m) stays below 2^8 (exact in fp16/bf16 scale) and most
// updates skip the rescale.
template <int RG, int NFO, bool XMAX = true>
struct FlashRows {
  float o[RG][NFO][4];
  float m[RG][2], x[RG][2], l[RG][2];
  float ra[RG][2];  // a deferred O rescale (`softmax<..., DEFER>`) and whether one is pending
  bool rpend;
  // With `softmax<..., QS>`: each row's exponent scale, log2 e times the row's factor q (the
  // 1 / rms of a raw Q row whose norm the softmax applies: exp(q (S - m)) with S = Q K of the
  // raw row and m in those units until `unscale`).
  float qs[RG][2];

  __device__ __forceinline__ void scale_o(int r, float a0, float a1) {
#pragma unroll
    for (int j = 0; j < NFO; ++j) {
      o[r][j][0] *= a0;
      o[r][j][1] *= a0;
      o[r][j][2] *= a1;
      o[r][j][3] *= a1;
    }
  }

  // The O rescale a `DEFER` softmax left, once no wgmma is accumulating into O (the rescale
  // decision is a warp's, and the wait for such a wgmma, `.sync.aligned`, must be the whole
  // warpgroup's: in that branch compute-sanitizer's synccheck reports mismatching warpgroup
  // instructions).
  __device__ __forceinline__ void rescale_deferred() {
    if (rpend) {
#pragma unroll
      for (int r = 0; r < RG; ++r) scale_o(r, ra[r][0], ra[r][1]);
      rpend = false;
    }
  }
  static constexpr float L2E = 1.4426950408889634f, TH = 8.0f * 0.6931471805599453f;

  __device__ __forceinline__ void reset() {
    rpend = false;
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      m[r][0] = m[r][1] = x[r][0] = x[r][1] = neg_inf();
      l[r][0] = l[r][1] = 0.0f;
#pragma unroll
      for (int j = 0; j < NFO; ++j) o[r][j][0] = o[r][j][1] = o[r][j][2] = o[r][j][3] = 0.0f;
    }
  }

  // The online-softmax update of one chunk S (NFC fragments of 8 keys per row group): P =
  // exp(S - m) = 2^(S log2e - m log2e) (one FMA and one MUFU.EX2) with the current m, its row
  // sums, and P as mma A fragments (`pa`). P does not wait for the chunk's row maxima, and
  // only a chunk whose max passes m + TH for some row of the warp (rare after the first)
  // rescales O and l and computes P again. Waiting for the maxima first cost the wgmma loop
  // about a fifth of its time. With XMAX the maxima are reduced beside P (pairwise trees, a
  // quad shuffle) to keep x; without, the test is whether some packed P passes 2^8 (a tree
  // of 16-bit integer maxima over the packed pairs: P >= 0, so their bit patterns order as
  // their values; the first chunk's P is infinite against m = -inf), and only the rare
  // branch reduces the maxima (MQA b=16's wgmma loop had 72 FMNMX and 8 SHFL of its 551
  // instructions a warp-iteration in them). With DEFER, O is left alone (l and m are
  // rescaled): `rescale_deferred` scales it later, where the wgmma forms first wait for the P
  // V still accumulating into O (a wgmma wait in the rescale's branch, which each warp
  // decides, would not be the whole warpgroup's, as `.sync.aligned` requires).
  // With QS, each row's exponent is scaled by `qs` instead of log2 e (the same instruction
  // count): no XMAX test, which compares maxima in the softmax's units.
  template <int NFC, typename T, bool DEFER = false, bool QS = false>
  __device__ __forceinline__ void softmax(float (&s)[RG][NFC][4], unsigned (&pa)[RG][NFC / 2][4]) {
    static_assert(!(QS && XMAX), "softmax: row scales only without the true running max");
    // Row r's half h exponent scale.
    auto sc = [&](int r, int h) { return QS ? qs[r][h] : L2E; };
    float t0[RG][NFC], t1[RG][NFC];
    auto exps = [&] {
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        const float c0 = sc(r, 0), c1 = sc(r, 1);
        const float b0 = -m[r][0] * c0, b1 = -m[r][1] * c1;
#pragma unroll
        for (int j = 0; j < NFC; ++j) {
          const float e0 = ex2(fmaf(s[r][j][0], c0, b0)), e1 = ex2(fmaf(s[r][j][1], c0, b0));
          const float e2 = ex2(fmaf(s[r][j][2], c1, b1)), e3 = ex2(fmaf(s[r][j][3], c1, b1));
          t0[r][j] = e0 + e1;
          t1[r][j] = e2 + e3;
          pa[r][j / 2][(j % 2) * 2] = pack_f32x2(e0, e1, (T*)nullptr);
          pa[r][j / 2][(j % 2) * 2 + 1] = pack_f32x2(e2, e3, (T*)nullptr);
        }
      }
    };
    exps();
    float mx[RG][2];
    bool grow = false;
    // Row maxima of the chunk over each quad (and, with XMAX, the running max and the test).
    auto maxima = [&] {
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        float u0[NFC], u1[NFC];
#pragma unroll
        for (int j = 0; j < NFC; ++j) {
          u0[j] = fmaxf(s[r][j][0], s[r][j][1]);
          u1[j] = fmaxf(s[r][j][2], s[r][j][3]);
        }
#pragma unroll
        for (int w = 1; w < NFC; w *= 2)
#pragma unroll
          for (int j = 0; j + w < NFC; j += 2 * w) {
            u0[j] = fmaxf(u0[j], u0[j + w]);
            u1[j] = fmaxf(u1[j], u1[j + w]);
          }
        float mx0 = u0[0], mx1 = u1[0];
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        mx[r][0] = mx0;
        mx[r][1] = mx1;
        if constexpr (XMAX) {
          x[r][0] = fmaxf(x[r][0], mx0);
          x[r][1] = fmaxf(x[r][1], mx1);
          grow |= mx0 > m[r][0] + TH || mx1 > m[r][1] + TH;
        }
      }
    };
    if constexpr (XMAX) {
      maxima();
    } else {
      unsigned v = pa[0][0][0];
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NFC / 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) v = max_u16x2(v, pa[r][j][e]);
      // 2^8 in the storage type.
      constexpr unsigned P8 = same_type<T, f16>::value ? 0x5C00u : 0x4380u;
      grow = (v & 0xFFFFu) > P8 || (v >> 16) > P8;
    }
    if (__any_sync(0xffffffffu, grow)) {
      if constexpr (!XMAX) maxima();
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        const float n0 = fmaxf(m[r][0], mx[r][0]), n1 = fmaxf(m[r][1], mx[r][1]);
        const float a0 = ex2((m[r][0] - n0) * sc(r, 0)), a1 = ex2((m[r][1] - n1) * sc(r, 1));
        m[r][0] = n0;
        m[r][1] = n1;
        l[r][0] *= a0;
        l[r][1] *= a1;
        if constexpr (DEFER) {
          ra[r][0] = a0;
          ra[r][1] = a1;
        } else {
          scale_o(r, a0, a1);
        }
      }
      if constexpr (DEFER) rpend = true;
      exps();
    }
#pragma unroll
    for (int r = 0; r < RG; ++r) {
#pragma unroll
      for (int w = 1; w < NFC; w *= 2)
#pragma unroll
        for (int j = 0; j + w < NFC; j += 2 * w) {
          t0[r][j] += t0[r][j + w];
          t1[r][j] += t1[r][j + w];
        }
      l[r][0] += t0[r][0];
      l[r][1] += t1[r][0];
    }
  }

  // After the last `softmax<..., QS>`: m in the units of S scaled by the rows' factors (the
  // merges' and `settle`'s), -inf staying -inf.
  __device__ __forceinline__ void unscale() {
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      m[r][0] *= qs[r][0] * (1.0f / L2E);
      m[r][1] *= qs[r][1] * (1.0f / L2E);
    }
  }

  // After the last update: l summed over the quad and, with XMAX, everything made relative
  // to the true max (m = x; without, x = m: any reference max serves the merges).
  __device__ __forceinline__ void settle() {
#pragma unroll
    for (int r = 0; r < RG; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[r][h] += __shfl_xor_sync(0xffffffffu, l[r][h], 1);
        l[r][h] += __shfl_xor_sync(0xffffffffu, l[r][h], 2);
        if constexpr (!XMAX) {
          x[r][h] = m[r][h];
          continue;
        }
        const float a = ex2((m[r][h] - x[r][h]) * L2E);
        m[r][h] = x[r][h];
        l[r][h] *= a;
#pragma unroll
        for (int j = 0; j < NFO; ++j) {
          o[r][j][2 * h] *= a;
          o[r][j][2 * h + 1] *= a;
        }
      }
    }
  }

  // A settled partial (O, m, l) of thread `tw` of a group of TH threads (a warpgroup or a
  // warp) for `merge` by the thread of the same rank in another group over the same rows:
  // float4 [RG * (NFO + 1)][TH] at `buf` (each store of a warp is 512 contiguous bytes, free
  // of bank conflicts).
  template <int TH>
  static constexpr int SLOT_FLOATS = RG * (NFO + 1) * 4 * TH;
  template <int TH>
  __device__ __forceinline__ void save(float* buf, int tw) const {
    float4* const p = reinterpret_cast<float4*>(buf) + tw;
#pragma unroll
    for (int r = 0; r < RG; ++r) {
#pragma unroll
      for (int j = 0; j < NFO; ++j) p[(r * (NFO + 1) + j) * TH] = make_float4(o[r][j][0], o[r][j][1], o[r][j][2], o[r][j][3]);
      p[(r * (NFO + 1) + NFO) * TH] = make_float4(m[r][0], m[r][1], l[r][0], l[r][1]);
    }
  }
  // Merges the partial another thread `save`d at `buf` into this settled one: both made
  // relative to the larger max (a row with no keys on either side stays 0).
  template <int TH>
  __device__ __forceinline__ void merge(const float* buf, int tw) {
    const float4* const p = reinterpret_cast<const float4*>(buf) + tw;
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      const float4 ml = p[(r * (NFO + 1) + NFO) * TH];
      float a[2], b[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mo = h ? ml.y : ml.x, lo = h ? ml.w : ml.z, mn = fmaxf(m[r][h], mo);
        a[h] = mn == neg_inf() ? 0.0f : ex2((m[r][h] - mn) * L2E);
        b[h] = mn == neg_inf() ? 0.0f : ex2((mo - mn) * L2E);
        l[r][h] = l[r][h] * a[h] + lo * b[h];
        m[r][h] = x[r][h] = mn;
      }
#pragma unroll
      for (int j = 0; j < NFO; ++j) {
        const float4 v = p[(r * (NFO + 1) + j) * TH];
        o[r][j][0] = o[r][j][0] * a[0] + v.x * b[0];
        o[r][j][1] = o[r][j][1] * a[0] + v.y * b[0];
        o[r][j][2] = o[r][j][2] * a[1] + v.z * b[1];
        o[r][j][3] = o[r][j][3] * a[1] + v.w * b[1];
      }
    }
  }

  // Merges a block's KS key slices over the same rows into slice 0, between two barriers of
  // the whole block (the scratch may overlay tiles other threads still read): the group (of
  // TH threads) of slice k > 0 `save`s into slot (k - 1) * GROUPS + grp, and slice 0's
  // `merge`s every slot, then runs `merged()`. Threads that hold no slice (`active` false)
  // only pass the barriers. With BAR > 0 the barriers span the block's first BAR threads.
  template <int TH, int KS, int GROUPS, int BAR = 0, class Merged>
  __device__ __forceinline__ void merge_slices(float* scratch, int slice, int grp, int tw, bool active, Merged merged) {
    constexpr int SLOT = SLOT_FLOATS<TH>;
    auto sync = [] {
      if constexpr (BAR > 0) {
        bar_sync_n<BAR>();
      } else {
        __syncthreads();
      }
    };
    sync();
    if (active && slice > 0) save<TH>(scratch + ((slice - 1) * GROUPS + grp) * SLOT, tw);
    sync();
    if (active && slice == 0) {
#pragma unroll 1
      for (int k = 1; k < KS; ++k) merge<TH>(scratch + ((k - 1) * GROUPS + grp) * SLOT, tw);
      merged();
    }
  }

  // Rows row(r) + g and row(r) + g + 8 of O ([rows][NFO * 8]), L and X (either may be null).
  template <class Row>
  __device__ __forceinline__ void store(float* O, float* L, float* X, int lane, Row row) const {
    const int g = lane >> 2, qd = lane & 3;
    constexpr int DV = NFO * 8;
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      const int r0 = row(r) + g, r1 = r0 + 8;
#pragma unroll
      for (int j = 0; j < NFO; ++j) {
        const int c = j * 8 + qd * 2;
        O[r0 * DV + c] = o[r][j][0];
        O[r0 * DV + c + 1] = o[r][j][1];
        O[r1 * DV + c] = o[r][j][2];
        O[r1 * DV + c + 1] = o[r][j][3];
      }
      if (qd == 0) {
        if (L) { L[r0] = l[r][0]; L[r1] = l[r][1]; }
        if (X) { X[r0] = m[r][0]; X[r1] = m[r][1]; }
      }
    }
  }
};

template <int NT, int BATCH, int M, int D, int N, int DV, int LDQ, int LDK, int LDV, int RG, int KS, int CW,
          typename T, typename TQ, bool XMAX = true>
struct Flash {
  static_assert((NT / 32) % BATCH == 0, "flash: warps per batch item");
  static constexpr int NW = NT / 32 / BATCH, MW = M / 16;
  static_assert(MW % RG == 0, "flash: row groups per warp");
  static constexpr int WR = MW / RG;  // warps along rows
  // CW: keys per online-softmax update (codegen's FlashRegion::chunk).
  static constexpr int NC = N / KS, NFO = DV / 8, KQ = D / 16, NFC = CW / 8, KPC = CW / 16;
  static_assert(CW % 16 == 0 && NC % CW == 0, "flash: softmax chunk");
  static_assert(M % 16 == 0 && D % 16 == 0 && N % (16 * KS) == 0 && DV % 16 == 0, "flash tile shape");
  static_assert(WR * KS <= NW, "flash warps");
  unsigned q[RG][KQ][4];
  FlashRows<RG, NFO, XMAX> st;
  int lane, bt, wr, slice;
  unsigned kofs, vofs;  // this lane's byte offsets in a K and a V tile
  bool active;

  __device__ __forceinline__ void init() {
    const int w = (lin_tid() >> 5) % NW;
    bt = (lin_tid() >> 5) / NW;
    lane = lin_tid() & 31;
    wr = w % WR;
    slice = w / WR;
    active = slice < KS;
    const int c0 = slice * NC, lr = lane & 15, lc = (lane >> 4) * 8;
    kofs = (unsigned)((bt * D * LDK + lr * LDK + c0 + lc) * 2);
    vofs = (unsigned)((bt * N * LDV + (c0 + lr) * LDV + lc) * 2);
    st.reset();
  }

  // One iteration: `first` reloads Q's fragments (Q is loop-invariant). Every K and V
  // fragment is read from shared memory once and used for all RG row groups.
  __device__ __forceinline__ void step(const TQ* Q, const T* K, const T* V, bool first) {
    if (!active) return;
    if (first) {
#pragma unroll
      for (int r = 0; r < RG; ++r) flash_load_q<KQ, LDQ, T, TQ>(q[r], Q + bt * M * LDQ, (wr * RG + r) * 16, lane);
    }
    const unsigned kb = (unsigned)__cvta_generic_to_shared(K) + kofs;
    const unsigned vb = (unsigned)__cvta_generic_to_shared(V) + vofs;
    // The warp's NC keys in chunks of CW, each a full online-softmax update (bounds the
    // registers S and P take whatever the tile's key count).
    // Software-pipelined: chunk c + 1's S = Q K is issued before chunk c's softmax, so the
    // tensor cores work while the exponentials run.
    float s[2][RG][NFC][4];
    qk(kb, s[0]);
#pragma unroll
    for (int c = 0; c < NC / CW; ++c) {
      if (c + 1 < NC / CW) qk(kb + (c + 1) * CW * 2, s[(c + 1) & 1]);
      unsigned pa[RG][KPC][4];
      st.template softmax<NFC, T>(s[c & 1], pa);
      mma_rows<KPC, NFO, LDV>(vb + c * CW * LDV * 2, pa, st.o);
    }
  }

  // acc[r] += A[r] B for every row group r: B (KSTEPS x 16 rows by NF x 8 columns, row pitch
  // LD elements, at shared-window address `b0`) is read once with ldmatrix.trans and shared
  // by the RG row groups; A is in mma A-fragments, one per 16-deep step.
  template <int KSTEPS, int NF, int LD, int KA, int NACC>
  __device__ __forceinline__ static void mma_rows(const unsigned b0, const unsigned (&a)[RG][KA][4],
                                                  float (&acc)[RG][NACC][4]) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
      for (int jj = 0; jj < NF / 2; ++jj) {
        unsigned b[4];
        ldsm_x4_trans_at(b, b0 + (kk * 16 * LD + jj * 16) * 2);
#pragma unroll
        for (int r = 0; r < RG; ++r) {
          mma_16816<T>(acc[r][2 * jj], a[r][kk], b);
          mma_16816<T>(acc[r][2 * jj + 1], a[r][kk], b + 2);
        }
      }
    }
  }

  // S = Q K over one chunk of keys.
  __device__ __forceinline__ void qk(const unsigned kb, float (&s)[RG][NFC][4]) {
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int j = 0; j < NFC; ++j) s[r][j][0] = s[r][j][1] = s[r][j][2] = s[r][j][3] = 0.0f;
    mma_rows<KQ, NFC, LDK>(kb, q, s);
  }

  // Floats of `scratch` that `finish` takes (0: none is read).
  template <int CS>
  __host__ __device__ static constexpr int scratch_floats() {
    return (KS - 1) * BATCH * WR * FlashRows<RG, NFO>::template SLOT_FLOATS<32>;
  }

  // After the loop: O ([BATCH][M][DV]), L and X ([BATCH][M], either may be null) in fp32
  // shared memory; every thread must call this. With KS > 1 the key slices merge in
  // registers as in `FlashWG::finish`: each warp of slice k > 0 `save`s its settled partial
  // into slot (k - 1) of its rows (`scratch_floats` in all), and the slice-0 warp over the
  // same rows merges it and writes the result.
  __device__ __forceinline__ void finish(float* scratch, float* O, float* L, float* X) {
    st.settle();
    const auto row = [&](int r) { return bt * M + (wr * RG + r) * 16; };
    if constexpr (KS == 1) {
      if (active) st.store(O, L, X, lane, row);
    } else {
      st.template merge_slices<32, KS, BATCH * WR>(scratch, slice, bt * WR + wr, lane, active,
                                                   [&] { st.store(O, L, X, lane, row); });
    }
  }
};

}  // namespace mi
