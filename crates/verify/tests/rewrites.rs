//! Property test: equivalence-preserving rewrites are never rejected. A case picks a workload,
//! a schedule of its µGraph (grid split, for-loop range, key splits), an algebraic variant of
//! the reference program (reassociated matmuls, distributed products, the normalisation moved
//! after the matmul, softmax spelled out), random operand commutations of add/mul at both
//! levels, a dtype and a seed; the verifier must accept.

mod common;

use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{BinaryOp, BlockOpKind, DType, KernelGraph, KernelOpKind, UnaryOp};
use mirage_verify::{equivalent, Options, Verdict};
use proptest::prelude::*;

fn input(g: &mut KernelGraph, dims: &[usize], dt: DType) -> usize {
    g.new_input(dims, dt, None).unwrap()
}

/// Algebraic variants of each reference program (variant 0 is the zoo's).
fn reference_variant(name: &str, v: usize, dt: DType) -> KernelGraph {
    use BinaryOp::*;
    let mut g = KernelGraph::new();
    let out = match name {
        "rmsnorm_linear" => {
            let (x, w) = (input(&mut g, &[4, 32], dt), input(&mut g, &[32, 64], dt));
            match v % 3 {
                0 => {
                    let y = g.rms_norm(x, &[32], None).unwrap();
                    g.matmul(y, w).unwrap()
                }
                v => {
                    // rms = sqrt(sum(x^2) / 32); 1/32 is exact.
                    let sq = g.unary(UnaryOp::Square, x).unwrap();
                    let s = g.reduction(sq, 1).unwrap();
                    let mean = g.unary(UnaryOp::MulScalar { scalar: 1.0 / 32.0 }, s).unwrap();
                    let r = g.unary(UnaryOp::Sqrt, mean).unwrap();
                    if v == 1 {
                        let xw = g.matmul(x, w).unwrap();
                        g.binary(Div, xw, r).unwrap()
                    } else {
                        let y = g.binary(Div, x, r).unwrap();
                        g.matmul(y, w).unwrap()
                    }
                }
            }
        }
        "gated_mlp" => {
            let x = input(&mut g, &[4, 32], dt);
            let (w1, w2) = (input(&mut g, &[32, 64], dt), input(&mut g, &[32, 64], dt));
            let a = g.matmul(x, w1).unwrap();
            let b = g.matmul(x, w2).unwrap();
            let s = g.unary(UnaryOp::Silu, a).unwrap();
            if v.is_multiple_of(2) {
                g.binary(Mul, s, b).unwrap()
            } else {
                g.binary(Mul, b, s).unwrap()
            }
        }
        "lora" => {
            let x = input(&mut g, &[4, 32], dt);
            let w = input(&mut g, &[32, 64], dt);
            let a = input(&mut g, &[32, 8], dt);
            let b = input(&mut g, &[8, 64], dt);
            match v % 4 {
                0 => {
                    let (xw, xa) = (g.matmul(x, w).unwrap(), g.matmul(x, a).unwrap());
                    let xab = g.matmul(xa, b).unwrap();
                    g.binary(Add, xw, xab).unwrap()
                }
                1 => {
                    let ab = g.matmul(a, b).unwrap();
                    let (xw, xab) = (g.matmul(x, w).unwrap(), g.matmul(x, ab).unwrap());
                    g.binary(Add, xab, xw).unwrap()
                }
                2 => {
                    let ab = g.matmul(a, b).unwrap();
                    let wab = g.binary(Add, w, ab).unwrap();
                    g.matmul(x, wab).unwrap()
                }
                _ => {
                    let xa = g.matmul(x, a).unwrap();
                    let xab = g.matmul(xa, b).unwrap();
                    let xw = g.matmul(x, w).unwrap();
                    g.binary(Add, xab, xw).unwrap()
                }
            }
        }
        "attention" => {
            let q = input(&mut g, &[2, 4, 8], dt);
            let k = input(&mut g, &[2, 8, 32], dt);
            let vv = input(&mut g, &[2, 32, 8], dt);
            let a = g.matmul(q, k).unwrap();
            match v % 3 {
                0 => {
                    let p = g.softmax(a, -1).unwrap();
                    g.matmul(p, vv).unwrap()
                }
                1 => {
                    let e = g.unary(UnaryOp::Exp, a).unwrap();
                    let ev = g.matmul(e, vv).unwrap();
                    let l = g.reduction(e, 2).unwrap();
                    g.binary(Div, ev, l).unwrap()
                }
                _ => {
                    let e = g.unary(UnaryOp::Exp, a).unwrap();
                    let l = g.reduction(e, 2).unwrap();
                    let p = g.binary(Div, e, l).unwrap();
                    g.matmul(p, vv).unwrap()
                }
            }
        }
        _ => {
            let shape = [4, 32];
            let (h, x, al) = (input(&mut g, &shape, dt), input(&mut g, &shape, dt), input(&mut g, &shape, dt));
            let hn = g.rms_norm(h, &[32], None).unwrap();
            let t = match v % 3 {
                0 => {
                    let t = g.binary(Add, hn, x).unwrap();
                    let t = g.binary(Mul, al, t).unwrap();
                    g.binary(Add, x, t).unwrap()
                }
                1 => {
                    let (a1, a2) = (g.binary(Mul, al, hn).unwrap(), g.binary(Mul, al, x).unwrap());
                    let t = g.binary(Add, a1, a2).unwrap();
                    g.binary(Add, x, t).unwrap()
                }
                _ => {
                    let (a1, a2) = (g.binary(Mul, al, hn).unwrap(), g.binary(Mul, x, al).unwrap());
                    let t = g.binary(Add, x, a2).unwrap();
                    g.binary(Add, t, a1).unwrap()
                }
            };
            g.rms_norm(t, &[32], None).unwrap()
        }
    };
    g.mark_output(out, None).unwrap();
    g
}

