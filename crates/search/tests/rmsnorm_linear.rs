//! RMSNorm + Linear (X 16x4096, W 4096x4096): the search rediscovers the paper's one-kernel
//! µGraph — rms accumulated in the matmul's loop, the division after it.

mod common;

use common::{accumulators, best, describe, is_input, is_post, kernels, launches, producer};
use mirage_search::{superoptimize, verify_candidate, SearchConfig, VerifyOptions};
use mirage_ugraph::{run, zoo, Accum, BinaryOp, BlockOpKind, DType, KernelGraph, Tensor};

fn assert_fused_rmsnorm_linear(g: &KernelGraph) {
    assert_eq!(launches(g), 1, "not one kernel: {}", describe(g));
    let bg = kernels(g)[0];
    assert!(bg.forloop_range > 1, "no for-loop: {}", describe(g));
    let acc = accumulators(bg);
    let rms =
        acc.iter().find(|(a, _)| *a == Accum::Rms).unwrap_or_else(|| panic!("no rms accumulator: {}", describe(g)));
    assert!(is_input(bg, rms.1), "rms does not accumulate X tiles: {}", describe(g));
    assert!(
        acc.iter().any(|(a, t)| *a == Accum::None && matches!(producer(bg, *t), BlockOpKind::Matmul)),
        "the matmul is not accumulated in the loop: {}",
        describe(g)
    );
    let div = bg
        .ops
        .iter()
        .find(|o| matches!(o.kind, BlockOpKind::Binary { op: BinaryOp::Div }))
        .unwrap_or_else(|| panic!("no division: {}", describe(g)));
    assert!(div.inputs.iter().all(|&t| is_post(bg, t)), "the division is not after the loop: {}", describe(g));
}

/// Deterministic inputs of `g`: element `i` of input `k` is `((7i + 13k) mod 17 - 8) / div + shift`.
fn patterned_inputs(g: &KernelGraph, div: f32, shift: f32) -> Vec<Tensor<f32>> {
    g.input_ids()
        .iter()
        .enumerate()
        .map(|(k, &t)| {
            let dims = g.tensors[t].dims.clone();
            let n: usize = dims.iter().product();
            let data = (0..n).map(|i| (((i * 7 + k * 13) % 17) as f32 - 8.0) / div + shift).collect();
            Tensor::new(dims, data).expect("dims match")
        })
        .collect()
}

#[test]
fn finds_one_kernel_with_rms_in_the_matmul_loop_at_paper_shape() {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo builds");
    let r = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    eprintln!("rmsnorm_linear 16x4096x4096: {:?}", r.stats);
    let c = best(&r);
    assert_fused_rmsnorm_linear(&c.graph);
    assert!(!r.stats.saturation.limit_hit, "saturation hit a limit: {:?}", r.stats.saturation);
    assert!(r.stats.pruned_by_expression > 0);
    assert!(r.stopped.is_none());
    // Every candidate kept is either checked and right, or unchecked; the best is checked again
    // on more boxes of the paper-sized output (inputs generated lazily).
    let more = VerifyOptions { trials: 6, seed: 99, ..VerifyOptions::default() };
    assert!(verify_candidate(&pair.reference, &c.graph, &more).passed());
}

#[test]
fn found_graph_computes_the_reference_values_on_the_cpu() {
    // Small enough that one tile holds a whole row; franges {4} keeps the loop form.
    let pair = zoo::rmsnorm_linear(8, 256, 128, 4, 4, DType::Float32).expect("zoo builds");
    let cfg = SearchConfig { franges: Some(vec![4]), ..SearchConfig::default() };
    let r = superoptimize(&pair.reference, &cfg).expect("search runs");
    let c = best(&r);
    assert_fused_rmsnorm_linear(&c.graph);
    let inputs = patterned_inputs(&pair.reference, 8.0, 0.05);
    let want = run(&pair.reference, &inputs).expect("reference runs");
    let got = run(&c.graph, &inputs).expect("candidate runs");
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.dims, g.dims);
        for (x, y) in w.data.iter().zip(&g.data) {
            assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
}

