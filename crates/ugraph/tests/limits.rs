//! Sizes past the limits of `mirage_ugraph::limits` are errors naming the op and dims, in the
//! builders, the JSON loader and the interpreter; a set cancel flag stops a run.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use mirage_ugraph::limits::{MAX_EXTENT, MAX_RUN_BLOCKS};
use mirage_ugraph::{run, run_with, Accum, BlockGraph, Cancel, DType, Error, KernelGraph, Tensor, UnaryOp};

const F32: DType = DType::Float32;

fn msg<T: std::fmt::Debug>(r: mirage_ugraph::Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn new_input_refuses_dims_past_the_limits() {
    let mut g = KernelGraph::new();
    let m = msg(g.new_input(&[1 << 63, 2], F32, None));
    assert!(m.starts_with("new_input:") && m.contains("dim 0"), "{m}");
    let m = msg(g.new_input(&[1 << 40, 1 << 40], F32, None));
    assert!(m.starts_with("new_input:"), "{m}");
    let m = msg(g.new_input(&[1 << 30, 1 << 30, 1 << 30], F32, None));
    assert!(m.contains("elements exceed"), "{m}");
    assert!(g.ops.is_empty(), "a refused input is not added");
}

#[test]
fn matmul_result_past_the_element_limit_is_refused() {
    let mut g = KernelGraph::new();
    let a = g.new_input(&[1 << 24, 1 << 24, 1], F32, None).expect("a");
    let b = g.new_input(&[1 << 24, 1, 1 << 24], F32, None).expect("b");
    let m = msg(g.matmul(a, b));
    assert!(m.starts_with("matmul:") && m.contains("the result"), "{m}");
}

#[test]
fn launch_parameters_past_the_limits_are_refused() {
    for (grid, block, range, dimx) in [
        ([1usize << 40, 1, 1], [128usize, 1, 1], 1usize, 1usize),
        ([1 << 16, 1 << 16, 1], [128, 1, 1], 1, 1),
        ([1, 1, 1], [1 << 40, 1 << 40, 1], 1, 1),
        ([1, 1, 1], [128, 1, 1], 1 << 40, 1),
        ([1, 1, 1], [128, 1, 1], 1, 1 << 40),
    ] {
        let m = msg(BlockGraph::new(grid, block, range, dimx));
        assert!(m.starts_with("new_threadblock_graph:"), "{m}");
    }
    assert!(BlockGraph::new([MAX_EXTENT, 1, 1], [128, 1, 1], MAX_EXTENT, 1).is_ok());
}

#[test]
fn a_concat_chain_stops_at_the_dim_limit_instead_of_wrapping() {
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 1).expect("tb");
    let mut t = tb.new_input(&[1, 1 << 20], F32, [-1, -1, -1], -1).expect("input");
    let mut err = None;
    for _ in 0..61 {
        match tb.concat(t, t, 1) {
            Ok(x) => t = x,
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    let m = err.expect("the chain must hit the limit");
    assert!(m.starts_with("tb.concat:") && m.contains("concat dim 1"), "{m}");
    assert!(tb.tensors.iter().all(|s| s.dims[1] > 0 && s.dims[1] <= MAX_EXTENT));
}

#[test]
fn an_output_past_the_dim_limit_is_refused() {
    let mut tb = BlockGraph::new([1 << 8, 1, 1], [128, 1, 1], 2, 1).expect("tb");
    let x = tb.new_input(&[1 << 31], F32, [-1, -1, -1], 0).expect("input");
    let m = msg(tb.new_output(x, [0, -1, -1], 0));
    assert!(m.starts_with("tb.new_output:"), "{m}");
}

#[test]
fn with_finer_loop_refuses_an_overflowing_range() {
    let tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1 << 30, 1).expect("tb");
    assert!(tb.with_finer_loop(usize::MAX).is_err());
}

#[test]
fn the_interpreter_refuses_a_box_past_its_element_limit() {
    let mut g = KernelGraph::new();
    let a = g.new_input(&[1 << 16, 1], F32, None).expect("a");
    let b = g.new_input(&[1, 1 << 16], F32, None).expect("b");
    g.matmul(a, b).expect("matmul");
    let ins = vec![Tensor::zeros(&[1 << 16, 1]), Tensor::zeros(&[1, 1 << 16])];
    let m = msg(run::<f32>(&g, &ins));
    assert!(m.starts_with("run:") && m.contains("2^31"), "{m}");
}

#[test]
fn the_interpreter_refuses_a_grid_past_its_block_limit() {
    let n = MAX_RUN_BLOCKS * 2;
    let mut g = KernelGraph::new();
    let x = g.new_input(&[n], F32, None).expect("x");
    let mut tb = BlockGraph::new([n, 1, 1], [128, 1, 1], 1, 1).expect("tb");
    let t = tb.new_input(&[n], F32, [0, -1, -1], -1).expect("t");
    let e = tb.unary(UnaryOp::Exp, t).expect("exp");
    tb.new_output(e, [0, -1, -1], -1).expect("out");
    g.customized(&[x], tb).expect("customized");
    let m = msg(run::<f32>(&g, &[Tensor::zeros(&[n])]));
    assert!(m.starts_with("run:") && m.contains("customized") && m.contains("2^20"), "{m}");
}

#[test]
fn a_set_cancel_flag_stops_a_run() {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[8, 8], F32, None).expect("x");
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1 << 30, 1).expect("tb");
    let t = tb.new_input(&[8, 8], F32, [-1, -1, -1], -1).expect("t");
    let acc = tb.forloop_accum(t, Accum::None).expect("acc");
    tb.new_output(acc, [-1, -1, -1], -1).expect("out");
    g.customized(&[x], tb).expect("customized");
    let flag = Arc::new(AtomicBool::new(true));
    let r = run_with::<f32>(&g, &[Tensor::zeros(&[8, 8])], &Cancel::new(flag));
    assert_eq!(r.unwrap_err(), Error::Cancelled);
}

