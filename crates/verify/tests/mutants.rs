//! Mutation test: single-edit mutants of the zoo µGraphs that the f64 float interpreter shows
//! to differ from the reference must all be rejected by the verifier.

mod common;

use std::collections::HashSet;
use std::time::Instant;

use common::*;
use mirage_ugraph::{graph_hash, Accum, BinaryOp, BlockOpKind, KernelGraph, KernelOpKind, UnaryOp};
use mirage_verify::{equivalent, Options, Verdict, VerifyError};

const UNARY: [UnaryOp; 6] =
    [UnaryOp::Exp, UnaryOp::Silu, UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Relu, UnaryOp::MulScalar { scalar: 0.5 }];
const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];
const ACCUM: [Accum; 5] = [Accum::None, Accum::Sum, Accum::Mean, Accum::Rms, Accum::SumToDimx];

/// Every single-edit mutant of one µGraph (before validation), labelled by the edit.
fn mutants(g: &KernelGraph) -> Vec<(String, KernelGraph)> {
    let mut out: Vec<(String, KernelGraph)> = Vec::new();
    let mut push = |what: String, m: Option<KernelGraph>| {
        if let Some(m) = m {
            out.push((what, m));
        }
    };
    for (i, op) in g.ops.iter().enumerate() {
        // Kernel level.
        for a in 0..op.inputs.len() {
            for b in a + 1..op.inputs.len() {
                let mut m = g.clone();
                m.ops[i].inputs.swap(a, b);
                push(format!("k{i} swap operands {a} {b}"), Some(m));
            }
        }
        for k in 0..op.inputs.len() {
            for t in 0..op.outputs.first().copied().unwrap_or(0) {
                if t != op.inputs[k] && g.tensors[t].dims == g.tensors[op.inputs[k]].dims {
                    let mut m = g.clone();
                    m.ops[i].inputs[k] = t;
                    push(format!("k{i} operand {k} -> t{t}"), Some(m));
                }
            }
        }
        match &op.kind {
            KernelOpKind::Unary { op: u } => {
                for v in UNARY.iter().filter(|v| *v != u) {
                    let mut m = g.clone();
                    m.ops[i].kind = KernelOpKind::Unary { op: *v };
                    push(format!("k{i} {} -> {}", u.name(), v.name()), Some(m));
                }
            }
            KernelOpKind::Binary { op: b } => {
                for v in BINARY.iter().filter(|v| *v != b) {
                    let mut m = g.clone();
                    m.ops[i].kind = KernelOpKind::Binary { op: *v };
                    push(format!("k{i} {} -> {}", b.name(), v.name()), Some(m));
                }
            }
            KernelOpKind::Reduction { dim } | KernelOpKind::Softmax { dim } => {
                for d in (0..4).filter(|d| d != dim) {
                    let mut m = g.clone();
                    match &mut m.ops[i].kind {
                        KernelOpKind::Reduction { dim } | KernelOpKind::Softmax { dim } => *dim = d,
                        _ => unreachable!(),
                    }
                    push(format!("k{i} dim -> {d}"), Some(m));
                }
            }
            _ => {}
        }
        if !matches!(op.kind, KernelOpKind::Input { .. }) {
            push(format!("k{i} drop"), drop_kernel_op(g, i));
            push(format!("k{i} duplicate"), duplicate_kernel_op(g, i));
        }
        // Block level.
        let KernelOpKind::Customized { graph: bg } = &op.kind else { continue };
        for r in [1, 2, 4, 8, 16].into_iter().filter(|&r| r != bg.forloop_range) {
            push(format!("k{i} forloop_range -> {r}"), with_block(g, i, |b| b.forloop_range = r));
        }
        for a in 0..3 {
            for n in [1, 2, 4, 8].into_iter().filter(|&n| n != bg.grid_dim[a]) {
                push(format!("k{i} grid[{a}] -> {n}"), with_block(g, i, |b| b.grid_dim[a] = n));
            }
        }
        for x in [4, 8, 16, 32].into_iter().filter(|&x| x != bg.reduction_dimx) {
            push(format!("k{i} reduction_dimx -> {x}"), with_block(g, i, |b| b.reduction_dimx = x));
        }
        for (j, bop) in bg.ops.iter().enumerate() {
            let edit = |f: &dyn Fn(&mut BlockOpKind)| with_block(g, i, |b| f(&mut b.ops[j].kind));
            if bop.inputs.len() >= 2 {
                push(format!("k{i}/b{j} swap operands"), with_block(g, i, |b| b.ops[j].inputs.swap(0, 1)));
            }
            for k in 0..bop.inputs.len() {
                for t in 0..bop.outputs.first().copied().unwrap_or(bg.tensors.len()) {
                    if t != bop.inputs[k] && bg.tensors[t].dims == bg.tensors[bop.inputs[k]].dims {
                        push(format!("k{i}/b{j} operand {k} -> s{t}"), with_block(g, i, |b| b.ops[j].inputs[k] = t));
                    }
                }
            }
            match &bop.kind {
                BlockOpKind::Input { imap, forloop_dim, .. } | BlockOpKind::Output { omap: imap, forloop_dim } => {
                    for a in 0..3 {
                        for v in (-1..4).filter(|v| *v != imap[a]) {
                            push(
                                format!("k{i}/b{j} map[{a}] -> {v}"),
                                edit(&|k| match k {
                                    BlockOpKind::Input { imap, .. } | BlockOpKind::Output { omap: imap, .. } => {
                                        imap[a] = v
                                    }
                                    _ => unreachable!(),
                                }),
                            );
                        }
                    }
                    for v in (-1..4).filter(|v| v != forloop_dim) {
                        push(
                            format!("k{i}/b{j} forloop_dim -> {v}"),
                            edit(&|k| match k {
                                BlockOpKind::Input { forloop_dim, .. } | BlockOpKind::Output { forloop_dim, .. } => {
                                    *forloop_dim = v
                                }
                                _ => unreachable!(),
                            }),
                        );
                    }
                }
                BlockOpKind::Unary { op: u } => {
                    for v in UNARY.iter().chain(&[UnaryOp::MulScalar { scalar: 3.0 }]).filter(|v| *v != u) {
                        push(
                            format!("k{i}/b{j} {} -> {}", u.name(), v.name()),
                            edit(&|k| *k = BlockOpKind::Unary { op: *v }),
                        );
                    }
                }
                BlockOpKind::Binary { op: o } => {
                    for v in BINARY.iter().filter(|v| *v != o) {
                        push(
                            format!("k{i}/b{j} {} -> {}", o.name(), v.name()),
                            edit(&|k| *k = BlockOpKind::Binary { op: *v }),
                        );
                    }
                }
                BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => {
                    for v in ACCUM.iter().filter(|v| *v != acc) {
                        push(
                            format!("k{i}/b{j} accum {acc:?} -> {v:?}"),
                            edit(&|k| match k {
                                BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => {
                                    *acc = *v
                                }
                                _ => unreachable!(),
                            }),
                        );
                    }
                    if matches!(bop.kind, BlockOpKind::ForloopAccum { .. }) {
                        push(format!("k{i}/b{j} accum -> max"), edit(&|k| *k = BlockOpKind::ForloopAccumMax));
                    }
                }
                BlockOpKind::Reduction { dim } | BlockOpKind::ReductionMax { dim } | BlockOpKind::Concat { dim } => {
                    for d in (0..4).filter(|d| d != dim) {
                        push(
                            format!("k{i}/b{j} dim -> {d}"),
                            edit(&|k| match k {
                                BlockOpKind::Reduction { dim }
                                | BlockOpKind::ReductionMax { dim }
                                | BlockOpKind::Concat { dim } => *dim = d,
                                _ => unreachable!(),
                            }),
                        );
                    }
                }
                _ => {}
            }
            if !matches!(bop.kind, BlockOpKind::Input { .. } | BlockOpKind::Output { .. }) {
                let dropped = drop_block_op(bg, j);
                push(format!("k{i}/b{j} drop"), dropped.and_then(|d| with_block(g, i, |b| *b = d)));
                let dup = duplicate_block_op(bg, j);
                push(format!("k{i}/b{j} duplicate"), dup.and_then(|d| with_block(g, i, |b| *b = d)));
                for u in [UnaryOp::Exp, UnaryOp::Square, UnaryOp::Sqrt, UnaryOp::MulScalar { scalar: 2.0 }] {
                    let ins = insert_block_op(bg, j, Some(BlockOpKind::Unary { op: u }));
                    push(format!("k{i}/b{j} insert {}", u.name()), ins.and_then(|d| with_block(g, i, |b| *b = d)));
                }
            }
        }
    }
    out
}

