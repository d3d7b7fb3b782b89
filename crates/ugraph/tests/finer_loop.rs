//! Loops made finer (`BlockGraph::with_finer_loop`): the same ops over more iterations of
//! smaller tiles, which the code generator uses for finer attention pipeline stages.

use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{random_inputs, run, BlockGraph, DType, KernelGraph, KernelOpKind, Tensor};

/// `g` with its first customized op's block graph (the attention loop) made `k` times finer.
fn finer(g: &KernelGraph, k: usize) -> KernelGraph {
    let mut out = g.clone();
    let graph = out
        .ops
        .iter_mut()
        .find_map(|op| match &mut op.kind {
            KernelOpKind::Customized { graph } => Some(graph),
            _ => None,
        })
        .expect("a customized op");
    *graph = graph.with_finer_loop(k).expect("a finer loop");
    out
}

fn rel_err(a: &Tensor<f32>, b: &Tensor<f32>) -> f64 {
    assert_eq!(a.dims, b.dims);
    let num: f64 = a.data.iter().zip(&b.data).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.data.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn first_block_graph(g: &KernelGraph) -> &BlockGraph {
    g.ops
        .iter()
        .find_map(|op| match &op.kind {
            KernelOpKind::Customized { graph } => Some(graph),
            _ => None,
        })
        .expect("a customized op")
}

const A: Attn = Attn { b: 2, h: 16, d: 16, s: 256, splits: 1, frange: 4, qsplit: 1 };

#[test]
fn attention_loops_keep_their_values_with_smaller_tiles() {
    // Online softmax over 64-key tiles against 32- and 16-key ones (running maxima, rescaled
    // sums and P V), with and without Q and V normalised in the loop, one and two kernels.
    let pairs = [
        zoo::attention_one_kernel(A, DType::Float32),
        zoo::qknorm_attention_one_kernel(A, DType::Float32),
        zoo::attention_online(Attn { splits: 2, frange: 2, ..A }, DType::Float32),
        zoo::qknorm_attention_online(Attn { splits: 2, frange: 2, ..A }, DType::Float32),
    ];
    for p in pairs {
        let p = p.expect("zoo");
        let ins = random_inputs(&p.ugraph, 11);
        let want = run(&p.ugraph, &ins).expect("runs");
        for k in [2, 4] {
            let got = run(&finer(&p.ugraph, k), &ins).expect("the finer graph runs");
            for (g, w) in got.iter().zip(&want) {
                let e = rel_err(g, w);
                assert!(e < 1e-5, "{} made {k} times finer: relative error {e}", p.name);
            }
        }
    }
}

#[test]
fn finer_loops_halve_the_loop_tiles_only() {
    let p = zoo::attention_one_kernel(A, DType::Float16).expect("zoo");
    let bg = first_block_graph(&p.ugraph);
    let fine = bg.with_finer_loop(2).expect("a finer loop");
    assert_eq!((fine.forloop_range, fine.grid_dim, fine.block_dim), (8, bg.grid_dim, bg.block_dim));
    assert_eq!(fine.ops.len(), bg.ops.len());
    for (t, u) in bg.tensors.iter().zip(&fine.tensors) {
        assert_eq!(t.phase, u.phase);
        // K [d, 64] -> [d, 32], V [64, d] -> [32, d], S and P [h, 64] -> [h, 32]; Q, the
        // row statistics and everything after the loop keep their shapes.
        let halved: Vec<usize> = t.dims.iter().map(|&d| if d == 64 { 32 } else { d }).collect();
        assert!(u.dims == t.dims || u.dims == halved, "{:?} -> {:?}", t.dims, u.dims);
    }
    assert!(bg.tensors.iter().zip(&fine.tensors).any(|(t, u)| t.dims != u.dims));
}

#[test]
fn a_loop_tile_that_does_not_split_is_an_error() {
    // 256 keys over 4 iterations: 64-key tiles split into at most 64 parts.
    let p = zoo::attention_one_kernel(A, DType::Float16).expect("zoo");
    let bg = first_block_graph(&p.ugraph);
    assert!(bg.with_finer_loop(64).is_ok());
    let err = bg.with_finer_loop(128).expect_err("64 keys do not split 128 ways").to_string();
    assert!(err.contains("forloop_range 512"), "{err}");
}
