// mirage runtime, a part of the header a generated source inlines where its kernels use it
// (after mirage_runtime.cuh and the parts this one needs: codegen's runtime.rs).
// Block- and warp-level reductions, the row kernels' combine steps and the tile stores
// that use them.

namespace mi {

// --------------------------------------------------------------- reductions
// Combine steps of the reductions.
struct SumOp {
  static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
};
struct MaxOp {
  static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
};

// Reduction with `comb` over aligned groups of W lanes (a power of two <= 32); every lane of
// a group gets the group's result. All 32 lanes of the warp must call it.
template <int W, class Comb>
__device__ __forceinline__ float lanes_reduce(float v, Comb comb) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = comb(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Warp-wide reduction with `Op`; every lane gets the result.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
  return lanes_reduce<32>(v, Op::apply);
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
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<NT, SumOp>(v, scratch); }
template <int NT>
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<NT, MaxOp>(v, scratch); }

__host__ __device__ constexpr int pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int cmax(int a, int b) { return a < b ? b : a; }

// How NT threads share NOUT reductions of LEN elements: WPO whole warps per output (their
// partials meet in shared memory) when outputs are fewer than warps and long, else TPO lanes
// per output (a power of two; partials meet by shuffles), else one thread per output.
template <int NT, int NOUT, int LEN>
struct ReducePlan {
  static constexpr int NW = NT / 32;
  static constexpr bool WARPS = NT % 32 == 0 && NOUT * 2 <= NW && LEN >= 128;
  static constexpr int WPO = WARPS ? pow2_floor(cmin(NW / NOUT, LEN / 64)) : 1;
  static constexpr bool LANES = !WARPS && NT % 32 == 0 && NOUT * 2 <= NT && LEN >= 2;
  static constexpr int TPO = LANES ? pow2_floor(cmin(cmin(NT / NOUT, 32), LEN)) : 1;
};

// Reduces a [NOUT / INNER, LEN, INNER] index space over LEN by the whole block with `comb`
// from `init` (every thread must call it: it may contain barriers), sharing outputs as
// `ReducePlan` says. map(i) gives element i (row-major) as float. Every thread that shares
// output o then gets done(o, total, first, step): its own slice of the reduced dim is
// first, first + step, ... < LEN, and exactly one of them has first == 0. Threads of one output
// read consecutive elements, each starting at a rotated position so that rows a multiple of
// 32 words apart do not share banks.
template <int NT, int NOUT, int LEN, int INNER, class Map, class Comb, class Done>
__device__ __forceinline__ void share_reduce(float init, Map map, Comb comb, Done done) {
  using Plan = ReducePlan<NT, NOUT, LEN>;
  const int t = lin_tid();
  if constexpr (Plan::WARPS) {
    constexpr int WPO = Plan::WPO;
    __shared__ float part[Plan::NW];
    const int w = t >> 5, lane = t & 31, o = w / WPO, j = w % WPO;
    float acc = init;
    if (o < NOUT) {
      const int base = (o / INNER) * LEN * INNER + o % INNER;
      for (int l = j * 32 + lane; l < LEN; l += WPO * 32) acc = comb(acc, map(base + l * INNER));
    }
    acc = lanes_reduce<32>(acc, comb);
    if (lane == 0) part[w] = acc;
    __syncthreads();
    if (o < NOUT) {
      float v = part[o * WPO];
#pragma unroll
      for (int k = 1; k < WPO; ++k) v = comb(v, part[o * WPO + k]);
      done(o, v, j * 32 + lane, WPO * 32);
    }
    __syncthreads();
  } else if constexpr (Plan::LANES) {
    constexpr int TPO = Plan::TPO, CNT = (LEN + TPO - 1) / TPO;
    const int g = t / TPO, j = t % TPO;
    for (int o0 = 0; o0 < NOUT; o0 += NT / TPO) {
      const int o = o0 + g;
      float acc = init;
      if (o < NOUT) {
        const int base = (o / INNER) * LEN * INNER + o % INNER;
        int i = INNER == 1 ? o % CNT : 0;
#pragma unroll 4
        for (int c = 0; c < CNT; ++c) {
          const int l = j + TPO * i;
          if (CNT * TPO == LEN || l < LEN) acc = comb(acc, map(base + l * INNER));
          if (++i == CNT) i = 0;
        }
      }
      acc = lanes_reduce<TPO>(acc, comb);
      if (o < NOUT) done(o, acc, j, TPO);
    }
  } else {
    for (int o = t; o < NOUT; o += NT) {
      const int base = (o / INNER) * LEN * INNER + o % INNER;
      int l = INNER == 1 ? o % LEN : 0;
      float acc = init;
      for (int c = 0; c < LEN; ++c) {
        acc = comb(acc, map(base + l * INNER));
        if (++l == LEN) l = 0;
      }
      done(o, acc, 0, 1);
    }
  }
}

