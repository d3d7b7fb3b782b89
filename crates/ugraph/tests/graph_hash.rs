//! Structural hashing: independent of tensor ids and build order, sensitive to every parameter.

mod common;

use mirage_ugraph::hash::graph_hash;
use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph, TensorId, UnaryOp};

/// Knobs of a small two-branch graph with one customized op per branch.
#[derive(Clone, Copy)]
struct P {
    swap: bool,
    dim: usize,
    dtype: DType,
    imap_x: i64,
    acc: Accum,
    scalar: f32,
    unary: UnaryOp,
}

const BASE: P =
    P { swap: false, dim: 64, dtype: DType::Float16, imap_x: -1, acc: Accum::None, scalar: 2.0, unary: UnaryOp::Exp };

fn branch(g: &mut KernelGraph, p: P, x: TensorId, w: TensorId) -> TensorId {
    let mut tb = BlockGraph::new([2, 1, 1], [128, 1, 1], 4, 8).unwrap();
    let tx = tb.new_input(&[16, p.dim], p.dtype, [p.imap_x, -1, -1], 1).unwrap();
    let tw = tb.new_input(&[p.dim, 32], p.dtype, [1, -1, -1], 0).unwrap();
    let mm = tb.matmul(tx, tw).unwrap();
    let acc = tb.forloop_accum(mm, p.acc).unwrap();
    let omap = if p.imap_x == 0 { [0, -1, -1] } else { [1, -1, -1] };
    tb.new_output(acc, omap, -1).unwrap();
    g.customized(&[x, w], tb).unwrap()[0]
}

fn build(p: P) -> KernelGraph {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[16, p.dim], p.dtype, None).unwrap();
    let w1 = g.new_input(&[p.dim, 32], p.dtype, None).unwrap();
    let w2 = g.new_input(&[p.dim, 32], p.dtype, None).unwrap();
    let (a, b) = if p.swap {
        let b = g.unary(p.unary, w2).unwrap();
        let b = branch(&mut g, p, x, b);
        let b = g.unary(UnaryOp::MulScalar { scalar: p.scalar }, b).unwrap();
        let a = branch(&mut g, p, x, w1);
        (a, b)
    } else {
        let a = branch(&mut g, p, x, w1);
        let b = g.unary(p.unary, w2).unwrap();
        let b = branch(&mut g, p, x, b);
        let b = g.unary(UnaryOp::MulScalar { scalar: p.scalar }, b).unwrap();
        (a, b)
    };
    let y = g.binary(BinaryOp::Add, a, b).unwrap();
    g.mark_output(y, None).unwrap();
    g
}

#[test]
fn independent_of_build_order_and_ids() {
    let (g1, g2) = (build(BASE), build(P { swap: true, ..BASE }));
    assert_ne!(g1, g2, "the two builds should differ in tensor ids");
    assert_eq!(graph_hash(&g1), graph_hash(&g2));
    assert_eq!(g1.hash().len(), 64);
    assert!(g1.hash().chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn every_parameter_changes_the_hash() {
    let base = build(BASE).hash();
    let variants = [
        ("dim", P { dim: 128, ..BASE }),
        ("dtype", P { dtype: DType::Bfloat16, ..BASE }),
        ("map", P { imap_x: 0, ..BASE }),
        ("accumulator", P { acc: Accum::Sum, ..BASE }),
        ("constant", P { scalar: 3.0, ..BASE }),
        ("op", P { unary: UnaryOp::Silu, ..BASE }),
    ];
    for (what, p) in variants {
        assert_ne!(build(p).hash(), base, "changing the {what} must change the hash");
        assert_eq!(build(P { swap: true, ..p }).hash(), build(p).hash(), "{what}: order independence");
    }
}

#[test]
fn operand_order_output_strides_and_launch_params_matter() {
    let mk = |swap_operands: bool, strides: Option<&[usize]>, loop_range: usize| {
        let mut g = KernelGraph::new();
        let a = g.new_input(&[4, 4], DType::Float32, None).unwrap();
        let b = g.new_input(&[4, 4], DType::Float32, None).unwrap();
        let (l, r) = if swap_operands { (b, a) } else { (a, b) };
        let s = g.binary(BinaryOp::Sub, l, r).unwrap();
        let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], loop_range, 1).unwrap();
        let t = tb.new_input(&[4, 4], DType::Float32, [-1, -1, -1], -1).unwrap();
        let acc = tb.forloop_accum(t, Accum::None).unwrap();
        tb.new_output(acc, [-1, -1, -1], -1).unwrap();
        let o = g.customized(&[s], tb).unwrap()[0];
        g.mark_output(o, strides).unwrap();
        g.hash()
    };
    let base = mk(false, None, 2);
    assert_ne!(mk(true, None, 2), base);
    assert_ne!(mk(false, Some(&[1, 4]), 2), base);
    assert_ne!(mk(false, None, 4), base);
    assert_eq!(mk(false, Some(&[4, 1]), 2), base);
}

#[test]
fn reference_graphs_hash_stably() {
    assert_eq!(common::every_op().hash(), common::every_op().hash());
    assert_ne!(common::every_op().hash(), common::rmsnorm_linear().hash());
}
