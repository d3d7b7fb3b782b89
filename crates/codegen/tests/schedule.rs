//! Generated block kernels as text, without a GPU: a few whole kernels compared with golden
//! sources (`tests/golden/`; `MIRAGE_BLESS=1 cargo test -p mirage-codegen --test schedule`
//! rewrites them after a deliberate change of the emitted code), and the order of statements
//! that emission decides (barriers, copy waits, prefetches, L2 policies, warpgroup issues).
//! The plans' decisions (stages, layouts, accumulators, attention variants, clusters, merges,
//! epilogues) are tested on the plans themselves (`block_kernel/plan_tests.rs`).

use std::path::PathBuf;

use mirage_codegen::{generate, Options};
use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph};

/// The source of the first customized kernel of `g` for sm_90.
fn kernel_source(g: &KernelGraph) -> String {
    kernel_source_with(g, &Options::for_arch(90))
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

/// Attention with 64 heads of 64 over 1024 keys, 4 KV splits of 4 iterations.
fn attn() -> Attn {
    Attn { b: 2, h: 64, d: 64, s: 1024, splits: 4, frange: 4, qsplit: 1 }
}

/// The body of the kernel's for-loop.
fn loop_body(src: &str) -> &str {
    let start = src.find("for (int it = 0;").expect("a for-loop");
    let end = src[start..].find("\n  }\n").map_or(src.len(), |i| start + i);
    &src[start..end]
}

/// Compares `kernel` with the golden source `tests/golden/<name>.cu` (written instead with
/// `MIRAGE_BLESS=1`), naming the first line that differs.
fn golden(name: &str, kernel: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.cu"));
    let text = format!("{kernel}\n}}\n");
    if std::env::var("MIRAGE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the golden folder");
        std::fs::write(&path, &text).expect("the golden source written");
        return;
    }
    let want =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (MIRAGE_BLESS=1 writes it)", path.display()));
    if want != text {
        let (n, (w, g)) = want
            .lines()
            .chain(std::iter::repeat(""))
            .zip(text.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (w, g))| w != g)
            .unwrap_or((0, ("", "")));
        panic!("{name}: line {} differs from {}\n  golden: {w}\n  now:    {g}\n(MIRAGE_BLESS=1 rewrites it after a deliberate change)", n + 1, path.display());
    }
}

/// The LoRA block graph without a loop (the bench's winner): X, W, A and B loaded, X W plus
/// (X A) B.
fn lora_without_a_loop() -> KernelGraph {
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
    g
}

#[test]
fn golden_rmsnorm_linear_streaming_loop() {
    // 16 iterations in 4 stages: L2 prefetches of the first three stages before the wait,
    // 16-byte copies with evict_first on W, one barrier an iteration, register accumulators,
    // the next kernel let go after the last copies.
    let pair = zoo::rmsnorm_linear(2, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    golden("rmsnorm_linear_2x4096x4096_sm90", &kernel_source(&pair.ugraph));
}

#[test]
fn golden_rmsnorm_linear_cluster_merge() {
    // A loop split over clusters of eight: the other blocks push their sums with st.async
    // onto the first block's mbarrier and leave; the first reads them where its epilogue does.
    let pair = zoo::rmsnorm_linear(4, 1024, 512, 8, 16, DType::Float16).expect("zoo");
    golden("rmsnorm_linear_4x1024x512_cluster_sm90", &kernel_source(&pair.ugraph));
}

#[test]
fn golden_attention_on_warpgroup_tensor_cores() {
    // `mi::FlashWG` with K read a step ahead; each iteration waits, fences the copies for the
    // async proxy and syncs once.
    let g = zoo::attention_online(attn(), DType::Float16).expect("zoo").ugraph;
    golden("attention_online_sm90", &kernel_source(&g));
}

#[test]
fn golden_qknorm_attention_with_the_lookahead() {
    // Q normalised before the loop while the first stage is in flight; V normalised in place,
    // the next stage a part after each block's P V.
    let a = Attn { s: 2048, ..attn() };
    let g = zoo::qknorm_attention_online(a, DType::Float16).expect("zoo").ugraph;
    golden("qknorm_attention_online_2048_sm90", &kernel_source(&g));
}

#[test]
fn golden_lora_without_a_loop() {
    // Every load in flight before the first wait, W (the largest) last and waited for only by
    // X W; X A and (X A) B computed while it lands.
    golden("lora_no_loop_sm90", &kernel_source(&lora_without_a_loop()));
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

#[test]
fn an_epilogue_reads_whole_rows_16_bytes_at_a_time_and_a_row_divisor_once() {
    // acc / rms over [32, 32] tiles, eight elements a thread: the accumulator tile is read as
    // two float4, the row's rms once, and the division multiplies by its reciprocal.
    let pair = zoo::rmsnorm_linear(32, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    let src = kernel_source(&pair.ugraph);
    let epi = &src[src.find("// fused element-wise -> output 0").expect("the epilogue")..];
    assert!(epi.contains("float x0[8];\n      mi::load_f32_n<8>(x0, t"), "{epi}");
    assert!(epi.contains("const float x1_rcp = 1.0f / x1;"), "{epi}");
    assert!(epi.contains("(r0 * x1_rcp)") && !epi.contains(" / r1"), "{epi}");
}

#[test]
fn rms_norms_of_staged_16_bit_tiles_keep_rows_in_registers() {
    // QK-norm attention op by op: V's norm in the loop reads, scales and writes whole 16-bit
    // rows 16 bytes at a time, not element by element.
    let src = kernel_source(&zoo::attention(attn(), true, DType::Float16).expect("zoo").ugraph);
    let body = loop_body(&src);
    assert!(body.contains("mi::rms_norm_rows_vec<NT, 64, 64, 72, 72, mi::f16>("), "{body}");
    assert!(!body.contains("mi::rms_norm_rows<"), "{body}");
}
