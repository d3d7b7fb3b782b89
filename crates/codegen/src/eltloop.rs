//! Register-resident element-wise loops: a block graph that is element-wise over one tile
//! shape ([`BlockGraph::is_elementwise`]: inputs, unary and binary ops with broadcasting, sums
//! and maxima over dims of size 1, the running max, plain / rescaled / max loop accumulators,
//! outputs after the loop) keeps every value in registers, across the loop too.
//!
//! Thread `tid` owns elements `tid + j * NT` of the largest tile and computes every value at
//! those elements, a broadcast one included (the same value in every thread that needs it),
//! so no value is shared: no shared memory and no barrier. The loop is unrolled, so that its
//! device loads do not wait on its arithmetic.
//!
//! Split-KV attention's combine step is of this form (per row: the running max of the slices'
//! maxima, their rescaled sums, one division). The general schedule (`block_kernel`) runs it
//! as passes over shared memory with a barrier between them, which for tiles of a few hundred
//! elements is a chain of barriers and latencies per iteration.

use mirage_ugraph::{BlockGraph, BlockOp, BlockOpKind, Phase};

use crate::block_kernel::{tile_base, Emitted};
use crate::emit::{binary_expr, coord, dev_offset, kernel_open, kernel_params, numel, unary_expr, wl};
use crate::error::Result;
use crate::program::DevBuffer;
use crate::runtime::Parts;

/// Most elements of the largest tile a thread holds.
const MAX_PER_THREAD: usize = 8;
/// Longest loop that is unrolled whole.
const MAX_UNROLL: usize = 32;

/// Where an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sec {
    Pre,
    Loop,
    Post,
}

/// The kernel `name` for `bg` in registers, or `None` when the graph is not of that form.
pub(crate) fn emit(name: &str, bg: &BlockGraph, ins: &[DevBuffer], outs: &[DevBuffer]) -> Result<Option<Emitted>> {
    let nt: usize = bg.block_dim.iter().product();
    if nt == 0 || !nt.is_multiple_of(32) || !bg.is_elementwise() {
        return Ok(None);
    }
    let Some(full) = bg.tensors.iter().max_by_key(|t| numel(&t.dims)).map(|t| t.dims.clone()) else {
        return Ok(None);
    };
    let n = numel(&full);
    let per = n.div_ceil(nt);
    if per > MAX_PER_THREAD {
        return Ok(None);
    }
    let params = kernel_params(ins, outs);
    // Element offset in device tensor `dev` of the tile element that element `e` reads.
    let elem = |dims: &[usize], dev: &DevBuffer| dev_offset(&full, "e", dims, &dev.strides);
    let v = |t: usize| format!("v{t}[j]");

    // The statements of each section, per element slot j (element e).
    let mut body: [String; 3] = Default::default();
    let (mut k_in, mut j_out) = (0, 0);
    for op in &bg.ops {
        let Some(sec) = section(bg, op) else { return Ok(None) };
        let s = &mut body[sec as usize];
        match op.kind {
            BlockOpKind::Input { imap, forloop_dim, .. } => {
                let (k, t) = (k_in, op.outputs[0]);
                k_in += 1;
                let dims = &bg.tensors[t].dims;
                let it = (forloop_dim >= 0).then_some("it");
                let base = tile_base(bg, imap, forloop_dim, dims, &ins[k].strides, it);
                wl!(s, "{} = mi::to_f32(in{k}[{base} + {}]);", v(t), elem(dims, &ins[k]));
            }
            BlockOpKind::Output { omap, forloop_dim } => {
                let (j, t) = (j_out, op.inputs[0]);
                j_out += 1;
                let dims = &bg.tensors[t].dims;
                let base = tile_base(bg, omap, forloop_dim, dims, &outs[j].strides, None);
                // A broadcast tile is stored by the elements at coordinate 0 of its unit dims.
                let firsts: Vec<String> = (0..full.len())
                    .filter(|&d| dims[d] == 1 && full[d] > 1)
                    .map(|d| format!("{} == 0", coord(&full, d, "e")))
                    .collect();
                let store = format!(
                    "out{j}[{base} + {}] = mi::from_f32<{}>({});",
                    elem(dims, &outs[j]),
                    outs[j].storage.cty(),
                    v(t)
                );
                if firsts.is_empty() {
                    wl!(s, "{store}");
                } else {
                    wl!(s, "if ({}) {store}", firsts.join(" && "));
                }
            }
            BlockOpKind::Unary { op: ref u } => {
                wl!(s, "{} = {};", v(op.outputs[0]), unary_expr(u, &v(op.inputs[0])));
            }
            BlockOpKind::Binary { op: b } => {
                wl!(s, "{} = {};", v(op.outputs[0]), binary_expr(b, &v(op.inputs[0]), &v(op.inputs[1])));
            }
            BlockOpKind::Reduction { .. } => wl!(s, "{} = {};", v(op.outputs[0]), v(op.inputs[0])),
            BlockOpKind::ReductionMax { .. } => {
                let (x, m, d) = (v(op.inputs[0]), v(op.outputs[0]), v(op.outputs[1]));
                if sec == Sec::Loop {
                    wl!(s, "if (it == 0) {{ {m} = {x}; {d} = {x} - {x}; }}");
                    wl!(s, "else {{ const float p = {m}; const float nm = fmaxf(p, {x}); {d} = p - nm; {m} = nm; }}");
                } else {
                    wl!(s, "{m} = {x}; {d} = {x} - {x};");
                }
            }
            BlockOpKind::ForloopAccumMax => {
                let (x, o) = (v(op.inputs[0]), v(op.outputs[0]));
                wl!(s, "{o} = it == 0 ? {x} : fmaxf({o}, {x});");
            }
            BlockOpKind::ForloopAccumRescale { .. } => {
                let (x, sc, o) = (v(op.inputs[0]), v(op.inputs[1]), v(op.outputs[0]));
                wl!(s, "{o} = it == 0 ? {x} : {o} * {sc} + {x};");
            }
            BlockOpKind::ForloopAccum { .. } => {
                let (x, o) = (v(op.inputs[0]), v(op.outputs[0]));
                wl!(s, "{o} = it == 0 ? {x} : {o} + {x};");
            }
            _ => return Ok(None),
        }
    }

    let mut s = String::new();
    wl!(
        s,
        "// block graph: grid {:?}, block {:?}, forloop_range {}: element-wise in registers ({per} element(s) per thread)",
        bg.grid_dim,
        bg.block_dim,
        bg.forloop_range
    );
    s.push_str(&kernel_open(&nt.to_string(), name, &params, nt, ""));
    wl!(s, "  constexpr int NT = {nt};");
    wl!(s, "  const int tid = mi::lin_tid();");
    wl!(s, "  (void)tid;");
    for t in 0..bg.tensors.len() {
        wl!(s, "  float v{t}[{per}];");
    }
    let guard = if n.is_multiple_of(nt) { String::new() } else { format!("if (e >= {n}u) continue; ") };
    let slots = |s: &mut String, ind: &str, code: &str| {
        if code.is_empty() {
            return;
        }
        wl!(s, "{ind}#pragma unroll");
        wl!(s, "{ind}for (int j = 0; j < {per}; ++j) {{");
        wl!(s, "{ind}  const unsigned e = (unsigned)tid + (unsigned)j * {nt}u; {guard}(void)e;");
        for l in code.lines() {
            wl!(s, "{ind}  {l}");
        }
        wl!(s, "{ind}}}");
    };
    slots(&mut s, "  ", &body[Sec::Pre as usize]);
    if !body[Sec::Loop as usize].is_empty() {
        if bg.forloop_range <= MAX_UNROLL {
            wl!(s, "#pragma unroll");
        } else {
            wl!(s, "#pragma unroll 8");
        }
        wl!(s, "  for (int it = 0; it < {}; ++it) {{", bg.forloop_range);
        slots(&mut s, "    ", &body[Sec::Loop as usize]);
        wl!(s, "  }}");
    }
    slots(&mut s, "  ", &body[Sec::Post as usize]);
    wl!(s, "}}");
    Ok(Some(Emitted { source: s, smem_bytes: 0, cluster: [1; 3], extra_threads: 0, parts: Parts::NONE }))
}

