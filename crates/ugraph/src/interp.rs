//! The interpreter: runs any kernel graph, customized ops block by block and iteration by
//! iteration, in any [`Scalar`] domain (f32 for CPU runs, a finite field for verification).
//!
//! It is demand-driven: [`run_region`] evaluates only what a box of each output depends on.
//! A backward pass maps each op's demanded output box to boxes of its operands (through kernel
//! ops, the blocks of customized ops whose tiles meet the demand, their iterations and tile
//! ops); the forward pass computes exactly those boxes. [`run`] demands whole outputs.
//!
//! Limits: every demanded box holds at most [`MAX_RUN_NUMEL`] elements and a customized op
//! runs at most [`MAX_RUN_BLOCKS`] blocks, checked before anything is allocated. A [`Cancel`]
//! handle ([`run_with`], [`run_region_with`]) is polled between kernel ops, row bands of a
//! kernel op, thread blocks and loop iterations.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::block::{BlockGraph, BlockOpKind, Phase};
use crate::cancel::Cancel;
use crate::error::{invalid, shape_err, Result};
use crate::kernel::{KernelGraph, KernelOpKind};
use crate::limits::{checked_numel, MAX_RUN_BLOCKS, MAX_RUN_NUMEL};
use crate::ops::{Accum, BinaryOp};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::types::numel;

/// A half-open box `[start, end)` of a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region {
    /// First index per dim.
    pub start: Vec<usize>,
    /// One past the last index per dim.
    pub end: Vec<usize>,
}

impl Region {
    /// The whole of a tensor of `dims`.
    pub fn full(dims: &[usize]) -> Region {
        Region { start: vec![0; dims.len()], end: dims.to_vec() }
    }

    /// Extent per dim.
    pub fn extent(&self) -> Vec<usize> {
        self.start.iter().zip(&self.end).map(|(s, e)| e - s).collect()
    }

    /// Smallest box holding both.
    pub fn hull(&self, o: &Region) -> Region {
        Region {
            start: self.start.iter().zip(&o.start).map(|(a, b)| *a.min(b)).collect(),
            end: self.end.iter().zip(&o.end).map(|(a, b)| *a.max(b)).collect(),
        }
    }

    /// Common part, if not empty.
    pub fn intersect(&self, o: &Region) -> Option<Region> {
        let start: Vec<usize> = self.start.iter().zip(&o.start).map(|(a, b)| *a.max(b)).collect();
        let end: Vec<usize> = self.end.iter().zip(&o.end).map(|(a, b)| *a.min(b)).collect();
        start.iter().zip(&end).all(|(s, e)| s < e).then_some(Region { start, end })
    }

    /// This box moved by `+off`.
    fn shift(&self, off: &[usize]) -> Region {
        Region {
            start: self.start.iter().zip(off).map(|(a, b)| a + b).collect(),
            end: self.end.iter().zip(off).map(|(a, b)| a + b).collect(),
        }
    }

    /// This box relative to `origin` (which it must not precede).
    fn relative(&self, origin: &[usize]) -> Region {
        Region {
            start: self.start.iter().zip(origin).map(|(a, b)| a - b).collect(),
            end: self.end.iter().zip(origin).map(|(a, b)| a - b).collect(),
        }
    }

    /// This box widened to the whole of `dims` (of size `full`) along each dim in `dims`.
    fn widen(&self, dims: &[usize], full: &[usize]) -> Region {
        let mut r = self.clone();
        for &d in dims {
            r.start[d] = 0;
            r.end[d] = full[d];
        }
        r
    }

    /// The box of an operand of `dims` that broadcasts into this box (size-1 dims stay `[0, 1)`).
    fn broadcast_to(&self, dims: &[usize]) -> Region {
        let mut r = self.clone();
        for (d, &n) in dims.iter().enumerate() {
            if n == 1 {
                r.start[d] = 0;
                r.end[d] = 1;
            }
        }
        r
    }
}

/// The hull of the demanded boxes of `outputs`, if any is demanded.
fn demanded(outputs: &[usize], need: &[Option<Region>]) -> Option<Region> {
    let mut r = None;
    for x in outputs.iter().filter_map(|&t| need[t].clone()) {
        hull_into(&mut r, x);
    }
    r
}

fn hull_into(slot: &mut Option<Region>, r: Region) {
    *slot = Some(match slot.take() {
        Some(old) => old.hull(&r),
        None => r,
    });
}

/// Where the interpreter reads graph inputs from: materialized tensors, or a lazy generator.
pub trait Source<S: Scalar>: Sync {
    /// Reads the box `[off, off + extent)` of graph input `input`.
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<S>;
}

impl<S: Scalar> Source<S> for [Tensor<S>] {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<S> {
        self[input].slice(off, extent)
    }
}

impl<S: Scalar> Source<S> for Vec<Tensor<S>> {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<S> {
        self[input].slice(off, extent)
    }
}

/// A computed box of a tensor.
#[derive(Clone)]
struct Part<S> {
    region: Region,
    t: Tensor<S>,
}

impl<S: Scalar> Part<S> {
    /// The values of `r`, which must lie inside this part.
    fn view(&self, r: &Region) -> Cow<'_, Tensor<S>> {
        if *r == self.region {
            Cow::Borrowed(&self.t)
        } else {
            Cow::Owned(self.t.slice(&r.relative(&self.region.start).start, &r.extent()))
        }
    }
}