#[test]
fn every_differing_mutant_is_rejected() {
    let start = Instant::now();
    let opts = Options { float_check: false, ..Options::default() };
    let (mut tried, mut kept, mut false_accepts, mut not_lax, mut reshaped) = (0, 0, 0, 0, 0);
    let mut seen: HashSet<String> = HashSet::new();
    let mut failures = Vec::new();
    for pair in small_pairs() {
        let mut kept_here = 0;
        for (what, m) in mutants(&pair.ugraph) {
            tried += 1;
            let Ok(m) = m.revalidate() else { continue };
            let dims = |g: &KernelGraph| g.output_ids().iter().map(|&t| g.tensors[t].dims.clone()).collect::<Vec<_>>();
            if dims(&m) != dims(&pair.reference) {
                reshaped += 1; // an interface change, refused before any test: not counted
                continue;
            }
            if !seen.insert(format!("{}:{}", pair.name, graph_hash(&m))) {
                continue;
            }
            match float_diff(&pair.reference, &m) {
                Some(e) if e > 1e-3 => {}
                _ => continue,
            }
            kept += 1;
            kept_here += 1;
            match equivalent(&pair.reference, &m, &opts) {
                Ok(Verdict::NotEquivalent { .. }) => {}
                Err(VerifyError::NotLax { .. }) => not_lax += 1,
                Ok(v) => {
                    false_accepts += 1;
                    failures.push(format!("{} {what}: {v:?}", pair.name));
                }
                Err(e) => failures.push(format!("{} {what}: error {e}", pair.name)),
            }
        }
        println!("{:<18} {kept_here} differing mutants", pair.name);
    }
    println!(
        "mutants: {tried} edits, {kept} valid and differing, {false_accepts} false accepts ({not_lax} rejected as not LAX, the rest NotEquivalent; {reshaped} valid edits changed an output's dims and are not counted), {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(false_accepts, 0);
    assert!(kept >= 1000, "only {kept} differing mutants");
}