/// Where op `op` runs: inputs of the loop and ops of loop-phase values in it, the running max
/// in it unless its operand is computed after the loop, outputs after it. `None` for an op
/// outside the form (which `is_elementwise` rules out).
fn section(bg: &BlockGraph, op: &BlockOp) -> Option<Sec> {
    let phase = |t: usize| match bg.tensors[t].phase {
        Phase::Invariant => Sec::Pre,
        Phase::Loop => Sec::Loop,
        Phase::Post => Sec::Post,
    };
    Some(match op.kind {
        BlockOpKind::Input { forloop_dim, .. } if forloop_dim >= 0 => Sec::Loop,
        BlockOpKind::Input { .. } => Sec::Pre,
        BlockOpKind::Output { .. } => Sec::Post,
        BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } | BlockOpKind::Reduction { .. } => phase(op.outputs[0]),
        BlockOpKind::ReductionMax { .. } if phase(op.inputs[0]) == Sec::Post => Sec::Post,
        BlockOpKind::ReductionMax { .. }
        | BlockOpKind::ForloopAccum { .. }
        | BlockOpKind::ForloopAccumRescale { .. }
        | BlockOpKind::ForloopAccumMax => Sec::Loop,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{BufferRef, Storage};
    use mirage_ugraph::{DType, KernelOpKind, TensorId};

    fn dev(dims: &[usize]) -> DevBuffer {
        let strides = crate::emit::row_major(dims);
        DevBuffer { dims: dims.to_vec(), strides, storage: Storage::F32, location: BufferRef::Input(0) }
    }

    /// The combine step over `splits` slices (`zoo::combine`, fp32); with `matmul`, a loop
    /// matmul besides: its block graph and the device buffers of its inputs and outputs.
    fn combine(splits: usize, matmul: bool) -> (BlockGraph, Vec<DevBuffer>, Vec<DevBuffer>) {
        let g = mirage_ugraph::zoo::combine(splits, 128, DType::Float32, matmul).expect("zoo");
        let op = g.ops.iter().find(|op| matches!(op.kind, KernelOpKind::Customized { .. })).expect("customized");
        let KernelOpKind::Customized { graph } = &op.kind else { unreachable!("found above") };
        let bufs = |ts: &[TensorId]| ts.iter().map(|&t| dev(&g.tensors[t].dims)).collect::<Vec<_>>();
        (graph.clone(), bufs(&op.inputs), bufs(&op.outputs))
    }

    #[test]
    fn the_combine_step_runs_in_registers_without_barriers() {
        let (bg, ins, outs) = combine(8, false);
        let e = emit("k", &bg, &ins, &outs).expect("emits").expect("register form");
        assert_eq!(e.smem_bytes, 0);
        assert!(!e.source.contains("__syncthreads"));
        // 4 x 64 elements per block over 128 threads: two per thread, the loop unrolled.
        assert!(e.source.contains("float v0[2];"));
        assert!(e.source.contains("#pragma unroll\n  for (int it = 0; it < 8; ++it)"));
    }

    #[test]
    fn other_ops_take_the_general_schedule() {
        let (bg, ins, outs) = combine(8, true);
        assert!(emit("k", &bg, &ins, &outs).expect("emits").is_none());
    }
}
