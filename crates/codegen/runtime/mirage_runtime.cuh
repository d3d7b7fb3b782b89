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
// 2^x with the hardware's approximation (MUFU.EX2; 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ------------------------------------------------------- dependent launches
// First statement of every generated kernel. On sm_90 the launcher lets a kernel be scheduled
// while the previous kernel of the stream drains (programmatic dependent launch): wait until
// that grid has completed and its writes are visible, before any global load or store, then
// let the next kernel of the stream be scheduled in turn (it waits the same way). Triggering
// here rather than at the end hides the next launch best (measured: GQA b=1 10.4 -> 9.0 us per
// call, nTrans 3.2 -> 2.9); its blocks then take free SM slots early, which slows some
// programs with a small second kernel; the profiler times both effects. (A kernel streaming a
// pipelined loop lets the next one go later instead: `dep_wait`, `dep_launch`.) Without sm_90
// a no-op.
__device__ __forceinline__ void dep_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The two halves of `dep_enter` apart, for a kernel that streams its inputs through a
// pipelined loop: it waits first, and lets the next kernel be scheduled only once its last
// copies are issued (`dep_launch` in the loop), after L2 prefetches of its first stages before
// the wait. The next call's blocks then arrive while this one drains and prefetch their own
// first stages into L2 while the memory would otherwise idle. On the H200 (bench timing, saved
// winners, two rounds) RMSNorm+Linear b=1 11.4 -> 11.1 us, b=16 12.5 -> 12.0, 4096x6144 b=16
// 17.5 -> 17.3; triggering late alone gained up to 0.2 us, prefetching with the early trigger
// lost up to 1.0 (those blocks arrive at this call's start and prefetch then).
__device__ __forceinline__ void dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A hint: fetch the line holding `p` into L2 (no register or shared memory is written).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// ------------------------------------------------------------------ threads
__device__ __forceinline__ int lin_tid() {
  return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// --------------------------------------------------------------- conversion
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
// Two adjacent 16-bit values (4-byte aligned) as floats, in one conversion.
__device__ __forceinline__ float2 to_f32x2(const f16& a, const f16&) { return __half22float2(*reinterpret_cast<const __half2*>(&a)); }
__device__ __forceinline__ float2 to_f32x2(const bf16& a, const bf16&) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a)); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// ------------------------------------------------------------ tile copies
// Shared-memory index of element i (>= 0) of a tile stored with rows of INNER elements padded
// to LD. Unsigned arithmetic: a power-of-two INNER becomes a shift and a mask.
template <int INNER, int LD>
__device__ __forceinline__ int pidx(int i) {
  if constexpr (INNER == LD) {
    return i;
  } else {
    const unsigned u = static_cast<unsigned>(i);
    return static_cast<int>(u / INNER * LD + u % INNER);
  }
}

// Shared-memory index of (row, col) in a tile of INNER-element rows stored unpadded, each row's
// 16-byte chunks (CE elements) XOR-swizzled by the row. With CH = 2 or 4 chunks per row, one
// chunk of 8 consecutive rows (an ldmatrix phase) and a quarter warp's 16-byte copies into
// consecutive rows (cp.async) each land in 8 distinct groups of 4 banks; padding cannot serve
// both. With CH = 8 (128-byte rows) it is the wgmma 128-byte swizzle, c ^ (r % 8), from a
// 1024-byte aligned base. Wider rows (CH a multiple of 8) take the same pattern in each of
// their 128-byte segments: a row's copies fill whole aligned 128-byte lines (cp.async writes
// that straddle 32-byte sectors, as a 16-byte row padding makes them, run at a quarter to half
// the rate from L2) and ldmatrix's 8 rows of one chunk stay in distinct banks.
template <int INNER, int CE>
__device__ __forceinline__ int swz(int row, int col) {
  constexpr unsigned CH = INNER / CE, XW = CH < 8 ? CH : 8, RS = 8 / XW;
  static_assert(CH == 2 || CH == 4 || CH % 8 == 0, "swz: rows of 2, 4 or a multiple of 8 chunks");
  const unsigned r = static_cast<unsigned>(row), c = static_cast<unsigned>(col);
  return static_cast<int>(r * INNER + ((c / CE) ^ ((r / RS) % XW)) * CE + c % CE);
}

// Shared-memory index of element i (row-major) of such a swizzled tile.
template <int INNER, int CE>
__device__ __forceinline__ int swz(int i) {
  const unsigned u = static_cast<unsigned>(i);
  return swz<INNER, CE>(static_cast<int>(u / INNER), static_cast<int>(u % INNER));
}

// Offset of element (r, c) of a 16-bit tile with rows LD elements apart, or, with SW, unpadded
// rows whose chunks are swizzled (`swz<LD, 8>`).
template <int LD, bool SW>
__device__ __forceinline__ int tile_at(int r, int c) {
  if constexpr (SW) {
    return swz<LD, 8>(r, c);
  } else {
    return r * LD + c;
  }
}

// Shared-memory index of element i (row-major) of a [ROWS][INNER] 16-bit tile stored as column
// blocks of 64 (each [ROWS][64], `swz<64, 8>`): the layout wgmma reads a wide MN-major
// operand in, one 128-byte swizzle atom per block.
template <int INNER, int ROWS>
__device__ __forceinline__ int swzb(int i) {
  static_assert(INNER % 64 == 0, "swzb: whole 64-column blocks");
  const unsigned u = static_cast<unsigned>(i), row = u / INNER, col = u % INNER;
  return static_cast<int>((col / 64) * ROWS * 64) + swz<64, 8>(static_cast<int>(row), static_cast<int>(col % 64));
}

// Whether a device pointer is 16-byte aligned (the vector copy path needs it).
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0ull;
}

// One 16-byte global -> shared copy: asynchronous (cp.async, L1 bypassed) on sm_80+, with
// L2 prefetching the whole 128-byte line (H100: +1.7% over the bench's winners, 4-7% on the
// weight-streaming ones; 256 bytes was slower).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
// The shared-memory address of `smem` through a shuffle of the lane's own value: ptxas then
// cannot split a warp-uniform part of it into a uniform register. With that split (`LDGSTS
// [R+UR], desc[..]`) the ptxas of CUDA 13.0's NVRTC encoded an L2 policy's descriptor as an odd
// uniform register (`desc[UR1]`), and the copy stopped the kernel with an illegal instruction
// (the zoo's fp32 gated MLP, a RMSNorm+Linear candidate; docs/tuning.md).
// One shuffle a tile: its copies add constants to it (`R+imm` addresses).
__device__ __forceinline__ unsigned smem_lane(const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // (The active lanes' mask: a copy loop's last round may leave lanes out.)
  return __shfl_sync(__activemask(), (unsigned)__cvta_generic_to_shared(smem), (int)(threadIdx.x & 31));
#else
  return (unsigned)__cvta_generic_to_shared(smem);
#endif
}
// `cp_async16` to shared address `s` (`smem_lane`) with L2 cache policy `pol` (`l2_policy`).
__device__ __forceinline__ void cp_async16_pol(unsigned s, const void* gmem, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(pol)
               : "memory");
#else
  (void)pol;
  *reinterpret_cast<uint4*>(__cvta_shared_to_generic(s)) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

// One 4-byte copy (global -> shared, through L1), asynchronous as cp_async16. Both addresses
// 4-byte aligned.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<unsigned*>(smem) = *reinterpret_cast<const unsigned*>(gmem);
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
__device__ __forceinline__ float op_tanh(float x) { return tanhf(x); }
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
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }
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

// An L2 cache policy (createpolicy): lines read once go first (LAST false), lines read again
// soon go last (LAST true).
template <bool LAST>
__device__ __forceinline__ unsigned long long l2_policy() {
  unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (LAST) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  }
