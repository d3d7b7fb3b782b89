//! Theorem 1 of the paper, checked on the zoo: a µGraph equivalent to its reference under the
//! axioms is never pruned. Every prefix of each zoo µGraph's block graphs (hence every tensor it
//! computes) has its abstract expression in the reference's saturated e-graph, and the final
//! output is in the target's e-class. Also: known-wrong µGraphs are pruned.

use mirage_search::expr::{block_terms, kernel_terms, output_terms, Expr, TermBuilder};
use mirage_search::labels::{analyze, propagate};
use mirage_search::{ExprOracle, SearchConfig};
use mirage_ugraph::{zoo, Accum, BinaryOp, BlockGraph, DType, KernelGraph, KernelOpKind, UnaryOp};

/// Checks every prefix of every block graph of `p.ugraph`; returns the number of terms checked.
fn check_pair(p: &zoo::Pair) -> usize {
    let cfg = SearchConfig::default();
    let info = analyze(&p.reference).expect("labels");
    let oracle = ExprOracle::with_labels(&p.reference, &info, &cfg.sum_factors(), &cfg.saturation).expect("oracle");
    assert!(!oracle.report().limit_hit, "{}: saturation hit a limit: {:?}", p.name, oracle.report());
    let input_labels: Vec<_> = p.reference.input_ids().iter().map(|&t| info.tensors[t].clone()).collect();
    let labels = propagate(&p.ugraph, &input_labels).expect("µGraph labels");
    let mut b = TermBuilder::new();
    let kt = kernel_terms(&mut b, &p.ugraph, &labels).expect("kernel terms");
    let mut checked = 0;
    for (oi, op) in p.ugraph.ops.iter().enumerate() {
        let KernelOpKind::Customized { graph } = &op.kind else { continue };
        let ins: Vec<_> = op.inputs.iter().map(|&t| kt[t]).collect();
        let bl = labels.blocks[oi].as_ref().expect("block labels");
        let bt = block_terms(&mut b, graph, bl, &ins).expect("block terms");
        // Prefix k of the op list defines exactly the tensors of its first k ops, so checking
        // each op's outputs in order checks every prefix.
        for (k, bop) in graph.ops.iter().enumerate() {
            for &t in &bop.outputs {
                let term = b.term(bt[t].unwrap_or_else(|| panic!("{}: op {k} has no term", p.name)));
                assert!(oracle.contains(&term), "{}: prefix of {} ops is pruned: tensor {t} = {term}", p.name, k + 1);
                checked += 1;
            }
        }
    }
    for (i, &t) in p.ugraph.output_ids().iter().enumerate() {
        let term = b.term(kt[t].expect("output term"));
        assert_eq!(
            oracle.class_of(&term),
            Some(oracle.targets()[i]),
            "{}: output {i} = {term} is not the target",
            p.name
        );
    }
    checked
}

#[test]
fn every_prefix_of_every_paper_ugraph_survives_pruning() {
    for b in [1, 8] {
        for p in zoo::paper_workloads(b).expect("zoo builds") {
            assert!(check_pair(&p) > 0, "{}", p.name);
        }
    }
}

#[test]
fn every_prefix_of_small_zoo_ugraphs_survives_pruning() {
    let f = DType::Float32;
    let attn = zoo::Attn { b: 2, h: 8, d: 16, s: 256, splits: 4, frange: 4, qsplit: 1 };
    for p in [
        zoo::rmsnorm_linear(8, 256, 128, 4, 16, f).expect("zoo"),
        zoo::gated_mlp(4, 128, 96, 4, 4, f).expect("zoo"),
        zoo::lora(4, 64, 128, 8, 4, 4, f).expect("zoo"),
        zoo::attention(attn, false, f).expect("zoo"),
        zoo::attention(attn, true, f).expect("zoo"),
        zoo::ntrans(3, 64, f).expect("zoo"),
    ] {
        assert!(check_pair(&p) > 0, "{}", p.name);
    }
}