/// An operand of a predefined kernel op: a computed part, or a graph input (its position)
/// that the op reads from the source box by box.
enum Operand<'a, S> {
    Part(&'a Part<S>),
    Input(usize),
}

impl<S: Scalar> Operand<'_, S> {
    /// The values of box `r` of the operand.
    fn values<'b, I: Source<S> + ?Sized>(&'b self, r: &Region, src: &I) -> Cow<'b, Tensor<S>> {
        match self {
            Operand::Part(p) => p.view(r),
            Operand::Input(pos) => Cow::Owned(src.read(*pos, &r.start, &r.extent())),
        }
    }
}

/// How a tile- or kernel-level op's demanded output box maps to operand boxes.
enum Rule {
    /// Element-wise, operands broadcast.
    Elementwise,
    /// `[.., m, k] x [.., k, n]`.
    Matmul,
    /// Operand 0 is needed whole along these dims; the output keeps the demanded box.
    Reduce(Vec<usize>),
    /// The op needs whole rows along these dims and computes them whole (rms_norm, softmax);
    /// operands after the first (a weight) are needed whole.
    Widen(Vec<usize>),
    /// Concatenation along a dim.
    Concat(usize),
}

impl Rule {
    /// Operand boxes (None: operand not needed) and the box the op computes for output box `r`.
    fn apply(&self, r: &Region, operands: &[&[usize]]) -> (Vec<Option<Region>>, Region) {
        match self {
            Rule::Elementwise => (operands.iter().map(|d| Some(r.broadcast_to(d))).collect(), r.clone()),
            Rule::Matmul => {
                let n = r.start.len();
                let mut a = r.widen(&[n - 1], operands[0]);
                a.end[n - 1] = operands[0][n - 1];
                let b = r.widen(&[n - 2], operands[1]);
                (vec![Some(a), Some(b)], r.clone())
            }
            Rule::Reduce(dims) => (vec![Some(r.widen(dims, operands[0]))], r.clone()),
            Rule::Widen(dims) => {
                let w = r.widen(dims, operands[0]);
                let mut ops = vec![Some(w.clone())];
                ops.extend(operands[1..].iter().map(|d| Some(Region::full(d))));
                (ops, w)
            }
            Rule::Concat(d) => {
                let (d, la) = (*d, operands[0][*d]);
                let mut a = r.clone();
                a.end[d] = a.end[d].min(la);
                let mut b = r.clone();
                b.start[d] = b.start[d].max(la) - la;
                b.end[d] = b.end[d].saturating_sub(la);
                let keep = |x: Region| (x.start[d] < x.end[d]).then_some(x);
                (vec![keep(a), keep(b)], r.clone())
            }
        }
    }
}

fn kernel_rule(kind: &KernelOpKind, rank: usize) -> Rule {
    match kind {
        KernelOpKind::Matmul => Rule::Matmul,
        KernelOpKind::Unary { .. } | KernelOpKind::Binary { .. } => Rule::Elementwise,
        KernelOpKind::Reduction { dim } => Rule::Reduce(vec![*dim]),
        KernelOpKind::RmsNorm { normalized_ndims, .. } => Rule::Widen((rank - normalized_ndims..rank).collect()),
        KernelOpKind::Softmax { dim } => Rule::Widen(vec![*dim]),
        KernelOpKind::Input { .. } | KernelOpKind::Customized { .. } => unreachable!("no region rule"),
    }
}

fn block_rule(kind: &BlockOpKind, rank: usize) -> Rule {
    match kind {
        BlockOpKind::Matmul => Rule::Matmul,
        BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } => Rule::Elementwise,
        BlockOpKind::Reduction { dim } | BlockOpKind::ReductionMax { dim } => Rule::Reduce(vec![*dim]),
        BlockOpKind::RmsNorm { .. } => Rule::Widen(vec![rank - 1]),
        BlockOpKind::Concat { dim } => Rule::Concat(*dim),
        BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => match acc {
            Accum::None => Rule::Elementwise,
            _ => Rule::Reduce(vec![rank - 1]),
        },
        BlockOpKind::ForloopAccumMax => Rule::Elementwise,
        BlockOpKind::Input { .. } | BlockOpKind::Output { .. } => unreachable!("no region rule"),
    }
}

/// Pseudo-random f32 tensors for every input of `g` ([`Tensor::random`], input `i` seeded with
/// `seed + i`).
pub fn random_inputs(g: &KernelGraph, seed: u64) -> Vec<Tensor<f32>> {
    g.input_ids().iter().enumerate().map(|(i, &id)| Tensor::random(&g.tensors[id].dims, seed + i as u64)).collect()
}

/// Runs `g` on `inputs` (one per graph input, in order); returns the graph's outputs
/// ([`KernelGraph::output_ids`]) in order.
pub fn run<S: Scalar>(g: &KernelGraph, inputs: &[Tensor<S>]) -> Result<Vec<Tensor<S>>> {
    run_with(g, inputs, &Cancel::default())
}

/// [`run`], stopping with [`crate::Error::Cancelled`] once `cancel` is set.
pub fn run_with<S: Scalar>(g: &KernelGraph, inputs: &[Tensor<S>], cancel: &Cancel) -> Result<Vec<Tensor<S>>> {
    let ids = g.input_ids();
    if ids.len() != inputs.len() {
        return invalid("run", format!("the graph has {} inputs but {} were given", ids.len(), inputs.len()));
    }
    for (i, (&id, t)) in ids.iter().zip(inputs).enumerate() {
        let want = &g.tensors[id].dims;
        if &t.dims != want || t.data.len() != t.dims.iter().product::<usize>() {
            return shape_err("run", format!("input {i} has dims {:?} but the graph expects {want:?}", t.dims));
        }
    }
    let regions: Vec<Region> = g.output_ids().iter().map(|&t| Region::full(&g.tensors[t].dims)).collect();
    run_region_with(g, inputs, &regions, cancel)
}

