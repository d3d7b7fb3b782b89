//! Thread graphs: element-wise fusion of block graphs and per-element evaluation.

mod common;

use mirage_ugraph::thread::{fuse_elementwise, ThreadGraph, ThreadOp};
use mirage_ugraph::{run, Accum, BinaryOp, BlockGraph, DType, KernelGraph, Tensor, UnaryOp};

/// e = exp(silu(a) * b), tiles saved every iteration.
fn silu_mul_exp() -> BlockGraph {
    let mut tb = BlockGraph::new([2, 1, 1], [128, 1, 1], 2, 1).unwrap();
    let a = tb.new_input(&[8, 16], DType::Float32, [0, -1, -1], 1).unwrap();
    let b = tb.new_input(&[8, 16], DType::Float32, [0, -1, -1], 1).unwrap();
    let s = tb.unary(UnaryOp::Silu, a).unwrap();
    let m = tb.binary(BinaryOp::Mul, s, b).unwrap();
    let e = tb.unary(UnaryOp::Exp, m).unwrap();
    tb.new_output(e, [0, -1, -1], 1).unwrap();
    tb
}

#[test]
fn silu_mul_exp_fuses_into_one_group() {
    let tb = silu_mul_exp();
    let groups = fuse_elementwise(&tb);
    assert_eq!(groups.len(), 1, "{groups:?}");
    let grp = &groups[0];
    assert_eq!(grp.ops, vec![2, 3, 4]);
    assert_eq!(grp.inputs, vec![0, 1]);
    assert_eq!(grp.output, 4);
    assert_eq!(grp.thread_graph.num_inputs, 2);
    assert!(grp.thread_graph.validate().is_ok());

    let mut g = KernelGraph::new();
    let x = g.new_input(&[8, 16], DType::Float32, None).unwrap();
    let y = g.new_input(&[8, 16], DType::Float32, None).unwrap();
    g.customized(&[x, y], tb).unwrap();
    let xs: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) / 37.0).collect();
    let ys: Vec<f32> = (0..128).map(|i| ((i * 7) % 19) as f32 / 11.0 - 0.8).collect();
    let out = run(&g, &[Tensor::new(vec![8, 16], xs.clone()).unwrap(), Tensor::new(vec![8, 16], ys.clone()).unwrap()])
        .unwrap();
    for i in 0..128 {
        let v = grp.thread_graph.eval(&[xs[i], ys[i]]);
        assert_eq!(v.to_bits(), out[0].data[i].to_bits(), "element {i}: {v} vs {}", out[0].data[i]);
    }
}

#[test]
fn shared_or_reshaped_intermediates_break_groups() {
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 1).unwrap();
    let a = tb.new_input(&[4, 8], DType::Float32, [-1, -1, -1], -1).unwrap();
    let r = tb.new_input(&[4, 1], DType::Float32, [-1, -1, -1], -1).unwrap();
    let s = tb.unary(UnaryOp::Exp, a).unwrap(); // two consumers: its own group
    let m = tb.binary(BinaryOp::Mul, s, s).unwrap();
    let q = tb.unary(UnaryOp::Sqrt, r).unwrap(); // [4,1] feeding a [4,8] result: not fused
    let d = tb.binary(BinaryOp::Div, m, q).unwrap();
    let t = tb.binary(BinaryOp::Add, d, s).unwrap();
    let acc = tb.forloop_accum(t, Accum::None).unwrap();
    tb.new_output(acc, [-1, -1, -1], -1).unwrap();
    let groups = fuse_elementwise(&tb);
    let ops: Vec<Vec<usize>> = groups.iter().map(|g| g.ops.clone()).collect();
    assert_eq!(ops, vec![vec![2], vec![3, 5, 6], vec![4]]);
    let main = &groups[1];
    assert_eq!(main.inputs, vec![s, q]);
    let tg = &main.thread_graph;
    assert_eq!(
        tg.ops,
        vec![
            ThreadOp::Binary { op: BinaryOp::Mul, lhs: 0, rhs: 0 },
            ThreadOp::Binary { op: BinaryOp::Div, lhs: 2, rhs: 1 },
            ThreadOp::Binary { op: BinaryOp::Add, lhs: 3, rhs: 0 },
        ]
    );
    assert_eq!(tg.eval(&[3.0f32, 2.0]), 3.0 * 3.0 / 2.0 + 3.0);
    assert!(fuse_elementwise(&common::every_block_op()).iter().all(|g| g.thread_graph.validate().is_ok()));
}

#[test]
fn validate_rejects_forward_references() {
    let tg = ThreadGraph { num_inputs: 1, ops: vec![ThreadOp::Unary { op: UnaryOp::Exp, arg: 1 }] };
    assert!(tg.validate().is_err());
}