fn gated_variant(wrong: impl Fn(&mut BlockGraph, usize, usize, usize) -> usize) -> (zoo::Pair, KernelGraph) {
    let dt = DType::Float16;
    let pair = zoo::gated_mlp(16, 4096, 4096, 64, 32, dt).expect("zoo");
    let mut g = KernelGraph::new();
    let v: Vec<_> =
        [[16, 4096], [4096, 4096], [4096, 4096]].iter().map(|d| g.new_input(d, dt, None).expect("input")).collect();
    let mut tb = BlockGraph::new([64, 1, 1], [128, 1, 1], 32, 64).expect("tb");
    let x = tb.new_input(&[16, 4096], dt, [-1, -1, -1], 1).expect("x");
    let w1 = tb.new_input(&[4096, 4096], dt, [1, -1, -1], 0).expect("w1");
    let w2 = tb.new_input(&[4096, 4096], dt, [1, -1, -1], 0).expect("w2");
    let out = wrong(&mut tb, x, w1, w2);
    tb.new_output(out, [1, -1, -1], -1).expect("output");
    let o = g.customized(&v, tb).expect("customized");
    g.mark_output(o[0], None).expect("mark");
    (pair, g)
}

fn output_class(pair: &zoo::Pair, g: &KernelGraph) -> (bool, bool) {
    let cfg = SearchConfig::default();
    let info = analyze(&pair.reference).expect("labels");
    let oracle = ExprOracle::with_labels(&pair.reference, &info, &cfg.sum_factors(), &cfg.saturation).expect("oracle");
    let input_labels: Vec<_> = pair.reference.input_ids().iter().map(|&t| info.tensors[t].clone()).collect();
    let labels = propagate(g, &input_labels).expect("labels");
    let term = output_terms(g, &labels).expect("terms").remove(0);
    (oracle.contains(&term), oracle.class_of(&term) == Some(oracle.targets()[0]))
}

#[test]
fn silu_on_the_wrong_accumulator_is_not_the_target() {
    let (pair, g) = gated_variant(|tb, x, w1, w2| {
        let m1 = tb.matmul(x, w1).expect("mm");
        let m2 = tb.matmul(x, w2).expect("mm");
        let a1 = tb.forloop_accum(m1, Accum::None).expect("acc");
        let a2 = tb.forloop_accum(m2, Accum::None).expect("acc");
        let s = tb.unary(UnaryOp::Silu, a2).expect("silu");
        tb.binary(BinaryOp::Mul, s, a1).expect("mul")
    });
    assert_eq!(output_class(&pair, &g), (false, false));
}

#[test]
fn product_of_sums_is_not_a_sum_of_products() {
    // silu((Σ_k x) (Σ_k w1)) * ...: equal to the target only under the size-only sum-of-product
    // axiom; the index-aware axiom rejects it.
    let (pair, g) = gated_variant(|tb, x, w1, w2| {
        let sx = tb.forloop_accum(x, Accum::Sum).expect("sum x");
        let r1 = tb.reduction(w1, 0).expect("sum w1");
        let a1 = tb.forloop_accum(r1, Accum::None).expect("acc");
        let p = tb.binary(BinaryOp::Mul, sx, a1).expect("mul");
        let m2 = tb.matmul(x, w2).expect("mm");
        let a2 = tb.forloop_accum(m2, Accum::None).expect("acc");
        let s = tb.unary(UnaryOp::Silu, p).expect("silu");
        tb.binary(BinaryOp::Mul, s, a2).expect("mul")
    });
    assert_eq!(output_class(&pair, &g), (false, false));
}

#[test]
fn reference_terms_read_as_expected() {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo");
    let info = analyze(&pair.reference).expect("labels");
    let input_labels: Vec<_> = pair.reference.input_ids().iter().map(|&t| info.tensors[t].clone()).collect();
    let labels = propagate(&pair.reference, &input_labels).expect("labels");
    let terms = output_terms(&pair.reference, &labels).expect("terms");
    assert_eq!(terms[0].to_string(), "(sum @1 4096 (* (/ x0 (rms @1 4096 x0)) x1))");
    let parsed: egg::RecExpr<Expr> = terms[0].to_string().parse().expect("terms print and parse back");
    assert_eq!(parsed.to_string(), terms[0].to_string());
}
