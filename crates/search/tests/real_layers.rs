//! Programs from real model layers at small shapes, dims not powers of two included: each is
//! found in a fused form (structure checked) and the found µGraph computes the reference's
//! values on the CPU interpreter.

mod common;

use common::{best, describe, kernels, launches};
use mirage_search::{superoptimize, verify_candidate, SearchConfig, SearchResult, VerifyOptions};
use mirage_ugraph::{random_inputs, run, BinaryOp, BlockGraph, BlockOpKind, DType, KernelGraph};

fn search(reference: &KernelGraph, name: &str) -> (SearchResult, KernelGraph) {
    let t = std::time::Instant::now();
    let r = superoptimize(reference, &SearchConfig::default()).expect("search runs");
    eprintln!("{name}: {:.2} s, {:?}", t.elapsed().as_secs_f64(), r.stats);
    let g = best(&r).graph.clone();
    eprintln!("{name}: best {} ({:?})", describe(&g), best(&r).verification);
    assert_same_values(reference, &g, name);
    (r, g)
}

fn assert_same_values(reference: &KernelGraph, g: &KernelGraph, name: &str) {
    let inputs = random_inputs(reference, 0x5eed);
    let want = run(reference, &inputs).expect("reference runs");
    let got = run(g, &inputs).expect("found µGraph runs");
    for (w, o) in want.iter().zip(&got) {
        let num: f64 = w.data.iter().zip(&o.data).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = w.data.iter().map(|a| (*a as f64).powi(2)).sum();
        assert!((num / den).sqrt() < 1e-4, "{name}: relative error {} on the CPU", (num / den).sqrt());
    }
}

/// Whether a block op of `bg` multiplies a tile by a tile of input `k` (as a block input).
fn input_of(bg: &BlockGraph, k: usize) -> usize {
    bg.ops.iter().filter(|o| matches!(o.kind, BlockOpKind::Input { .. })).nth(k).expect("input exists").outputs[0]
}

fn rms_weight_linear(m: usize, k: usize, n: usize, dtype: DType) -> KernelGraph {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[m, k], dtype, None).expect("input");
    let w = g.new_input(&[k], dtype, None).expect("input");
    let wo = g.new_input(&[k, n], dtype, None).expect("input");
    let y = g.rms_norm(x, &[k], Some(w)).expect("rms_norm");
    let z = g.matmul(y, wo).expect("matmul");
    g.mark_output(z, None).expect("output");
    g
}

fn assert_weight_in_block_graph(g: &KernelGraph) {
    assert_eq!(launches(g), 1, "not one kernel: {}", describe(g));
    let bg = kernels(g)[0];
    let w = input_of(bg, 1);
    assert_eq!(bg.tensors[w].dims.len(), 2, "the weight is not read as a [1, k] tile: {}", describe(g));
    let mul = bg
        .ops
        .iter()
        .find(|o| matches!(o.kind, BlockOpKind::Binary { op: BinaryOp::Mul }) && o.inputs.contains(&w))
        .unwrap_or_else(|| panic!("the weight is not applied in the block graph: {}", describe(g)));
    let prod = mul.outputs[0];
    assert!(
        bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::Matmul) && o.inputs.contains(&prod)),
        "x*w does not feed the matmul: {}",
        describe(g)
    );
    assert!(
        bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::Binary { op: BinaryOp::Div })),
        "no division by the row rms: {}",
        describe(g)
    );
}

#[test]
fn rms_norm_with_weight_then_linear_is_one_kernel_bf16() {
    let g = rms_weight_linear(8, 256, 256, DType::Bfloat16);
    let (_, best) = search(&g, "rms_norm(weight) @ W bf16 8x256x256");
    assert_weight_in_block_graph(&best);
}

#[test]
fn rms_norm_with_weight_then_linear_is_one_kernel_at_odd_dims() {
    let g = rms_weight_linear(7, 400, 300, DType::Float16);
    let (_, best) = search(&g, "rms_norm(weight) @ W fp16 7x400x300");
    assert_weight_in_block_graph(&best);
}

fn input(g: &mut KernelGraph, dims: &[usize], dtype: DType) -> usize {
    g.new_input(dims, dtype, None).expect("input")
}

