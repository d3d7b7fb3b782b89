//! Graphviz (DOT) export of kernel graphs: one node per kernel op, one `cluster_N` subgraph per
//! customized op holding its block ops, edges labelled with tensor dims.

use std::fmt::Write as _;

use crate::block::{BlockGraph, BlockOpKind};
use crate::kernel::{KernelGraph, KernelOpKind};
use crate::ops::UnaryOp;

/// Escapes a label for a double-quoted DOT string (newlines become `\n` line breaks).
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn dims(d: &[usize]) -> String {
    format!("{d:?}")
}

fn unary_label(u: &UnaryOp) -> String {
    match *u {
        UnaryOp::Clamp { min, max } => format!("clamp({min}, {max})"),
        UnaryOp::MulScalar { scalar } => format!("mul_scalar({scalar})"),
        _ => u.name().to_string(),
    }
}

fn kernel_label(kind: &KernelOpKind) -> String {
    match kind {
        KernelOpKind::Unary { op } => unary_label(op),
        KernelOpKind::Reduction { dim } | KernelOpKind::Softmax { dim } => format!("{}(dim={dim})", kind.name()),
        KernelOpKind::RmsNorm { normalized_ndims, eps } if *eps != 0.0 => {
            format!("rms_norm(ndims={normalized_ndims}, eps={eps})")
        }
        KernelOpKind::RmsNorm { normalized_ndims, .. } => format!("rms_norm(ndims={normalized_ndims})"),
        _ => kind.name().to_string(),
    }
}

fn block_label(kind: &BlockOpKind) -> String {
    let n = kind.name();
    match kind {
        BlockOpKind::Input { imap, forloop_dim, .. } => format!("{n}\nimap {imap:?} fmap {forloop_dim}"),
        BlockOpKind::Output { omap, forloop_dim } => format!("{n}\nomap {omap:?} fmap {forloop_dim}"),
        BlockOpKind::Unary { op } => unary_label(op),
        BlockOpKind::Reduction { dim } | BlockOpKind::ReductionMax { dim } | BlockOpKind::Concat { dim } => {
            format!("{n}(dim={dim})")
        }
        BlockOpKind::ForloopAccum { acc, eps } if *eps != 0.0 => {
            format!("{n}\nacc {} eps {eps}", acc.name().unwrap_or("none"))
        }
        BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => {
            format!("{n}\nacc {}", acc.name().unwrap_or("none"))
        }
        BlockOpKind::RmsNorm { eps } if *eps != 0.0 => format!("{n}(eps={eps})"),
        _ => n.to_string(),
    }
}

fn node(out: &mut String, indent: &str, id: &str, label: &str, style: &str) {
    let _ = writeln!(out, "{indent}{id} [label=\"{}\"{style}];", esc(label));
}

fn edge(out: &mut String, indent: &str, from: &str, to: &str, label: &str) {
    let _ = writeln!(out, "{indent}{from} -> {to} [label=\"{}\"];", esc(label));
}

const INPUT_STYLE: &str = ", shape=invhouse, style=filled, fillcolor=lightblue";
const OUTPUT_STYLE: &str = ", shape=house, style=filled, fillcolor=palegreen";
const ACCUM_STYLE: &str = ", style=filled, fillcolor=khaki";

