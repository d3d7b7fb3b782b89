//! Shared helpers of the verifier's integration tests: small zoo graphs, the f64 float
//! interpreter on realistic inputs, and struct-level graph edits.

#![allow(dead_code)]

use mirage_ugraph::zoo::{self, Attn, Pair};
use mirage_ugraph::{run, BlockGraph, BlockOp, DType, KernelGraph, KernelOp, KernelOpKind, Tensor};

/// Small-shape zoo pairs, several schedules per workload.
pub fn small_pairs() -> Vec<Pair> {
    let dt = DType::Float32;
    let gqa = Attn { b: 2, h: 4, d: 8, s: 64, splits: 4, frange: 2, qsplit: 1 };
    let mha = Attn { b: 4, h: 2, d: 8, s: 32, splits: 2, frange: 4, qsplit: 1 };
    let mqa = Attn { b: 1, h: 8, d: 16, s: 64, splits: 2, frange: 2, qsplit: 1 };
    let small = Attn { b: 2, h: 2, d: 4, s: 16, splits: 2, frange: 2, qsplit: 1 };
    vec![
        zoo::rmsnorm_linear(4, 32, 64, 4, 4, dt).unwrap(),
        zoo::rmsnorm_linear(2, 64, 32, 2, 8, dt).unwrap(),
        zoo::rmsnorm_linear(8, 16, 16, 2, 2, dt).unwrap(),
        zoo::rmsnorm_linear(2, 16, 64, 8, 4, dt).unwrap(),
        zoo::gated_mlp(4, 32, 64, 4, 4, dt).unwrap(),
        zoo::gated_mlp(2, 64, 32, 2, 2, dt).unwrap(),
        zoo::gated_mlp(8, 16, 16, 4, 2, dt).unwrap(),
        zoo::gated_mlp(2, 16, 64, 8, 4, dt).unwrap(),
        zoo::lora(4, 32, 64, 8, 4, 4, dt).unwrap(),
        zoo::lora(2, 64, 32, 4, 2, 2, dt).unwrap(),
        zoo::lora(8, 16, 16, 2, 2, 4, dt).unwrap(),
        zoo::lora(2, 16, 64, 4, 8, 2, dt).unwrap(),
        zoo::attention(gqa, false, dt).unwrap(),
        zoo::attention(mha, false, dt).unwrap(),
        zoo::attention(mqa, false, dt).unwrap(),
        zoo::attention(gqa, true, dt).unwrap(),
        zoo::attention(mha, true, dt).unwrap(),
        zoo::attention_online(gqa, dt).unwrap(),
        zoo::attention_online(mha, dt).unwrap(),
        zoo::attention_online(small, dt).unwrap(),
        zoo::attention(small, false, dt).unwrap(),
        zoo::attention(small, true, dt).unwrap(),
        zoo::attention(mqa, true, dt).unwrap(),
        zoo::ntrans(4, 32, dt).unwrap(),
        zoo::ntrans(2, 64, dt).unwrap(),
        zoo::ntrans(8, 16, dt).unwrap(),
    ]
}

/// Full inputs of `g`, about N(0, 1).
pub fn float_inputs(g: &KernelGraph, seed: u64) -> Vec<Tensor<f64>> {
    mirage_verify::inputs::normal_inputs(g, seed)
}

/// Largest difference of two output lists relative to the RMS of `a`'s outputs (infinite on a
/// shape mismatch or a NaN/inf in one but not the other).
pub fn rel_err(a: &[Tensor<f64>], b: &[Tensor<f64>]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        if x.dims != y.dims {
            return f64::INFINITY;
        }
        let rms = (x.data.iter().map(|v| v * v).sum::<f64>() / x.data.len().max(1) as f64).sqrt().max(1e-12);
        for (u, v) in x.data.iter().zip(&y.data) {
            if u.is_finite() != v.is_finite() {
                return f64::INFINITY;
            }
            if u.is_finite() {
                worst = worst.max((u - v).abs() / rms);
            }
        }
    }
    worst
}

/// Float relative error of `cand` against `reference` on two input draws (`None`: `cand` fails).
pub fn float_diff(reference: &KernelGraph, cand: &KernelGraph) -> Option<f64> {
    let mut worst = 0.0f64;
    for seed in [1, 2] {
        let ins = float_inputs(reference, seed);
        let r = run(reference, &ins).ok()?;
        let c = run(cand, &ins).ok()?;
        worst = worst.max(rel_err(&r, &c));
    }
    Some(worst)
}