#endif
  return p;
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
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, bool SWA, bool SWB, class Epi>
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
  const int t = lin_tid();
  const int lane = t & 31;
  const int g = lane >> 2, q = lane & 3;

  // Accumulates k-steps [s_lo, s_hi) of task f into d[0..NF).
  auto compute = [&](int f, int s_lo, int s_hi, float (*d)[4]) {
    const int b = f / (MT * NG);
    const int mt = (f / NG) % MT, ng = f % NG;
    const T* Ab = A + b * M * LDA;
    const T* Bb = B + b * K * LDB;
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
        if constexpr (B_LDSM && NF % 2 == 0) {
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
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, bool SWB = false, bool SWA = false>
struct MmaAcc {
  static constexpr int NW = NT / 32, MT = (M + 15) / 16, N8 = N / 8, KSTEPS = K / 16;
  static constexpr int FR = BATCH * MT * N8;
  static_assert(K % 16 == 0 && N % 8 == 0 && LDB % 8 == 0 && LDA % 2 == 0, "MmaAcc tile shape");
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
            if constexpr (SWB) {
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

// CUDA-core path: a thread per output element, fp32 fused multiply-adds (SWA / SWB as
// `matmul_mma`'s).
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, bool SWA, bool SWB, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_simt(const TA* A, const TB* B, Epi epi) {
  for (int c = lin_tid(); c < BATCH * M * N; c += NT) {
    const int b = c / (M * N);
    const int m = (c / N) % M, n = c % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      acc = fmaf(to_f32(A[tile_at<LDA, SWA>(b * M + m, k)]), to_f32(B[tile_at<LDB, SWB>(b * K + k, n)]), acc);
    }
    epi(c, acc);
  }
}

// LDA / LDB: row pitch of A and B in elements (K and N when unpadded). SWA / SWB: A / B
// unpadded with their rows' chunks swizzled (`swz<LD, 8>`, 16-bit, rows of 2, 4 or a multiple
// of 8 chunks). `scratch`: NT * 16 bytes of shared memory for split-K partial sums.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, bool SWA = false, bool SWB = false, typename TA, typename TB, class Epi>
__device__ __forceinline__ void matmul_tile(const TA* A, const TB* B, float* scratch, Epi epi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (NT % 32 == 0 && same_type<TA, TB>::value && is_16bit<TA>::value) {
    matmul_mma<NT, BATCH, M, N, K, LDA, LDB, TA, SWA, SWB>(A, B, scratch, epi);
    return;
  }
#endif
  matmul_simt<NT, BATCH, M, N, K, LDA, LDB, SWA, SWB, TA, TB>(A, B, epi);
}


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

// Barrier over the block's first N threads (named barrier 1: the consumers of a warp-specialised
// block, `FlashWG::run_ws`).
template <int N>
__device__ __forceinline__ void bar_sync_n() {
  asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory");
}
// Barrier `id` (chosen at run time) over N threads: a warpgroup's turn in a warp-specialised
// block (named barriers 8 on, `FlashWG::run_ws`).
template <int N>
__device__ __forceinline__ void bar_sync_id(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(N) : "memory");
}
// Arrival (no wait) on barrier `id` of N threads: the other side of a `bar_sync_id`.
template <int N>
__device__ __forceinline__ void bar_arrive_id(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(N) : "memory");
}

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

// Thread-block clusters (sm_90): this block's rank in its cluster; a barrier of every thread
// of the cluster whose release / acquire makes shared-memory writes before it visible to the
// cluster's blocks after it; the generic address of `p`'s shared-memory location in block
// `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  return 0;
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// The same barrier without ordering memory (every thread's earlier reads are done; nothing
// it wrote needs to be visible): no fence before the arrival.
__device__ __forceinline__ void cluster_sync_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}
// This thread's arrival on the cluster barrier's current phase, releasing its writes, without
// waiting: a warp-specialised producer's, as it leaves (its copies into shared memory that
// other blocks' merges later overwrite are then ordered before them).
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
// The barrier's two halves apart, ordering nothing on arrival and acquiring on the wait: a
// summing cluster split arrives at its start and waits before its merge (every block of the
// cluster has started, so its shared memory may be written), then pushes (`cluster_push`).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned long long a;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(a) : "l"(p), "r"(rank));
  return reinterpret_cast<T*>(a);
#else
  return p;
#endif
}

// Adds the n-float tile `t` (the same shared-memory offset in every block) of each of the CS
// blocks of a thread-block cluster into the first block's: block r sums elements
// [r, r + 1) * n / CS. Call between two `cluster_sync`s (every block's tile complete before,
// none exits before every block is done reading).
template <int NT, int CS>
__device__ __forceinline__ void cluster_sum(float* t, int n) {
  const int per = (n + CS - 1) / CS, lo = (int)cluster_rank() * per, hi = min(n, lo + per);
  const float* src[CS];
#pragma unroll
  for (int r = 0; r < CS; ++r) src[r] = cluster_map(t, (unsigned)r);
  float* const dst = cluster_map(t, 0u);
  for (int i = lo + lin_tid(); i < hi; i += NT) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < CS; ++r) acc += src[r][i];
    dst[i] = acc;
  }
}

// A summing cluster split's merge, pushed (`Step::ClusterMerge`): every block but the first
// stores its n-float tile `t` into slot rank - 1 of the first block's receive area (`recv`: the
// same shared-memory offset in every block, slots `slot` floats apart), arrives on the cluster
// barrier (releasing the stores) and leaves; the first block waits there, then adds the slots
// to its own tile in rank order (`cluster_gather`: the sums of the former two-barrier merge,
// in the same order). No block reads another's shared memory, so none waits for the others to
// leave. On the H200 the two-barrier merge (each block summing a slice from every block's
// tile) took 1.5 us of RMSNorm+Linear b=16's 12.5 (globaltimer stamps).
template <int NT>
__device__ __forceinline__ void cluster_push(const float* t, float* recv, int slot, int n) {
  float* const dst = cluster_map(recv + ((int)cluster_rank() - 1) * slot, 0u);
  if (n % 4 == 0) {
    for (int i = lin_tid() * 4; i < n; i += NT * 4)
      *reinterpret_cast<float4*>(dst + i) = *reinterpret_cast<const float4*>(t + i);
  } else {
    for (int i = lin_tid(); i < n; i += NT) dst[i] = t[i];
  }
}
// The pushed merge signalled on an mbarrier instead of the cluster barrier (`Knobs::async_push`):
// every block but the first writes its tile into its slot of the first block's receive area
// with `st.async`, each store completing its bytes on the first block's mbarrier `bar` (the
// same shared-memory offset in every block), and leaves; the first block, having armed `bar`
// with the bytes of every slot (`cluster_merge_arm`), waits on it alone. The data and the
// signal travel together: no release fence, no cluster-wide barrier.
template <int NT>
__device__ __forceinline__ void cluster_push_async(const float* t, float* recv, int slot, int n, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned dst, mb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"((unsigned)__cvta_generic_to_shared(recv + ((int)cluster_rank() - 1) * slot)), "r"(0u));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mb) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(0u));
  if (n % 4 == 0) {
    for (int i = lin_tid() * 4; i < n; i += NT * 4) {
      const float4 v = *reinterpret_cast<const float4*>(t + i);
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst + 4u * i), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(mb) : "memory");
    }
  } else {
    for (int i = lin_tid(); i < n; i += NT)
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst + 4u * i), "f"(t[i]), "r"(mb) : "memory");
  }
#endif
}
// The first block's mbarrier of that merge, set up at the kernel's start by one thread before
// its arrival on the cluster barrier's first phase (which the pushes wait for).
__device__ __forceinline__ void cluster_merge_init(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\nfence.mbarrier_init.release.cluster;" ::"r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
#endif
}
// One thread of the first block arms the mbarrier with the bytes every other block sends.
__device__ __forceinline__ void cluster_merge_arm(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
#endif
}
template <int NT, int CS>
__device__ __forceinline__ void cluster_gather(float* t, const float* recv, int slot, int n) {
  if (n % 4 == 0) {
    for (int i = lin_tid() * 4; i < n; i += NT * 4) {
      float4 a = *reinterpret_cast<const float4*>(t + i);
#pragma unroll
      for (int r = 1; r < CS; ++r) {
        const float4 b = *reinterpret_cast<const float4*>(recv + (r - 1) * slot + i);
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
      }
      *reinterpret_cast<float4*>(t + i) = a;
    }
  } else {
    for (int i = lin_tid(); i < n; i += NT) {
      float a = t[i];
#pragma unroll
      for (int r = 1; r < CS; ++r) a += recv[(r - 1) * slot + i];
      t[i] = a;
    }
  }
}

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

