//! Gated MLP (silu(X W1) * (X W2), X 16x4096, W 4096x4096): one kernel accumulating both
//! matmuls in one loop, silu and the product after it.

mod common;

use common::{accumulators, best, describe, is_post, kernels, launches, producer};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{zoo, Accum, BinaryOp, BlockOpKind, DType, UnaryOp};

#[test]
fn finds_one_kernel_with_both_matmuls_in_one_loop_at_paper_shape() {
    let pair = zoo::gated_mlp(16, 4096, 4096, 64, 32, DType::Float16).expect("zoo builds");
    let r = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    eprintln!("gated_mlp 16x4096x4096: {:?}", r.stats);
    let c = best(&r);
    let g = &c.graph;
    assert_eq!(launches(g), 1, "not one kernel: {}", describe(g));
    let bg = kernels(g)[0];
    assert!(bg.forloop_range > 1, "no for-loop: {}", describe(g));
    let mm_accs = accumulators(bg)
        .iter()
        .filter(|(a, t)| *a == Accum::None && matches!(producer(bg, *t), BlockOpKind::Matmul))
        .count();
    assert_eq!(mm_accs, 2, "both matmuls must accumulate in the loop: {}", describe(g));
    let silu = bg.ops.iter().find(|o| matches!(o.kind, BlockOpKind::Unary { op: UnaryOp::Silu })).expect("silu");
    assert!(is_post(bg, silu.inputs[0]), "silu runs after the loop: {}", describe(g));
    let mul = bg.ops.iter().find(|o| matches!(o.kind, BlockOpKind::Binary { op: BinaryOp::Mul })).expect("mul");
    assert!(mul.inputs.iter().all(|&t| is_post(bg, t)), "the product runs after the loop: {}", describe(g));
    assert_eq!(r.stats.verification_failed, 0, "the index-aware axioms admit no wrong candidate here");
}