// Eight 16-bit values (one 16-byte word) as floats.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float* v) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const float2 f = to_f32x2(h[e], h[e + 1]);
    v[e] = f.x;
    v[e + 1] = f.y;
  }
}

// Eight consecutive values of a device tensor as floats: one 16-byte load (two for fp32) when
// `vec` (p 16-byte aligned), element loads otherwise.
template <class T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float* v, bool vec) {
  if (vec) {
    if constexpr (sizeof(T) == 2) {
      unpack8<T>(__ldg(reinterpret_cast<const uint4*>(p)), v);
    } else {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_f32(p[e]);
  }
}

// load8 of 16-bit values through L2 policy `pol` (16-byte aligned p).
template <typename T>
__device__ __forceinline__ void load8_pol(const T* __restrict__ p, float* v, bool vec, unsigned long long pol) {
  static_assert(sizeof(T) == 2, "load8_pol: 16-bit values");
  if (vec) {
    uint4 u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p), "l"(pol));
#endif
    unpack8<T>(u, v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_f32(p[e]);
  }
}

// The unsigned vector type of B bytes (one store of W 16-bit values).
template <int B> struct uvec;
template <> struct uvec<16> { typedef uint4 type; };
template <> struct uvec<8> { typedef uint2 type; };

// Stores W (8 or 4) floats to consecutive elements of a device tensor, converted to T: 16-byte
// stores (one 8-byte store for four 16-bit values) when `vec` (p aligned to that width), else
// element by element.
template <int W, typename T>
__device__ __forceinline__ void store_n(T* __restrict__ p, const float* v, bool vec) {
  static_assert(W == 8 || W == 4, "store_n: 8 or 4 values");
  if (vec) {
    if constexpr (sizeof(T) == 2) {
      typedef typename uvec<W * 2>::type V;
      V u;
      T* h = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int e = 0; e < W; ++e) h[e] = from_f32<T>(v[e]);
      *reinterpret_cast<V*>(p) = u;
    } else {
#pragma unroll
      for (int q = 0; q < W / 4; ++q) reinterpret_cast<float4*>(p)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) p[e] = from_f32<T>(v[e]);
  }
}

// Reads N (a multiple of 4) consecutive floats of shared memory at p (16-byte aligned), four at a
// time.
template <int N>
__device__ __forceinline__ void load_f32_n(float (&v)[N], const float* p) {
  static_assert(N % 4 == 0, "load_f32_n: a multiple of 4 values");
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 x = reinterpret_cast<const float4*>(p)[q];
    v[4 * q] = x.x;
    v[4 * q + 1] = x.y;
    v[4 * q + 2] = x.z;
    v[4 * q + 3] = x.w;
  }
}

// store_n of 8 values to 16-bit T through L2 policy `pol`.
template <typename T>
__device__ __forceinline__ void store8_pol(T* __restrict__ p, const float* v, bool vec, unsigned long long pol) {
  static_assert(sizeof(T) == 2, "store8_pol: 16-bit values");
  if (vec) {
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = from_f32<T>(v[e]);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w), "l"(pol)
                 : "memory");
