//! Problems that prevent a verdict are errors, not verdicts: interface mismatches, graphs with
//! two exponentials on a path, unusable options.

use mirage_ugraph::{zoo, BinaryOp, DType, KernelGraph, UnaryOp};
use mirage_verify::{equivalent, Fragment, Options, Verdict, VerifyError};

fn unary_graph(dims: &[usize], dt: DType, ops: &[UnaryOp]) -> KernelGraph {
    let mut g = KernelGraph::new();
    let mut t = g.new_input(dims, dt, None).unwrap();
    for &u in ops {
        t = g.unary(u, t).unwrap();
    }
    g.mark_output(t, None).unwrap();
    g
}

#[test]
fn interface_mismatches_are_errors() {
    let a = unary_graph(&[4, 8], DType::Float32, &[UnaryOp::Square]);
    let other_dims = unary_graph(&[8, 4], DType::Float32, &[UnaryOp::Square]);
    let other_dtype = unary_graph(&[4, 8], DType::Float16, &[UnaryOp::Square]);
    for b in [&other_dims, &other_dtype] {
        let e = equivalent(&a, b, &Options::default()).unwrap_err();
        assert!(matches!(e, VerifyError::Interface(_)), "{e}");
    }
    let p = zoo::lora(4, 16, 16, 4, 2, 2, DType::Float32).unwrap();
    let e = equivalent(&a, &p.ugraph, &Options::default()).unwrap_err();
    assert!(e.to_string().contains("inputs"), "{e}");
}

#[test]
fn two_exps_on_a_path_are_an_error_unless_allowed() {
    let a = unary_graph(&[4, 8], DType::Float32, &[UnaryOp::Exp, UnaryOp::Exp]);
    let b = unary_graph(&[4, 8], DType::Float32, &[UnaryOp::Exp, UnaryOp::Silu]);
    let e = equivalent(&a, &b, &Options::default()).unwrap_err();
    match &e {
        VerifyError::NotLax { graph, reason } => {
            assert_eq!(*graph, "reference");
            assert!(reason.contains("kernel op #1 (exp)") && reason.contains("kernel op #2 (exp)"), "{reason}");
        }
        _ => panic!("{e}"),
    }
    let allow = Options { allow_non_lax: true, ..Options::default() };
    let v = equivalent(&a, &a, &allow).unwrap();
    assert!(matches!(&v, Verdict::Equivalent { lax, .. } if matches!(lax.fragment, Fragment::NotLax { .. })), "{v:?}");
    assert!(!equivalent(&a, &b, &allow).unwrap().is_equivalent());
}

#[test]
fn bad_options_are_errors() {
    let a = unary_graph(&[4, 8], DType::Float32, &[UnaryOp::Square]);
    let e = equivalent(&a, &a, &Options { trials: Some(0), ..Options::default() }).unwrap_err();
    assert!(matches!(e, VerifyError::Options(_)));
}

#[test]
fn a_difference_is_reported_with_its_place_and_values() {
    let mut a = KernelGraph::new();
    let (x, y) =
        (a.new_input(&[4, 8], DType::Float32, None).unwrap(), a.new_input(&[4, 8], DType::Float32, None).unwrap());
    let mut b = a.clone();
    let s = a.binary(BinaryOp::Sub, x, y).unwrap();
    a.mark_output(s, None).unwrap();
    let s = b.binary(BinaryOp::Sub, y, x).unwrap();
    b.mark_output(s, None).unwrap();
    match equivalent(&a, &b, &Options::default()).unwrap() {
        Verdict::NotEquivalent { output, index, reference_value, candidate_value, trial, .. } => {
            assert_eq!((output, trial, index.len()), (0, 0, 2));
            assert_ne!(reference_value, candidate_value);
            assert_eq!((reference_value + candidate_value) % mirage_verify::field::P, 0);
        }
        v => panic!("{v:?}"),
    }
}