/// Evaluates only what box `regions[i]` of each output `i` ([`KernelGraph::output_ids`] order)
/// depends on; returns those boxes.
pub fn run_region<S: Scalar, I: Source<S> + ?Sized>(
    g: &KernelGraph,
    inputs: &I,
    regions: &[Region],
) -> Result<Vec<Tensor<S>>> {
    run_region_with(g, inputs, regions, &Cancel::default())
}

/// [`run_region`], stopping with [`crate::Error::Cancelled`] once `cancel` is set.
pub fn run_region_with<S: Scalar, I: Source<S> + ?Sized>(
    g: &KernelGraph,
    inputs: &I,
    regions: &[Region],
    cancel: &Cancel,
) -> Result<Vec<Tensor<S>>> {
    let outs = g.output_ids();
    if regions.len() != outs.len() {
        return invalid(
            "run_region",
            format!("the graph has {} outputs but {} regions were given", outs.len(), regions.len()),
        );
    }
    let mut need: Vec<Option<Region>> = vec![None; g.tensors.len()];
    for (k, (&t, r)) in outs.iter().zip(regions).enumerate() {
        let dims = &g.tensors[t].dims;
        let ok = r.start.len() == dims.len() && (0..dims.len()).all(|d| r.start[d] < r.end[d] && r.end[d] <= dims[d]);
        if !ok {
            return shape_err(
                "run_region",
                format!("region {r:?} of output {k} is empty or outside its dims {dims:?}"),
            );
        }
        hull_into(&mut need[t], r.clone());
    }

    // Backward: demanded boxes of every tensor; block plans of customized ops.
    let mut plans: Vec<Vec<BlockPlan>> = vec![Vec::new(); g.ops.len()];
    for (i, op) in g.ops.iter().enumerate().rev() {
        let out_need: Vec<Option<Region>> = op.outputs.iter().map(|&t| need[t].clone()).collect();
        if out_need.iter().all(Option::is_none) {
            continue;
        }
        let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| g.tensors[t].dims.as_slice()).collect();
        let in_need = match &op.kind {
            KernelOpKind::Input { .. } => continue,
            KernelOpKind::Customized { graph } => {
                check_run_blocks(i, graph)?;
                let (plan, in_need) = plan_blocks(graph, &out_need, cancel);
                cancel.check()?;
                plans[i] = plan;
                in_need
            }
            kind => {
                let r = out_need[0].as_ref().expect("single-output op is demanded");
                kernel_rule(kind, r.start.len()).apply(r, &dims).0
            }
        };
        for (&t, r) in op.inputs.iter().zip(in_need) {
            if let Some(r) = r {
                // A block input that lifts the tensor's rank (leading 1s) demands its trailing dims.
                let lift = r.start.len().saturating_sub(g.tensors[t].dims.len());
                let r = Region { start: r.start[lift..].to_vec(), end: r.end[lift..].to_vec() };
                hull_into(&mut need[t], r);
            }
        }
    }

    check_run_sizes(g, &need)?;

    // A graph input that one op alone reads (not an output) is never read whole: a predefined
    // op reads the boxes of its bands from `inputs`, a customized kernel's blocks their tiles
    // where they read each element at most a few times ([`tiles_read_few_times`]). Any other
    // is read once, here.
    let whole = materialized_inputs(g);
    let mut deferred: Vec<Option<usize>> = vec![None; g.tensors.len()];

    // Forward: compute the demanded boxes.
    let mut vals: Vec<Option<Part<S>>> = vec![None; g.tensors.len()];
    let mut input_pos = 0;
    for (i, op) in g.ops.iter().enumerate() {
        if let KernelOpKind::Input { .. } = op.kind {
            let t = op.outputs[0];
            if let Some(r) = &need[t] {
                if whole[t] {
                    vals[t] = Some(Part { region: r.clone(), t: inputs.read(input_pos, &r.start, &r.extent()) });
                } else {
                    deferred[t] = Some(input_pos);
                }
            }
            input_pos += 1;
            continue;
        }
        if op.outputs.iter().all(|&t| need[t].is_none()) {
            continue;
        }
        cancel.check()?;
        let results: Vec<Option<Part<S>>> = match &op.kind {
            KernelOpKind::Customized { graph } => {
                // An input no demanded output depends on was never computed. A block input
                // declared with leading 1s sees the part with those dims added.
                let lifted: Vec<Option<Part<S>>> = op
                    .inputs
                    .iter()
                    .zip(graph.input_ops())
                    .map(|(&t, bop)| {
                        let rank = bop.outputs.first().map_or(0, |&o| graph.tensors[o].dims.len());
                        let p = vals[t].as_ref()?;
                        let lift = rank.checked_sub(p.t.dims.len()).filter(|&l| l > 0)?;
                        let pad = |v: &[usize], x: usize| [vec![x; lift], v.to_vec()].concat();
                        let region = Region { start: pad(&p.region.start, 0), end: pad(&p.region.end, 1) };
                        Some(Part { region, t: Tensor { dims: pad(&p.t.dims, 1), data: p.t.data.clone() } })
                    })
                    .collect();
                let ins: Vec<Option<BlockSource<'_, S, I>>> = op
                    .inputs
                    .iter()
                    .zip(&lifted)
                    .map(|(&t, l)| match (l.as_ref().or(vals[t].as_ref()), deferred[t]) {
                        (Some(p), _) => Some(BlockSource::Part(p)),
                        (None, Some(pos)) => {
                            Some(BlockSource::Input { src: inputs, pos, rank: g.tensors[t].dims.len() })
                        }
                        (None, None) => None,
                    })
                    .collect();
                let out_need: Vec<Option<Region>> = op.outputs.iter().map(|&t| need[t].clone()).collect();
                let outs = run_customized(graph, &plans[i], &ins, &out_need, cancel);
                cancel.check()?;
                outs
            }
            kind => {
                let r = need[op.outputs[0]].clone().expect("demanded");
                let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| g.tensors[t].dims.as_slice()).collect();
                let operands: Vec<Operand<S>> = op
                    .inputs
                    .iter()
                    .map(|&t| match (&vals[t], deferred[t]) {
                        (Some(p), _) => Operand::Part(p),
                        (None, Some(pos)) => Operand::Input(pos),
                        (None, None) => unreachable!("operands are computed before use"),
                    })
                    .collect();
                let t = kernel_op(kind, &r, &dims, &operands, inputs, cancel)?;
                vec![Some(Part { region: r, t })]
            }
        };
        for (&t, p) in op.outputs.iter().zip(results) {
            vals[t] = p;
        }
    }
    Ok(outs
        .iter()
        .zip(regions)
        .map(|(&t, r)| vals[t].as_ref().expect("outputs are computed").view(r).into_owned())
        .collect())
}