// ------------------------------------------ warpgroup tensor cores (wgmma, sm_90a only)
// Compiled for sm_90a (codegen's nvrtc options), __CUDA_ARCH_FEAT_SM90_ALL is defined and
// FlashWG below may be instantiated; elsewhere its instantiation fails to compile.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MI_WGMMA 1
#else
#define MI_WGMMA 0
#endif

// Orders this thread's generic-proxy shared-memory writes (plain stores, cp.async) before
// later async-proxy reads (wgmma operands) once a barrier has passed.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The shared-memory descriptor of a wgmma B operand stored MN-major (N contiguous) in rows of
// 128 bytes (64 16-bit elements) with the 128-byte swizzle, chunk c of row r at c ^ (r % 8)
// (`swz<64, 8>`, 1024-byte aligned): 8-row groups along K are SBO = 1024 bytes apart; an
// operand is at most one 64-element atom wide, so LBO is never stepped (on the H100 the
// swapped reading, SBO 16 bytes, reads rows 8-15 wrong). Built from 32-bit halves so that stepping the start address (the low word) stays a 32-bit
// add: `wg_desc_sw128(lo + bytes / 16)` with lo = `wg_desc_lo(saddr)`.
__device__ __forceinline__ unsigned wg_desc_lo(unsigned saddr) { return ((saddr & 0x3FFFFu) >> 4) | (1u << 16); }
__device__ __forceinline__ unsigned long long wg_desc_sw128(unsigned lo) {
  unsigned long long d;
  asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo), "r"(64u | (1u << 30)));
  return d;
}

// wgmma.fence: registers written since (accumulators, A fragments) are ready for wgmma.
__device__ __forceinline__ void wg_fence() {
#if MI_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Closes the wgmma issued since the last commit into one group.
__device__ __forceinline__ void wg_commit() {
#if MI_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups are in flight.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if MI_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Operand lists of the wgmma wrappers: 32 (16) fp32 accumulators, then the instruction with
// A in registers, B by descriptor (transposed: MN-major), scale-d from an int.
#define MI_WG_D32(d)                                                                                    \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define MI_WG_RS(ty)                                                                                      \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"

// One wgmma of instruction string INSTR (of the element type) with accumulator operands D,
// then the A operands (registers a[0..3], or descriptor a), B descriptor b, scale-d flag acc:
// the f16 or bf16 form by T.
#define MI_WG_MMA(INSTR, D, ...)                                                     \
  if constexpr (same_type<T, f16>::value) {                                          \
    asm volatile(INSTR("f16") : D : __VA_ARGS__, "l"(b), "r"(acc));                  \
  } else {                                                                           \
    asm volatile(INSTR("bf16") : D : __VA_ARGS__, "l"(b), "r"(acc));                 \
  }
#define MI_WG_A_REGS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

// d (+)= A B for one warpgroup, m64 n64 k16: A in registers (each warp its 16 rows, the mma
// A-fragment layout), B through descriptor `b` (MN-major: transposed), d in the mma
// accumulator layout per warp. `acc` = 0 overwrites d.
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b, int acc) {
#if MI_WGMMA
  MI_WG_MMA(MI_WG_RS, MI_WG_D32(d), MI_WG_A_REGS);
#endif
}

#define MI_WG_D16(d)                                                                                    \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3])
#define MI_WG_RS32(ty)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"

// The same for m64 n32 k16 (d: 4 fragments of 8 columns).
template <typename T>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], const unsigned (&a)[4], unsigned long long b, int acc) {
#if MI_WGMMA
  MI_WG_MMA(MI_WG_RS32, MI_WG_D16(d), MI_WG_A_REGS);
#endif
}
// The same with A through a descriptor too (K-major: rows of 64 along K, `swz<64, 8>`).
#define MI_WG_SS64(ty)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;\n}\n"
#define MI_WG_SS32(ty)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 1;\n}\n"
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[8][4], unsigned long long a, unsigned long long b, int acc) {
#if MI_WGMMA
  MI_WG_MMA(MI_WG_SS64, MI_WG_D32(d), "l"(a));
#endif
}
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n32k16(float (&d)[4][4], unsigned long long a, unsigned long long b, int acc) {
#if MI_WGMMA
  MI_WG_MMA(MI_WG_SS32, MI_WG_D16(d), "l"(a));
#endif
}

// Both operands through descriptors, A MN-major and B K-major (the transposed product of
// `MmaAccWG`): m64 n16 and n32 k16, d in the accumulator layout (2 or 4 fragments of 8 columns).
#define MI_WG_D8(d) "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
#define MI_WG_TS16(ty)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n16k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 1, 0;\n}\n"
#define MI_WG_TS32(ty)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." ty "." ty " "                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 1, 0;\n}\n"
template <typename T, int NF>
__device__ __forceinline__ void wgmma_ts(float (&d)[NF][4], unsigned long long a, unsigned long long b, int acc) {
#if MI_WGMMA
  static_assert(NF == 2 || NF == 4, "wgmma_ts: n16 or n32");
  if constexpr (NF == 2) {
    MI_WG_MMA(MI_WG_TS16, MI_WG_D8(d), "l"(a));
  } else {
    MI_WG_MMA(MI_WG_TS32, MI_WG_D16(d), "l"(a));
  }
#endif
}

// Pins an accumulator's registers at this point of the program (the hardware writes them
// asynchronously until `wg_wait`; the compiler must not move their reads or writes across).
template <int NF>
__device__ __forceinline__ void wg_pin(float (&d)[NF][4]) {
#pragma unroll
  for (int j = 0; j < NF; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(d[j][k])::"memory");
}

// `MmaAcc` on the warpgroup tensor cores, transposed (`Knobs::wgmma_acc`; sm_90a): C = sum over
// iterations of A B with A [M][K] (M = 16 or 32 rows: RMSNorm+Linear and gated MLP at b = 8 and
// 16) and B [K][64] is summed as C^T = B^T A^T, so that B's 64 columns fill the wgmma's M and
// A's few rows are its N (m64 n16/n32 k16: no padding rows; `MmaAccWG` over m64 with A's rows
// as M wasted half or more of each instruction and ran RMSNorm+Linear b=16's loop 2 us slower
// on the H200). B^T is read MN-major through B's 128-byte swizzle (`swz<64, 8>`, unpadded
// rows of 64), A^T K-major through A stored as column blocks of 64 (`swzb<K, M>`), both
// 1024-byte aligned. Warpgroup g of the NT / 128 takes k-steps g, g + WG, ... of every
// iteration, issued back to back and waited for once (`issue`, `wait`; the stage is
// overwritten after the next barrier; the loop fences its copies for the async proxy before
// that barrier). Each thread keeps M / 2 sums (not `MmaAcc`'s K slices of every fragment),
// so `finish` adds WG slices of M x 64 floats, none with one warpgroup.
template <int NT, int BATCH, int M, int N, int K, int LDA, int LDB, typename T, bool SWB = false, bool SWA = false>
struct MmaAccWG {
  static_assert(MI_WGMMA, "MmaAccWG needs sm_90a (wgmma)");
  static_assert(BATCH == 1 && (M == 16 || M == 32) && N == 64 && LDB == 64 && SWB && SWA && LDA == K &&
                    K % 64 == 0 && NT % 128 == 0,
                "MmaAccWG: 16 or 32 rows in column blocks, one 64-column swizzled B, whole warpgroups");
  static constexpr int WG = NT / 128, KSTEPS = K / 16, NS = (KSTEPS + WG - 1) / WG, NF = M / 8;
  // Floats of shared scratch `finish` needs: every warpgroup but the first's M x 64 sums.
  static constexpr int SCRATCH = (WG - 1) * M * 64;
  float d[NF][4];

