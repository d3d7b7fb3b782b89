// mirage runtime, a part of the header a generated source inlines where its kernels use it
// (after mirage_runtime.cuh and the parts this one needs: codegen's runtime.rs).
// Warp specialisation: a producer warpgroup that fills pipeline stages behind mbarriers
// for consumer warpgroups.

namespace mi {

// ------------------------------------------------------ warp specialisation
// A block of NT consumer threads and one producer warpgroup after them (`FlashWG::run_ws`):
// the producer fills pipeline stages with cp.async and marks each full on an mbarrier (one
// arrival a producer thread, when its copies have landed); the consumers mark a stage empty
// (one arrival a consumer warp) once their tensor-core reads of it are done. No block-wide
// barrier in the loop: each warpgroup runs at its own pace. Named barrier 1 syncs the
// consumers alone (the producer leaves after its loop).
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
// `Flash` for N = 64, 128 or 256 keys per iteration of DV-wide values (DV = 64 or 128), with
// one block of lookahead. K ([BATCH][D][N]) sits in shared memory as `swzb<N, BATCH * D>`:
// column blocks of 64 keys, each [BATCH * D][64] in 128-byte rows swizzled as the hardware's
// 128-byte pattern from a 1024-byte aligned base; V ([BATCH][N][DV]) as `swz<64, 8>`, in
// column blocks of 64 values ([BATCH * N][64] each) where DV is 128; Q as in `Flash`.
// Warpgroup w of batch item b takes RG groups of 64 rows (group (w % WR) * RG + r)
// and key slice w / WR (N / KS keys). The slice's keys go in blocks of 64 (or one of 32): each
// step issues the next block's S = Q K (D / 16 wgmma per group, Q from registers; after the
// last block, the next iteration's first) before this block's online softmax (`FlashRows`),
// so the tensor cores work while the exponentials run, then O += P V (wgmma, P from registers).
// With QSS, Q ([BATCH * M][D], K's type) sits as `swz<64, 8>` too (in column blocks of 64,
// `swzb`, where D is 128 or 256) and S = Q K takes both operands through descriptors; then
// within a step each block's P V runs on while the next block's softmax does (see `step`).
//
// With ILV (only `run_ws`), the KS slices are whole stages instead of keys within each: the
// warpgroup of slice k takes stages k, k + KS, ... (all N keys of each), so each works as the
// one of a KS = 1 block would; `finish` merges them as key slices.
//
// VARIANT (attention.cuh's attention variants) is what the loop computes beyond softmax(Q K) V;
// its hooks run in `run_ws` (the other forms take the plain one).
template <int NT, int BATCH, int M, int D, int N, int LDQ, int RG, int KS, typename T, typename TQ, bool QSS = false,
          bool XMAX = true, bool ILV = false, class VARIANT = PlainAttention, int DV = 64>
struct FlashWG {
#if defined(__CUDA_ARCH__)
  static_assert(MI_WGMMA, "FlashWG needs sm_90a (wgmma)");
#endif
  static constexpr int NWG = NT / 128 / BATCH, KQ = D / 16, WR = M / 64 / RG;
  static constexpr int NK = ILV ? N : N / KS;        // keys per slice (of a stage)
  static constexpr int KOFS = ILV ? 0 : NK;          // a slice's first key in a stage: slice * KOFS
  static constexpr int NKB = NK < 64 ? NK : 64;      // keys per block
  static constexpr int NB = NK / NKB, NFC = NKB / 8;  // blocks per slice, S fragments per block
  static constexpr int NFO = DV / 8, VB = DV / 64;    // O fragments; V's column blocks of 64 values
  static_assert(DV == 64 || DV == 128, "flash (wgmma): 64 or 128 values a row");
  static_assert((NT / 128) % BATCH == 0 && M % (64 * RG) == 0 && NWG == WR * KS && D % 16 == 0 &&
                    N % 64 == 0 && N <= 256 && (NKB == 64 || NKB == 32),
                "flash (wgmma) tile shape");
  static_assert(!QSS || ((D == 64 || D == 128 || D == 256) && same_type<TQ, T>::value),
                "flash (wgmma): Q by descriptor needs rows of 64, 128 or 256 of K's type");
  FlashRows<RG, NFO, XMAX> st;
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

  // The `q_factors` variants' query hook: the exponent scales of this thread's rows (`FlashRows::qs`) from the raw
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
      st.qs[0][h] = FlashRows<RG, NFO, XMAX>::L2E * rsqrtf(ss * (1.0f / (float)D));
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
      // 16; each k-step of 16 is 32 bytes further along the swizzled 128-byte rows, the
      // fifth the first row of the next column block (BATCH * M rows of 128 bytes on).
      const unsigned ql = wg_desc_lo((unsigned)__cvta_generic_to_shared(qp) + (row0 & ~63) * 128);
      wg_fence();
#pragma unroll
      for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
          const unsigned qo = r * 64 * 8 + (kk / 4) * BATCH * M * 8 + (kk % 4) * 2;
          const unsigned long long qd = wg_desc_sw128(ql + qo), bd = wg_desc_sw128(kd + kk * 128);
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