/// Output elements (times the inner dim of a matmul) a kernel op computes between two polls
/// of the cancel flag.
const BAND_WORK: usize = 1 << 22;
/// Rows a band is widened to where [`BAND_WORK`] would leave fewer, within [`MAX_BAND_WORK`]: a
/// matmul of a few rows by a wide weight (a whole-output check of a projection) then runs as one
/// parallel, blocked matmul per band instead of one row at a time on one thread.
const MIN_BAND_ROWS: usize = 32;
/// Most work between two polls of the cancel flag when a band is widened (about 10^9 products:
/// a second or two on two cores).
const MAX_BAND_WORK: usize = 1 << 30;

/// Elements of a graph input an op reads from the source in one band, at most (a band of
/// one row may read more).
const INPUT_BAND: usize = 1 << 21;

/// Computes box `r` of a predefined kernel op from its operands, in bands of rows along dim 0
/// (polling `cancel` between bands) where the op's rule allows it. A graph-input operand
/// whose box shrinks with the band is read band by band from `src` (bands then hold at most
/// [`INPUT_BAND`] of its elements); one every band needs whole is read once.
fn kernel_op<S: Scalar, I: Source<S> + ?Sized>(
    kind: &KernelOpKind,
    r: &Region,
    dims: &[&[usize]],
    operands: &[Operand<S>],
    src: &I,
    cancel: &Cancel,
) -> Result<Tensor<S>> {
    let rule = kernel_rule(kind, r.start.len());
    let ext = r.extent();
    let inner = match kind {
        KernelOpKind::Matmul => dims[0][dims[0].len() - 1],
        _ => 1,
    };
    let per_row = numel(&ext[1..]).saturating_mul(inner).max(1);
    let splittable = !matches!(&rule, Rule::Widen(d) if d.contains(&0)) && ext.len() > 1;
    let mut band =
        if splittable { (BAND_WORK / per_row).max(MIN_BAND_ROWS.min(MAX_BAND_WORK / per_row)).max(1) } else { ext[0] };
    // Input operands: banded where one row's box is a share of the whole box, else read once.
    let (whole_boxes, _) = rule.apply(r, dims);
    let mut row = r.clone();
    row.end[0] = row.start[0] + 1;
    let (row_boxes, _) = rule.apply(&row, dims);
    let mut read: Vec<Option<Part<S>>> = Vec::with_capacity(operands.len());
    for ((o, w), b) in operands.iter().zip(&whole_boxes).zip(&row_boxes) {
        let (Operand::Input(pos), Some(w)) = (o, w) else {
            read.push(None);
            continue;
        };
        let per_band_row = b.as_ref().map_or(0, |b| numel(&b.extent()));
        if splittable && per_band_row.saturating_mul(ext[0]) <= numel(&w.extent()) {
            band = band.min((INPUT_BAND / per_band_row.max(1)).max(1));
            read.push(None);
        } else {
            read.push(Some(Part { region: w.clone(), t: src.read(*pos, &w.start, &w.extent()) }));
        }
    }
    let operands: Vec<Operand<S>> = operands
        .iter()
        .zip(&read)
        .map(|(o, p)| match (o, p) {
            (_, Some(p)) => Operand::Part(p),
            (Operand::Part(p), None) => Operand::Part(p),
            (Operand::Input(pos), None) => Operand::Input(*pos),
        })
        .collect();
    let parts = operands.as_slice();
    if band >= ext[0] {
        return Ok(kernel_box(kind, &rule, r, dims, parts, src));
    }
    let mut out = Tensor::zeros(&ext);
    let mut row = r.start[0];
    while row < r.end[0] {
        cancel.check()?;
        let mut rb = r.clone();
        rb.start[0] = row;
        rb.end[0] = (row + band).min(r.end[0]);
        let t = kernel_box(kind, &rule, &rb, dims, parts, src);
        let mut at = vec![0; ext.len()];
        at[0] = row - r.start[0];
        out.copy_from(&at, &t, &vec![0; ext.len()], &rb.extent());
        row = rb.end[0];
    }
    Ok(out)
}