  __device__ __forceinline__ MmaAccWG() {
#pragma unroll
    for (int j = 0; j < NF; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
  }

  // One iteration's products issued: this warpgroup's k-steps, one wgmma group, in flight until
  // `wait` (A and B must not be overwritten before it). K-step s reads B's rows 16 s.. (2048
  // bytes each step) and A's columns 16 s..: column block s / 4 (M rows of 128 bytes), 32 bytes
  // in (the hardware applies the swizzle to the stepped address).
  __device__ __forceinline__ void issue(const T* A, const T* B) {
    const int g = lin_tid() >> 7;
    const unsigned lb = wg_desc_lo((unsigned)__cvta_generic_to_shared(B));
    const unsigned la = wg_desc_lo((unsigned)__cvta_generic_to_shared(A));
    wg_fence();
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int s = g + i * WG;
      if (KSTEPS % WG != 0 && s >= KSTEPS) break;  // the same for the whole warpgroup
      wgmma_ts<T, NF>(d, wg_desc_sw128(lb + (unsigned)s * 128u),
                      wg_desc_sw128(la + (unsigned)(s / 4) * (M * 8) + (unsigned)(s % 4) * 2u), 1);
    }
    wg_commit();
    wg_pin(d);
  }
  // Waits for the products `issue` started (the code generator waits at the end of the
  // iteration, so that the steps between run beside them: the row sums of squares of
  // RMSNorm+Linear).
  __device__ __forceinline__ void wait() {
    wg_wait<0>();
    wg_pin(d);
  }

  // After the loop: C = this block's sums (ref(c): element c = m * 64 + n of C, a float&).
  // Thread (warp w, lane) holds C^T rows (B columns) n0 = 16 w + lane / 4 and n0 + 8, columns
  // (A rows) 8 j + 2 (lane % 4) and the next. Warpgroups 1.. store theirs to `scratch`; after
  // one barrier the first adds them in order. Call from every thread; the caller orders what
  // follows.
  template <class Ref>
  __device__ __forceinline__ void finish(float* scratch, Ref ref) {
    const int t = lin_tid(), g = t >> 7, w = (t >> 5) & 3, lane = t & 31;
    const int n0 = w * 16 + (lane >> 2), n1 = n0 + 8;
    if constexpr (WG > 1) {
      if (g > 0) {
        float* const mine = scratch + (g - 1) * M * 64;
#pragma unroll
        for (int j = 0; j < NF; ++j) {
          const int m0 = j * 8 + (lane & 3) * 2;
          mine[m0 * 64 + n0] = d[j][0];
          mine[(m0 + 1) * 64 + n0] = d[j][1];
          mine[m0 * 64 + n1] = d[j][2];
          mine[(m0 + 1) * 64 + n1] = d[j][3];
        }
      }
      __syncthreads();
      if (g > 0) return;
#pragma unroll
      for (int o = 1; o < WG; ++o) {
        const float* const other = scratch + (o - 1) * M * 64;
#pragma unroll
        for (int j = 0; j < NF; ++j) {
          const int m0 = j * 8 + (lane & 3) * 2;
          d[j][0] += other[m0 * 64 + n0];
          d[j][1] += other[(m0 + 1) * 64 + n0];
          d[j][2] += other[m0 * 64 + n1];
          d[j][3] += other[(m0 + 1) * 64 + n1];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      const int m0 = j * 8 + (lane & 3) * 2;
      ref(m0 * 64 + n0) = d[j][0];
      ref((m0 + 1) * 64 + n0) = d[j][1];
      ref(m0 * 64 + n1) = d[j][2];
      ref((m0 + 1) * 64 + n1) = d[j][3];
    }
  }
};

// ------------------------------------------------------ warp specialisation
// A block of NT consumer threads and one producer warpgroup after them (`FlashWG::run_ws`):
// the producer fills pipeline stages with cp.async and marks each full on an mbarrier (one
// arrival a producer thread, when its copies have landed); the consumers mark a stage empty
// (one arrival a consumer warp) once their tensor-core reads of it are done. No block-wide
// barrier in the loop: each warpgroup runs at its own pace. Named barrier 1 syncs the
// consumers alone (the producer leaves after its loop).
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count) : "memory");
#endif
}
// Waits until the phase of parity `parity` of mbarrier `b` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nMI_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MI_WAIT_%=;\n}\n" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(parity) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
#endif
}
// An arrival on `b` once every cp.async this thread issued so far has landed (counted in the
// barrier's expected arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned long long* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
#endif
}
// This warpgroup's register budget raised (consumers) or lowered (producer) to R (sm_90a).
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#if MI_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#if MI_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
#endif
}

// Register-resident attention on warpgroup tensor cores (sm_90a), the same contract as
// `Flash` for N = 64, 128 or 256 keys per iteration of 64-wide values, with one block of
// lookahead. K ([BATCH][D][N]) sits in shared memory as `swzb<N, BATCH * D>`: column blocks
// of 64 keys, each [BATCH * D][64] in 128-byte rows swizzled as the hardware's 128-byte
// pattern from a 1024-byte aligned base; V ([BATCH][N][64]) as `swz<64, 8>`; Q as in
// `Flash`. Warpgroup w of batch item b takes RG groups of 64 rows (group (w % WR) * RG + r)
// and key slice w / WR (N / KS keys). The slice's keys go in blocks of 64 (or one of 32): each
// step issues the next block's S = Q K (D / 16 wgmma per group, Q from registers; after the
// last block, the next iteration's first) before this block's online softmax (`FlashRows`),
// so the tensor cores work while the exponentials run, then O += P V (wgmma, P from registers).
// With QSS, Q ([BATCH * M][64], K's type) sits as `swz<64, 8>` too and S = Q K takes both
// operands through descriptors; then within a step each block's P V runs on while the next
// block's softmax does (see `step`).
//
// With ILV (only `run_ws`), the KS slices are whole stages instead of keys within each: the
// warpgroup of slice k takes stages k, k + KS, ... (all N keys of each), so each works as the
// one of a KS = 1 block would; `finish` merges them as key slices.
template <int NT, int BATCH, int M, int D, int N, int LDQ, int RG, int KS, typename T, typename TQ, bool QSS = false,
          bool XMAX = true, bool ILV = false>
struct FlashWG {
#if defined(__CUDA_ARCH__)
  static_assert(MI_WGMMA, "FlashWG needs sm_90a (wgmma)");
#endif
  static constexpr int NWG = NT / 128 / BATCH, KQ = D / 16, WR = M / 64 / RG;
  static constexpr int NK = ILV ? N : N / KS;        // keys per slice (of a stage)
  static constexpr int KOFS = ILV ? 0 : NK;          // a slice's first key in a stage: slice * KOFS
  static constexpr int NKB = NK < 64 ? NK : 64;      // keys per block
  static constexpr int NB = NK / NKB, NFC = NKB / 8;  // blocks per slice, S fragments per block
  static_assert((NT / 128) % BATCH == 0 && M % (64 * RG) == 0 && NWG == WR * KS && D % 16 == 0 &&
                    N % 64 == 0 && N <= 256 && (NKB == 64 || NKB == 32),
                "flash (wgmma) tile shape");
  static_assert(!QSS || (D == 64 && same_type<TQ, T>::value), "flash (wgmma): Q by descriptor needs 64-wide rows of K's type");
  FlashRows<RG, 8, XMAX> st;
  float s[RG][NFC][4];  // S of the current block (issued one block ahead)
  int lane, bt, row0, slice;  // row0: this warp's first row of its first group
  const TQ* qp;  // this batch item's Q (set at the first step; Q is loop-invariant)
  unsigned qa;   // 16-bit Q: this lane's ldmatrix address of its first fragment
  bool qscaled;  // `st`'s rows carry Q's factors in their exponents (`q_scales`)

