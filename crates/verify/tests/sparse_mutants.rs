//! Sparse mutants: candidates that differ from the reference in one element, one row, one
//! column, one tile, the tail tile or one column at a tile boundary, and nowhere else. Every-
//! element coverage must reject all of them; the fused µGraphs must still be accepted.
//!
//! Construction: both graphs add to the zoo program's output a delta assembled by a block graph
//! that concatenates input pieces (a 3x3 partition of the output's last two dims around the
//! chosen box). The mutant scales the box's piece by 2 inside that block graph, so its float
//! result differs exactly on the box (checked with the f64 interpreter).

mod common;

use common::{float_inputs, small_pairs};
use mirage_ugraph::zoo::Pair;
use mirage_ugraph::{run, BinaryOp, BlockGraph, DType, KernelGraph, UnaryOp};
use mirage_verify::sample::tiles;
use mirage_verify::{Coverage, Options, Verdict};

/// A box of the last two dims of an output: rows `[r0, r1)`, columns `[c0, c1)`.
#[derive(Debug, Clone, Copy)]
struct Boxed {
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// `[0, n)` cut at `a` and `b`: the non-empty pieces `(start, len, is_middle)`.
fn cuts(n: usize, a: usize, b: usize) -> Vec<(usize, usize, bool)> {
    [(0, a, false), (a, b - a, true), (b, n - b, false)].into_iter().filter(|p| p.1 > 0).collect()
}

/// `base` with its first output replaced by `output + delta`, where delta is assembled from new
/// graph inputs (one per piece of the 3x3 partition around `bx`), its box piece scaled by
/// `scale` when given.
fn with_delta(base: &KernelGraph, bx: Boxed, scale: Option<f32>) -> KernelGraph {
    let mut g = base.clone();
    let out = g.output_ids()[0];
    let dims = g.tensors[out].dims.clone();
    let dt = g.tensors[out].dtype;
    let r = dims.len();
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 64).unwrap();
    let mut ins = Vec::new();
    let mut rows = Vec::new();
    for (r_start, r_len, r_mid) in cuts(m, bx.r0, bx.r1) {
        let _ = r_start;
        let mut row = None;
        for (_, c_len, c_mid) in cuts(n, bx.c0, bx.c1) {
            let mut d = dims.clone();
            d[r - 2] = r_len;
            d[r - 1] = c_len;
            ins.push(g.new_input(&d, dt, None).unwrap());
            let mut t = tb.new_input(&d, dt, [-1, -1, -1], -1).unwrap();
            if let (true, true, Some(s)) = (r_mid, c_mid, scale) {
                t = tb.unary(UnaryOp::MulScalar { scalar: s }, t).unwrap();
            }
            row = Some(match row {
                None => t,
                Some(acc) => tb.concat(acc, t, r as i64 - 1).unwrap(),
            });
        }
        rows.push(row.unwrap());
    }
    let delta = rows.into_iter().reduce(|a, b| tb.concat(a, b, r as i64 - 2).unwrap()).unwrap();
    tb.new_output(delta, [-1, -1, -1], -1).unwrap();
    let d = g.customized(&ins, tb).unwrap()[0];
    let sum = g.binary(BinaryOp::Add, out, d).unwrap();
    g.outputs[0].tensor = sum;
    g.revalidate().unwrap()
}

/// The sparse boxes of an output `[.., m, n]` whose fused µGraph writes `tiles`.
fn boxes(g: &KernelGraph) -> Vec<(&'static str, Boxed)> {
    let out = g.output_ids()[0];
    let dims = &g.tensors[out].dims;
    let r = dims.len();
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let ts = tiles(g, out, 1 << 20, 0);
    let tile_box = |i: usize| {
        let t = &ts[i];
        Boxed {
            r0: t.start[r - 2],
            r1: t.start[r - 2] + t.extent[r - 2],
            c0: t.start[r - 1],
            c1: t.start[r - 1] + t.extent[r - 1],
        }
    };
    let (tile, tail) = if ts.len() >= 3 {
        (tile_box(ts.len() / 2), tile_box(ts.len() - 1))
    } else {
        (Boxed { r0: 0, r1: m.div_ceil(2), c0: 0, c1: n.div_ceil(2) }, Boxed { r0: m / 2, r1: m, c0: n / 2, c1: n })
    };
    // The first column (or row) of the second tile: an off-by-one at a tile boundary.
    let boundary = match ts.get(1) {
        Some(t) if t.start[r - 1] > 0 => Boxed { r0: 0, r1: m, c0: t.start[r - 1], c1: t.start[r - 1] + 1 },
        Some(t) if t.start[r - 2] > 0 => Boxed { r0: t.start[r - 2], r1: t.start[r - 2] + 1, c0: 0, c1: n },
        _ => Boxed { r0: 0, r1: m, c0: n / 2, c1: n / 2 + 1 },
    };
    vec![
        ("element", Boxed { r0: m / 3, r1: m / 3 + 1, c0: n / 3, c1: n / 3 + 1 }),
        ("row", Boxed { r0: m / 2, r1: m / 2 + 1, c0: 0, c1: n }),
        ("column", Boxed { r0: 0, r1: m, c0: 2 * n / 3, c1: 2 * n / 3 + 1 }),
        ("tile", tile),
        ("tail tile", tail),
        ("boundary", boundary),
    ]
}