/// Computes box `r` of a predefined kernel op in one piece.
fn kernel_box<S: Scalar, I: Source<S> + ?Sized>(
    kind: &KernelOpKind,
    rule: &Rule,
    r: &Region,
    dims: &[&[usize]],
    operands: &[Operand<S>],
    src: &I,
) -> Tensor<S> {
    let (opr, computed) = rule.apply(r, dims);
    let args: Vec<Cow<Tensor<S>>> = operands
        .iter()
        .zip(&opr)
        .map(|(o, rr)| o.values(rr.as_ref().expect("kernel operands are always needed"), src))
        .collect();
    let t = match kind {
        KernelOpKind::Matmul => args[0].matmul(&args[1]),
        KernelOpKind::Unary { op: u } => args[0].unary(u),
        KernelOpKind::Binary { op: b } => args[0].binary(*b, &args[1]),
        KernelOpKind::Reduction { dim } => args[0].sum_dim(*dim),
        KernelOpKind::RmsNorm { normalized_ndims, eps } => {
            let x = &args[0];
            let len: usize = x.dims[x.dims.len() - normalized_ndims..].iter().product();
            x.rms_norm(len, args.get(1).map(|w| w.as_ref()), *eps)
        }
        KernelOpKind::Softmax { dim } => args[0].softmax(*dim),
        KernelOpKind::Input { .. } | KernelOpKind::Customized { .. } => unreachable!("no kernel box"),
    };
    Part { region: computed, t }.view(r).into_owned()
}

/// Refuses a customized op (kernel op `i`) whose grid has more blocks than the interpreter runs.
fn check_run_blocks(i: usize, bg: &BlockGraph) -> Result<()> {
    let blocks = bg.grid_dim.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
    if blocks > MAX_RUN_BLOCKS {
        return shape_err(
            "run",
            format!(
                "kernel op #{i} (customized) has grid_dim {:?} ({blocks} blocks); the CPU interpreter runs at most {MAX_RUN_BLOCKS} (2^20) blocks per op",
                bg.grid_dim
            ),
        );
    }
    Ok(())
}

/// Refuses a run whose demanded boxes (or a demanded customized op's tiles) hold more than
/// [`MAX_RUN_NUMEL`] elements, before anything is allocated.
fn check_run_sizes(g: &KernelGraph, need: &[Option<Region>]) -> Result<()> {
    let too_big = |what: String, dims: &[usize]| {
        shape_err(
            "run",
            format!("{what} with dims {dims:?} needs more than {MAX_RUN_NUMEL} (2^31) elements, the most the CPU interpreter holds per tensor"),
        )
    };
    for (t, r) in need.iter().enumerate() {
        let Some(r) = r else { continue };
        let ext = r.extent();
        if crate::limits::checked_numel(&ext).is_none_or(|n| n > MAX_RUN_NUMEL) {
            return too_big(format!("tensor #{t} (a box of it)"), &ext);
        }
    }
    for (i, op) in g.ops.iter().enumerate() {
        let KernelOpKind::Customized { graph } = &op.kind else { continue };
        if op.outputs.iter().all(|&t| need[t].is_none()) {
            continue;
        }
        for (j, st) in graph.tensors.iter().enumerate() {
            if crate::limits::checked_numel(&st.dims).is_none_or(|n| n > MAX_RUN_NUMEL) {
                return too_big(format!("kernel op #{i} (customized): stensor #{j}"), &st.dims);
            }
        }
    }
    Ok(())
}

/// What one block must compute: its coordinate and the demanded box of each of its tensors.
#[derive(Clone)]
struct BlockPlan {
    coord: [usize; 3],
    need: Vec<Option<Region>>,
}

fn block_coord(bg: &BlockGraph, b: usize) -> [usize; 3] {
    let [gx, gy, _] = bg.grid_dim;
    [b % gx, (b / gx) % gy, b / (gx * gy)]
}

/// Iterations whose tiles a loop dim selects: all of them when `loop_dim >= 0`, else one.
fn iterations(bg: &BlockGraph, loop_dim: i64) -> usize {
    if loop_dim >= 0 {
        bg.forloop_range
    } else {
        1
    }
}

