// mirage runtime: device helpers shared by every generated kernel. mirage-codegen embeds in
// each generated source this file (always) and the parts its kernels use, with the parts they
// need, in this order (codegen's runtime.rs declares the parts and their dependencies):
//   reductions.cuh        block- and warp-level reductions, row kernels' combine steps
//   matmul.cuh            the tile matmul (SIMT; ldmatrix + mma.sync)
//   attention.cuh         register-resident online-softmax attention (needs matmul)
//   wgmma.cuh             warpgroup tensor cores (sm_90a)
//   warp_specialized.cuh  the wgmma attention and its producer/consumer warpgroups over
//                         mbarrier pipelines (needs reductions, attention and wgmma)
// This file holds the common types, dependent launches, thread indexing, dtype conversion, tile
// copies, element-wise ops, L2 policies, named barriers, mbarriers and thread-block clusters.
// Every function is header-only and templated on compile-time sizes so that tile shapes are
// constants for the compiler.
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

// Shared-memory index of element i (row-major over [rows][C]) of a tile stored transposed:
// its C columns as rows of LD elements (a transposed weight copied down its columns).
template <int C, int LD>
__device__ __forceinline__ int tidx(int i) {
  const unsigned u = static_cast<unsigned>(i);
  return static_cast<int>(u % C * LD + u / C);
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
// (Add, sub, mul and div are written as operators; binary ops call op_pow only.)
__device__ __forceinline__ float op_exp(float x) { return expf(x); }
__device__ __forceinline__ float op_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ float op_relu(float x) { return x > 0.0f ? x : 0.0f; }
__device__ __forceinline__ float op_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float op_square(float x) { return x * x; }
__device__ __forceinline__ float op_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float op_clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ float op_pow(float a, float b) { return powf(a, b); }

// ---------------------------------------------- L2 policies and synchronisation
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

// Orders this thread's generic-proxy shared-memory writes (plain stores, cp.async) before
// later async-proxy reads (wgmma operands) once a barrier has passed.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The named barriers (bar.sync ids) a generated block uses, each for one purpose (codegen's
// runtime.rs has the same ids as `NamedBarrier`).
enum class NamedBarrier : int {
  // __syncthreads: every thread of the block.
  Block = 0,
  // The consumer threads of a warp-specialised block (`FlashWG::run_ws`), after the producer
  // warpgroup has left: `bar_sync_n`.
  Consumers = 1,
  // The first of the warpgroups' turns of the ping-pong wgmma issue (`FlashWG::run_ws`):
  // warpgroup w waits on Turns + w (w < 3).
  Turns = 8,
};

// Barrier over the block's first N threads (`NamedBarrier::Consumers`).
template <int N>
__device__ __forceinline__ void bar_sync_n() {
  asm volatile("bar.sync %0, %1;" ::"n"(static_cast<int>(NamedBarrier::Consumers)), "n"(N) : "memory");
}
// Barrier `id` (chosen at run time) over N threads: a warpgroup's turn in a warp-specialised
// block (`NamedBarrier::Turns` + its index, `FlashWG::run_ws`).
template <int N>
__device__ __forceinline__ void bar_sync_id(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(N) : "memory");
}
// Arrival (no wait) on barrier `id` of N threads: the other side of a `bar_sync_id`.
template <int N>
__device__ __forceinline__ void bar_arrive_id(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(N) : "memory");
}

// mbarriers (sm_90): set up with `count` expected arrivals, waited on by phase parity, arrived on.
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

}  // namespace mi
