//! DOT export: well-formed output naming every op, one cluster per customized op.

mod common;

use mirage_ugraph::dot::to_dot;
use mirage_ugraph::{KernelGraph, KernelOpKind};

fn check_dot(g: &KernelGraph) -> String {
    let s = to_dot(g);
    assert!(s.starts_with("digraph ") && s.trim_end().ends_with('}'), "{s}");
    let mut depth = 0i64;
    let mut in_str = false;
    let mut prev = ' ';
    for c in s.chars() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '{' if !in_str => depth += 1,
            '}' if !in_str => {
                depth -= 1;
                assert!(depth >= 0, "unbalanced braces\n{s}");
            }
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    assert_eq!(depth, 0, "unbalanced braces\n{s}");
    assert!(!in_str, "unterminated string\n{s}");
    for (k, op) in g.ops.iter().enumerate() {
        assert!(s.contains(op.kind.name()), "missing {}\n{s}", op.kind.name());
        if let KernelOpKind::Customized { graph } = &op.kind {
            assert!(s.contains(&format!("subgraph cluster_{k} {{")), "{s}");
            for bop in &graph.ops {
                assert!(s.contains(bop.kind.name()), "missing {}\n{s}", bop.kind.name());
            }
        }
    }
    if let Ok(mut child) = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "dot rejected the output: {}", String::from_utf8_lossy(&out.stderr));
    }
    s
}

#[test]
fn rmsnorm_linear_dot() {
    let s = check_dot(&common::rmsnorm_linear());
    for needle in [
        "grid (64, 1, 1)",
        "block (128, 1, 1)",
        "forloop_range 64",
        "imap [1, -1, -1] fmap 0",
        "acc rms",
        "omap [1, -1, -1] fmap -1",
        "[16, 4096]",
        "float16",
    ] {
        assert!(s.contains(needle), "missing {needle}\n{s}");
    }
}

#[test]
fn every_op_dot() {
    let s = check_dot(&common::every_op());
    assert!(s.contains("clamp(-1.5, inf)") && s.contains("acc sum_todimx"), "{s}");
}

#[test]
fn random_graphs_dot() {
    for seed in 0..50 {
        check_dot(&common::random_graph(seed, 20));
    }
}