/// Plans the blocks of a customized op for the demanded boxes of its outputs; returns the plans
/// and the demanded boxes of its inputs.
fn plan_blocks(bg: &BlockGraph, out_need: &[Option<Region>], cancel: &Cancel) -> (Vec<BlockPlan>, Vec<Option<Region>>) {
    let n_inputs = bg.input_ops().count();
    let per_block: Vec<(BlockPlan, Vec<Option<Region>>)> = (0..bg.num_blocks())
        .into_par_iter()
        .filter_map(|b| {
            if cancel.is_set() {
                return None;
            }
            let coord = block_coord(bg, b);
            let mut need: Vec<Option<Region>> = vec![None; bg.tensors.len()];
            for (op, demand) in bg.output_ops().zip(out_need) {
                let (Some(demand), BlockOpKind::Output { omap, forloop_dim }) = (demand, &op.kind) else { continue };
                let tile = &bg.tensors[op.inputs[0]].dims;
                for it in 0..iterations(bg, *forloop_dim) {
                    if cancel.is_set() {
                        return None;
                    }
                    let t = Region::full(tile).shift(&tile_offset(bg, coord, *omap, *forloop_dim, tile, it));
                    if let Some(hit) = t.intersect(demand) {
                        hull_into(&mut need[op.inputs[0]], hit.relative(&t.start));
                    }
                }
            }
            if need.iter().all(Option::is_none) {
                return None;
            }
            let mut in_need: Vec<Option<Region>> = vec![None; n_inputs];
            let mut pos = n_inputs;
            for op in bg.ops.iter().rev() {
                match &op.kind {
                    BlockOpKind::Output { .. } => {}
                    BlockOpKind::Input { imap, forloop_dim, .. } => {
                        pos -= 1;
                        let Some(r) = need[op.outputs[0]].clone() else { continue };
                        let tile = &bg.tensors[op.outputs[0]].dims;
                        for it in 0..iterations(bg, *forloop_dim) {
                            if cancel.is_set() {
                                return None;
                            }
                            hull_into(
                                &mut in_need[pos],
                                r.shift(&tile_offset(bg, coord, *imap, *forloop_dim, tile, it)),
                            );
                        }
                    }
                    kind => {
                        let Some(r) = demanded(&op.outputs, &need) else { continue };
                        let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| bg.tensors[t].dims.as_slice()).collect();
                        let rule = block_rule(kind, r.start.len());
                        let opr = match kind {
                            // The scale broadcasts into the accumulator's box.
                            BlockOpKind::ForloopAccumRescale { .. } => {
                                let mut v = rule.apply(&r, &dims[..1]).0;
                                v.push(Some(r.broadcast_to(dims[1])));
                                v
                            }
                            _ => rule.apply(&r, &dims).0,
                        };
                        for (&t, x) in op.inputs.iter().zip(opr) {
                            if let Some(x) = x {
                                hull_into(&mut need[t], x);
                            }
                        }
                    }
                }
            }
            Some((BlockPlan { coord, need }, in_need))
        })
        .collect();
    let mut in_need: Vec<Option<Region>> = vec![None; n_inputs];
    let plans = per_block
        .into_iter()
        .map(|(plan, ins)| {
            for (slot, r) in in_need.iter_mut().zip(ins) {
                if let Some(r) = r {
                    hull_into(slot, r);
                }
            }
            plan
        })
        .collect();
    (plans, in_need)
}

/// Which graph inputs the interpreter reads whole before running `g`'s ops: one several ops
/// read, an output, and one a customized kernel reads unless its blocks read each element at
/// most a few times ([`tiles_read_few_times`]: they then read their tiles from the source).
/// One predefined op alone reads is read band by band. Indexed by tensor; others false.
pub fn materialized_inputs(g: &KernelGraph) -> Vec<bool> {
    let mut readers = vec![0usize; g.tensors.len()];
    let mut whole = vec![false; g.tensors.len()];
    for op in &g.ops {
        for (k, &t) in op.inputs.iter().enumerate() {
            readers[t] += 1;
            let tiled = match &op.kind {
                KernelOpKind::Customized { graph } => tiles_read_few_times(graph, k, &g.tensors[t].dims),
                _ => true,
            };
            whole[t] |= !tiled || readers[t] > 1;
        }
    }
    g.output_ids().into_iter().for_each(|t| whole[t] = true);
    whole
}

/// Elements of `g`'s tensors the interpreter holds at once when it computes every output
/// whole, at most: every tensor but the graph inputs it reads box by box
/// ([`materialized_inputs`]).
pub fn held_elements(g: &KernelGraph) -> usize {
    let mut held = materialized_inputs(g);
    let inputs = g.input_ids();
    (0..g.tensors.len()).for_each(|t| held[t] |= !inputs.contains(&t));
    g.tensors
        .iter()
        .zip(held)
        .filter(|(_, h)| *h)
        .map(|(t, _)| checked_numel(&t.dims).unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add)
}

/// Whether the blocks of `bg` read each element of their `k`-th input (a device tensor of
/// `dims`) at most [`MAX_TILE_READS`] times over the whole grid and loop: its tiles times the
/// iterations that select them, times the blocks, against the tensor (a grid dim the input
/// map leaves out reads every tile again).
fn tiles_read_few_times(bg: &BlockGraph, k: usize, dims: &[usize]) -> bool {
    let Some(op) = bg.input_ops().nth(k) else { return false };
    let BlockOpKind::Input { forloop_dim, .. } = op.kind else { return false };
    let Some(&tile) = op.outputs.first() else { return false };
    let reads = numel(&bg.tensors[tile].dims)
        .checked_mul(iterations(bg, forloop_dim))
        .and_then(|r| r.checked_mul(bg.num_blocks()));
    reads.is_some_and(|r| r <= numel(dims).saturating_mul(MAX_TILE_READS))
}

/// Times the blocks of a customized kernel may read an element of a graph input before the
/// interpreter reads the input whole instead of tile by tile: a read from a lazy source
/// computes the element again, one from a whole input copies it (after the faults and writes
/// of a fresh buffer of the whole). LLaMA-3-70B's decode over 32,000 keys (two query blocks
/// a head read each key tile), the every-element check on 2 cores: 18.5 s read whole,
/// 15.4-16.3 s tile by tile.
const MAX_TILE_READS: usize = 2;