/// The workload's µGraph under schedule choice `s` (grid split, loop range, key splits).
fn ugraph(name: &str, s: (usize, usize, usize), dt: DType) -> KernelGraph {
    let pick = |opts: &[usize], i: usize| opts[i % opts.len()];
    let pair = match name {
        "rmsnorm_linear" => zoo::rmsnorm_linear(4, 32, 64, pick(&[1, 2, 4, 8, 16], s.0), pick(&[1, 2, 4, 8], s.1), dt),
        "gated_mlp" => zoo::gated_mlp(4, 32, 64, pick(&[1, 2, 4, 8], s.0), pick(&[1, 2, 4, 8, 16], s.1), dt),
        "lora" => zoo::lora(4, 32, 64, 8, pick(&[1, 2, 4, 8], s.0), pick(&[1, 2, 4], s.1), dt),
        "attention" => {
            let splits = pick(&[1, 2, 4], s.2);
            let frange = pick(&[1, 2, 4, 8], s.1).min(32 / splits);
            let a = Attn { b: 2, h: 4, d: 8, s: 32, splits, frange, qsplit: 1 };
            if s.0.is_multiple_of(2) {
                zoo::attention(a, false, dt)
            } else {
                zoo::attention_online(a, dt)
            }
        }
        _ => zoo::ntrans(4, 32, dt),
    };
    pair.unwrap().ugraph
}

/// Swaps the operands of the add/mul ops (kernel and block level) whose bit in `mask` is set.
fn commute(g: &KernelGraph, mask: u64) -> KernelGraph {
    let mut m = g.clone();
    let mut bit = 0;
    let mut flip = |inputs: &mut Vec<usize>| {
        if mask >> (bit % 64) & 1 == 1 {
            inputs.swap(0, 1);
        }
        bit += 1;
    };
    for op in m.ops.iter_mut() {
        match &mut op.kind {
            KernelOpKind::Binary { op: BinaryOp::Add | BinaryOp::Mul } => flip(&mut op.inputs),
            KernelOpKind::Customized { graph } => {
                for bop in graph.ops.iter_mut() {
                    if matches!(bop.kind, BlockOpKind::Binary { op: BinaryOp::Add | BinaryOp::Mul }) {
                        flip(&mut bop.inputs);
                    }
                }
            }
            _ => {}
        }
    }
    m.revalidate().unwrap()
}

const NAMES: [&str; 5] = ["rmsnorm_linear", "gated_mlp", "lora", "attention", "ntrans"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn equivalent_rewrites_are_accepted(
        w in 0..NAMES.len(),
        sched in (0usize..8, 0usize..8, 0usize..8),
        rv in 0usize..4,
        cand_is_variant in any::<bool>(),
        cv in 0usize..4,
        masks in (any::<u64>(), any::<u64>()),
        dt in prop_oneof![Just(DType::Float16), Just(DType::Bfloat16), Just(DType::Float32)],
        seed in any::<u64>(),
    ) {
        let name = NAMES[w];
        let reference = commute(&reference_variant(name, rv, dt), masks.0);
        let cand = if cand_is_variant { reference_variant(name, cv, dt) } else { ugraph(name, sched, dt) };
        let cand = commute(&cand, masks.1);
        let opts = Options { seed, float_check: false, ..Options::default() };
        let v = equivalent(&reference, &cand, &opts);
        prop_assert!(matches!(v, Ok(Verdict::Equivalent { .. })), "{name} rv={rv} sched={sched:?}: {v:?}");
    }
}

#[test]
fn reordered_outputs_are_matched_by_value() {
    // Two outputs of equal shape in swapped order: the identity assignment fails, the swap fits.
    let dt = DType::Float32;
    let build = |swap: bool| {
        let mut g = KernelGraph::new();
        let (x, y) = (input(&mut g, &[4, 8], dt), input(&mut g, &[4, 8], dt));
        let s = g.binary(BinaryOp::Add, x, y).unwrap();
        let p = g.binary(BinaryOp::Mul, x, y).unwrap();
        let (a, b) = if swap { (p, s) } else { (s, p) };
        g.mark_output(a, None).unwrap();
        g.mark_output(b, None).unwrap();
        g
    };
    let v = equivalent(&build(false), &build(true), &Options::default()).unwrap();
    assert!(matches!(&v, Verdict::Equivalent { assignment, .. } if assignment == &vec![1, 0]), "{v:?}");
}