#endif
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) p[e] = from_f32<T>(v[e]);
  }
}

// Adds map(x) for the eight 16-bit values T packed in u to acc, in order.
template <class T, class Map>
__device__ __forceinline__ void acc8(float& acc, const uint4& u, Map map) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const float2 f = to_f32x2(h[e], h[e + 1]);
    acc += map(f.x);
    acc += map(f.y);
  }
}

// Row sums of map(x) over a [ROWS, LEN] tile of 16-bit values T in shared memory (row pitch LD
// elements; LEN and LD multiples of 8, rows 16-byte aligned), read 16 bytes at a time: TPO
// lanes share a row (shuffles, no barrier) and store(r, v) gets row r's total once. Every
// thread must call it. This is `reduce` for the common case of a staged fp16/bf16 tile, without
// per-element index arithmetic.
template <int NT, int ROWS, int LEN, int LD, class T, class Map, class Store>
__device__ __forceinline__ void row_sums_vec(const T* tile, Map map, Store store) {
  static_assert(LEN % 8 == 0 && LD % 8 == 0 && sizeof(T) == 2, "16-byte rows of 16-bit values");
  constexpr int V = LEN / 8;
  constexpr int TPO = pow2_floor(cmin(cmin(NT / ROWS > 0 ? NT / ROWS : 1, 32), V));
  const int t = lin_tid();
  const int g = t / TPO, j = t % TPO;
  for (int r0 = 0; r0 < ROWS; r0 += NT / TPO) {
    const int r = r0 + g;
    float acc = 0.0f;
    if (r < ROWS) {
      const T* row = tile + r * LD;
#pragma unroll 4
      for (int c = j; c < V; c += TPO) acc8<T>(acc, *reinterpret_cast<const uint4*>(row + c * 8), map);
    }
    acc = lanes_reduce<TPO>(acc, [](float a, float b) { return a + b; });
    if (r < ROWS && j == 0) store(r, acc);
  }
}

// Reduces a [OUTER, LEN, INNER] index space over LEN by the whole block (every thread must
// call it). load(i) returns element i (row-major over [OUTER, LEN, INNER]) as float;
// store(o, v) receives output o (row-major over [OUTER, INNER]) once. IS_MAX picks max over sum.
template <int NT, int OUTER, int LEN, int INNER, bool IS_MAX, class Load, class Store>
__device__ __forceinline__ void reduce(Load load, Store store) {
  share_reduce<NT, OUTER * INNER, LEN, INNER>(
      IS_MAX ? neg_inf() : 0.0f, load, [](float a, float b) { return IS_MAX ? fmaxf(a, b) : a + b; },
      [&](int o, float v, int first, int) {
        if (first == 0) store(o, v);
      });
}

// RMS normalisation of ROWS rows of length LEN: store(i, x_i / sqrt(mean(x^2))) for every
// element i (row-major over [ROWS, LEN]); load(i) returns element i as float. Threads share
// rows as in `reduce` (every thread must call it) and each normalises its own slice.
template <int NT, int ROWS, int LEN, class Load, class Store>
__device__ __forceinline__ void rms_norm_rows(Load load, Store store) {
  share_reduce<NT, ROWS, LEN, 1>(
      0.0f,
      [&](int i) {
        const float x = load(i);
        return x * x;
      },
      [](float a, float b) { return a + b; },
      [&](int r, float ss, int first, int step) {
        const float inv = 1.0f / sqrtf(ss / (float)LEN);
        for (int l = first; l < LEN; l += step) store(r * LEN + l, load(r * LEN + l) * inv);
      });
}

