// mirage runtime, a part of the header a generated source inlines where its kernels use it
// (after mirage_runtime.cuh and the parts this one needs: codegen's runtime.rs).
// Warpgroup tensor cores (wgmma, sm_90a only) and the loop matmul accumulator on them.

namespace mi {

// ------------------------------------------ warpgroup tensor cores (wgmma, sm_90a only)
// Compiled for sm_90a (codegen's nvrtc options), __CUDA_ARCH_FEAT_SM90_ALL is defined and
// FlashWG below may be instantiated; elsewhere its instantiation fails to compile.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MI_WGMMA 1
#else
#define MI_WGMMA 0
#endif


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

}  // namespace mi