  // The warp's warpgroup, batch item, slice and rows are broadcast from its first lane, so
  // that ptxas sees them warp-uniform: the descriptors, stage indices and barrier addresses
  // derived from them then stay in uniform registers (sm_90: the wgmma descriptors without a
  // `R2UR` each; the bench's GQA b=8 winner went 7520 -> 6936 instructions, its 12/52 bytes of
  // spills to none; docs/tuning.md).
  __device__ __forceinline__ void init() {
    const int t = lin_tid(), g = __shfl_sync(0xffffffffu, t >> 5, 0), w = (g >> 2) % NWG;
    bt = (g >> 2) / NWG;
    lane = t & 31;
    slice = w / WR;
    row0 = (w % WR) * RG * 64 + (g & 3) * 16;
    qscaled = false;
    st.reset();
  }

  // `run_ws`'s QN: the exponent scales of this thread's rows (`FlashRows::qs`) from the raw
  // Q rows (`swz<64, 8>`, rows of 64, at `qp`): lane quad position qd sums the squares of
  // chunks 2 qd and 2 qd + 1 of rows g and g + 8 in fp32, the quad's partials meet by
  // shuffles, and the factor is 1 / rms as the norm's (`rms_rows_regs`). S = Q K of the raw
  // rows times the factor in the exponent is the normalised rows' S, with no rounding of the
  // normalised Q to T; Q goes to shared memory as copied, and the first S does not wait for
  // a norm.
  __device__ __forceinline__ void q_scales() {
    static_assert(QSS && RG == 1 && D == 64 && !XMAX, "q_scales: Q by descriptor, one row group, rows of 64, no true max");
    const int g = lane >> 2, qd = lane & 3;
    const unsigned q0 = (unsigned)__cvta_generic_to_shared(qp);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + g + 8 * h;
      float ss = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c) acc8<T>(ss, lds16(q0 + r * 128 + (((2 * qd + c) ^ (r & 7)) << 4)), [](float x) { return x * x; });
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      ss += __shfl_xor_sync(0xffffffffu, ss, 2);
      st.qs[0][h] = FlashRows<RG, 8, XMAX>::L2E * rsqrtf(ss * (1.0f / (float)D));
    }
    qscaled = true;
  }

  // S = Q K over block j of this slice's keys for every group into `acc`, issued as one wgmma
  // group (not waited for).
  __device__ __forceinline__ void qk(const T* K, int j, float (&acc)[RG][NFC][4]) {
    const int key0 = slice * KOFS + j * NKB;
    const unsigned kd = wg_desc_lo((unsigned)__cvta_generic_to_shared(K) +
                                   ((key0 / 64) * BATCH * D + bt * D) * 128 + (key0 % 64) * 2);
    if constexpr (QSS) {
      // Q by descriptor: this warpgroup's 64 rows of group r start at row row0 - its warp's
      // 16; each k-step of 16 is 32 bytes further along the swizzled 128-byte rows.
      const unsigned ql = wg_desc_lo((unsigned)__cvta_generic_to_shared(qp) + (row0 & ~63) * 128);
      wg_fence();
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
          const unsigned long long qd = wg_desc_sw128(ql + r * 64 * 8 + kk * 2), bd = wg_desc_sw128(kd + kk * 128);
          if constexpr (NKB == 64) {
            wgmma_ss_m64n64k16<T>(acc[r], qd, bd, kk);
          } else {
            wgmma_ss_m64n32k16<T>(acc[r], qd, bd, kk);
          }
        }
      wg_commit();
      return;
    }
    // Q's fragments are read again for every use (a few ldmatrix): ptxas (CUDA 13.0) reuses
    // the registers of wgmma A operands that are only carried around the loop, so fragments
    // loaded once read back clobbered.
    unsigned q[RG][KQ][4];
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      if constexpr (same_type<TQ, T>::value) {
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) ldsm_x4_at(q[r][kk], qa + (r * 64 * LDQ + kk * 16) * 2);
      } else {
        flash_load_q<KQ, LDQ, T, TQ>(q[r], qp, row0 + r * 64, lane);
      }
    }
    // Block j's keys (`kd` above): column block key0 / 64 of K, starting (key0 % 64) * 2
    // bytes into its swizzled rows (the swizzle applies to the address, so a sub-row start
    // reads the same layout); each 16 rows are 2048 bytes further (128 in the descriptor's
    // address field).
    wg_fence();
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        if constexpr (NKB == 64) {
          wgmma_m64n64k16<T>(acc[r], q[r][kk], wg_desc_sw128(kd + kk * 128), kk);
        } else {
          wgmma_m64n32k16<T>(acc[r], q[r][kk], wg_desc_sw128(kd + kk * 128), kk);
        }
      }
    wg_commit();
  }

  // The first step: this batch item's Q (loop-invariant) and S of the first block, waited for.
  __device__ __forceinline__ void begin(const TQ* Q, const T* K) {
    qp = Q + bt * M * LDQ;
    qa = (unsigned)__cvta_generic_to_shared(qp + (row0 + (lane & 15)) * LDQ + (lane >> 4) * 8);
    qk(K, 0, s);
    wg_wait<0>();
#pragma unroll
    for (int r = 0; r < RG; ++r) wg_pin(s[r]);
  }

  // The next block's S (retired) becomes the current one: row group r.
  __device__ __forceinline__ void take(float (&sn)[RG][NFC][4], int r) {
    wg_pin(sn[r]);
#pragma unroll
    for (int f = 0; f < NFC; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[r][f][e] = sn[r][f][e];
  }

  // O += P V over block j of this slice's keys, issued as one wgmma group (not waited for).
  __device__ __forceinline__ void pv(const unsigned (&p)[RG][NFC / 2][4], const T* V, int j) {
    const unsigned vd = wg_desc_lo((unsigned)__cvta_generic_to_shared(V) + (bt * N + slice * KOFS + j * NKB) * 128);
    wg_fence();
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int kk = 0; kk < NFC / 2; ++kk) wgmma_m64n64k16<T>(st.o[r], p[r][kk], wg_desc_sw128(vd + kk * 128), 1);
    wg_commit();
  }

  // One iteration over K and V. With AHEAD, `Kn` is the next iteration's K tile, which must
  // already be in shared memory (at the last iteration any K-shaped tile: that S is never
  // used, and issuing it anyway keeps every wgmma group unconditional: GQA b=8 in the H100
  // bench 27.0 -> 24.2 µs against a run-time `Kn != nullptr` test). `first` (every step
  // without AHEAD) computes the first block's S here.
  // `between(j)` runs after block j's P V is issued, beside it (the tensor cores busy): work
  // of the loop's own for the next iteration (QK-norm's next V stage, normalised a part a block).
  //
  // Skewed warpgroups (AHEAD, one block a step, an even number of warpgroups): the odd
  // warpgroups run half a step behind the even ones, so one's exponentials run while the
  // other's wgmma do instead of both at once. Every warpgroup issues P V and the next S
  // together after its softmax; an odd one keeps its P (`ph`) across the block barrier
  // that starts each iteration and does the next block's softmax after its wgmma, so it
  // reaches that barrier having done the exponentials the even ones do after it. The tiles
  // each warpgroup reads between two barriers are the same as without the skew (V of this
  // iteration, K of the next). `last`: no softmax after the last iteration's wgmma.
  static constexpr bool SKEW = NB == 1 && NWG % 2 == 0;
  unsigned ph[RG][NFC / 2][4];  // an odd warpgroup's P of the current block (SKEW)

  template <bool AHEAD, class F = NoOp>
  __device__ __forceinline__ void step(const TQ* Q, const T* K, const T* V, const T* Kn, bool first, bool last,
                                       F between = F()) {
    if constexpr (AHEAD && SKEW) {
      // No P V is in flight during a softmax here: nothing to wait for before a rescale.
      const bool lag = ((lin_tid() >> 7) % NWG) & 1;
      if (first) {
        begin(Q, K);
        if (lag) st.template softmax<NFC, T>(s, ph);
      }
      if (!lag) st.template softmax<NFC, T>(s, ph);
      // P is a wgmma A operand that an odd warpgroup carries around the loop: kept live here
      // (see `qk` on ptxas reusing such registers).
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int kk = 0; kk < NFC / 2; ++kk)
          asm volatile("" : "+r"(ph[r][kk][0]), "+r"(ph[r][kk][1]), "+r"(ph[r][kk][2]), "+r"(ph[r][kk][3])::"memory");
      pv(ph, V, 0);
      float sn[RG][NFC][4];
      qk(Kn, 0, sn);
      between(0);
      wg_wait<0>();
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        wg_pin(st.o[r]);
        take(sn, r);
      }
      if (lag && !last) st.template softmax<NFC, T>(s, ph);
      return;
    }
    if (first) begin(Q, K);
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const bool more = j + 1 < NB || AHEAD;
      float sn[RG][NFC][4];
      if (j + 1 < NB) {
        qk(K, j + 1, sn);
      } else if constexpr (AHEAD) {
        qk(Kn, 0, sn);
      }
      unsigned pa[RG][NFC / 2][4];
      if constexpr (QSS) {
        // The previous block's P V may still be accumulating into O here, so the softmax's
        // rare O rescale waits until after it, where the whole warpgroup waits for that P V
        // (in flight: it and, when another block follows, the next S, committed after it).
        // (A wait inside the rescale's branch, which each warp decides, is a `.sync.aligned`
        // wgmma wait not every warp reaches: compute-sanitizer's synccheck reported it.)
        st.template softmax<NFC, T, true>(s, pa);
        if (j > 0) {
          if (more) {
            wg_wait<1>();
          } else {
            wg_wait<0>();
          }
#pragma unroll
          for (int r = 0; r < RG; ++r) wg_pin(st.o[r]);
        }
        st.rescale_deferred();
      } else {
        st.template softmax<NFC, T>(s, pa);
      }
      pv(pa, V, j);
      between(j);
      // With QSS, a block followed by another of this step retires only the next S (committed
      // before this P V), so P V runs on beside the next softmax. (With Q's fragments loaded
      // into registers for S, ptxas serialises every wgmma instead.) The step's last block
      // waits for both: the next iteration's loads reuse this stage's buffers.
      const bool overlap = QSS && j + 1 < NB;
      if (overlap) {
        wg_wait<1>();
      } else {
        wg_wait<0>();
      }
