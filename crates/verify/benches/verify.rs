//! Verification time per candidate at the paper's shapes, on one core: a fresh check (reference
//! and candidate evaluated), a check through a prepared [`Verifier`] whose reference samples are
//! cached (the search's steady state: candidate cost only), and the rejection of a wrong
//! candidate (the common case in a search).

use criterion::{criterion_group, criterion_main, Criterion};
use mirage_ugraph::{zoo, BinaryOp, BlockOpKind, KernelGraph, KernelOpKind};
use mirage_verify::{equivalent, Options, Verifier};

/// The µGraph with its last block-level binary op changed (div <-> mul, add <-> sub): a wrong
/// candidate of the same shapes.
fn wrong_candidate(g: &KernelGraph) -> KernelGraph {
    let mut m = g.clone();
    if let Some(graph) = m.ops.iter_mut().rev().find_map(|op| match &mut op.kind {
        KernelOpKind::Customized { graph } => Some(graph),
        _ => None,
    }) {
        if let Some(op) = graph.ops.iter_mut().rev().find_map(|o| match &mut o.kind {
            BlockOpKind::Binary { op } => Some(op),
            _ => None,
        }) {
            *op = match *op {
                BinaryOp::Div => BinaryOp::Mul,
                BinaryOp::Mul => BinaryOp::Div,
                BinaryOp::Add => BinaryOp::Sub,
                _ => BinaryOp::Add,
            };
        }
    }
    m.revalidate().expect("the edit keeps shapes")
}

fn bench(c: &mut Criterion) {
    rayon::ThreadPoolBuilder::new().num_threads(1).build_global().ok();
    let pairs = zoo::paper_workloads(1).unwrap();
    let mut group = c.benchmark_group("verify");
    group.sample_size(10);
    for p in pairs.iter().filter(|p| ["gqa", "rmsnorm_linear", "gated_mlp", "qknorm_gqa"].contains(&p.name.as_str())) {
        let field_only = Options { float_check: false, ..Options::default() };
        group.bench_function(format!("{}/fresh", p.name), |b| {
            b.iter(|| assert!(equivalent(&p.reference, &p.ugraph, &field_only).unwrap().is_equivalent()))
        });
        group.bench_function(format!("{}/fresh+float", p.name), |b| {
            b.iter(|| equivalent(&p.reference, &p.ugraph, &Options::default()).unwrap())
        });
        let v = Verifier::new(&p.reference, field_only.clone()).unwrap();
        group.bench_function(format!("{}/cached_reference", p.name), |b| {
            b.iter(|| assert!(v.check(&p.ugraph).unwrap().is_equivalent()))
        });
        let wrong = wrong_candidate(&p.ugraph);
        group.bench_function(format!("{}/reject", p.name), |b| {
            b.iter(|| assert!(!v.check(&wrong).unwrap().is_equivalent()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