// RMS normalisation of ROWS rows of LEN 16-bit values T, 16-byte vector v of row r at
// chunk(r, v) (16-byte aligned; shared or device memory), 16 bytes at a time: TPO lanes share a row
// (coalesced loads, shuffles, no barrier), each keeps its CNT vectors in registers between
// the sum of squares and the results: out(r, v, u, inv) gets vector v (elements 8v .. 8v + 7)
// of row r as loaded and 1 / the row's rms (`rsqrtf` once a row; an IEEE division an element
// had QK-norm b=1's attention kernel, which normalises V in its loop, at 19.0-19.5 µs
// against 14.4-14.6). LEN % 8 == 0. Every thread must call it.
template <int NT, int ROWS, int LEN, class T, class Chunk, class Out>
__device__ __forceinline__ void rms_rows_regs(Chunk chunk, Out out) {
  static_assert(LEN % 8 == 0 && sizeof(T) == 2, "16-byte rows of 16-bit values");
  constexpr int V = LEN / 8;
  constexpr int TPO = pow2_floor(cmin(32, V));
  constexpr int CNT = (V + TPO - 1) / TPO;
  const int t = lin_tid();
  const int g = t / TPO, j = t % TPO;
  // Up to B passes (rows r0 + p * RP + g) at once, B * CNT <= 8 vectors: every load first,
  // then the sums, then the results, so that the passes' loads, shuffles and rsqrt overlap
  // (ptxas keeps a pass's loads below the previous pass's stores, which may alias them).
  constexpr int RP = NT / TPO, B = cmin(cmax(8 / CNT, 1), (ROWS + RP - 1) / RP);
  for (int r0 = 0; r0 < ROWS; r0 += B * RP) {
    uint4 u[B][CNT];
    float ss[B];
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const int r = r0 + p * RP + g;
      ss[p] = 0.0f;
#pragma unroll
      for (int c = 0; c < CNT; ++c) {
        const int v = j + c * TPO;
        if (r < ROWS && (V % TPO == 0 || v < V)) u[p][c] = *reinterpret_cast<const uint4*>(chunk(r, v));
      }
    }
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const int r = r0 + p * RP + g;
#pragma unroll
      for (int c = 0; c < CNT; ++c) {
        const int v = j + c * TPO;
        if (r < ROWS && (V % TPO == 0 || v < V)) acc8<T>(ss[p], u[p][c], [](float x) { return x * x; });
      }
      ss[p] = lanes_reduce<TPO>(ss[p], [](float a, float b) { return a + b; });
    }
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const int r = r0 + p * RP + g;
      const float inv = rsqrtf(ss[p] / (float)LEN);
#pragma unroll
      for (int c = 0; c < CNT; ++c) {
        const int v = j + c * TPO;
        if (r < ROWS && (V % TPO == 0 || v < V)) out(r, v, u[p][c], inv);
      }
    }
  }
}

// rms_rows_regs of rows read from device memory, row r at row(r); the results go to
// store(r * LEN + l, v) one by one.
template <int NT, int ROWS, int LEN, class T, class Row, class Store>
__device__ __forceinline__ void rms_norm_rows_ld(Row row, Store store) {
  rms_rows_regs<NT, ROWS, LEN, T>([&](int r, int v) { return row(r) + v * 8; }, [&](int r, int v, const uint4& u, float inv) {
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) store(r * LEN + v * 8 + e, to_f32(h[e]) * inv);
  });
}

// rms_rows_regs from `in` (row pitch LDI) to `out` (row pitch LDO), 16-bit values T both,
// 16 bytes a store. LDI and LDO are multiples of 8; rows 16-byte aligned.
template <int NT, int ROWS, int LEN, int LDI, int LDO, class T>
__device__ __forceinline__ void rms_norm_rows_vec(const T* in, T* out) {
  static_assert(LDI % 8 == 0 && LDO % 8 == 0, "16-byte row pitches");
  rms_rows_regs<NT, ROWS, LEN, T>([&](int r, int v) { return in + r * LDI + v * 8; }, [&](int r, int v, const uint4& u, float inv) {
    uint4 o;
    const T* h = reinterpret_cast<const T*>(&u);
    T* w = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e] = from_f32<T>(to_f32(h[e]) * inv);
    *reinterpret_cast<uint4*>(out + r * LDO + v * 8) = o;
  });
}

}  // namespace mi