#pragma unroll
      for (int r = 0; r < RG; ++r) {
        if (!overlap) wg_pin(st.o[r]);
        if (more) take(sn, r);
      }
    }
  }

  // The 1 / rms of each of the NK V rows (keys) of stage `V` (`swz<64, 8>` rows of 64),
  // rounded to T, into `r` where the thread of P's key column owns it: key t = 8 j + 2 q + h
  // (fragment j, lane quad position q, half h) at half (NF q + j) * 2 + h (NF = NK / 8
  // fragments), so that a lane reads its fragments' pairs as 16-byte words. A row is one
  // thread's (128 keys) or two threads' (64 keys: half the chunks each, a shuffle). The row's
  // chunks are read in the swizzled order (chunk c ^ (t % 8) at c: conflict-free, and the sum
  // does not mind the order), each at the row's 1024-aligned stage address XOR its offset: one
  // LOP3 a load (through `swz` the loop was about 100 instructions a step longer with its
  // spills; QK-norm b=8 on the H100 20.4-20.8 us against 20.9-21.6).
  //
  // fp16 rows are summed in packed fp16 (a multiply-add a pair of squares: 16 `HFMA2` a
  // thread of a 64-key step where the fp32 sum takes 32 conversions and 32 `FFMA`), each lane
  // of the four half2 sums over CH squares, then a tree of three packed adds: at most CH + 2
  // roundings of 2^-11 on the way to a sum (under 3e-3 relative with 64-key steps, 5e-3 with
  // 128, the factor half that), against the output's own 16-bit rounding of 2^-11; the error
  // against float64 in the bench moved 4.7e-4 -> 4.8e-4. A thread's sum outside
  // [2^-4, 30000) (a square or a partial sum overflowed, or squares small enough to lose bits
  // as subnormals matter) is redone exactly in fp32 (`v_sq_exact`), as is every bf16 row.
  // QK-norm b=8 on the H200 (saved winner, bench timing, three rounds, one call): 18.17-18.47
  // -> 17.84-18.11 us, b=16 29.6-31.0 -> 29.3-29.9; the two-warpgroup form (128-key steps)
  // 18.82-19.07 -> 18.70-18.94.
  // 16 bytes of shared memory at 32-bit shared address `s` (`v_factor`'s chunk loads).
  static __device__ __forceinline__ uint4 lds16(unsigned s) {
    uint4 u;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "r"(s));
    return u;
  }
  __device__ __forceinline__ float v_sq_exact(unsigned b, int part) const {
    constexpr int CH = 8 / (128 / NK);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int c = 0; c < CH; ++c) {
      const uint4 u = lds16(b ^ ((part * CH + c) << 4));
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e % 4] = fmaf(to_f32(h[e]), to_f32(h[e]), d[e % 4]);
    }
    return d[0] + d[1] + d[2] + d[3];
  }
  __device__ __forceinline__ void v_factor(const T* V, T* r) {
    static_assert(NK == 128 || NK == 64, "v_factor: 64- or 128-key steps");
    constexpr int TPR = 128 / NK, CH = 8 / TPR;  // threads a row, chunks a thread
    const int i = lin_tid() & 127, t = i / TPR, part = i % TPR;
    const unsigned b = ((unsigned)__cvta_generic_to_shared(V) + t * 128) | ((t & 7) << 4);
    float sum;
    if constexpr (same_type<T, f16>::value) {
      // Four chunks' loads in flight at a time (a 128-key step's eight at once spilled in the
      // two-warpgroup form's 240 registers).
      constexpr int CB = CH < 4 ? CH : 4;
      __half2 a[4];
#pragma unroll
      for (int c0 = 0; c0 < CH; c0 += CB) {
        uint4 u[CB];
#pragma unroll
        for (int c = 0; c < CB; ++c) u[c] = lds16(b ^ ((part * CH + c0 + c) << 4));
#pragma unroll
        for (int c = 0; c < CB; ++c) {
          const __half2* h = reinterpret_cast<const __half2*>(&u[c]);
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = c0 + c == 0 ? __hmul2(h[e], h[e]) : __hfma2(h[e], h[e], a[e]);
        }
      }
      const float2 s2 = __half22float2(__hadd2(__hadd2(a[0], a[1]), __hadd2(a[2], a[3])));
      sum = s2.x + s2.y;
      if (!(sum >= 0.0625f && sum < 30000.0f)) sum = v_sq_exact(b, part);
    } else {
      sum = v_sq_exact(b, part);
    }
    if constexpr (TPR == 2) sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    constexpr int NFK = NK / 8;
    if (part == 0) r[(NFK * ((t & 7) >> 1) + (t >> 3)) * 2 + (t & 1)] = from_f32<T>(rsqrtf(sum * (1.0f / 64.0f)));
  }

  // The whole loop of `iters` iterations, warp-specialised (see `mbar_init`): stage u % STAGES
  // of K and V (`kel`, `vel` elements apart) is full once `full[u % STAGES]` completes its
  // phase (u / STAGES) % 2 (the producer's arrivals are its copies landing; each consumer
  // then fences its view for the tensor cores), and is released on `empty` (one arrival a
  // warp, a thread with VN) once this
  // warpgroup's P V over it has retired. One step a stage: the softmax covers all the
  // stage's keys at once (NB * NFC fragments, twice the independent exponentials of a
  // 64-key block), then the next stage's S and this stage's P V are issued together, and
  // only S is waited for, so P V runs on beside the next softmax (P in two alternating
  // buffers); the rare O rescale a softmax decides waits until after it, where the whole
  // warpgroup waits for that P V. MQA b=16 (128-row blocks) on the H100: 47.2 -> 38.8 us
  // (bench table) against the same form with a block barrier and cp.async by all threads an
  // iteration. With ILV (KS warpgroups over 64 rows each), this warpgroup's stages are
  // slice, slice + KS, ... (its `mine` of them; the others' pass by), each released by its
  // four warps (one arrival a warp; with VN one a thread).
  //
  // With VN, V's rows are normalised (QK-norm): P V over normalised rows is P with each key's
  // column scaled by its row's 1 / rms times V, so the stage's V is read, not rewritten. Each
  // step, beside its softmax (128-key steps) or a step ahead beside the previous step's wgmma
  // (64-key steps, `FAHEAD`), every thread of the warpgroup computes the factor of one of the
  // stage's keys (`v_factor`) into `rs` (the warpgroup's two slots of NK 16-bit factors, in
  // alternation); after the warpgroup's turn (a barrier of its four warps, see below) P's
  // fragments are scaled by them before its P V: the row sums stay those of unscaled P.
  // A step ahead against beside the softmax, on the H200 (bench timing, the saved winner,
  // three rounds): QK-norm b=8, three warpgroups of 64-key steps, 18.47-18.54 -> 18.17-18.30
  // us; two of 128-key steps 18.82-19.05 -> 19.12-19.16 (so those keep the factors beside the
  // softmax). The alternatives, on the H100:
  // QK-norm b=8 (64-row interleaved form, saved graph): 20.4 us against 16.8 for
  // the same form without norms (a step is issue-latency bound, about 9.4 cycles a warp
  // instruction under ncu, and the norm adds about 45% to the instructions); computing the
  // next stage's factors after its S instead: 21.4 (without the factor loads 18.4, without
  // the barrier and scaling 19.5). Rewriting V in place by a producer that waits
  // for each stage's copies kept two stages in flight (30 us). Three warpgroups (18.9-19.5 us
  // here) against factors off the consumers (docs/tuning.md): by the
  // producer a few stages behind its copies 23.0-23.9; by two factor warps beside two copying
  // ones 22.3-22.7 (17.7 without their sums: a warp's chain over a stage outlasts a step); as
  // the diagonal of V V^T by the producer's wgmma 28.3-29.2; here in packed fp16 partial sums
  // with an exact fallback 20.2-20.4. The factors are read after the turn rather than after
  // a barrier of their own: 18.8-19.0 against 18.9-19.6 (b=16 30.0-30.4 against 30.0-30.1).
  //
  // With SPLITV the producer marks each stage's K full on `full` and its V on `vfull` (each
  // once its own copies landed): a step's S starts before V has landed, and the step waits
  // for V only before its P V.
  //
  // With QN, Q's rows are normalised (QK-norm) by the softmax: Q sits in shared memory as
  // copied, and each row's factor scales its exponent (`q_scales`, `FlashRows::qs`), so the
  // loop starts without a pass over Q between its copy and the first S.
  //
  // With ILV and KS = 3 (three warpgroups of 64-key steps) S, P and O fit 160 registers a
  // thread where two warpgroups of 128-key steps take 240.
  //
  // The warpgroups issue their steps' wgmma (the next S, this P V) in turns (ping-pong, as
  // FlashAttention-3): a warpgroup waits for its turn on named barrier PP_BAR + its index,
  // which the previous turn's warpgroup arrives on once its own are issued, so that one's
  // softmax runs while the other's matrix products do rather than all at once. On the H100
  // (bench timing, saved winners): MQA b=8 24.6-24.8 -> 23.1-23.4 us, GQA b=16 24.4-24.6 ->
  // 23.6-24.0, MQA b=16 40.6-40.9 -> 40.1-40.4, GQA b=8 15.4-15.7 -> 15.1-15.4, QK-norm b=8
  // (three warpgroups) 19.2-19.5 -> 19.0-19.1.
  static constexpr int PP_BAR = 8;
  template <int STAGES, bool VN = false, bool SPLITV = false, bool QN = false>
  __device__ __forceinline__ void run_ws(const TQ* Q, const T* Kst, const T* Vst, int kel, int vel,
                                         unsigned long long* full, unsigned long long* empty, int iters,
                                         T* rs = nullptr, unsigned long long* vfull = nullptr) {
    static_assert(QSS && (KS == 1 || ILV) && RG == 1 && BATCH == 1, "run_ws: one row group, slices by stage");
    static_assert(!VN || NK == 128 || NK == 64, "run_ws: V factors of 64- or 128-key steps");
    static_assert(!(VN && SPLITV), "run_ws: V marked full apart only without V factors");
    static_assert(!VN || NWG > 1, "run_ws: V factors behind the warpgroups' turns (ping-pong)");
    constexpr int NF = NB * NFC;
    typedef float SH[RG][NFC][4];
    typedef unsigned PH[RG][NFC / 2][4];
    // One batch item and, within a stage, one key slice: constants here, so that every
    // descriptor is the stage's base plus a constant (with `init`'s run-time values, MQA b=16
    // took 46 us). With ILV `slice` only picks the stages (and the merge in `finish`).
    bt = 0;
    if constexpr (!ILV) slice = 0;
    qp = Q;
    // Stage of this warpgroup's k-th step.
    auto at = [&](const int k) { return ILV ? slice + k * KS : k; };
    const int mine = ILV ? (iters - slice + KS - 1) / KS : iters;
    // This warpgroup's factor slots and turn barrier (named barrier PP_BAR + its index).
    const int wg = __shfl_sync(0xffffffffu, (lin_tid() >> 7) % NWG, 0);
    // Turns of the warpgroups at their wgmma (see above): in stage order (ILV) or step by
    // step round the warpgroups, from warpgroup 0's, which the last warpgroup lets go first
    // (also when it has no stage itself); `turns` in all.
    constexpr bool PP = NWG > 1;
    const int turns = ILV ? iters : iters * NWG;
    if (PP && wg == NWG - 1 && turns > 0) bar_arrive_id<256>(PP_BAR);
    if (mine <= 0) return;
    float sc[RG][NF][4];
    unsigned pa[RG][NF / 2][4], pb[RG][NF / 2][4];
    mbar_wait(full + at(0) % STAGES, (at(0) / STAGES) & 1);
    fence_proxy_async();
#pragma unroll
    for (int j = 0; j < NB; ++j)
      qk(Kst + (at(0) % STAGES) * kel, j, reinterpret_cast<SH&>(sc[0][j * NFC]));
    // With QN, Q is the raw rows: their factors beside the first S.
    if constexpr (QN) q_scales();
    T* const rw = VN ? rs + wg * 2 * NK : nullptr;
    // With 64-key steps (FAHEAD), each stage's factors are computed a step ahead, beside the
    // previous step's wgmma; the first stage's here, beside its S.
    constexpr bool FAHEAD = VN && NK == 64;
    if constexpr (FAHEAD) v_factor(Vst + (at(0) % STAGES) * vel, rw);
    wg_wait<0>();
    wg_pin(sc[0]);
    // Step k: `more` (a next stage) and `first` are constants where it is inlined, so that
    // every wgmma group is unconditional (ptxas serialises the wgmma of a pipeline with
    // conditional ones).
    auto stage = [&](const int k, const bool more, const bool first, unsigned (&p)[RG][NF / 2][4]) {
      const int u = at(k), un = at(k + 1), cur = u % STAGES, nxt = un % STAGES;
      // P V of the previous stage ran beside this softmax; it has retired by now (issued a
      // softmax ago), so the wait is short and the whole warpgroup's; then the O rescale the
      // softmax may have deferred.
      // With VN and 128-key steps, this stage's factors beside the softmax (independent of
      // it: the compiler interleaves them), into slot k % 2.
      if constexpr (VN && !FAHEAD) v_factor(Vst + cur * vel, rw + (k & 1) * NK);
      st.template softmax<NF, T, true, QN>(sc, p);
      wg_wait<0>();
      wg_pin(st.o[0]);
      st.rescale_deferred();
      // The previous stage's P V has retired: its stage is free. With VN every thread arrives
      // (the factors read V with ordinary loads, and each thread's arrival releases its own
      // reads to the producer's next copy into the stage); else one thread a warp, the
      // tensor cores' reads of the warp retired at its wait above.
      if (!first) {
        __syncwarp();
        if (VN || lane == 0) mbar_arrive(empty + at(k - 1) % STAGES);
      }
      const int turn = ILV ? u : k * NWG + wg;
      if (more) {
        mbar_wait(full + nxt, (un / STAGES) & 1);
        fence_proxy_async();
      }
      // This warpgroup's turn: the previous turn's wgmma are issued.
      if (PP) bar_sync_id<256>(PP_BAR + wg);
      unsigned w[VN ? NF : 1];
      if constexpr (VN) {
        // Every factor of this stage is in: the warpgroup's four warps have all waited at its
        // turn since writing theirs (the turn is their barrier, as the next turn orders these
        // reads before the next-but-one step's writes into this slot).
        const uint4* const f = reinterpret_cast<const uint4*>(rw + (k & 1) * NK) + (lane & 3) * (NF / 4);
#pragma unroll
        for (int i = 0; i < NF / 4; ++i) {
          const uint4 x = f[i];
          w[4 * i] = x.x;
          w[4 * i + 1] = x.y;
          w[4 * i + 2] = x.z;
          w[4 * i + 3] = x.w;
        }
      }
      if (more) {
#pragma unroll
        for (int j = 0; j < NB; ++j) qk(Kst + nxt * kel, j, reinterpret_cast<SH&>(sc[0][j * NFC]));
      }
      if constexpr (VN) {
        // Word e of P's pair jj holds fragment 2 jj + e / 2 (rows g and g + 8 alike).
#pragma unroll
        for (int jj = 0; jj < NF / 2; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e) p[0][jj][e] = mul_x2<T>(p[0][jj][e], w[2 * jj + e / 2]);
      }
      if constexpr (SPLITV) {
        // This stage's V, marked full apart from its K (which `full` covered).
        mbar_wait(vfull + cur, (u / STAGES) & 1);
        fence_proxy_async();
      }
#pragma unroll
      for (int j = 0; j < NB; ++j) pv(reinterpret_cast<PH&>(p[0][j * (NFC / 2)]), Vst + cur * vel, j);
      if (PP && turn + 1 < turns) bar_arrive_id<256>(PP_BAR + (wg + 1) % NWG);
      // FAHEAD: the next stage's factors (its V landed with its K, waited for above) while this
      // step's wgmma run, into slot (k + 1) % 2, whose last reader (step k - 1, after its turn)
      // all four warps passed this step's turn since.
      if constexpr (FAHEAD) {
        if (more) v_factor(Vst + nxt * vel, rw + ((k + 1) & 1) * NK);
      }
      if (more) {
        wg_wait<NB>();
        wg_pin(sc[0]);
      } else {
        wg_wait<0>();
        wg_pin(st.o[0]);
      }
    };
    if (mine == 1) {
      stage(0, false, true, pa);
      return;
    }
    stage(0, true, true, pa);
    if (mine == 2) {
      stage(1, false, false, pb);
      return;
    }
    stage(1, true, false, pb);
    int k = 2;
#pragma unroll 1
    for (; k < mine - 2; k += 2) {
      stage(k, true, false, pa);
      stage(k + 1, true, false, pb);
    }
    if (k == mine - 2) {
      stage(k, true, false, pa);
      stage(k + 1, false, false, pb);
    } else {
      stage(k, false, false, pa);
    }
  }

  // Floats of `scratch` that `finish<CS>` takes (0: none is read): the key slices' slots.
  template <int CS>
  __host__ __device__ static constexpr int scratch_floats() {
    return (KS - 1) * BATCH * WR * FlashRows<RG, 8>::template SLOT_FLOATS<128>;
  }
  // Floats of `remote` that `finish<CS>` takes: the other blocks' slots of a cluster split.
  template <int CS>
  __host__ __device__ static constexpr int remote_floats() {
    return (CS - 1) * BATCH * WR * FlashRows<RG, 8>::template SLOT_FLOATS<128>;
  }

  // After the loop, as `Flash::finish`. The key slices merge in registers
  // (`FlashRows::merge_slices` over warpgroups through `scratch`, which overlaps the loop's
  // tiles: slot (k - 1) of its rows for slice k > 0).
  // With CS > 1 the block is one of a thread-block cluster of CS that split the loop: the
  // slice-0 warpgroups of block rank > 0 save their merged partials straight into the first
  // block's `remote` area (distributed shared memory, slot rank - 1), and that block alone
  // merges them and writes O, L and X. One slot per (slice or rank, batch item, row group):
  // see `scratch_floats` and `remote_floats`. Where it fits without costing the loop a
  // pipeline stage, `remote` is shared memory that nothing else writes; else it follows the
  // slices' slots over the loop's tiles. A remote store into bytes that the owner's cp.async
  // wrote is ordered through the owner's own waits for its copies and the cluster barrier
  // (release, then acquire), which compute-sanitizer's racecheck does not credit: it reports
  // every such byte (benches/gpu/racecheck_cluster_cp_async.cu shows it in miniature). The
  // cluster barrier before the saves makes sure every block of the cluster has left its loop
  // and started (its shared memory may then be written); the one after them publishes the
  // saves to their readers.
  // With WS (after `run_ws`) the slices' barriers are the consumers' own (named barrier 1):
  // the producer warpgroup has left.
  // With HALVES (a cluster of two over one group of 64 rows), each block finishes half the
  // rows instead: the slice-0 warps of rows 32 h to 32 h + 31 (h = row0 / 32) save into block
  // h's remote area when h is the other block, and merge there; O, L and X get block h's rows
  // only (the caller's later steps take that half too). Half the bytes cross each way at once,
  // and both blocks' epilogues run.
  template <int CS = 1, bool WS = false, bool HALVES = false>
  __device__ __forceinline__ void finish(float* scratch, float* O, float* L, float* X, float* remote = nullptr) {
    static_assert(!HALVES || (CS == 2 && M == 64 && RG == 1 && BATCH == 1), "finish: halves of one group of 64 rows in a pair");
    if (qscaled) st.unscale();
    st.settle();
    constexpr int GROUPS = BATCH * WR;
    [[maybe_unused]] const int tw = lin_tid() & 127, grp = bt * WR + ((lin_tid() >> 7) % NWG) % WR;
    if constexpr (KS > 1) st.template merge_slices<128, KS, GROUPS, WS ? NT : 0>(scratch, slice, grp, tw, true, [] {});
    bool mine = slice == 0;
    if constexpr (CS > 1) {
      cluster_sync_relaxed();
      const unsigned rank = cluster_rank();
      constexpr int SLOT = FlashRows<RG, 8>::template SLOT_FLOATS<128>;
      if constexpr (HALVES) {
        const unsigned h = (unsigned)row0 >> 5;
        if (h != rank && slice == 0) st.template save<128>(cluster_map(remote, h) + grp * SLOT, tw);
        cluster_sync();
        if (h == rank && slice == 0) st.template merge<128>(remote + grp * SLOT, tw);
        mine = mine && h == rank;
      } else {
        if (rank > 0 && slice == 0) st.template save<128>(cluster_map(remote, 0u) + (((int)rank - 1) * GROUPS + grp) * SLOT, tw);
        cluster_sync();
        if (rank == 0 && slice == 0) {
#pragma unroll 1
          for (int r = 1; r < CS; ++r) st.template merge<128>(remote + ((r - 1) * GROUPS + grp) * SLOT, tw);
        }
        mine = mine && rank == 0;
      }
    }
    if (mine) st.store(O, L, X, lane, [&](int r) { return bt * M + row0 + r * 64; });
  }
};

}  // namespace mi