  // O += P V over block j of this slice's keys, issued as one wgmma group (not waited for):
  // each of V's column blocks of 64 values (BATCH * N rows of 128 bytes apart) into its 8 O
  // fragments.
  __device__ __forceinline__ void pv(const unsigned (&p)[RG][NFC / 2][4], const T* V, int j) {
    const unsigned vd = wg_desc_lo((unsigned)__cvta_generic_to_shared(V) + (bt * N + slice * KOFS + j * NKB) * 128);
    wg_fence();
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int c = 0; c < VB; ++c) {
        float(&o)[8][4] = *reinterpret_cast<float(*)[8][4]>(&st.o[r][c * 8]);
#pragma unroll
        for (int kk = 0; kk < NFC / 2; ++kk)
          wgmma_m64n64k16<T>(o, p[r][kk], wg_desc_sw128(vd + c * ((BATCH * N * 128) >> 4) + kk * 128), 1);
      }
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
    static_assert(!VARIANT::q_factors && !VARIANT::v_factors, "step: the plain variant (QK-norm's factors are run_ws's)");
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
  // warp, a thread with the `v_factors` variants) once this
  // warpgroup's P V over it has retired. One step a stage: the softmax covers all the
  // stage's keys at once (NB * NFC fragments, twice the independent exponentials of a
  // 64-key block), then the next stage's S and this stage's P V are issued together, and
  // only S is waited for, so P V runs on beside the next softmax (P in two alternating
  // buffers); the rare O rescale a softmax decides waits until after it, where the whole
  // warpgroup waits for that P V. MQA b=16 (128-row blocks) on the H100: 47.2 -> 38.8 us
  // (bench table) against the same form with a block barrier and cp.async by all threads an
  // iteration. With ILV (KS warpgroups over 64 rows each), this warpgroup's stages are
  // slice, slice + KS, ... (its `mine` of them; the others' pass by), each released by its
  // four warps (one arrival a warp; with `v_factors` one a thread).
  //
  // With a `v_factors` variant (VRowFactors), V's rows are normalised (QK-norm): P V over normalised rows is P with each key's
  // column scaled by its row's 1 / rms times V, so the stage's V is read, not rewritten. Each
  // step, beside its softmax (128-key steps) or a step ahead beside the previous step's wgmma
  // (64-key steps, `FAHEAD`), every thread of the warpgroup computes the factor of one of the
  // stage's keys (`v_factor`, the `value_factors` hook) into `rs` (the warpgroup's two slots of NK 16-bit factors, in
  // alternation); after the warpgroup's turn (a barrier of its four warps, see below) P's
  // fragments are scaled by them before its P V (`load_value_factors`, `scale_p`): the row
  // sums stay those of unscaled P.
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
  // With a `q_factors` variant (QRowScales), Q's rows are normalised (QK-norm) by the softmax:
  // Q sits in shared memory as copied, and each row's factor scales its exponent (the `query`
  // hook, `q_scales`; `FlashRows::qs`), so the
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
  static constexpr int PP_BAR = static_cast<int>(NamedBarrier::Turns);
  template <int STAGES, bool SPLITV = false>
  __device__ __forceinline__ void run_ws(const TQ* Q, const T* Kst, const T* Vst, int kel, int vel,
                                         unsigned long long* full, unsigned long long* empty, int iters,
                                         T* rs = nullptr, unsigned long long* vfull = nullptr) {
    static_assert(QSS && (KS == 1 || ILV) && RG == 1 && BATCH == 1, "run_ws: one row group, slices by stage");
    static_assert(PP_BAR + NWG <= 16, "run_ws: a turn barrier a warpgroup, within the 16 named barriers");
    constexpr bool VF = VARIANT::v_factors;  // V row factors (the variant's)
    static_assert(!VF || NK == 128 || NK == 64, "run_ws: V factors of 64- or 128-key steps");
    static_assert(!(VF && SPLITV), "run_ws: V marked full apart only without V factors");
    static_assert(!VF || NWG > 1, "run_ws: V factors behind the warpgroups' turns (ping-pong)");
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
    // The query hook: with `q_factors`, Q is the raw rows, their factors beside the first S.
    VARIANT::query(*this);
    T* const rw = VF ? rs + wg * 2 * NK : nullptr;
    // With 64-key steps (FAHEAD), each stage's factors are computed a step ahead, beside the
    // previous step's wgmma; the first stage's here, beside its S.
    constexpr bool FAHEAD = VF && NK == 64;
    if constexpr (FAHEAD) VARIANT::value_factors(*this, Vst + (at(0) % STAGES) * vel, rw);
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
      // With v_factors and 128-key steps, this stage's factors beside the softmax (independent of
      // it: the compiler interleaves them), into slot k % 2.
      if constexpr (!FAHEAD) VARIANT::value_factors(*this, Vst + cur * vel, rw + (k & 1) * NK);
      st.template softmax<NF, T, true, VARIANT::q_factors>(sc, p);
      wg_wait<0>();
      wg_pin(st.o[0]);
      st.rescale_deferred();
      // The previous stage's P V has retired: its stage is free. With v_factors every thread arrives
      // (the factors read V with ordinary loads, and each thread's arrival releases its own
      // reads to the producer's next copy into the stage); else one thread a warp, the
      // tensor cores' reads of the warp retired at its wait above.
      if (!first) {
        __syncwarp();
        if (VF || lane == 0) mbar_arrive(empty + at(k - 1) % STAGES);
      }
      const int turn = ILV ? u : k * NWG + wg;
      if (more) {
        mbar_wait(full + nxt, (un / STAGES) & 1);
        fence_proxy_async();
      }
      // This warpgroup's turn: the previous turn's wgmma are issued.
      if (PP) bar_sync_id<256>(PP_BAR + wg);
      // With `v_factors`, every factor of this stage is in: the warpgroup's four warps have
      // all waited at its turn since writing theirs (the turn is their barrier, as the next
      // turn orders these reads before the next-but-one step's writes into this slot).
      unsigned w[VF ? NF : 1];
      VARIANT::template load_value_factors<T>(rw + (k & 1) * NK, lane, w);
      if (more) {
#pragma unroll
        for (int j = 0; j < NB; ++j) qk(Kst + nxt * kel, j, reinterpret_cast<SH&>(sc[0][j * NFC]));
      }
      VARIANT::template scale_p<T>(p[0], w);
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
        if (more) VARIANT::value_factors(*this, Vst + nxt * vel, rw + ((k + 1) & 1) * NK);
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
    return (KS - 1) * BATCH * WR * FlashRows<RG, NFO>::template SLOT_FLOATS<128>;
  }
  // Floats of `remote` that `finish<CS>` takes: a block's own slots of a cluster split (the
  // other block's with HALVES).
  template <int CS>
  __host__ __device__ static constexpr int remote_floats() {
    return (CS > 1 ? 1 : 0) * BATCH * WR * FlashRows<RG, NFO>::template SLOT_FLOATS<128>;
  }