#[test]
fn banded_kernel_ops_match_the_unbanded_result() {
    // 1024 x 1024 x 64 is computed in bands of rows; compare with a direct product.
    let (m, k, n) = (1024, 64, 1024);
    let mut g = KernelGraph::new();
    let a = g.new_input(&[m, k], F32, None).expect("a");
    let b = g.new_input(&[k, n], F32, None).expect("b");
    g.matmul(a, b).expect("matmul");
    let (ta, tb) = (Tensor::random(&[m, k], 1), Tensor::random(&[k, n], 2));
    let out = run(&g, &[ta.clone(), tb.clone()]).expect("run");
    assert_eq!(out[0], ta.matmul(&tb));
}

#[test]
fn json_errors_quote_a_few_hundred_characters_at_most() {
    let big = "x".repeat(10 << 20);
    let text = format!("{{\"format\": \"{big}\", \"version\": 1, \"graph\": {{}}}}");
    let m = mirage_ugraph::from_json(&text).unwrap_err().to_string();
    assert!(m.len() < 1000 && m.contains("more characters"), "{} chars", m.len());
    let text = format!("{{\"format\": \"mirage-ugraph\", \"version\": 1, \"graph\": {{\"ops\": \"{big}\"}}}}");
    let m = mirage_ugraph::from_json(&text).unwrap_err().to_string();
    assert!(m.len() < 1000, "{} chars", m.len());
}

#[test]
fn json_with_sizes_past_the_limits_is_refused() {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[4, 2], F32, None).expect("x");
    g.unary(UnaryOp::Exp, x).expect("exp");
    let text = g.to_json().replace("[4,2]", &format!("[{},2]", 1u64 << 63));
    let m = mirage_ugraph::from_json(&text).unwrap_err().to_string();
    assert!(m.contains("new_input") && m.contains("dim 0"), "{m}");
}
