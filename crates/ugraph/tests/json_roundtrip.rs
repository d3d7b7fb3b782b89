//! Versioned JSON: exact round trips, rejection of malformed, newer or inconsistent files.

mod common;

use mirage_ugraph::json::{from_json, to_json, FORMAT_VERSION};
use mirage_ugraph::{DType, Error, KernelGraph, UnaryOp};
use proptest::prelude::*;
use serde_json::{json, Value};

fn assert_round_trip(g: &KernelGraph) {
    let s = to_json(g);
    let back = from_json(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    assert_eq!(&back, g);
    assert_eq!(to_json(&back), s);
    assert_eq!(back.hash(), g.hash());
}

/// A named edit of a graph's JSON value.
type Edit = Box<dyn Fn(&mut Value)>;

fn edit(g: &KernelGraph, f: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap();
    f(&mut v);
    v.to_string()
}

#[test]
fn rmsnorm_linear_round_trips() {
    let g = common::rmsnorm_linear();
    assert_round_trip(&g);
    let v: Value = serde_json::from_str(&g.to_json()).unwrap();
    assert_eq!(v["format"], "mirage-ugraph");
    // Without an rms epsilon the graph is written as version 1 (version 2 marks an eps).
    assert_eq!(v["version"], 1);
    assert_eq!(KernelGraph::from_json(&g.to_json()).unwrap(), g);
}

#[test]
fn every_op_round_trips() {
    assert_round_trip(&common::every_op());
}

#[test]
fn float_constants_round_trip_exactly() {
    let mut g = KernelGraph::new();
    let mut x = g.new_input(&[4], DType::Float32, None).unwrap();
    let consts = [0.1f32, -0.0, 1e-45, f32::MIN_POSITIVE, f32::MAX, 3.4028233e38, 16777217.0, 1.0 / 3.0];
    for c in consts {
        x = g.unary(UnaryOp::MulScalar { scalar: c }, x).unwrap();
    }
    for (min, max) in [(f32::NEG_INFINITY, f32::INFINITY), (-0.0, 0.0), (f32::NEG_INFINITY, -1e30)] {
        x = g.unary(UnaryOp::Clamp { min, max }, x).unwrap();
    }
    assert_round_trip(&g);
    let back = from_json(&to_json(&g)).unwrap();
    let bits = |g: &KernelGraph| format!("{:?}", g.ops.iter().map(|o| format!("{:?}", o.kind)).collect::<Vec<_>>());
    assert_eq!(bits(&back), bits(&g)); // -0.0 stays -0.0
}

#[test]
fn truncated_json_is_a_json_error_with_position() {
    let s = common::rmsnorm_linear().to_json();
    match from_json(&s[..s.len() / 2]) {
        Err(Error::Json(m)) => assert!(m.contains("line") && m.contains("column"), "{m}"),
        other => panic!("expected a JSON error, got {other:?}"),
    }
    assert!(matches!(from_json(""), Err(Error::Json(_))));
}

#[test]
fn newer_version_is_rejected() {
    let s = edit(&common::rmsnorm_linear(), |v| v["version"] = json!(99));
    assert_eq!(from_json(&s), Err(Error::Version { found: 99, supported: FORMAT_VERSION }));
    let msg = from_json(&s).unwrap_err().to_string();
    assert!(msg.contains("99") && msg.contains(&FORMAT_VERSION.to_string()), "{msg}");
}

#[test]
fn missing_or_foreign_format_is_rejected() {
    let g = common::rmsnorm_linear();
    for (f, needle) in [(Value::Null, "format"), (json!("onnx"), "onnx")] {
        let s = edit(&g, |v| {
            if f.is_null() {
                v.as_object_mut().unwrap().remove("format");
            } else {
                v["format"] = f.clone();
            }
        });
        match from_json(&s) {
            Err(Error::Json(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected a JSON error, got {other:?}"),
        }
    }
    assert!(matches!(from_json("[1, 2]"), Err(Error::Json(_))));
    let s = edit(&g, |v| v["version"] = json!("one"));
    assert!(matches!(from_json(&s), Err(Error::Json(_))));
}

#[test]
fn wrong_field_type_reports_position() {
    let s = edit(&common::rmsnorm_linear(), |v| v["graph"]["tensors"][0]["dims"] = json!("big"));
    match from_json(&s) {
        Err(Error::Json(m)) => assert!(m.contains("column"), "{m}"),
        other => panic!("expected a JSON error, got {other:?}"),
    }
}

#[test]
fn operand_defined_later_is_rejected() {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[4, 4], DType::Float32, None).unwrap();
    let y = g.unary(UnaryOp::Exp, x).unwrap();
    g.unary(UnaryOp::Relu, y).unwrap();
    let s = edit(&g, |v| v["graph"]["ops"][1]["inputs"] = json!([2]));
    match from_json(&s) {
        Err(Error::Invalid { msg, .. }) => assert!(msg.contains("before it is defined"), "{msg}"),
        other => panic!("expected an invalid-graph error, got {other:?}"),
    }
}

#[test]
fn non_dividing_imap_is_rejected_clearly() {
    // X [16, 4096] split over grid x = 64 along dim 0: 16 is not divisible by 64.
    let s = edit(&common::rmsnorm_linear(), |v| {
        v["graph"]["ops"][2]["kind"]["graph"]["ops"][0]["kind"]["imap"] = json!([0, -1, -1])
    });
    match from_json(&s) {
        Err(e @ Error::Shape { .. }) => {
            let m = e.to_string();
            assert!(m.contains("tb.new_input") && m.contains("not divisible") && m.contains("64"), "{m}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn inconsistent_derived_data_is_rejected() {
    let g = common::rmsnorm_linear();
    let cases: [(&str, Edit); 4] = [
        ("tensor #2", Box::new(|v| v["graph"]["tensors"][2]["dims"] = json!([16, 2048]))),
        ("stensor #0", Box::new(|v| v["graph"]["ops"][2]["kind"]["graph"]["tensors"][0]["dims"] = json!([16, 128]))),
        ("kernel op #2", Box::new(|v| v["graph"]["ops"][2]["outputs"] = json!([7]))),
        (
            "tensors",
            Box::new(|v| v["graph"]["tensors"].as_array_mut().unwrap().push(json!({"dims": [1], "dtype": "float32"}))),
        ),
    ];
    for (needle, f) in cases {
        match from_json(&edit(&g, f)) {
            Err(Error::Json(m)) => assert!(m.contains("inconsistent") && m.contains(needle), "{m}"),
            other => panic!("expected an inconsistency error for {needle}, got {other:?}"),
        }
    }
}

#[test]
fn huge_sizes_are_rejected_without_panicking() {
    let g = common::rmsnorm_linear();
    let s = edit(&g, |v| v["graph"]["ops"][0]["kind"]["dims"] = json!([usize::MAX, usize::MAX]));
    assert!(from_json(&s).is_err());
    let s = edit(&g, |v| v["graph"]["ops"][2]["kind"]["graph"]["block_dim"] = json!([1u64 << 40, 1u64 << 40, 1]));
    assert!(from_json(&s).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_graphs_round_trip(seed in any::<u64>(), steps in 0usize..40) {
        let g = common::random_graph(seed, steps);
        let s = to_json(&g);
        let back = from_json(&s);
        prop_assert!(back.is_ok(), "{:?}\n{}", back, s);
        let back = back.unwrap();
        prop_assert_eq!(&back, &g);
        prop_assert_eq!(to_json(&back), s);
        prop_assert_eq!(back.hash(), g.hash());
    }
}
