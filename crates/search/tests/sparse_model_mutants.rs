//! Sparse mutants of the model suite's programs (`benches/gpu/model_suite.py`: norm + QKV,
//! norm + gate/up, the whole SwiGLU MLP, a projection, LoRA, decode attention, QK-norm
//! attention with weights) at small shapes, dims that are not powers of two included: the
//! search's winner of each (fused, but for the projection: a predefined matmul) is accepted by
//! every-element coverage, and each of its six
//! sparse mutants (`mirage_verify::mutants`: one element, row, column, tile, the tail tile, a
//! tile boundary) is rejected, with the evidence inside the changed box.

mod common;

use common::{best, describe, launches};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{BinaryOp, DType, KernelGraph, TensorId, UnaryOp};
use mirage_verify::mutants;

const DT: DType = DType::Float16;
const EPS: f32 = 1e-5;

fn inputs(g: &mut KernelGraph, shapes: &[&[usize]]) -> Vec<TensorId> {
    shapes.iter().map(|s| g.new_input(s, DT, None).expect("input")).collect()
}

fn norm(g: &mut KernelGraph, x: TensorId, k: usize, w: TensorId) -> TensorId {
    g.rms_norm_eps(x, &[k], Some(w), EPS).expect("rms_norm")
}

fn finish(mut g: KernelGraph, out: TensorId) -> KernelGraph {
    g.mark_output(out, None).expect("output");
    g
}

/// `rms_norm(x, w) @ W`: the input norm and the QKV projection.
fn qkv(m: usize, k: usize, n: usize) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k], &[k, n]]);
    let y = norm(&mut g, v[0], k, v[1]);
    let z = g.matmul(y, v[2]).expect("matmul");
    finish(g, z)
}

/// `silu(xn @ Wg) * (xn @ Wu)` with `xn = rms_norm(x, w)`: the post-attention norm and gate/up.
fn gate_up(m: usize, k: usize, n: usize) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k], &[k, n], &[k, n]]);
    let xn = norm(&mut g, v[0], k, v[1]);
    let a = g.matmul(xn, v[2]).expect("matmul");
    let a = g.unary(UnaryOp::Silu, a).expect("silu");
    let b = g.matmul(xn, v[3]).expect("matmul");
    let h = g.binary(BinaryOp::Mul, a, b).expect("mul");
    finish(g, h)
}

/// `(silu(x @ Wg) * (x @ Wu)) @ Wd`: the whole SwiGLU MLP.
fn mlp(m: usize, k: usize, n: usize) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k, n], &[k, n], &[n, k]]);
    let a = g.matmul(v[0], v[1]).expect("matmul");
    let a = g.unary(UnaryOp::Silu, a).expect("silu");
    let b = g.matmul(v[0], v[2]).expect("matmul");
    let h = g.binary(BinaryOp::Mul, a, b).expect("mul");
    let y = g.matmul(h, v[3]).expect("matmul");
    finish(g, y)
}

/// `x @ W`: the output or down projection.
fn projection(m: usize, k: usize, n: usize) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k, n]]);
    let y = g.matmul(v[0], v[1]).expect("matmul");
    finish(g, y)
}

/// `x @ W + (x @ A) @ B`: a LoRA-adapted projection.
fn lora(m: usize, k: usize, n: usize, rank: usize) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k, n], &[k, rank], &[rank, n]]);
    let base = g.matmul(v[0], v[1]).expect("matmul");
    let xa = g.matmul(v[0], v[2]).expect("matmul");
    let ab = g.matmul(xa, v[3]).expect("matmul");
    let y = g.binary(BinaryOp::Add, base, ab).expect("add");
    finish(g, y)
}

/// `softmax(q @ k) @ v` over `heads` KV heads of `rows` query rows (GQA folded), optionally
/// with `q` and `v` RMS-normed with weights (QK-norm as the suite writes it).
fn attention(heads: usize, rows: usize, d: usize, keys: usize, qknorm: bool) -> KernelGraph {
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[heads, rows, d], &[heads, d, keys], &[heads, keys, d]]);
    let (mut q, mut val) = (v[0], v[2]);
    if qknorm {
        let w = inputs(&mut g, &[&[d], &[d]]);
        q = norm(&mut g, q, d, w[0]);
        val = norm(&mut g, val, d, w[1]);
    }
    let s = g.matmul(q, v[1]).expect("matmul");
    let p = g.softmax(s, -1).expect("softmax");
    let o = g.matmul(p, val).expect("matmul");
    finish(g, o)
}

/// Searches `reference`, then checks the six sparse mutants of its winner.
fn check(name: &str, reference: &KernelGraph, attention: bool) {
    // The attention preset's block-op limit; its searches stop after 20 s with what they
    // found (the mutants need a winner, not the best one).
    let cfg = if attention {
        SearchConfig {
            max_block_ops: 13,
            franges: Some(vec![1, 4, 16, 32, 64]),
            time_budget: Some(std::time::Duration::from_secs(20)),
            ..SearchConfig::default()
        }
    } else {
        SearchConfig::default()
    };
    let r = superoptimize(reference, &cfg).expect("search runs");
    let g = best(&r).graph.clone();
    eprintln!("{name}: searched in {:.1} s", r.stats.elapsed.as_secs_f64());
    let outcomes = mutants::check_pair(reference, &g, name).expect("mutants build and check");
    assert_eq!(outcomes.len(), 6, "{name}");
    for m in &outcomes {
        assert!(m.sound(), "{m:?} (winner {})", describe(&g));
    }
    let sampled = outcomes.iter().filter(|m| m.sampled_accepted).count();
    eprintln!("{name}: {} launches, 6 sparse mutants rejected ({sampled} accepted by sampling)", launches(&g));
}

macro_rules! model_case {
    ($name:ident, $graph:expr, $attention:expr) => {
        #[test]
        fn $name() {
            check(stringify!($name), &$graph, $attention);
        }
    };
}

model_case!(norm_qkv, qkv(8, 256, 192), false);
model_case!(norm_gate_up, gate_up(4, 256, 344), false);
model_case!(swiglu_mlp, mlp(8, 128, 344), false);
model_case!(down_projection, projection(8, 344, 128), false);
model_case!(lora_rank_16, lora(8, 128, 192, 16), false);
model_case!(decode_attention, attention(2, 4, 64, 320, false), true);
model_case!(qknorm_attention_with_weights, attention(2, 4, 32, 128, true), true);