/// Where a block input's tiles come from: a computed part of its device tensor, or a graph
/// input read tile by tile from the source (`rank`: the device tensor's; a block input with
/// leading 1s added reads the trailing dims).
enum BlockSource<'a, S, I: ?Sized> {
    Part(&'a Part<S>),
    Input { src: &'a I, pos: usize, rank: usize },
}

impl<S: Scalar, I: Source<S> + ?Sized> BlockSource<'_, S, I> {
    /// The values of box `r` (in the block input's rank).
    fn tile(&self, r: &Region) -> Tensor<S> {
        match self {
            BlockSource::Part(p) => p.view(r).into_owned(),
            BlockSource::Input { src, pos, rank } => {
                let lift = r.start.len().saturating_sub(*rank);
                let extent = r.extent();
                let t = src.read(*pos, &r.start[lift..], &extent[lift..]);
                Tensor { dims: extent, data: t.data }
            }
        }
    }
}

/// Runs the planned blocks of a customized op in parallel and places their tiles into the
/// demanded boxes of its outputs.
fn run_customized<S: Scalar, I: Source<S> + ?Sized>(
    bg: &BlockGraph,
    plans: &[BlockPlan],
    inputs: &[Option<BlockSource<'_, S, I>>],
    out_need: &[Option<Region>],
    cancel: &Cancel,
) -> Vec<Option<Part<S>>> {
    let writes: Vec<Vec<Write<S>>> = plans.par_iter().map(|p| run_block(bg, p, inputs, cancel)).collect();
    if cancel.is_set() {
        return Vec::new();
    }
    let mut outs: Vec<Option<Part<S>>> = out_need
        .iter()
        .map(|r| r.as_ref().map(|r| Part { region: r.clone(), t: Tensor::zeros(&r.extent()) }))
        .collect();
    for (k, region, tile) in writes.into_iter().flatten() {
        let Some(out) = outs[k].as_mut() else { continue };
        if let Some(hit) = region.intersect(&out.region) {
            out.t.copy_from(
                &hit.relative(&out.region.start).start,
                &tile,
                &hit.relative(&region.start).start,
                &hit.extent(),
            );
        }
    }
    outs
}

/// One tile written by one block: (output position, its box in the output, values).
type Write<S> = (usize, Region, Tensor<S>);

/// Offset of a block's (and iteration's) tile in a device tensor, for an imap/omap and loop dim.
fn tile_offset(
    bg: &BlockGraph,
    coord: [usize; 3],
    map: [i64; 3],
    loop_dim: i64,
    tile: &[usize],
    iter: usize,
) -> Vec<usize> {
    let mut off = vec![0; tile.len()];
    let lr = iterations(bg, loop_dim);
    for a in 0..3 {
        if bg.grid_dim[a] > 1 && map[a] >= 0 {
            let d = map[a] as usize;
            let part = if d as i64 == loop_dim { tile[d] * lr } else { tile[d] };
            off[d] += coord[a] * part;
        }
    }
    if loop_dim >= 0 {
        off[loop_dim as usize] += iter * tile[loop_dim as usize];
    }
    off
}

/// Runs one planned thread block: loop iterations, accumulators, then the post-loop ops.
/// Stops early (with partial writes) once `cancel` is set; the caller checks it.
fn run_block<S: Scalar, I: Source<S> + ?Sized>(
    bg: &BlockGraph,
    plan: &BlockPlan,
    inputs: &[Option<BlockSource<'_, S, I>>],
    cancel: &Cancel,
) -> Vec<Write<S>> {
    let need = &plan.need;
    let mut vals: Vec<Option<Part<S>>> = vec![None; bg.tensors.len()];
    let mut writes = Vec::new();
    let range = bg.forloop_range;
    fn get<S>(vals: &[Option<Part<S>>], t: usize) -> &Part<S> {
        vals[t].as_ref().expect("operand is computed")
    }
    // Pass 0..range: loop-phase work (and invariant work once); pass `range`: post-loop work.
    for it in 0..=range {
        if cancel.is_set() {
            break;
        }
        let post = it == range;
        let (mut n_in, mut n_out) = (0, 0);
        for op in &bg.ops {
            let out_phase = op.outputs.first().map(|&t| bg.tensors[t].phase);
            let in_phase = op.inputs.first().map(|&t| bg.tensors[t].phase);
            let out_need = op.outputs.first().and_then(|&t| need[t].clone());
            match &op.kind {
                BlockOpKind::Input { forloop_dim, imap, .. } => {
                    let k = n_in;
                    n_in += 1;
                    let phase = bg.tensors[op.outputs[0]].phase;
                    let Some(r) = out_need else { continue };
                    if post || (phase == Phase::Invariant && it > 0) {
                        continue;
                    }
                    let tile = &bg.tensors[op.outputs[0]].dims;
                    let dev = r.shift(&tile_offset(bg, plan.coord, *imap, *forloop_dim, tile, it));
                    let src = inputs[k].as_ref().expect("a demanded block input has its device tensor computed");
                    vals[op.outputs[0]] = Some(Part { region: r, t: src.tile(&dev) });
                }
                BlockOpKind::Output { omap, forloop_dim } => {
                    let k = n_out;
                    n_out += 1;
                    if (*forloop_dim >= 0) == post {
                        continue;
                    }
                    let Some(p) = vals[op.inputs[0]].clone() else { continue };
                    let tile = &bg.tensors[op.inputs[0]].dims;
                    let off = tile_offset(bg, plan.coord, *omap, *forloop_dim, tile, it);
                    writes.push((k, p.region.shift(&off), p.t));
                }
                kind if kind.is_accumulator() => {
                    let Some(r) = out_need else { continue };
                    if post {
                        finalize_accum(bg, kind, &op.inputs, &mut vals[op.outputs[0]]);
                        continue;
                    }
                    let x_dims = &bg.tensors[op.inputs[0]].dims;
                    let (opr, _) = block_rule(kind, r.start.len()).apply(&r, &[x_dims]);
                    let x = get(&vals, op.inputs[0]).view(opr[0].as_ref().expect("accumulated operand is needed"));
                    let last = x.dims.len() - 1;
                    let contrib = match kind {
                        BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => match acc {
                            Accum::None => x.into_owned(),
                            Accum::Sum | Accum::Mean => x.sum_dim(last),
                            Accum::Rms => x.zip_with(&x, |a, b| S::zero().mul_acc(a, b)).sum_dim(last),
                            Accum::SumToDimx => {
                                // Fold the whole row, then keep the demanded part of [0, dimx).
                                let folded = x.sum_to_dimx(bg.reduction_dimx);
                                let mut fr = r.clone();
                                fr.start[last] = 0;
                                fr.end[last] = bg.reduction_dimx;
                                Part { region: fr, t: folded }.view(&r).into_owned()
                            }
                        },
                        _ => x.into_owned(),
                    };
                    let next = match (&vals[op.outputs[0]], kind) {
                        (None, _) => contrib,
                        (Some(acc), BlockOpKind::ForloopAccumMax) => acc.t.zip_with(&contrib, S::max),
                        (Some(acc), BlockOpKind::ForloopAccumRescale { .. }) => {
                            let s = get(&vals, op.inputs[1]).view(&r.broadcast_to(&bg.tensors[op.inputs[1]].dims));
                            acc.t.binary(BinaryOp::Mul, &s).zip_with(&contrib, S::add_acc)
                        }
                        (Some(acc), _) => acc.t.zip_with(&contrib, S::add_acc),
                    };
                    vals[op.outputs[0]] = Some(Part { region: r, t: next });
                }
                kind => {
                    let Some(r) = demanded(&op.outputs, need) else { continue };
                    let runs_now = match (kind, out_phase) {
                        (BlockOpKind::ReductionMax { .. }, _) => post == (in_phase == Some(Phase::Post)),
                        (_, Some(Phase::Invariant)) => it == 0,
                        (_, Some(Phase::Loop)) => !post,
                        _ => post,
                    };
                    if !runs_now {
                        continue;
                    }
                    let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| bg.tensors[t].dims.as_slice()).collect();
                    let (opr, computed) = block_rule(kind, r.start.len()).apply(&r, &dims);
                    let args: Vec<Option<Cow<Tensor<S>>>> = op
                        .inputs
                        .iter()
                        .zip(&opr)
                        .map(|(&t, rr)| rr.as_ref().map(|rr| get(&vals, t).view(rr)))
                        .collect();
                    let arg = |k: usize| args[k].as_ref().expect("operand is needed");
                    if let BlockOpKind::ReductionMax { dim } = kind {
                        let m = arg(0).max_dim(*dim);
                        drop(args);
                        let (new_max, diff) = match vals[op.outputs[0]].take() {
                            Some(prev) if !post && it > 0 => {
                                let nm = prev.t.zip_with(&m, S::max);
                                let d = prev.t.binary(BinaryOp::Sub, &nm);
                                (nm, d)
                            }
                            _ => (m.clone(), m.binary(BinaryOp::Sub, &m)),
                        };
                        vals[op.outputs[0]] = Some(Part { region: r.clone(), t: new_max });
                        vals[op.outputs[1]] = Some(Part { region: r, t: diff });
                        continue;
                    }
                    let t = match kind {
                        BlockOpKind::Matmul => arg(0).matmul(arg(1)),
                        BlockOpKind::Unary { op: u } => arg(0).unary(u),
                        BlockOpKind::Binary { op: b } => arg(0).binary(*b, arg(1)),
                        BlockOpKind::Reduction { dim } => arg(0).sum_dim(*dim),
                        BlockOpKind::RmsNorm { eps } => {
                            let x = arg(0);
                            x.rms_norm(*x.dims.last().unwrap_or(&1), None, *eps)
                        }
                        BlockOpKind::Concat { dim } => match (&args[0], &args[1]) {
                            (Some(a), Some(b)) => a.concat(b, *dim),
                            (Some(a), None) => a.clone().into_owned(),
                            (None, Some(b)) => b.clone().into_owned(),
                            (None, None) => unreachable!("a demanded concat needs an operand"),
                        },
                        _ => unreachable!("inputs, outputs, accumulators and reduction_max are handled above"),
                    };
                    let t = Part { region: computed, t }.view(&r).into_owned();
                    vals[op.outputs[0]] = Some(Part { region: r, t });
                }
            }
        }
    }
    writes
}

/// Turns a summed accumulator into its final value (mean and rms divide, rms takes the root).
fn finalize_accum<S: Scalar>(bg: &BlockGraph, kind: &BlockOpKind, inputs: &[usize], slot: &mut Option<Part<S>>) {
    let BlockOpKind::ForloopAccum { acc, eps } = kind else { return };
    if !matches!(acc, Accum::Mean | Accum::Rms) {
        return;
    }
    let last = *bg.tensors[inputs[0]].dims.last().unwrap_or(&1);
    let n = S::from_count(last * bg.forloop_range);
    if let Some(p) = slot.as_mut() {
        for v in p.t.data.iter_mut() {
            *v = v.div(n);
            if *acc == Accum::Rms {
                *v = crate::tensor::add_eps(*v, *eps).sqrt();
            }
        }
    }
}
