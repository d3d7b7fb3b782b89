//! What the generated block kernels look like, without a GPU: per-iteration input tiles go
//! through a multi-stage `cp.async` pipeline with 16-byte copies, rows of tiles that feed
//! tensor-core matmuls are swizzled (or padded, when their rows are neither whole 128-byte lines
//! nor 2 or 4 chunks), and barriers sit only where a shared-memory hazard needs one.

use mirage_codegen::{generate, Options};
use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph};

/// The source of the first customized kernel of `g` for sm_90.
fn kernel_source(g: &KernelGraph) -> String {
    kernel_source_for(g, 90)
}

/// The source of the first customized kernel of `g` for `arch`.
fn kernel_source_for(g: &KernelGraph, arch: u32) -> String {
    kernel_source_with(g, &Options::for_arch(arch))
}

/// The source of the first customized kernel of `g` under `opts`.
fn kernel_source_with(g: &KernelGraph, opts: &Options) -> String {
    let p = generate(g, opts).expect("generates");
    let k = p.kernels.iter().find(|k| k.name.contains("customized")).expect("a customized kernel");
    let start = p.source.find("// block graph:").expect("kernels");
    let at = p.source[start..].find(&k.name).map(|i| start + i).expect("kernel in the source");
    // From the kernel's header comment on.
    let at = p.source[..at].rfind("// block graph:").unwrap_or(at);
    let end = p.source[at..].find("\n}\n").map_or(p.source.len(), |i| at + i);
    p.source[at..end].to_string()
}

/// Attention with 64 heads of 64 over 1024 keys, 4 KV splits of 4 iterations: the shape of the
/// attention schedule tests.
fn attn() -> Attn {
    Attn { b: 2, h: 64, d: 64, s: 1024, splits: 4, frange: 4, qsplit: 1 }
}

/// The body of the kernel's for-loop.
fn loop_body(src: &str) -> &str {
    let start = src.find("for (int it = 0;").expect("a for-loop");
    let end = src[start..].find("\n  }\n").map_or(src.len(), |i| start + i);
    &src[start..end]
}

#[test]
fn loop_tiles_are_pipelined_with_vector_copies() {
    // RMSNorm + Linear, 16 iterations: X and W tiles are prefetched stages ahead.
    let pair = zoo::rmsnorm_linear(2, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("4 pipeline stage(s)"), "{src}");
    assert!(src.contains("mi::cp_async16("), "16-byte async copies: {src}");
    assert!(src.contains("mi::cp_async_wait<2>();"), "waits for the current stage only: {src}");
    assert!(src.contains("if (mi::aligned16(in1))"), "pointer alignment is checked: {src}");
    // One address pair per tile and thread; the copies add constants (W [256, 32]: 128 threads
    // of 8 elements cover 32 rows, of pitch 32 in shared memory and 4096 in W).
    // W's tiles, each block's own, read once: with the L2 policy evict_first.
    assert!(src.contains("mi::cp_async16_pol(sdst + 2048u, src + 131072LL, mi_once);"), "{src}");
    // W's rows of 64 bytes are swizzled, not padded, and the matmul reads B through the swizzle;
    // X's two rows are padded (read a word at a time).
    assert!(src.contains("mi::swz<32, 8>(i)"), "{src}");
    assert!(src.contains(", 264, 32, mi::f16, true> mm"), "{src}");
    assert!(src.contains("mi::RowSumAcc<NT, 2, 256, 264, mi::f16, true> rs"), "{src}");
    let body = loop_body(&src);
    // The wait's barrier at the top of the iteration is the only one the loop needs: the
    // rms accumulator and the matmul read the staged tiles and write separate accumulators.
    assert_eq!(body.matches("__syncthreads()").count(), 1, "{body}");
}

#[test]
fn tensor_core_operands_are_swizzled_or_padded_against_bank_conflicts() {
    // W tile [256, 64] fp16: rows of 128 bytes, swizzled; X [16, 256] too.
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("mi::swz<64, 8>(i)"), "{src}");
    assert!(!src.contains("mi::pidx<"), "{src}");
    assert!(src.contains(", 256, 64, mi::f16, true, true> mm"), "{src}");
    // W tile [256, 48]: rows of 96 bytes, not whole lines, get 16 bytes of padding (pitch 56).
    let pair = zoo::rmsnorm_linear(16, 4096, 6144, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("mi::pidx<48, 56>"), "{src}");
    assert!(src.contains(", 256, 56, mi::f16, false, true> mm"), "A swizzled, B padded: {src}");
}

#[test]
fn loop_matmul_sums_stay_in_registers() {
    // RMSNorm + Linear: X W summed over the loop is a register accumulator: each iteration only
    // adds this warp's k-steps (no split-K scratch, no barrier); the sum is written after the loop.
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let body = loop_body(&src);
    assert!(body.contains(".step(t0, t1);"), "{body}");
    assert!(!body.contains("matmul_tile"), "{body}");
    assert_eq!(body.matches("__syncthreads()").count(), 1, "{body}");
    // The rms accumulator's sums of squares also stay in registers, on the tensor cores.
    assert!(src.contains("mi::RowSumAcc<NT, 16, 256, 256, mi::f16, true, true> rs"), "{src}");
    assert!(body.contains(".step(t0);"), "{body}");
    assert!(!body.contains("row_sums_vec"), "{body}");
    let after = &src[src.find(body).map_or(0, |i| i + body.len())..];
    // Both finishes add their K slices through scratch in shared memory (for the matmul's
    // [16, 64] sums: 4 slices x 8 fragments x 32 lanes x 16 bytes = 16 KiB), placed by the
    // planner and checked against the accumulator's need at compile time.
    assert!(after.contains("static_assert(decltype(mm3)::SCRATCH * 4 <= 16384"), "{after}");
    assert!(after.contains("), [&](int c) -> float& {"), "{after}");
    assert!(after.contains("), [&](int r) -> float& {"), "{after}");
}