  // After the loop, as `Flash::finish`. The key slices merge in registers
  // (`FlashRows::merge_slices` over warpgroups through `scratch`, which overlaps the loop's
  // tiles: slot (k - 1) of its rows for slice k > 0).
  // With CS > 1 the block is one of a thread-block cluster of CS that split the loop: the
  // slice-0 warpgroups of block rank > 0 save their merged partials into their own block's
  // `remote` area (one slot per batch item and row group: see `remote_floats`), a cluster
  // barrier (release, then acquire) publishes them, and the first block alone reads every other
  // block's slots over distributed shared memory, merges them and writes O, L and X; a second
  // cluster barrier keeps every block resident until those reads are done. Every byte is then
  // written only by its own block: where `remote` overlaps the loop's tiles (it follows the
  // slices' slots when an area of its own would cost the loop a pipeline stage), a barrier of
  // the block's consumers orders the save after their last reads of the stages, whose copies
  // each consumer waited for. (Stores pushed into the first block's stages instead were
  // ordered only through that block's copy waits and the cluster barrier, which
  // compute-sanitizer's racecheck does not credit: benches/gpu/racecheck_cluster_cp_async.cu.)
  // With WS (after `run_ws`) the slices' barriers are the consumers' own
  // (`NamedBarrier::Consumers`):
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
      const unsigned rank = cluster_rank();
      constexpr int SLOT = FlashRows<RG, NFO>::template SLOT_FLOATS<128>;
      if constexpr (HALVES) {
        cluster_sync_relaxed();
        const unsigned h = (unsigned)row0 >> 5;
        if (h != rank && slice == 0) st.template save<128>(cluster_map(remote, h) + grp * SLOT, tw);
        cluster_sync();
        if (h == rank && slice == 0) st.template merge<128>(remote + grp * SLOT, tw);
        mine = mine && h == rank;
      } else {
        // Pulled: each block but the first saves into its own slots, which the first block
        // reads over distributed shared memory between two cluster barriers.
        if constexpr (KS == 1) {
          // Every consumer has left the loop before a save may overwrite its stages.
          if (rank > 0) {
            if constexpr (WS) {
              bar_sync_n<NT>();
            } else {
              __syncthreads();
            }
          }
        }
        if (rank > 0 && slice == 0) st.template save<128>(remote + grp * SLOT, tw);
        cluster_sync();
        if (rank == 0 && slice == 0) {
#pragma unroll 1
          for (int r = 1; r < CS; ++r) st.template merge<128>(cluster_map(remote, (unsigned)r) + grp * SLOT, tw);
        }
        cluster_sync();
        mine = mine && rank == 0;
      }
    }
    if (mine) st.store(O, L, X, lane, [&](int r) { return bt * M + row0 + r * 64; });
  }
};

}  // namespace mi
