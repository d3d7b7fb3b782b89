//! Sparse mutants: candidates that differ from the reference in one element, one row, one
//! column, one tile, the tail tile or one column at a tile boundary, and nowhere else. Every-
//! element coverage must reject all of them; the fused µGraphs must still be accepted.
//!
//! Construction: `mirage_verify::mutants` (a delta added to the output, scaled by 2 on the box
//! in the mutant; the f64 interpreter checks that it differs there only).

mod common;

use common::small_pairs;
use mirage_ugraph::zoo::Pair;
use mirage_ugraph::{BlockGraph, DType, KernelGraph, UnaryOp};
use mirage_verify::{mutants, Coverage, Options, Verdict};

fn every() -> Options {
    Options { coverage: Coverage::Every, float_check: false, ..Options::default() }
}

/// Checks one zoo pair: its sparse mutants are rejected, the fused µGraph accepted. Returns how
/// many mutants the sampled coverage accepted (reported, not asserted: it is not sound for them).
fn check_pair(p: &Pair) -> usize {
    let outcomes = mutants::check_pair(&p.reference, &p.ugraph, &p.name).unwrap();
    assert_eq!(outcomes.len(), 6, "{}", p.name);
    for m in &outcomes {
        assert!(m.sound(), "{m:?}");
    }
    outcomes.iter().filter(|m| m.sampled_accepted).count()
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