/// Renders `g` as a Graphviz digraph.
pub fn to_dot(g: &KernelGraph) -> String {
    let mut out = String::from("digraph ugraph {\n  node [shape=box, fontname=\"monospace\"];\n");
    // Node that produces each kernel tensor.
    let mut producer: Vec<Option<String>> = vec![None; g.tensors.len()];
    let tdesc = |t: usize| g.tensors.get(t).map(|x| dims(&x.dims)).unwrap_or_else(|| format!("#{t}?"));
    let src = |producer: &[Option<String>], t: usize| producer.get(t).cloned().flatten();
    for (k, op) in g.ops.iter().enumerate() {
        if let KernelOpKind::Customized { graph } = &op.kind {
            let outs = cluster(&mut out, k, graph, &op.inputs, |t| src(&producer, t), &tdesc);
            for (&t, n) in op.outputs.iter().zip(outs) {
                if let Some(slot) = producer.get_mut(t) {
                    *slot = Some(n);
                }
            }
            continue;
        }
        let id = format!("k{k}");
        let first = op.outputs.first().and_then(|&t| g.tensors.get(t));
        let desc = first.map(|t| format!("\n{} {}", dims(&t.dims), t.dtype.name())).unwrap_or_default();
        let style = if matches!(op.kind, KernelOpKind::Input { .. }) { INPUT_STYLE } else { "" };
        node(&mut out, "  ", &id, &format!("{}{desc}", kernel_label(&op.kind)), style);
        for &t in &op.inputs {
            if let Some(s) = src(&producer, t) {
                edge(&mut out, "  ", &s, &id, &tdesc(t));
            }
        }
        for &t in &op.outputs {
            if let Some(slot) = producer.get_mut(t) {
                *slot = Some(id.clone());
            }
        }
    }
    for (n, t) in g.output_ids().into_iter().enumerate() {
        let id = format!("out{n}");
        let dt = g.tensors.get(t).map(|x| x.dtype.name()).unwrap_or("?");
        node(&mut out, "  ", &id, &format!("output {n}\n{} {dt}", tdesc(t)), OUTPUT_STYLE);
        if let Some(s) = src(&producer, t) {
            edge(&mut out, "  ", &s, &id, &tdesc(t));
        }
    }
    out.push_str("}\n");
    out
}

/// Writes the cluster of customized kernel op `k`; returns the node of each output in order.
fn cluster(
    out: &mut String,
    k: usize,
    bg: &BlockGraph,
    operands: &[usize],
    producer: impl Fn(usize) -> Option<String>,
    tdesc: &dyn Fn(usize) -> String,
) -> Vec<String> {
    let [gx, gy, gz] = bg.grid_dim;
    let [bx, by, bz] = bg.block_dim;
    let label = format!(
        "customized #{k}\ngrid ({gx}, {gy}, {gz}) block ({bx}, {by}, {bz})\nforloop_range {} reduction_dimx {}",
        bg.forloop_range, bg.reduction_dimx
    );
    let _ = writeln!(out, "  subgraph cluster_{k} {{\n    label=\"{}\";\n    style=rounded;", esc(&label));
    let mut sprod: Vec<Option<String>> = vec![None; bg.tensors.len()];
    let sdesc = |t: usize| bg.tensors.get(t).map(|x| dims(&x.dims)).unwrap_or_else(|| format!("#{t}?"));
    let (mut n_in, mut outs, mut cross) = (0, Vec::new(), Vec::new());
    for (j, op) in bg.ops.iter().enumerate() {
        let id = format!("b{k}_{j}");
        let first = op.outputs.first().and_then(|&t| bg.tensors.get(t));
        let desc = first.map(|t| format!("\ntile {} {}", dims(&t.dims), t.dtype.name())).unwrap_or_default();
        let style = match &op.kind {
            BlockOpKind::Input { .. } => INPUT_STYLE,
            BlockOpKind::Output { .. } => OUTPUT_STYLE,
            kind if kind.is_accumulator() => ACCUM_STYLE,
            _ => "",
        };
        node(out, "    ", &id, &format!("{}{desc}", block_label(&op.kind)), style);
        for &t in &op.inputs {
            if let Some(s) = sprod.get(t).cloned().flatten() {
                edge(out, "    ", &s, &id, &sdesc(t));
            }
        }
        for &t in &op.outputs {
            if let Some(slot) = sprod.get_mut(t) {
                *slot = Some(id.clone());
            }
        }
        match op.kind {
            BlockOpKind::Input { .. } => {
                if let Some(&t) = operands.get(n_in) {
                    if let Some(s) = producer(t) {
                        cross.push((s, id.clone(), tdesc(t)));
                    }
                }
                n_in += 1;
            }
            BlockOpKind::Output { .. } => outs.push(id),
            _ => {}
        }
    }
    out.push_str("  }\n");
    for (s, d, l) in cross {
        edge(out, "  ", &s, &d, &l);
    }
    outs
}