/// Distinct structures (loop ranges of the customized kernels, predefined kernel count) among
/// the candidates that were checked and passed.
fn verified_structures(r: &mirage_search::SearchResult) -> std::collections::HashSet<(Vec<usize>, usize)> {
    r.candidates
        .iter()
        .filter(|c| c.verification.passed())
        .map(|c| {
            let franges = kernels(&c.graph).iter().map(|bg| bg.forloop_range).collect();
            (franges, launches(&c.graph) - kernels(&c.graph).len())
        })
        .collect()
}

#[test]
fn spread_verification_spans_structures() {
    // With few verification slots, the default order spends them on launch shapes of the
    // model's favourite structure; `spread` (for a GPU that times the verified set) first
    // checks the cheapest candidate of each structure, e.g. the two-kernel and other-loop forms.
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 16, DType::Float16).expect("zoo builds");
    let run = |spread: bool| {
        let verify = VerifyOptions { top_n: 4, spread, ..VerifyOptions::default() };
        superoptimize(&pair.reference, &SearchConfig { verify, ..SearchConfig::default() }).expect("search runs")
    };
    let (plain, spread) = (run(false), run(true));
    let (a, b) = (verified_structures(&plain), verified_structures(&spread));
    assert!(b.len() > a.len(), "spread verified {b:?}, the default {a:?}");
    // Both choose the same best candidate by the model (the cheapest is always checked first).
    assert_eq!(best(&plain).hash, best(&spread).hash);
}

#[test]
fn with_eps_the_fused_form_carries_the_reference_eps() {
    let eps = 0.5f32; // large against mean(x^2) of the data below, so a dropped eps shows
    let pair = zoo::rmsnorm_linear_eps(8, 256, 128, 4, 4, DType::Float32, eps).expect("zoo builds");
    let cfg = SearchConfig { franges: Some(vec![4]), ..SearchConfig::default() };
    let r = superoptimize(&pair.reference, &cfg).expect("search runs");
    let c = best(&r);
    assert_fused_rmsnorm_linear(&c.graph);
    assert!(c.verification.passed(), "{:?}", c.verification);
    let bg = kernels(&c.graph)[0];
    let rms_eps: Vec<f32> = bg
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            BlockOpKind::ForloopAccum { acc: Accum::Rms, eps } | BlockOpKind::RmsNorm { eps } => Some(eps),
            _ => None,
        })
        .collect();
    assert_eq!(rms_eps, vec![eps], "{}", describe(&c.graph));
    let inputs = patterned_inputs(&pair.reference, 16.0, 0.0);
    let want = run(&pair.reference, &inputs).expect("reference runs");
    let got = run(&c.graph, &inputs).expect("candidate runs");
    for (x, y) in want[0].data.iter().zip(&got[0].data) {
        assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
    }
    // Every candidate that passed verification carries the same eps in its norms.
    for cand in r.candidates.iter().filter(|c| c.verification.passed()) {
        for bg in kernels(&cand.graph) {
            for o in &bg.ops {
                if let BlockOpKind::ForloopAccum { acc: Accum::Rms, eps: e } | BlockOpKind::RmsNorm { eps: e } = o.kind
                {
                    assert_eq!(e, eps, "{}", describe(&cand.graph));
                }
            }
        }
    }
}

#[test]
fn an_unfused_rms_norm_keeps_the_references_eps() {
    // With no customized kernel allowed, the only plans are the reference's own kernels: the
    // rms_norm the search emits must carry the reference's eps (else no candidate computes it).
    let mut g = KernelGraph::new();
    let x = g.new_input(&[8, 64], DType::Float16, None).expect("input");
    let w = g.new_input(&[64], DType::Float16, None).expect("input");
    let wl = g.new_input(&[64, 32], DType::Float16, None).expect("input");
    let xn = g.rms_norm_eps(x, &[64], Some(w), 1e-5).expect("rms_norm");
    let y = g.matmul(xn, wl).expect("matmul");
    g.mark_output(y, None).expect("output");
    let cfg = SearchConfig { max_customized_ops: 0, ..SearchConfig::default() };
    let r = superoptimize(&g, &cfg).expect("search runs");
    let c = best(&r);
    assert!(verify_candidate(&g, &c.graph, &VerifyOptions::default()).passed(), "{}", describe(&c.graph));
    let eps: Vec<f32> = c
        .graph
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            mirage_ugraph::KernelOpKind::RmsNorm { eps, .. } => Some(eps),
            _ => None,
        })
        .collect();
    assert_eq!(eps, vec![1e-5], "{}", describe(&c.graph));
}
