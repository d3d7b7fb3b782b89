//! Every element-wise unary op of the registry (docs/ops.md) reaches the search: for
//! `op(X W)` the search finds a one-kernel candidate applying the op in its block graph, so
//! the generator tries the op and its abstract-expression term matches the reference's.

mod common;

use common::{best, describe, kernels, launches};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{BlockOpKind, DType, KernelGraph, UNARY_OPS};

#[test]
fn every_registry_op_is_fused_after_a_matmul() {
    for d in UNARY_OPS {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[16, 256], DType::Float16, None).expect("input");
        let w = g.new_input(&[256, 256], DType::Float16, None).expect("input");
        let mm = g.matmul(x, w).expect("matmul");
        let y = g.unary(d.op, mm).expect("unary");
        g.mark_output(y, None).expect("output");
        let r = superoptimize(&g, &SearchConfig::default()).expect("search runs");
        best(&r);
        let fused = r.candidates.iter().any(|c| {
            launches(&c.graph) == 1
                && kernels(&c.graph).iter().any(|bg| bg.ops.iter().any(|o| o.kind == BlockOpKind::Unary { op: d.op }))
        });
        let found: Vec<String> = r.candidates.iter().map(|c| describe(&c.graph)).collect();
        assert!(fused, "{}: no one-kernel candidate applies the op: {found:?}", d.name);
    }
}