#[test]
fn lora_chain_is_fused() {
    // (X @ A) @ B at odd dims: one customized kernel must exist among the candidates.
    let d = DType::Float16;
    let mut g = KernelGraph::new();
    let (x, a, b) = (input(&mut g, &[7, 400], d), input(&mut g, &[400, 16], d), input(&mut g, &[16, 300], d));
    let xa = g.matmul(x, a).expect("matmul");
    let y = g.matmul(xa, b).expect("matmul");
    g.mark_output(y, None).expect("output");
    let (r, _) = search(&g, "(X@A)@B 7x400x16x300");
    let fused = r.candidates.iter().find(|c| launches(&c.graph) == 1);
    let c = fused.unwrap_or_else(|| panic!("no one-kernel candidate among {}", r.candidates.len()));
    let bg = kernels(&c.graph)[0];
    assert_eq!(bg.ops.iter().filter(|o| matches!(o.kind, BlockOpKind::Matmul)).count(), 2, "{}", describe(&c.graph));
    assert!(verify_candidate(&g, &c.graph, &VerifyOptions::default()).passed());
    assert_same_values(&g, &c.graph, "(X@A)@B fused");
}

#[test]
fn matmul_times_scale_is_fused() {
    let d = DType::Float16;
    let mut g = KernelGraph::new();
    let (x, w, s) = (input(&mut g, &[7, 400], d), input(&mut g, &[400, 300], d), input(&mut g, &[1, 300], d));
    let xw = g.matmul(x, w).expect("matmul");
    let y = g.binary(BinaryOp::Mul, xw, s).expect("mul");
    g.mark_output(y, None).expect("output");
    let (r, _) = search(&g, "X@W*s 7x400x300");
    let fused = r.candidates.iter().find(|c| launches(&c.graph) == 1);
    let c = fused.unwrap_or_else(|| panic!("no one-kernel candidate among {}", r.candidates.len()));
    let bg = kernels(&c.graph)[0];
    assert!(
        bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::Binary { op: BinaryOp::Mul })),
        "{}",
        describe(&c.graph)
    );
    assert!(verify_candidate(&g, &c.graph, &VerifyOptions::default()).passed());
    assert_same_values(&g, &c.graph, "X@W*s fused");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "attention search: run with --release")]
fn softmax_of_a_projection_gets_the_online_form() {
    // softmax(X @ Wq @ K^T) @ V in fp16: the plain exp overflows; the winner must be stable.
    let d = DType::Float16;
    let mut g = KernelGraph::new();
    let x = input(&mut g, &[8, 256], d);
    let wq = input(&mut g, &[256, 64], d);
    let kt = input(&mut g, &[64, 128], d);
    let v = input(&mut g, &[128, 64], d);
    let q = g.matmul(x, wq).expect("matmul");
    let s = g.matmul(q, kt).expect("matmul");
    let p = g.softmax(s, 1).expect("softmax");
    let o = g.matmul(p, v).expect("matmul");
    g.mark_output(o, None).expect("output");
    let (r, best) = search(&g, "softmax(X@Wq@Kt)@V");
    assert_eq!(r.best().map(|c| c.verification.clone()), Some(mirage_search::Verification::Passed));
    assert!(
        kernels(&best).iter().any(|bg| bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::ReductionMax { .. }))),
        "no running max: {}",
        describe(&best)
    );
    assert!(r.stats.online_softmax_rewrites > 0);
}

#[test]
fn gated_mlp_then_down_projection() {
    // silu(X@Wg) * (X@Wu) @ Wd with an intermediate dim that is not a power of two.
    let d = DType::Float16;
    let mut g = KernelGraph::new();
    let x = input(&mut g, &[8, 256], d);
    let (wg, wu, wd) = (input(&mut g, &[256, 344], d), input(&mut g, &[256, 344], d), input(&mut g, &[344, 256], d));
    let gate = g.matmul(x, wg).expect("matmul");
    let gate = g.unary(mirage_ugraph::UnaryOp::Silu, gate).expect("silu");
    let up = g.matmul(x, wu).expect("matmul");
    let h = g.binary(BinaryOp::Mul, gate, up).expect("mul");
    let y = g.matmul(h, wd).expect("matmul");
    g.mark_output(y, None).expect("output");
    let (_, best) = search(&g, "mlp 8x256x344");
    // Gate and up projections in one customized kernel; the down projection after it.
    assert!(launches(&best) <= 2, "{}", describe(&best));
    let bg = kernels(&best)[0];
    let has = |k: fn(&BlockOpKind) -> bool| bg.ops.iter().any(|o| k(&o.kind));
    assert!(has(|k| matches!(k, BlockOpKind::Unary { op: mirage_ugraph::UnaryOp::Silu })), "{}", describe(&best));
    assert!(has(|k| matches!(k, BlockOpKind::Binary { op: BinaryOp::Mul })), "{}", describe(&best));
}