/// Asserts that the f64 outputs of `a` and `b` differ inside `bx` and agree outside it.
fn assert_differs_only_in(a: &KernelGraph, b: &KernelGraph, bx: Boxed, what: &str) {
    let ins = float_inputs(a, 3);
    let (x, y) = (run(a, &ins).unwrap(), run(b, &ins).unwrap());
    let dims = &x[0].dims;
    let r = dims.len();
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let (mut inside, mut outside) = (0.0f64, 0.0f64);
    for (i, (u, v)) in x[0].data.iter().zip(&y[0].data).enumerate() {
        let (row, col) = ((i / n) % m, i % n);
        let d = (u - v).abs();
        if (bx.r0..bx.r1).contains(&row) && (bx.c0..bx.c1).contains(&col) {
            inside = inside.max(d);
        } else {
            outside = outside.max(d);
        }
    }
    assert!(inside > 1e-3 && outside < 1e-9, "{what}: inside {inside}, outside {outside}");
}

fn every() -> Options {
    Options { coverage: Coverage::Every, float_check: false, ..Options::default() }
}

/// Checks one zoo pair: its sparse mutants are rejected, the fused µGraph accepted. Returns how
/// many mutants the sampled coverage accepted (reported, not asserted: it is not sound for them).
fn check_pair(p: &Pair) -> usize {
    let sampled = Options { float_check: false, ..Options::default() };
    let mut sampled_accepts = 0;
    for (what, bx) in boxes(&p.ugraph) {
        let what = format!("{} {what} {bx:?}", p.name);
        let reference = with_delta(&p.reference, bx, None);
        let fused = with_delta(&p.ugraph, bx, None);
        let mutant = with_delta(&p.ugraph, bx, Some(2.0));
        assert_differs_only_in(&reference, &mutant, bx, &what);
        let v = mirage_verify::equivalent(&reference, &fused, &every()).unwrap();
        assert!(matches!(v, Verdict::Equivalent { coverage: Coverage::Every, .. }), "{what}: fused rejected: {v:?}");
        let v = mirage_verify::equivalent(&reference, &mutant, &every()).unwrap();
        assert!(!v.is_equivalent(), "{what}: false accept: {v:?}");
        if let Verdict::NotEquivalent { index, .. } = &v {
            let (row, col) = (index[index.len() - 2], index[index.len() - 1]);
            assert!((bx.r0..bx.r1).contains(&row) && (bx.c0..bx.c1).contains(&col), "{what}: {index:?}");
        }
        if mirage_verify::equivalent(&reference, &mutant, &sampled).unwrap().is_equivalent() {
            sampled_accepts += 1;
        }
    }
    sampled_accepts
}

#[test]
fn every_element_coverage_rejects_sparse_mutants() {
    let (mut pairs, mut sampled_accepts) = (0, 0);
    for p in small_pairs() {
        sampled_accepts += check_pair(&p);
        pairs += 1;
    }
    println!(
        "{pairs} pairs x 6 sparse mutants: 0 false accepts with every-element coverage, {sampled_accepts} with sampled"
    );
}

/// The concatenation `[A (16, 511), X (16, 1), B (16, 512)]` against the same with `2 X`: one
/// interior column differs.
#[test]
fn one_interior_column_of_a_concat_is_caught() {
    let build = |scale: bool| {
        let mut g = KernelGraph::new();
        let dt = DType::Float16;
        let ins: Vec<usize> = [511, 1, 512].iter().map(|&c| g.new_input(&[16, c], dt, None).unwrap()).collect();
        let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 64).unwrap();
        let a = tb.new_input(&[16, 511], dt, [-1, -1, -1], -1).unwrap();
        let mut x = tb.new_input(&[16, 1], dt, [-1, -1, -1], -1).unwrap();
        let b = tb.new_input(&[16, 512], dt, [-1, -1, -1], -1).unwrap();
        if scale {
            x = tb.unary(UnaryOp::MulScalar { scalar: 2.0 }, x).unwrap();
        }
        let ax = tb.concat(a, x, 1).unwrap();
        let out = tb.concat(ax, b, 1).unwrap();
        tb.new_output(out, [-1, -1, -1], -1).unwrap();
        let o = g.customized(&ins, tb).unwrap()[0];
        g.mark_output(o, None).unwrap();
        g
    };
    let (reference, candidate) = (build(false), build(true));
    let mut sampled_accepts = 0;
    for seed in 0..20 {
        let v = mirage_verify::equivalent(&reference, &candidate, &Options { seed, ..every() }).unwrap();
        match v {
            Verdict::NotEquivalent { index, .. } => assert_eq!(index[1], 511, "seed {seed}"),
            other => panic!("seed {seed}: accepted {other:?}"),
        }
        let sampled = Options { seed, float_check: false, ..Options::default() };
        sampled_accepts +=
            usize::from(mirage_verify::equivalent(&reference, &candidate, &sampled).unwrap().is_equivalent());
    }
    println!("sampled coverage accepted the concat mutant for {sampled_accepts}/20 seeds");
    let v = mirage_verify::equivalent(&reference, &reference.clone(), &every()).unwrap();
    assert!(
        matches!(v, Verdict::Equivalent { coverage: Coverage::Every, samples, .. } if samples >= 16 * 1024),
        "{v:?}"
    );
}