#[test]
fn dependent_steps_keep_their_barrier() {
    // Plain attention: the scores matmul, exp and the accumulations each read what the
    // previous step wrote in shared memory.
    let pair = zoo::attention(attn(), false, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let body = loop_body(&src);
    let barriers = body.matches("__syncthreads()").count();
    assert!(barriers >= 2, "a barrier between each producer and consumer: {body}");
    let steps = body.matches("mi::matmul_tile").count() + body.matches("mi::reduce").count();
    assert!(barriers <= steps + 1, "no barrier after every step: {barriers} barriers, {steps} steps\n{body}");
}

#[test]
fn exp_tiles_stay_fp32_unless_the_running_max_bounds_them() {
    // Plain attention (exp without the max subtracted) keeps P in fp32: fp16 would overflow
    // for logits above ~11.
    let plain = kernel_source(&zoo::attention(attn(), false, DType::Float16).expect("zoo").ugraph);
    let i = plain.find("mi::op_exp").expect("an exp");
    let line_end = plain[i..].find("\n}").map_or(plain.len(), |e| i + e);
    assert!(!plain[i..line_end].contains("from_f32<mi::f16>"), "{}", &plain[i..line_end]);
}

#[test]
fn attention_warps_take_two_row_groups_only_in_one_wave() {
    // 8 blocks (one wave): each of the 4 warps takes 2 row groups of 16 and the warps split
    // every key chunk 2 ways (RG 2, KS 2), updating the softmax 16 keys at a time (CW 16).
    // Q's rows are padded by 16 bytes (pitch 72), the staged K and V rows of 128 bytes by 32
    // (pitch 80: every copied 32-byte sector lands on a sector boundary).
    let one = kernel_source_for(&zoo::attention_online(attn(), DType::Float16).expect("zoo").ugraph, 80);
    assert!(one.contains("mi::Flash<NT, 1, 64, 64, 64, 64, 72, 80, 80, 2, 2, 16, mi::f16"), "{one}");
    // 256 blocks: one row group per warp (RG 1), so that registers stay within what several
    // blocks per SM allow.
    let many = Attn { b: 64, ..attn() };
    let src = kernel_source_for(&zoo::attention_online(many, DType::Float16).expect("zoo").ugraph, 80);
    assert!(src.contains("mi::Flash<NT, 1, 64, 64, 64, 64, 72, 80, 80, 1, "), "{src}");
}

#[test]
fn online_attention_keeps_scores_in_registers() {
    // The online-softmax loop (scores, running max, P, row sums, P V) is one register-resident
    // step: the loop has only the pipeline's barrier and materialises no score tile; the
    // accumulators are written once, after the loop.
    let src = kernel_source_for(&zoo::attention_online(attn(), DType::Float16).expect("zoo").ugraph, 80);
    assert!(src.contains("mi::Flash<NT, 1, 64, 64, "), "{src}");
    let body = loop_body(&src);
    assert_eq!(body.matches("fa.step(").count(), 1, "{body}");
    assert_eq!(body.matches("__syncthreads()").count(), 1, "{body}");
    assert!(!body.contains("mi::matmul_tile") && !body.contains("mi::reduce") && !body.contains("op_exp"), "{body}");
    let after = &src[src.find("fa.step(").expect("step")..];
    assert!(after.contains("fa.finish("), "{src}");
}

#[test]
fn attention_runs_on_warpgroup_tensor_cores_on_sm_90() {
    // sm_90: the same region as `mi::FlashWG` (wgmma): K and V staged in 128-byte rows with
    // the hardware's swizzle from 1024-byte aligned buffers, the loop waiting for the next
    // stage too (its K is read a step ahead, at every iteration: no run-time test around the
    // lookahead's wgmma) and fencing the copies for the tensor cores. Q, loaded and read only by
    // the region, takes the same swizzle (S = Q K with both operands by descriptor: QSS).
    let src = kernel_source(&zoo::attention_online(attn(), DType::Float16).expect("zoo").ugraph);
    assert!(src.contains("mi::FlashWG<NT, 1, 64, 64, 64, 64, 1, 1, mi::f16, mi::f16, true, true> fa;"), "{src}");
    assert!(src.contains("__align__(1024) unsigned char mi_smem[]"), "{src}");
    assert!(src.contains("mi::swz<64, 8>(i)"), "{src}");
    let body = loop_body(&src);
    assert!(body.contains("mi::cp_async_wait<1>();\n    mi::fence_proxy_async();\n    __syncthreads();"), "{body}");
    assert!(body.contains("fa.step<true>(") && body.contains("_st + ((it + 1) % 4) * "), "{body}");
    assert!(!body.contains("nullptr"), "{body}");
    assert_eq!(body.matches("__syncthreads()").count(), 1, "{body}");
    // Every K and V buffer, and Q's, starts on a 1024-byte boundary.
    assert_eq!(src.matches("t0 + mi::swz<64, 8>(i)").count(), 1, "{src}");
    for line in
        src.lines().filter(|l| l.contains("_st = reinterpret_cast") || l.contains("const t0 = reinterpret_cast"))
    {
        let off: usize = line
            .split("mi_smem + ")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .and_then(|n| n.parse().ok())
            .expect("offset");
        assert_eq!(off % 1024, 0, "{line}");
    }
}

/// softmax(Q K) V in one kernel (`zoo::attention_one_kernel`) with blocks of `rows` of 128
/// query rows (128 threads) over 1024 keys, 128 an iteration: no running max leaves the loop.
fn one_kernel_attention(rows: usize) -> KernelGraph {
    let a = Attn { b: 2, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 128 / rows };
    zoo::attention_one_kernel(a, DType::Float16).expect("zoo").ugraph
}

#[test]
fn attention_without_a_saved_max_keeps_no_running_max() {
    // Where no running max leaves the loop, the register softmax is told so (XMAX false): it
    // tests the packed P for a rescale instead of reducing every chunk's row maxima. The
    // graphs of the other tests save the max (split-KV partials) and keep it.
    let wg = kernel_source(&one_kernel_attention(64));
    assert!(wg.contains("mi::FlashWG<NT, 1, 64, 64, 128, 64, 1, 1, mi::f16, mi::f16, true, false> fa;"), "{wg}");
    let mma = kernel_source_for(&one_kernel_attention(32), 90);
    assert!(
        mma.contains("mi::Flash<NT, 1, 32, 64, 128, 64, ") && mma.contains(", mi::f16, mi::f16, false> fa;"),
        "{mma}"
    );
}

#[test]
fn a_q_normalised_before_the_loop_is_written_swizzled_for_the_descriptors() {
    // QK-norm's Q, row-normalised in the kernel before the loop, is read only by the wgmma
    // region: the norm writes it through the 128-byte swizzle (QSS, as a loaded Q) from a
    // 1024-byte aligned buffer, and the loop's first proxy fence comes before any wgmma reads it.
    let src = kernel_source(&zoo::qnorm_attention_online(attn(), DType::Float16).expect("zoo").ugraph);
    assert!(src.contains("mi::FlashWG<NT, 1, 64, 64, 64, 64, 1, 1, mi::f16, mi::f16, true, true> fa;"), "{src}");
    let norm = src.lines().find(|l| l.contains("rms_norm_rows")).expect("Q's rms norm");
    assert!(norm.contains("[mi::swz<64, 8>(i)] = "), "{norm}");
    let q = norm.split("[mi::swz").next().and_then(|l| l.rsplit(' ').next()).expect("Q's tile");
    let decl = src.lines().find(|l| l.contains(&format!("* const {q} = reinterpret_cast"))).expect("Q's buffer");
    let off: usize =
        decl.split("mi_smem + ").nth(1).and_then(|r| r.split(')').next()).and_then(|n| n.parse().ok()).expect("offset");
    assert_eq!(off % 1024, 0, "{decl}");
    let (pre, body) = src.split_at(src.find("for (int it = 0;").expect("a for-loop"));
    assert!(!pre.contains("fa.step"), "{pre}");
    let fence = body.find("mi::fence_proxy_async();").expect("a proxy fence");
    assert!(fence < body.find("fa.step").expect("the step"), "{body}");
}

#[test]
fn the_first_stage_is_in_flight_while_q_is_normalised_before_the_loop() {
    // QK-norm's Q is normalised from device memory before the loop, in bytes no stage uses:
    // the first K / V stage's copies are issued (and committed) before it, not after.
    let src = kernel_source(&zoo::qnorm_attention_online(attn(), DType::Float16).expect("zoo").ugraph);
    let norm = src.find("mi::rms_norm_rows_ld<").expect("Q's norm from device memory");
    let commit = src.find("mi::cp_async_commit();").expect("a copy group");
    assert!(commit < norm, "{src}");
    let first_copy = src.find("mi::cp_async16").expect("a copy");
    assert!(first_copy < norm, "{src}");
}

#[test]
fn a_v_normalised_in_the_loop_is_normalised_in_place_in_its_stage() {
    // QK-norm attention in one kernel: V's rms norm is part of the attention region. Each
    // iteration normalises the landed V stage in place (no tile of its own, the wgmma form
    // and its stages kept), then fences the writes for the async proxy and syncs before the
    // step reads it.
    let one = kernel_source(&zoo::qnorm_attention_online(attn(), DType::Float16).expect("zoo").ugraph);
    let src = kernel_source(&zoo::qknorm_attention_online(attn(), DType::Float16).expect("zoo").ugraph);
    assert!(src.contains("mi::FlashWG<NT, 1, 64, 64, 64, 64, 1, 1, mi::f16, mi::f16, true, true> fa;"), "{src}");
    let body = &src[src.find("for (int it = 0;").expect("a for-loop")..];
    let norm = body.find("mi::rms_norm_rows_frag<NT, 64, 64, 64, true, mi::f16>(").expect("V's in-place norm");
    let step = body.find("fa.step").expect("the step");
    let between = &body[norm..step];
    assert!(between.contains("mi::fence_proxy_async();") && between.contains("__syncthreads();"), "{body}");
    let tiles = |s: &str| s.lines().filter(|l| l.contains("= reinterpret_cast<")).count();
    assert_eq!(tiles(&src), tiles(&one), "{src}");
}

#[test]
fn with_the_lookahead_each_iteration_normalises_the_next_v_stage_beside_its_matmuls() {
    // 128 keys an iteration: the stages fit four deep, the step reads the next K a step
    // ahead, and the next V stage (landed too) is normalised a part after each block's P V
    // (two blocks of 64 keys, two parts); only the first iteration normalises its own stage
    // before its step.
    let a = Attn { s: 2048, ..attn() };
    let src = kernel_source(&zoo::qknorm_attention_online(a, DType::Float16).expect("zoo").ugraph);
    let body = &src[src.find("for (int it = 0;").expect("a for-loop")..];
    let first = body.find("if (it == 0) {").expect("the first stage's norm");
    let own = body.find("mi::rms_norm_rows_frag<NT, 128, 64, 64, true, mi::f16>(t").expect("its own stage");
    let step = body.find("fa.step<true>(").expect("the lookahead step");
    assert!(first < own && own < step, "{body}");
    let next = &body[step..];
    assert!(
        next.contains(
            "[&](int j) { if (it + 1 < 4) mi::rms_norm_rows_frag<NT, 128, 64, 64, true, mi::f16, decltype(fa)::NB>("
        ),
        "{next}"
    );
    // The step's blocks, so the parts: 128 keys of one slice in blocks of 64, NB = 2.
    assert!(src.contains("mi::FlashWG<NT, 1, 64, 64, 128, 64, 1, 1, mi::f16, mi::f16, true, true> fa;"), "{src}");
    assert!(next.contains("_st + ((it + 1) % 4) * 8192, j); });"), "{next}");
}

#[test]
fn wide_key_tiles_go_in_swizzled_column_blocks() {
    // 256 keys per iteration: K [64, 256] is stored as 4 column blocks of [64, 64] (`swzb`),
    // V [256, 64] keeps its 128-byte rows; the warpgroups take the keys in blocks of 64.
    let wide = Attn { s: 4096, ..attn() };
    let src = kernel_source(&zoo::attention_online(wide, DType::Float16).expect("zoo").ugraph);
    assert!(src.contains("mi::swzb<256, 64>(i)"), "{src}");
    assert!(src.contains("mi::swz<64, 8>(i)"), "{src}");
    assert!(src.contains("mi::FlashWG<NT, 1, 64, 64, 256, 64, "), "{src}");
}

#[test]
fn rms_norms_of_staged_16_bit_tiles_keep_rows_in_registers() {
    // QK-norm attention normalises each V tile in the loop: whole 16-bit rows are read, scaled
    // and written 16 bytes at a time, into the padded tile that feeds the P V matmul.
    let pair = zoo::attention(attn(), true, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let body = loop_body(&src);
    assert!(body.contains("mi::rms_norm_rows_vec<NT, 64, 64, 72, 72, mi::f16>("), "{body}");
    assert!(!body.contains("mi::rms_norm_rows<"), "{body}");
}

#[test]
fn loop_free_row_kernels_keep_tiles_in_registers() {
    // nTrans, one 4096-wide row per block: every tile lives in registers, loaded and stored 16
    // bytes at a time; each RMS norm needs one barrier (its per-warp partial sums) and nothing
    // else touches shared memory.
    let pair = zoo::ntrans(2, 4096, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("tiles in registers"), "{src}");
    assert!(src.contains("mi::load8(in0 + base"), "{src}");
    assert!(src.contains("mi::store_n<8>(out0 + base"), "{src}");
    assert_eq!(src.matches("__syncthreads()").count(), 2, "{src}");
    assert!(!src.contains("mi_smem"), "no dynamic shared memory: {src}");
    // A row that is not a whole number of warp chunks (256 elements) keeps the general schedule.
    let pair = zoo::ntrans(2, 4104, DType::Float16).expect("zoo");
    assert!(!kernel_source(&pair.ugraph).contains("tiles in registers"));
}

#[test]
fn a_row_kernel_feeding_a_later_kernel_keeps_its_output_in_l2() {
    // rms_norm(X) in one kernel, then rms_norm of that plus Y in a second: the first kernel's
    // output is a workspace tensor, stored with the L2 policy evict_last, and its graph input,
    // read once, is loaded with evict_first; the second writes a graph output and keeps the
    // plain loads and stores.
    let dt = DType::Float16;
    let mut g = KernelGraph::new();
    let x = g.new_input(&[8, 4096], dt, None).expect("input");
    let y = g.new_input(&[8, 4096], dt, None).expect("input");
    let mut b1 = BlockGraph::new([8, 1, 1], [128, 1, 1], 1, 64).expect("block graph");
    let tx = b1.new_input(&[8, 4096], dt, [0, -1, -1], -1).expect("input");
    let n = b1.rms_norm(tx).expect("rms");
    b1.new_output(n, [0, -1, -1], -1).expect("output");
    let xn = g.customized(&[x], b1).expect("kernel 1");
    let mut b2 = BlockGraph::new([8, 1, 1], [128, 1, 1], 1, 64).expect("block graph");
    let tn = b2.new_input(&[8, 4096], dt, [0, -1, -1], -1).expect("input");
    let ty = b2.new_input(&[8, 4096], dt, [0, -1, -1], -1).expect("input");
    let t = b2.binary(BinaryOp::Add, tn, ty).expect("add");
    let o = b2.rms_norm(t).expect("rms");
    b2.new_output(o, [0, -1, -1], -1).expect("output");
    let out = g.customized(&[xn[0], y], b2).expect("kernel 2");
    g.mark_output(out[0], None).expect("output");
    let p = generate(&g, &Options::for_arch(90)).expect("generates");
    let (k1, k2) = (&p.kernels[0].name, &p.kernels[1].name);
    let body = |k: &str| {
        let at = p.source.find(&format!(" {k}(")).expect("kernel");
        let end = p.source[at..].find("\n}\n").map_or(p.source.len(), |i| at + i);
        p.source[at..end].to_string()
    };
    let (s1, s2) = (body(k1), body(k2));
    assert!(s1.contains("mi::load8_pol(in0 + base") && s1.contains(", mi_once);"), "{s1}");
    assert!(s1.contains("mi::store8_pol(out0 + base") && s1.contains(", mi_keep);"), "{s1}");
    assert!(s2.contains("mi::load8(in0 + base") && s2.contains("mi::store_n<8>(out0 + base"), "{s2}");
    assert!(!s2.contains("_pol("), "{s2}");
}

#[test]
fn loop_free_kernels_prefetch_their_inputs_before_the_wait() {
    // Every kernel waits for the previous grid first (dependent launch); a loop-free one first
    // asks L2 for its input tiles, so that their latency overlaps that grid's drain, and lets
    // the next kernel go at once.
    let before_wait = |src: &str| {
        let head = &src[..src.find("mi::dep_enter();").expect("the wait")];
        head.matches("mi::prefetch_l2(").count()
    };
    let lora = zoo::lora(16, 256, 4096, 16, 64, 1, DType::Float16).expect("zoo");
    let src = kernel_source(&lora.ugraph);
    assert_eq!(before_wait(&src), 4, "one prefetch loop per input: {src}");
    assert!(src.contains("mi::prefetch_l2(in1 + base + (i / 64) * 4096 + (i % 64));"), "W's tile: {src}");
    let ntrans = zoo::ntrans(8, 4096, DType::Float16).expect("zoo");
    let src = kernel_source(&ntrans.ugraph);
    assert_eq!(before_wait(&src), 3, "{src}");
}

#[test]
fn a_streaming_loop_prefetches_its_first_stages_and_lets_the_next_kernel_go_after_its_last_copies() {
    // RMSNorm + Linear, 16 iterations in 4 stages: before its wait the kernel asks L2 for the
    // three stages its prologue copies (X's and W's tiles of iterations 0, 1, 2), and it lets
    // the next kernel be scheduled in iteration 12, right after the copies of iteration 15.
    let rl = zoo::rmsnorm_linear(2, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&rl.ugraph);
    let wait = src.find("mi::dep_wait();").unwrap_or_else(|| panic!("the wait: {src}"));
    assert!(!src.contains("mi::dep_enter();"), "{src}");
    let stages = src.matches("pipeline stage(s)").count();
    assert_eq!(stages, 1, "{src}");
    assert!(src.contains("4 pipeline stage(s)"), "{src}");
    let head = &src[..wait];
    assert_eq!(head.matches("mi::prefetch_l2(").count(), 6, "two tiles, three stages: {src}");
    for it in 0..3 {
        assert!(head.contains(&format!("(long long)({it}) * 1048576LL;")), "W's tile of iteration {it}: {head}");
    }
    let body = loop_body(&src);
    let copies = body.rfind("mi::cp_async_commit();").expect("the loop's copies");
    let launch = body.find("if (it == 12) mi::dep_launch();").unwrap_or_else(|| panic!("{body}"));
    assert!(copies < launch, "{body}");
    assert_eq!(src.matches("mi::dep_launch();").count(), 1, "{src}");
}

#[test]
fn small_attention_grids_split_the_loop_across_a_cluster() {
    // Two blocks of 8 iterations: on sm_90 the loop is split over clusters of four blocks
    // along the free grid axis y (2 iterations each, their key tiles along y), the partial
    // results merged into each cluster's first block through distributed shared memory,
    // which alone goes on; on sm_80, and where the grid already fills the GPU, no clusters.
    let small = Attn { s: 2048, splits: 1, frange: 8, ..attn() };
    let g = zoo::attention_online(small, DType::Float16).expect("zoo").ugraph;
    let p = generate(&g, &Options::for_arch(90)).expect("generates");
    let k = p.kernels.iter().find(|k| k.name.contains("customized")).expect("a customized kernel");
    assert_eq!((k.grid, k.cluster), ([2, 4, 1], [1, 4, 1]));
    let src = kernel_source(&g);
    assert!(src.contains("forloop_range 2,"), "{src}");
    assert!(src.contains("(long long)blockIdx.y * 32768LL"), "K and V tiles of 256 keys: {src}");
    assert!(src.contains("fa.finish<4>(") && src.contains(", mi_fa_remote);"), "{src}");
    let exit = src.find("if (mi::cluster_rank() != 0) return;").expect("other blocks leave");
    assert!(src[exit..].contains("-> output 0"), "the first block saves: {src}");
    let p80 = generate(&g, &Options::for_arch(80)).expect("generates");
    assert!(p80.kernels.iter().all(|k| k.cluster == [1; 3] && k.grid[1] == 1));
    let wide = Attn { b: 80, ..small };
    let g = zoo::attention_online(wide, DType::Float16).expect("zoo").ugraph;
    let p = generate(&g, &Options::for_arch(90)).expect("generates");
    assert!(p.kernels.iter().all(|k| k.cluster == [1; 3]), "{}", p.launch_summary());
}

#[test]
fn cluster_splits_shrink_until_the_gathered_partials_fit() {
    // One block of 128 rows by 4096 keys in 16 iterations: the rule's clusters of eight would
    // gather 8 x 128 rows of partials (264 KiB) in the first block, more than an sm_90 block
    // may have, so the loop is split over four blocks instead, whose partials fit.
    let one = Attn { b: 1, h: 128, s: 4096, splits: 1, frange: 16, ..attn() };
    let g = zoo::attention_online(one, DType::Float16).expect("zoo").ugraph;
    let p = generate(&g, &Options::for_arch(90)).expect("generates");
    let k = p.kernels.iter().find(|k| k.name.contains("customized")).expect("a customized kernel");
    assert_eq!((k.grid, k.cluster), ([4, 1, 1], [4, 1, 1]), "{}", p.launch_summary());
    assert!(k.smem_bytes <= mirage_codegen::Target::sm90().smem_per_block_optin, "{}", p.launch_summary());
    let src = kernel_source(&g);
    assert!(src.contains("fa.finish<4>(") && src.contains(", mi_fa_remote);"), "{src}");
}

#[test]
fn loads_outside_the_pipeline_are_all_in_flight_before_the_first_wait() {
    // LoRA without a loop (the bench's winner): X, W, A and B are copied before anything
    // reads them, so their copies go out together (not one round trip per input), W (the
    // largest) last: X A and (X A) B are computed while it lands, and only X W waits for it.
    // Every tile is read only by tile matmuls, so it is copied unpadded and swizzled (whole
    // 32-byte sectors per copy).
    let dt = DType::Float16;
    let shapes: [&[usize]; 4] = [&[8, 256], &[256, 4096], &[256, 16], &[16, 4096]];
    let mut g = KernelGraph::new();
    let v: Vec<_> = shapes.iter().map(|d| g.new_input(d, dt, None).expect("input")).collect();
    let mut tb = BlockGraph::new([64, 1, 1], [256, 1, 1], 1, 64).expect("block graph");
    let none = [-1, -1, -1];
    let tx = tb.new_input(shapes[0], dt, none, -1).expect("x");
    let tw = tb.new_input(shapes[1], dt, [1, -1, -1], -1).expect("w");
    let ta = tb.new_input(shapes[2], dt, none, -1).expect("a");
    let tbm = tb.new_input(shapes[3], dt, [1, -1, -1], -1).expect("b");
    let xw = tb.matmul(tx, tw).expect("xw");
    let xa = tb.matmul(tx, ta).expect("xa");
    let xab = tb.matmul(xa, tbm).expect("xab");
    let out = tb.binary(BinaryOp::Add, xw, xab).expect("add");
    tb.new_output(out, [1, -1, -1], -1).expect("output");
    let o = g.customized(&v, tb).expect("customized");
    g.mark_output(o[0], None).expect("output");
    let src = kernel_source(&g);
    let first_wait = src.find("mi::cp_async_wait<").expect("a wait");
    assert_eq!(src[..first_wait].matches("mi::cp_async_commit();").count(), 4, "{src}");
    let pos = |pat: &str| src.find(pat).unwrap_or_else(|| panic!("{pat} in {src}"));
    assert!(pos("// input 2 -> t2") < pos("// input 1 -> t1"), "{src}");
    assert_eq!(first_wait, pos("mi::cp_async_wait<1>();"), "{src}");
    let (xa, w_wait, xw) = (pos("(t0, t2, mi_scratch"), pos("mi::cp_async_wait<0>();"), pos("(t0, t1, mi_scratch"));
    assert!(first_wait < xa && xa < w_wait && w_wait < xw, "{src}");
    assert_eq!(src.matches("mi::cp_async_wait<").count(), 2, "{src}");
    for (t, inner) in [(0, 256), (1, 64), (2, 16), (3, 64)] {
        assert!(src.contains(&format!("t{t} + mi::swz<{inner}, 8>(i)")), "t{t} swizzled: {src}");
    }
    assert!(src.contains("mi::matmul_tile<NT, 1, 8, 64, 256, 256, 64, true, true>(t0, t1,"), "{src}");
}

#[test]
fn the_epilogue_runs_in_registers_and_its_finishes_need_no_barrier_between() {
    // RMSNorm + Linear after the loop: the matmul's and the rms accumulator's finishes use
    // separate scratch, so no barrier sits between them; the [32, 32] output tile has eight
    // elements for each of the 128 threads, so the division by the rms is computed in
    // registers and stored 16 bytes at a time, with no tile of its own.
    let pair = zoo::rmsnorm_linear(32, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let after = &src[src.find("mi::cp_async_wait<0>();").expect("the final wait")..];
    let mm = after.find(".finish(").expect("the matmul's finish");
    let rs = mm + 1 + after[mm + 1..].find(".finish(").expect("the rms finish");
    assert!(!after[mm..rs].contains("__syncthreads()"), "{after}");
    assert!(after.contains("// fused element-wise -> output 0"), "{after}");
    assert!(after.contains("mi::store_n<8>(out0 + base + (i8 / 32) * 4096 + (i8 % 32), v, vec);"), "{after}");
    assert!(!after.contains("fused element-wise -> t"), "{after}");
    assert_eq!(after.matches("__syncthreads()").count(), 2, "{after}");
}

#[test]
fn a_cluster_split_pushes_the_sums_into_its_first_block_which_alone_waits() {
    // RMSNorm + Linear on 8 blocks of 16 iterations: on sm_90 each loop is split across a
    // cluster. After the loop every block but the first stores its matmul tile and its sums of
    // squares into the first block's receive area and leaves; the first block waits for them
    // on the cluster barrier (whose first phase, arrived at the start, orders the pushes after
    // every block has started), adds them, and only then takes the rms (a square root of the
    // whole sum, not of each block's part). The receive area overlaps none of the stages: a
    // block may push while the first one still loops. (The gathering merge,
    // `Options::lazy_merge` off; the lazy one, the default, is the next test's.)
    let pair = zoo::rmsnorm_linear(4, 1024, 512, 8, 16, DType::Float16).expect("zoo");
    let eager = Options { lazy_merge: false, async_push: false, ..Options::for_arch(90) };
    let p = generate(&pair.ugraph, &eager).expect("generates");
    let k = p.kernels.iter().find(|k| k.cluster != [1; 3]).unwrap_or_else(|| panic!("{}", p.launch_summary()));
    let src = kernel_source_with(&pair.ugraph, &eager);
    let loop_at = src.find("for (int it = 0;").expect("a loop");
    assert!(src[..loop_at].contains("mi::cluster_arrive_relaxed();"), "{src}");
    let after = &src[src.rfind("mi::cp_async_wait<0>();").expect("the final wait")..];
    assert!(!after.contains("mi::cluster_sync();") && !after.contains("mi::cluster_sum<"), "{after}");
    let pos = |pat: &str| after.find(pat).unwrap_or_else(|| panic!("{pat} in {after}"));
    let (started, others, pushes) = (
        pos("mi::cluster_wait(); // every block"),
        pos("if (mi::cluster_rank() != 0) {"),
        pos("mi::cluster_push<NT>("),
    );
    let (left, gathers, root) =
        (pos("mi::cluster_arrive_release();\n    return;"), pos("mi::cluster_gather<NT, "), pos("sqrtf("));
    assert!(started < others && others < pushes && pushes < left && left < gathers && gathers < root, "{after}");
    assert_eq!(after.matches("mi::cluster_push<NT>(").count(), 2, "{after}");
    assert_eq!(after.matches("mi::cluster_gather<NT, ").count(), 2, "{after}");
    assert_eq!(after[..pushes].matches(".finish(").count(), after.matches(".finish(").count(), "{after}");
    // Every stage's bytes, against the receive area's (its slots: the [4, 64] tile, the 4 sums).
    let cs = k.cluster.iter().product::<u32>() as usize;
    let num = |t: &str| t.trim().parse::<usize>().unwrap_or_else(|_| panic!("`{t}` in {src}"));
    let at = pos("mi_recv = reinterpret_cast<float*>(mi_smem + ") + 45;
    let recv = num(after[at..].split(')').next().unwrap_or(""));
    let recv_end = recv + (cs - 1) * (4 * 64 + 4) * 4;
    assert!(recv_end <= k.smem_bytes, "{recv_end} > {}: {src}", k.smem_bytes);
    let body = loop_body(&src);
    let stages = num(src.split(" pipeline stage").next().and_then(|h| h.rsplit(", ").next()).unwrap_or(""));
    let mut tiles = 0;
    for line in src[..loop_at].lines().filter(|l| l.contains("_st = reinterpret_cast<")) {
        let name = line.split("* const ").nth(1).and_then(|r| r.split(' ').next()).expect("a stage tile");
        let off = num(line.split("mi_smem + ").nth(1).and_then(|r| r.split(')').next()).unwrap_or(""));
        let at = body.find(&format!("{name} + (it % {stages}) * ")).unwrap_or_else(|| panic!("{name}: {body}"));
        let stride = num(body[at..].split(" * ").nth(1).and_then(|r| r.split(';').next()).unwrap_or(""));
        let end = off + stride * 2 * stages;
        assert!(end <= recv || off >= recv_end, "{name} [{off}, {end}) meets [{recv}, {recv_end}): {src}");
        tiles += 1;
    }
    assert_eq!(tiles, 2, "{src}");
}

#[test]
fn a_lazy_cluster_merge_adds_the_other_blocks_sums_where_the_epilogue_reads_them() {
    // `Options::lazy_merge`: RMSNorm + Linear split across clusters as above, but the first
    // block neither gathers the pushed sums nor takes the rms in passes of their own: its
    // epilogue reads each element as its own sum plus the receive area's, and the rms as the
    // root of the summed squares over the row. Gated MLP likewise, without a division. The
    // default.
    let lazy = Options::for_arch(90);
    for (pair, divided) in [
        (zoo::rmsnorm_linear(4, 1024, 512, 8, 16, DType::Float16).expect("zoo"), true),
        (zoo::gated_mlp(4, 1024, 512, 8, 16, DType::Float16).expect("zoo"), false),
    ] {
        let p = generate(&pair.ugraph, &lazy).expect("generates");
        let start = p.source.find("// block graph:").expect("kernels");
        let src = &p.source[start..];
        assert!(src.contains("mi::cluster_push_async<NT>("), "{src}");
        assert!(!src.contains("mi::cluster_gather<") && !src.contains("] = sqrtf("), "{src}");
        assert_eq!(src.matches("float* const mi_recv = ").count(), 1, "{src}");
        let epilogue = &src[src.find("mi::mbar_wait(mi_merge_bar, 0);").expect("the wait")..];
        assert!(epilogue.contains(" + mi_recv["), "{epilogue}");
        assert_eq!(epilogue.contains("sqrtf(("), divided, "{epilogue}");
        // Without it, the gathering merge.
        let eager = Options { lazy_merge: false, ..Options::for_arch(90) };
        let eager = generate(&pair.ugraph, &eager).expect("generates").source;
        assert!(eager.contains("mi::cluster_gather<"), "{eager}");
    }
}

#[test]
fn a_cluster_merge_pushes_with_st_async_onto_an_mbarrier_of_the_first_block() {
    // `Options::async_push` (the default): the other blocks send their tiles with st.async
    // completing on an mbarrier after the first block's receive area (initialised by one
    // thread before the barrier's first phase, which the pushes wait for); the first block
    // arms it with every slot's bytes and waits on it alone: no cluster barrier after the
    // start, no release arrival.
    let pair = zoo::rmsnorm_linear(4, 1024, 512, 8, 16, DType::Float16).expect("zoo");
    let p = generate(&pair.ugraph, &Options::for_arch(90)).expect("generates");
    let k = p.kernels.iter().find(|k| k.cluster != [1; 3]).unwrap_or_else(|| panic!("{}", p.launch_summary()));
    let cs = k.cluster.iter().product::<u32>() as usize;
    let src = kernel_source(&pair.ugraph);
    let pos = |pat: &str| src.find(pat).unwrap_or_else(|| panic!("{pat} in {src}"));
    let num = |t: &str| t.trim().trim_end_matches('u').parse::<usize>().unwrap_or_else(|_| panic!("`{t}` in {src}"));
    let after = |pat: &str| num(src[pos(pat) + pat.len()..].split(')').next().unwrap_or(""));
    let (init, started, loop_at) = (
        pos("if (mi::cluster_rank() == 0 && tid == 0) mi::cluster_merge_init(mi_merge_bar);"),
        pos("mi::cluster_arrive_relaxed(); // its merge"),
        pos("for (int it = 0;"),
    );
    assert!(init < started && started < loop_at, "{src}");
    // The mbarrier sits right after the slots ([4, 64] tile and 4 sums a block), in bounds.
    let (recv, bar) = (
        after("mi_recv = reinterpret_cast<float*>(mi_smem + "),
        after("mi_merge_bar = reinterpret_cast<unsigned long long*>(mi_smem + "),
    );
    let slot = 4 * 64 + 4;
    assert_eq!(bar, recv + (cs - 1) * slot * 4, "{src}");
    assert!(bar % 8 == 0 && bar + 8 <= k.smem_bytes, "{bar} of {}: {src}", k.smem_bytes);
    assert_eq!(src.matches("mi::cluster_push_async<NT>(").count(), 2, "{src}");
    assert_eq!(after("mi::cluster_merge_arm(mi_merge_bar, "), (cs - 1) * slot * 4, "{src}");
    let merge = &src[pos("mi::cluster_wait(); // every block")..];
    let (pushes, left, armed, waited) = (
        pos("mi::cluster_push_async<NT>(t"),
        pos("mi::cluster_push_async<NT>(t")
            + src[pos("mi::cluster_push_async<NT>(t")..].find("return;").unwrap_or(usize::MAX),
        pos("if (tid == 0) mi::cluster_merge_arm("),
        pos("mi::mbar_wait(mi_merge_bar, 0);"),
    );
    assert!(pushes < left && left < armed && armed < waited, "{src}");
    assert!(!merge.contains("mi::cluster_arrive") && !merge.contains("mi::cluster_push<"), "{merge}");
    assert_eq!(merge.matches("mi::cluster_wait();").count(), 1, "{merge}");
}

#[test]
fn an_epilogue_reads_whole_rows_16_bytes_at_a_time_and_a_row_divisor_once() {
    // The same epilogue (acc / rms over [32, 32] tiles, eight elements a thread): the
    // accumulator tile is read as two float4 (one float at a time, a warp's reads were 8-way
    // bank conflicts), the row's rms once, and the division multiplies by its reciprocal.
    let pair = zoo::rmsnorm_linear(32, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let epi = &src[src.find("// fused element-wise -> output 0").expect("the epilogue")..];
    assert!(epi.contains("float x0[8];\n      mi::load_f32_n<8>(x0, t"), "{epi}");
    assert!(epi.contains("const float x1 = t") && epi.contains("[(i8 / 32)];"), "{epi}");
    assert!(epi.contains("const float x1_rcp = 1.0f / x1;"), "{epi}");
    assert!(epi.contains("(r0 * x1_rcp)") && !epi.contains(" / r1"), "{epi}");
}

#[test]
fn an_epilogue_with_four_elements_a_thread_stores_them_together() {
    // [16, 32] output tiles (512 elements, 128 threads): four elements a thread, computed in
    // registers and stored 8 bytes at a time, with no tile of their own.
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("mi::store_n<4>(out0 + base + (i4 / 32) * 4096 + (i4 % 32), v, vec);"), "{src}");
    assert!(!src.contains("fused element-wise -> t"), "{src}");
}

#[test]
fn an_epilogue_with_fewer_than_four_elements_a_thread_keeps_its_tile_pass() {
    // [8, 32] output tiles (256 elements, 128 threads): all threads take part, one element
    // a time, through a tile.
    let pair = zoo::rmsnorm_linear(8, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    assert!(src.contains("fused element-wise -> t"), "{src}");
    assert!(!src.contains("fused element-wise -> output"), "{src}");
}

#[test]
fn copies_issued_before_a_loop_land_before_its_first_barrier() {
    // Q's rows normalised by an rms accumulator over a loop of one iteration (a QK-norm
    // candidate): Q is copied before the loop, which stages nothing, so its copies are waited
    // for before the barrier at the top of the loop, not after it (the threads would read
    // each other's rows before they land: rms 0, inf out).
    let dt = DType::Float16;
    let mut g = KernelGraph::new();
    let q = g.new_input(&[16, 256, 64], dt, None).expect("input");
    let mut tb = BlockGraph::new([8, 16, 1], [128, 1, 1], 1, 64).expect("block graph");
    let tq = tb.new_input(&[16, 256, 64], dt, [0, 1, -1], -1).expect("q");
    let rms = tb.forloop_accum(tq, Accum::Rms).expect("rms");
    let out = tb.binary(BinaryOp::Div, tq, rms).expect("div");
    tb.new_output(out, [0, 1, -1], -1).expect("output");
    let o = g.customized(&[q], tb).expect("customized");
    g.mark_output(o[0], None).expect("output");
    let src = kernel_source(&g);
    let body = loop_body(&src);
    let wait = body.find("mi::cp_async_wait<0>();").expect("a wait in the loop");
    let barrier = body.find("__syncthreads();").expect("a barrier in the loop");
    assert!(wait < barrier, "{body}");
    assert!(body.find("row_sums").expect("the row sums") > barrier, "{body}");
}

#[test]
fn warpgroup_products_run_beside_the_iterations_other_steps() {
    // RMSNorm + Linear, 32 rows, 64 columns a block, on the warpgroup tensor cores: the
    // iteration issues the products first (`mm.issue`), computes the rms row sums while they
    // run, and waits for them at its end, before the next iteration's copies overwrite a stage.
    // The block graph as a user's program gives it, the rms sums before the matmul: the
    // products move ahead of them.
    let wg = Options { wgmma_acc: true, ..Options::for_arch(90) };
    let dt = DType::Float16;
    let mut g = KernelGraph::new();
    let x = g.new_input(&[32, 4096], dt, None).expect("x");
    let w = g.new_input(&[4096, 4096], dt, None).expect("w");
    let mut tb = BlockGraph::new([64, 1, 1], [128, 1, 1], 16, 64).expect("block graph");
    let tx = tb.new_input(&[32, 4096], dt, [-1, -1, -1], 1).expect("x tile");
    let tw = tb.new_input(&[4096, 4096], dt, [1, -1, -1], 0).expect("w tile");
    let rms = tb.forloop_accum(tx, Accum::Rms).expect("rms");
    let xw = tb.matmul(tx, tw).expect("matmul");
    let sum = tb.forloop_accum(xw, Accum::None).expect("sum");
    let out = tb.binary(BinaryOp::Div, sum, rms).expect("div");
    tb.new_output(out, [1, -1, -1], -1).expect("output");
    let o = g.customized(&[x, w], tb).expect("customized");
    g.mark_output(o[0], None).expect("output");
    let src = kernel_source_with(&g, &wg);
    assert!(src.contains("mi::MmaAccWG<"), "{src}");
    let body = loop_body(&src);
    let issue = body.find(".issue(t0, t1);").expect("the products issued");
    let sums = body.find("rs2.step(t0);").expect("the row sums");
    let wait = body.rfind(".wait();").expect("the products waited for");
    assert!(issue < sums && sums < wait, "{body}");
    assert!(body[wait..].lines().skip(1).all(|l| l.trim().is_empty()), "the wait ends the iteration: {body}");
    assert!(!body.contains(".step(t0, t1);"), "{body}");
    // Gated MLP's two warpgroup products: one chain in flight at a time.
    let pair = zoo::gated_mlp(16, 1024, 512, 8, 4, DType::Float16).expect("zoo");
    let body = loop_body(&kernel_source_with(&pair.ugraph, &wg)).to_string();
    let calls: Vec<&str> =
        body.lines().map(str::trim).filter(|l| l.contains(".issue(") || l.contains(".wait();")).collect();
    assert_eq!(calls.len(), 4, "{body}");
    for pair in calls.chunks(2) {
        let acc = pair[0].split('.').next().unwrap_or_default();
        assert!(pair[0].contains(".issue(") && pair[1] == format!("{acc}.wait();"), "{body}");
    }
    // Without the warpgroup form the warp accumulator steps synchronously, as before.
    let src = kernel_source(&zoo::rmsnorm_linear(32, 4096, 4096, 64, 16, DType::Float16).expect("zoo").ugraph);
    let body = loop_body(&src);
    assert!(body.contains(".step(t0, t1);") && !body.contains(".issue(") && !body.contains(".wait()"), "{body}");
}