/// A copy of `g` with the block graph of kernel op `i` edited by `f` (None if op `i` is not customized).
pub fn with_block(g: &KernelGraph, i: usize, f: impl FnOnce(&mut BlockGraph)) -> Option<KernelGraph> {
    let mut m = g.clone();
    let KernelOpKind::Customized { graph } = &mut m.ops.get_mut(i)?.kind else { return None };
    f(graph);
    Some(m)
}

/// Renumbers tensor ids `> t` by +1 in `ops` (inputs and outputs).
fn shift_ids<'a>(ins_outs: impl Iterator<Item = &'a mut usize>, t: usize) {
    for id in ins_outs {
        if *id > t {
            *id += 1;
        }
    }
}

/// Inserts after block op `j` (single output `t`) a copy of it applied to `t` (for two-operand
/// ops: `op(t, second operand)`), and makes later consumers of `t` use the copy.
pub fn duplicate_block_op(bg: &BlockGraph, j: usize) -> Option<BlockGraph> {
    insert_block_op(bg, j, None)
}

/// Inserts after block op `j` (single output `t`) the op `kind` applied to `t` (`None`: a copy of
/// op `j`, with its second operand if any), and makes later consumers of `t` use the new op.
pub fn insert_block_op(bg: &BlockGraph, j: usize, kind: Option<mirage_ugraph::BlockOpKind>) -> Option<BlockGraph> {
    let op = bg.ops.get(j)?;
    if op.outputs.len() != 1 || op.inputs.is_empty() {
        return None;
    }
    let t = op.outputs[0];
    let mut m = bg.clone();
    for o in m.ops.iter_mut() {
        shift_ids(o.inputs.iter_mut().chain(o.outputs.iter_mut()), t);
    }
    for o in m.ops.iter_mut().skip(j + 1) {
        for id in o.inputs.iter_mut() {
            if *id == t {
                *id = t + 1;
            }
        }
    }
    let (kind, inputs) = match kind {
        Some(k) => (k, vec![t]),
        None => {
            let mut inputs = op.inputs.clone();
            inputs[0] = t;
            (op.kind.clone(), inputs)
        }
    };
    let dup = BlockOp { kind, inputs, outputs: vec![t + 1] };
    m.ops.insert(j + 1, dup);
    m.tensors.insert(t + 1, m.tensors[t].clone());
    Some(m)
}

/// Kernel-level counterpart of [`duplicate_block_op`].
pub fn duplicate_kernel_op(g: &KernelGraph, j: usize) -> Option<KernelGraph> {
    let op = g.ops.get(j)?;
    if op.outputs.len() != 1 || op.inputs.is_empty() || matches!(op.kind, KernelOpKind::Customized { .. }) {
        return None;
    }
    let t = op.outputs[0];
    let mut m = g.clone();
    for o in m.ops.iter_mut() {
        shift_ids(o.inputs.iter_mut().chain(o.outputs.iter_mut()), t);
    }
    for o in m.ops.iter_mut().skip(j + 1) {
        for id in o.inputs.iter_mut() {
            if *id == t {
                *id = t + 1;
            }
        }
    }
    for out in m.outputs.iter_mut() {
        if out.tensor >= t {
            out.tensor += 1;
        }
    }
    let mut inputs = op.inputs.clone();
    inputs[0] = t;
    m.ops.insert(j + 1, KernelOp { kind: op.kind.clone(), inputs, outputs: vec![t + 1] });
    m.tensors.insert(t + 1, m.tensors[t].clone());
    Some(m)
}

/// Removes block op `j` (one operand, one output) by making its consumers read its operand.
pub fn drop_block_op(bg: &BlockGraph, j: usize) -> Option<BlockGraph> {
    let op = bg.ops.get(j)?;
    if op.outputs.len() != 1 || op.inputs.is_empty() {
        return None;
    }
    let (t, u) = (op.outputs[0], op.inputs[0]);
    let mut m = bg.clone();
    for o in m.ops.iter_mut().skip(j + 1) {
        for id in o.inputs.iter_mut() {
            if *id == t {
                *id = u;
            }
        }
    }
    Some(m)
}

/// Removes kernel op `j` (one output) by making its consumers (and outputs) read its first operand.
pub fn drop_kernel_op(g: &KernelGraph, j: usize) -> Option<KernelGraph> {
    let op = g.ops.get(j)?;
    if op.outputs.len() != 1 || op.inputs.is_empty() {
        return None;
    }
    let (t, u) = (op.outputs[0], op.inputs[0]);
    let mut m = g.clone();
    for o in m.ops.iter_mut().skip(j + 1) {
        for id in o.inputs.iter_mut() {
            if *id == t {
                *id = u;
            }
        }
    }
    for out in m.outputs.iter_mut() {
        if out.tensor == t {
            out.tensor = u;
        }
    }
    Some(m)
}
