//! The block-graph generator: every block graph of a customized kernel over given inputs, up
//! to the search limits, pruned by abstract expressions.
//!
//! 1. **Configurations** (`plans`): grid axes each split one index label (parallel labels;
//!    at most one reduction label, and only for a kernel whose partial results a later kernel
//!    reduces), from `grid_sizes` (or a full split of a small index) or the user's `griddims`;
//!    the for-loop iterates one reduction label with a range from `franges` (1 = no loop);
//!    imaps and fmaps follow from the labels (an input lacking a label is replicated / not
//!    iterated) and are filtered by the user's `imaps` / `fmaps`; block dims from `blockdims`.
//! 2. **Ops**, depth first: matmul, the registry's unary ops (docs/ops.md), `rms_norm`, reductions,
//!    the registry's binary ops with `block_search` (`add mul div`) and the accumulators `None sum rms sum_todimx`. A new op is allowed only if
//!    its key `(largest operand id, operands, op type)` is larger than the previous op's (the
//!    reference's canonical order: each DAG is built in one order). It must be well shaped,
//!    respect phases (no loop tensor meets a post-loop one; an accumulator closes the loop over
//!    its label), pair equal labels, keep shared memory under the limit, leave room for the ops
//!    that completion still needs, and — the main pruning — its term must be in the target's
//!    e-graph.
//! 3. **Completion**: when every input is used and no loop tensor is left dangling, the dangling
//!    tensors become the outputs; omaps place every grid axis of size > 1 on the dim holding its
//!    label, or — for a reduction label the tensor has summed over — side by side along the
//!    last dim as partial results. A final kernel's outputs must be exactly the remaining target
//!    outputs (term, dims, labels); an intermediate kernel's outputs feed later kernels.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering::Relaxed;

use egg::Id;
use mirage_ugraph::smem::{self, TileLife};
use mirage_ugraph::{
    Accum, BlockGraph, BlockOpKind, DType, KernelGraph, KernelOpKind, Phase, UnaryOp, BINARY_OPS, UNARY_OPS,
};
use rayon::prelude::*;

use crate::config::SearchConfig;
use crate::control::Control;
use crate::cost::{block_graph_cost, Cost};
use crate::expr::{op_term, LoopCtx, OpRef};
use crate::labels::{Label, LabelInfo};
use crate::oracle::ExprOracle;
use crate::sizes;

/// What the search knows about a device tensor: shape, labels and abstract term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TensorInfo {
    pub dims: Vec<usize>,
    pub labels: Vec<Label>,
    pub class: Option<Id>,
    pub dtype: DType,
}

/// What a customized kernel must produce.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode<'a> {
    /// Results for later kernels (not a target).
    Intermediate,
    /// Exactly these targets.
    Final(&'a [TensorInfo]),
}

/// One complete block graph.
#[derive(Debug, Clone)]
pub(crate) struct BlockSolution {
    pub graph: BlockGraph,
    pub outputs: Vec<TensorInfo>,
    pub cost: Cost,
    pub key: u64,
}

/// Grids of at most this many blocks, without a for-loop, also get [`WIDE_BLOCK_THREADS`]
/// threads per block when the user names no `blockdims`.
const SMALL_GRID_BLOCKS: usize = 16;
/// Threads per block of the extra block shape for small loop-free grids.
const WIDE_BLOCK_THREADS: usize = 512;

/// Everything a block search reads.
pub(crate) struct Env<'a> {
    pub oracle: &'a ExprOracle,
    pub labels: &'a LabelInfo,
    pub cfg: &'a SearchConfig,
    pub ctl: &'a Control,
    pub franges: Vec<usize>,
    pub blockdims: Vec<[usize; 3]>,
    /// The epsilon of the block-level `rms_norm` and `rms` accumulators the generator builds:
    /// the reference's ([`reference_eps`]).
    pub eps: f32,
}

/// The RMS epsilon the generator gives its norms: the first nonzero `eps` of the reference's
/// `rms_norm` ops (kernel- or block-level), else 0. A reference mixing several epsilons gets
/// fused norms of the first only; the others' terms then match no candidate and stay unfused.
pub(crate) fn reference_eps(g: &KernelGraph) -> f32 {
    let block = |bg: &BlockGraph| {
        bg.ops.iter().find_map(|o| match o.kind {
            BlockOpKind::RmsNorm { eps } | BlockOpKind::ForloopAccum { eps, .. } if eps != 0.0 => Some(eps),
            _ => None,
        })
    };
    g.ops
        .iter()
        .find_map(|o| match &o.kind {
            KernelOpKind::RmsNorm { eps, .. } if *eps != 0.0 => Some(*eps),
            KernelOpKind::Customized { graph } => block(graph),
            _ => None,
        })
        .unwrap_or(0.0)
}

impl Env<'_> {
    fn parallel(&self, l: Label) -> bool {
        self.labels.is_parallel(l)
    }
}

/// A tile shape with its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    rank: usize,
    dims: [usize; 4],
    labels: [Label; 4],
}

impl Shape {
    fn new(dims: &[usize], labels: &[Label]) -> Option<Shape> {
        if dims.is_empty() || dims.len() > 4 || labels.len() != dims.len() {
            return None;
        }
        let mut s = Shape { rank: dims.len(), dims: [1; 4], labels: [Label::Unit; 4] };
        s.dims[..dims.len()].copy_from_slice(dims);
        s.labels[..dims.len()].copy_from_slice(labels);
        Some(s)
    }
    fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }
    fn labels(&self) -> &[Label] {
        &self.labels[..self.rank]
    }
    fn numel(&self) -> usize {
        self.dims().iter().product()
    }
}

/// One block input of a configuration.
#[derive(Debug, Clone)]
struct PlanInput {
    imap: [i64; 3],
    fmap: i64,
    tile: Shape,
    /// The block input's dims: the device tensor's, with leading 1s up to the block's rank.
    dims: Vec<usize>,
}

/// A configuration: launch parameters and the maps of every input.
#[derive(Debug, Clone)]
struct Plan {
    grid: [usize; 3],
    axis: [Option<Label>; 3],
    block: [usize; 3],
    frange: usize,
    loop_label: Option<Label>,
    dimx: usize,
    inputs: Vec<PlanInput>,
}

/// The unary ops the generator tries, in `Code::Unary` order: every registry entry (docs/ops.md).
pub(crate) fn unary_ops() -> impl Iterator<Item = UnaryOp> {
    UNARY_OPS.iter().map(|d| d.op)
}
/// The binary ops the generator tries, with their `Code::Binary` index, in registry order:
/// the entries with `block_search` (docs/ops.md).
fn block_binary_ops() -> impl Iterator<Item = (u8, &'static mirage_ugraph::BinaryDef)> {
    BINARY_OPS.iter().enumerate().filter(|(_, d)| d.block_search).map(|(i, d)| (i as u8, d))
}
const ACCUM: [Accum; 4] = [Accum::None, Accum::Sum, Accum::Rms, Accum::SumToDimx];

/// An op type of the generator (ordered: part of the canonical key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Code {
    Matmul,
    Unary(u8),
    RmsNorm,
    Reduction(u8),
    /// A binary op, by its [`BINARY_OPS`] index (the generator tries those with `block_search`).
    Binary(u8),
    Accum(u8),
}

impl Code {
    fn kind(self, eps: f32) -> BlockOpKind {
        match self {
            Code::Matmul => BlockOpKind::Matmul,
            Code::Unary(u) => BlockOpKind::Unary { op: UNARY_OPS[u as usize].op },
            Code::RmsNorm => BlockOpKind::RmsNorm { eps },
            Code::Reduction(d) => BlockOpKind::Reduction { dim: d as usize },
            Code::Binary(b) => BlockOpKind::Binary { op: BINARY_OPS[b as usize].op },
            Code::Accum(a) => {
                let acc = ACCUM[a as usize];
                BlockOpKind::ForloopAccum { acc, eps: if acc == Accum::Rms { eps } else { 0.0 } }
            }
        }
    }
}

/// One op of a block graph being built (`b == a` for one-operand ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Step {
    code: Code,
    a: u16,
    b: u16,
}

type Key = (u16, u16, u16, Code);

impl Step {
    fn key(&self) -> Key {
        (self.a.max(self.b), self.a, self.b, self.code)
    }
}

/// A tile tensor of the graph being built.
#[derive(Debug, Clone, Copy)]
struct Node {
    shape: Shape,
    phase: Phase,
    class: Option<Id>,
    /// Index labels this value has summed over (bit per label).
    reduced: u64,
    uses: u16,
    input: bool,
}

struct State {
    nodes: Vec<Node>,
    steps: Vec<Step>,
    smem: usize,
    n_inputs: usize,
}

enum Reject {
    IllTyped,
    Expr,
}

#[derive(Default)]
struct Local {
    states: u64,
    pruned_expr: u64,
    pruned_limits: u64,
    ill_typed: u64,
}

/// All block graphs over `inputs` for `mode`, in a deterministic order.
pub(crate) fn search_block_graphs(env: &Env<'_>, inputs: &[TensorInfo], mode: Mode<'_>) -> Vec<BlockSolution> {
    let plans = plans(env, inputs, mode);
    env.ctl.counters.configurations.fetch_add(plans.len() as u64, Relaxed);
    plans
        .par_iter()
        .flat_map_iter(|p| {
            // A full check (clock, flag) per configuration: small DFSs never reach the
            // periodic check inside.
            if env.ctl.check() {
                return Vec::new();
            }
            let mut dfs = Dfs::new(env, p, inputs, mode);
            dfs.run();
            dfs.sols
        })
        .collect()
}

/// Number of configurations [`search_block_graphs`] would explore.
pub(crate) fn count_plans(env: &Env<'_>, inputs: &[TensorInfo], mode: Mode<'_>) -> usize {
    plans(env, inputs, mode).len()
}

/// Whether reduction label `l` of size `s` gets derived grid sizes and loop ranges
/// ([`crate::sizes`]).
fn derives(env: &Env<'_>, l: Label, s: usize) -> bool {
    !env.parallel(l) && sizes::needs_derived(s, &env.cfg.grid_sizes, &env.franges)
}

fn size_options(env: &Env<'_>, l: Label, s: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        env.cfg.grid_sizes.iter().copied().filter(|&g| g > 1 && g <= s && s.is_multiple_of(g)).collect();
    if s > 1 && s <= env.cfg.max_full_split {
        v.push(s);
    }
    if derives(env, l, s) {
        v.extend(sizes::derived_grid_sizes(s, &env.cfg.grid_sizes).into_iter().filter(|&g| g < s));
    }
    v.sort_unstable();
    v.dedup();
    v
}

type Grid = ([usize; 3], [Option<Label>; 3]);

fn plans(env: &Env<'_>, inputs: &[TensorInfo], mode: Mode<'_>) -> Vec<Plan> {
    let cfg = env.cfg;
    let mut labs: Vec<(Label, usize)> = Vec::new();
    for t in inputs {
        for (&l, &s) in t.labels.iter().zip(&t.dims) {
            if matches!(l, Label::Index(_)) && !labs.iter().any(|x| x.0 == l) {
                labs.push((l, s));
            }
        }
    }
    labs.sort();
    let final_mode = matches!(mode, Mode::Final(_));
    // A grid axis may split a reduction label only if a later kernel reduces the partials.
    let eligible = |l: Label| env.parallel(l) || !final_mode;
    let mut grids: Vec<Grid> = Vec::new();
    match &cfg.griddims {
        None => generated_grids(env, &labs, &eligible, 0, 0, ([1; 3], [None; 3]), 0, &mut grids),
        Some(list) => {
            for g in list {
                if g.contains(&0) {
                    continue;
                }
                assigned_grids(env, &labs, &eligible, *g, 0, ([1, 1, 1], [None; 3]), &mut grids);
            }
        }
    }
    let mut loops: Vec<(Option<Label>, usize)> = Vec::new();
    for &f in &env.franges {
        if f == 1 {
            loops.push((None, 1));
        } else {
            loops.extend(labs.iter().filter(|(l, _)| !env.parallel(*l)).map(|&(l, _)| (Some(l), f)));
        }
    }
    let mut out = Vec::new();
    for &(grid, axis) in &grids {
        // Loops over whole tiles of a block's share of an index the configured ranges cut
        // only into ragged tiles.
        let mut derived: Vec<(Option<Label>, usize)> = Vec::new();
        for &(l, s) in labs.iter().filter(|&&(l, s)| derives(env, l, s)) {
            let split: usize = (0..3).filter(|&a| axis[a] == Some(l)).map(|a| grid[a]).product();
            if s.is_multiple_of(split) {
                derived.extend(sizes::derived_ranges(s / split, &env.franges).into_iter().map(|f| (Some(l), f)));
            }
        }
        for &(loop_label, frange) in loops.iter().chain(&derived) {
            let Some(ins) = plan_inputs(env, inputs, grid, axis, loop_label, frange) else { continue };
            let smem: usize = ins.iter().zip(inputs).map(|(p, t)| p.tile.numel() * t.dtype.size_bytes()).sum();
            if smem > cfg.shared_memory_limit {
                continue;
            }
            let dimx = ins
                .iter()
                .find_map(|p| match p.tile.labels()[p.tile.rank - 1] {
                    Label::Partial { parts, .. } if p.tile.dims[p.tile.rank - 1] % parts as usize == 0 => {
                        Some(p.tile.dims[p.tile.rank - 1] / parts as usize)
                    }
                    _ => None,
                })
                .unwrap_or(64);
            // A loop-free kernel of few blocks is latency-bound: more threads per block put
            // more loads in flight (nTrans at one row: 1.9 µs with 512 threads, 2.7 µs with 256).
            let blocks: usize = grid.iter().product();
            let wide = (cfg.blockdims.is_none() && frange == 1 && blocks <= SMALL_GRID_BLOCKS).then_some([
                WIDE_BLOCK_THREADS,
                1,
                1,
            ]);
            for block in env.blockdims.iter().copied().chain(wide) {
                out.push(Plan { grid, axis, block, frange, loop_label, dimx, inputs: ins.clone() });
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn generated_grids(
    env: &Env<'_>,
    labs: &[(Label, usize)],
    eligible: &dyn Fn(Label) -> bool,
    from: usize,
    axis: usize,
    cur: Grid,
    reductions: usize,
    out: &mut Vec<Grid>,
) {
    out.push(cur);
    if axis >= env.cfg.max_grid_axes.min(3) {
        return;
    }
    let blocks: usize = cur.0.iter().product();
    for (i, &(l, s)) in labs.iter().enumerate().skip(from) {
        let red = usize::from(!env.parallel(l));
        if !eligible(l) || reductions + red > 1 {
            continue;
        }
        for g in size_options(env, l, s) {
            if blocks * g > env.cfg.max_blocks {
                continue;
            }
            let mut next = cur;
            next.0[axis] = g;
            next.1[axis] = Some(l);
            generated_grids(env, labs, eligible, i + 1, axis + 1, next, reductions + red, out);
        }
    }
}

fn assigned_grids(
    env: &Env<'_>,
    labs: &[(Label, usize)],
    eligible: &dyn Fn(Label) -> bool,
    grid: [usize; 3],
    axis: usize,
    cur: Grid,
    out: &mut Vec<Grid>,
) {
    if axis == 3 {
        out.push(cur);
        return;
    }
    let g = grid[axis];
    if g == 1 {
        return assigned_grids(env, labs, eligible, grid, axis + 1, cur, out);
    }
    let reductions = cur.1.iter().flatten().filter(|&&l| !env.parallel(l)).count();
    for &(l, s) in labs {
        let red = usize::from(!env.parallel(l));
        if !eligible(l) || cur.1.contains(&Some(l)) || s % g != 0 || reductions + red > 1 {
            continue;
        }
        let mut next = cur;
        next.0[axis] = g;
        next.1[axis] = Some(l);
        assigned_grids(env, labs, eligible, grid, axis + 1, next, out);
    }
}

fn plan_inputs(
    env: &Env<'_>,
    inputs: &[TensorInfo],
    grid: [usize; 3],
    axis: [Option<Label>; 3],
    loop_label: Option<Label>,
    frange: usize,
) -> Option<Vec<PlanInput>> {
    let mut out = Vec::with_capacity(inputs.len());
    // Inputs of a lower rank than the others (an rms_norm weight `[k]` beside `[m, k]` tiles)
    // are read as tiles of the highest rank with leading 1s, so that element-wise ops pair them.
    let rank = inputs.iter().map(|t| t.dims.len()).max().unwrap_or(0);
    let single = |t: &TensorInfo, l: Label| -> Result<Option<usize>, ()> {
        let mut pos = t.labels.iter().enumerate().filter(|(_, &x)| x == l).map(|(d, _)| d);
        let first = pos.next();
        if pos.next().is_some() {
            return Err(());
        }
        Ok(first)
    };
    for t in inputs {
        let mut tile = t.dims.clone();
        let mut imap = [-1i64; 3];
        for a in 0..3 {
            let Some(l) = axis[a] else { continue };
            if let Some(d) = single(t, l).ok()? {
                if tile[d] % grid[a] != 0 {
                    return None;
                }
                tile[d] /= grid[a];
                imap[a] = d as i64;
            }
        }
        let mut fmap = -1i64;
        if let Some(l) = loop_label {
            if let Some(d) = single(t, l).ok()? {
                if tile[d] % frange != 0 {
                    return None;
                }
                tile[d] /= frange;
                fmap = d as i64;
            }
        }
        let lift = rank - t.dims.len();
        let pad = |v: &[usize]| [vec![1; lift], v.to_vec()].concat();
        let labels = [vec![Label::Unit; lift], t.labels.clone()].concat();
        let shift = |m: i64| if m >= 0 { m + lift as i64 } else { m };
        let (imap, fmap) = (imap.map(shift), shift(fmap));
        if env.cfg.imaps.as_ref().is_some_and(|list| !list.contains(&imap)) {
            return None;
        }
        if env.cfg.fmaps.as_ref().is_some_and(|list| !list.contains(&fmap)) {
            return None;
        }
        out.push(PlanInput { imap, fmap, tile: Shape::new(&pad(&tile), &labels)?, dims: pad(&t.dims) });
    }
    Some(out)
}

struct Dfs<'a> {
    env: &'a Env<'a>,
    plan: &'a Plan,
    inputs: &'a [TensorInfo],
    mode: Mode<'a>,
    ctx: LoopCtx,
    out_min: usize,
    out_max: usize,
    bytes: usize,
    sols: Vec<BlockSolution>,
    local: Local,
}

impl<'a> Dfs<'a> {
    fn new(env: &'a Env<'a>, plan: &'a Plan, inputs: &'a [TensorInfo], mode: Mode<'a>) -> Self {
        let (out_min, out_max) = match mode {
            Mode::Final(t) => (t.len(), t.len()),
            Mode::Intermediate => (1, env.cfg.max_intermediate_outputs.max(1)),
        };
        Dfs {
            env,
            plan,
            inputs,
            mode,
            ctx: LoopCtx { forloop_range: plan.frange, reduction_dimx: plan.dimx, loop_label: plan.loop_label },
            out_min,
            out_max,
            bytes: inputs.first().map_or(2, |t| t.dtype.size_bytes()),
            sols: Vec::new(),
            local: Local::default(),
        }
    }

    fn run(&mut self) {
        let mut st = State { nodes: Vec::new(), steps: Vec::new(), smem: 0, n_inputs: self.inputs.len() };
        for (p, t) in self.plan.inputs.iter().zip(self.inputs) {
            st.smem += p.tile.numel() * t.dtype.size_bytes();
            st.nodes.push(Node {
                shape: p.tile,
                phase: if p.fmap >= 0 { Phase::Loop } else { Phase::Invariant },
                class: t.class,
                reduced: 0,
                uses: 0,
                input: true,
            });
        }
        if st.n_inputs + self.lower_bound(&st) <= self.env.cfg.max_block_ops {
            self.dfs(&mut st);
        } else {
            self.local.pruned_limits += 1;
        }
        let c = &self.env.ctl.counters;
        c.states.fetch_add(self.local.states, Relaxed);
        c.pruned_expr.fetch_add(self.local.pruned_expr, Relaxed);
        c.pruned_limits.fetch_add(self.local.pruned_limits, Relaxed);
        c.block_graphs.fetch_add(self.sols.len() as u64, Relaxed);
        c.ill_typed.fetch_add(self.local.ill_typed, Relaxed);
    }

    /// Fewest ops still needed to complete `st`: each op removes at most two dangling tensors
    /// that cannot be outputs (unused inputs, loop tensors, outputs beyond the maximum), and
    /// at least `out_min` output savers follow.
    fn lower_bound(&self, st: &State) -> usize {
        let (mut e, mut p) = (0usize, 0usize);
        for n in st.nodes.iter().filter(|n| n.uses == 0) {
            if n.input || n.phase == Phase::Loop {
                e += 1;
            } else {
                p += 1;
            }
        }
        e += p.saturating_sub(self.out_max);
        e.div_ceil(2) + self.out_min
    }

    fn dfs(&mut self, st: &mut State) {
        self.local.states += 1;
        if self.local.states.is_multiple_of(256) && self.env.ctl.check() {
            return;
        }
        if self.env.ctl.stopped() {
            return;
        }
        if let Some(sol) = self.complete(st) {
            self.sols.push(sol);
        }
        let n = st.nodes.len();
        let last = st.steps.last().map(Step::key);
        let from = last.map_or(0, |k| k.0 as usize);
        for hi in from..n {
            let h = hi as u16;
            for u in 0..UNARY_OPS.len() as u8 {
                self.try_step(st, Step { code: Code::Unary(u), a: h, b: h }, last);
            }
            self.try_step(st, Step { code: Code::RmsNorm, a: h, b: h }, last);
            for d in 0..st.nodes[hi].shape.rank as u8 {
                self.try_step(st, Step { code: Code::Reduction(d), a: h, b: h }, last);
            }
            for acc in 0..ACCUM.len() as u8 {
                self.try_step(st, Step { code: Code::Accum(acc), a: h, b: h }, last);
            }
            // Past the last step's operands every key is larger: the binary ops of a pair are
            // then rejected together where the pair itself is (`binary_gate`).
            let fresh = last.is_none_or(|k| h > k.0);
            for lo in 0..=h {
                self.try_step(st, Step { code: Code::Matmul, a: lo, b: h }, last);
                self.try_binary(st, lo, h, fresh, last, |_| true);
                if lo != h {
                    self.try_step(st, Step { code: Code::Matmul, a: h, b: lo }, last);
                    self.try_binary(st, h, lo, fresh, last, |d| !d.commutative);
                }
            }
        }
    }

    /// The binary ops `which` selects on operands `(a, b)`. Where `fresh` (no key of theirs
    /// can precede the last step's) and [`Self::binary_gate`] rejects the pair, they are
    /// counted as rejected for that reason without being tried one by one.
    fn try_binary(
        &mut self,
        st: &mut State,
        a: u16,
        b: u16,
        fresh: bool,
        last: Option<Key>,
        which: impl Fn(&mirage_ugraph::BinaryDef) -> bool,
    ) {
        if fresh {
            if let Err(r) = self.binary_gate(st, a, b) {
                let n = block_binary_ops().filter(|(_, d)| which(d)).count() as u64;
                match r {
                    Reject::IllTyped => self.local.ill_typed += n,
                    Reject::Expr => self.local.pruned_expr += n,
                }
                return;
            }
        }
        for (code, _) in block_binary_ops().filter(|(_, d)| which(d)) {
            self.try_step(st, Step { code: Code::Binary(code), a, b }, last);
        }
    }

    /// The checks [`Self::apply`] makes of every binary op on operands `(a, b)` alike, in its
    /// order: the shapes broadcast, the phases combine, and (with expression pruning) both
    /// operands have terms that some node pairs ([`Self::term`]).
    fn binary_gate(&self, st: &State, a: u16, b: u16) -> Result<(), Reject> {
        let (x, y) = (&st.nodes[a as usize], &st.nodes[b as usize]);
        broadcast(&x.shape, &y.shape)?;
        phase2(x.phase, y.phase)?;
        if self.env.cfg.expression_pruning {
            let (Some(i), Some(j)) = (x.class, y.class) else { return Err(Reject::Expr) };
            if !self.env.oracle.may_pair(i, j) {
                return Err(Reject::Expr);
            }
        }
        Ok(())
    }

    fn try_step(&mut self, st: &mut State, step: Step, last: Option<Key>) {
        if last.is_some_and(|k| step.key() <= k) {
            return;
        }
        let node = match self.apply(st, step) {
            Ok(n) => n,
            Err(Reject::IllTyped) => {
                self.local.ill_typed += 1;
                return;
            }
            Err(Reject::Expr) => {
                self.local.pruned_expr += 1;
                return;
            }
        };
        let size = node.shape.numel() * self.bytes;
        // The sum of every tile bounds the tiles live at once from above; only past the limit
        // is the latter computed (on this partial graph: a lower bound of any completion's).
        if st.smem + size > self.env.cfg.shared_memory_limit
            && self.live_peak(st, step, &node) > self.env.cfg.shared_memory_limit
        {
            self.local.pruned_limits += 1;
            return;
        }
        st.nodes[step.a as usize].uses += 1;
        if step.b != step.a {
            st.nodes[step.b as usize].uses += 1;
        }
        st.nodes.push(node);
        st.steps.push(step);
        st.smem += size;
        if st.n_inputs + st.steps.len() + self.lower_bound(st) <= self.env.cfg.max_block_ops {
            self.dfs(st);
        } else {
            self.local.pruned_limits += 1;
        }
        st.smem -= size;
        st.steps.pop();
        st.nodes.pop();
        st.nodes[step.a as usize].uses -= 1;
        if step.b != step.a {
            st.nodes[step.b as usize].uses -= 1;
        }
    }

    /// Bytes of the tiles of `st` and `node`, made by `step`, live at once in any completion
    /// at the least ([`smem::peak_bytes`] of a partial graph).
    fn live_peak(&self, st: &State, step: Step, node: &Node) -> usize {
        let steps = st.steps.iter().copied().chain([step]);
        let made = st.nodes.iter().chain([node]);
        let mut lives: Vec<TileLife> = made
            .map(|n| TileLife {
                bytes: n.shape.numel() * self.bytes,
                phase: n.phase,
                input: n.input,
                accumulator: false,
                output: false,
                readers: Vec::new(),
            })
            .collect();
        for (i, s) in steps.enumerate() {
            let me = st.n_inputs + i;
            lives[me].accumulator = matches!(s.code, Code::Accum(_));
            lives[s.a as usize].readers.push(me);
            if s.b != s.a {
                lives[s.b as usize].readers.push(me);
            }
        }
        smem::peak_bytes(&lives)
    }

    /// The tile `step` produces, or why it is rejected.
    fn apply(&self, st: &State, step: Step) -> Result<Node, Reject> {
        let a = &st.nodes[step.a as usize];
        let b = &st.nodes[step.b as usize];
        let loop_label = self.plan.loop_label;
        let mut reduced = a.reduced | b.reduced;
        let (shape, phase) = match step.code {
            Code::Matmul => {
                let r = a.shape.rank;
                if r < 2 || b.shape.rank != r {
                    return Err(Reject::IllTyped);
                }
                let (ad, bd, al, bl) = (a.shape.dims(), b.shape.dims(), a.shape.labels(), b.shape.labels());
                if ad[r - 1] != bd[r - 2]
                    || al[r - 1] != bl[r - 2]
                    || ad[..r - 2] != bd[..r - 2]
                    || al[..r - 2] != bl[..r - 2]
                {
                    return Err(Reject::IllTyped);
                }
                let mut s = a.shape;
                s.dims[r - 1] = bd[r - 1];
                s.labels[r - 1] = bl[r - 1];
                reduced |= al[r - 1].bit();
                (s, phase2(a.phase, b.phase)?)
            }
            Code::Binary(_) => (broadcast(&a.shape, &b.shape)?, phase2(a.phase, b.phase)?),
            Code::Unary(_) => (a.shape, a.phase),
            Code::RmsNorm => {
                if a.shape.dims[a.shape.rank - 1] == 1 {
                    return Err(Reject::IllTyped);
                }
                (a.shape, a.phase)
            }
            Code::Reduction(d) => {
                let d = d as usize;
                if a.shape.dims[d] == 1 {
                    return Err(Reject::IllTyped);
                }
                let mut s = a.shape;
                reduced |= s.labels[d].bit();
                s.dims[d] = 1;
                s.labels[d] = Label::Unit;
                (s, a.phase)
            }
            Code::Accum(k) => {
                let acc = ACCUM[k as usize];
                let looping = self.plan.frange > 1;
                // With a loop, accumulate loop tensors; without one, only the reducing kinds.
                let ok_phase =
                    if looping { a.phase == Phase::Loop } else { a.phase == Phase::Invariant && acc != Accum::None };
                if !ok_phase {
                    return Err(Reject::IllTyped);
                }
                let r = a.shape.rank;
                let mut s = a.shape;
                if let Some(l) = loop_label {
                    // The accumulator sums iterations: the loop label must be gone, or be the
                    // last dim that a reducing accumulator sums.
                    let lim = if acc == Accum::None { r } else { r - 1 };
                    if s.labels[..lim].contains(&l) {
                        return Err(Reject::IllTyped);
                    }
                    reduced |= l.bit();
                }
                match acc {
                    Accum::None => {}
                    Accum::Sum | Accum::Mean | Accum::Rms => {
                        if s.dims[r - 1] == 1 {
                            return Err(Reject::IllTyped);
                        }
                        reduced |= s.labels[r - 1].bit();
                        s.dims[r - 1] = 1;
                        s.labels[r - 1] = Label::Unit;
                    }
                    Accum::SumToDimx => {
                        let Label::Partial { of, parts, .. } = s.labels[r - 1] else { return Err(Reject::IllTyped) };
                        let dimx = self.plan.dimx;
                        if s.dims[r - 1] != dimx * parts as usize {
                            return Err(Reject::IllTyped);
                        }
                        s.dims[r - 1] = dimx;
                        s.labels[r - 1] = of.map_or(Label::Unit, Label::Index);
                    }
                }
                (s, Phase::Post)
            }
        };
        let class = self.term(step, a, b)?;
        Ok(Node { shape, phase, class, reduced, uses: 0, input: false })
    }

    /// The e-class of the step's result (see [`crate::expr::op_term`]).
    fn term(&self, step: Step, a: &Node, b: &Node) -> Result<Option<Id>, Reject> {
        let pruning = self.env.cfg.expression_pruning;
        let ins = match (a.class, b.class) {
            (Some(x), Some(y)) => [x, y],
            _ if pruning => return Err(Reject::Expr),
            _ => return Ok(None),
        };
        // A matmul's product and a binary op's node have the two operands as children (in
        // either order): where no node pairs their classes, the lookups would all miss.
        let two = matches!(step.code, Code::Matmul | Code::Binary(_));
        let oracle = &self.env.oracle;
        if pruning && two && !oracle.may_pair(ins[0], ins[1]) {
            return Err(Reject::Expr);
        }
        let tabled = match step.code {
            Code::Unary(u) => oracle.unary_term(u as usize, ins[0]),
            Code::Binary(op) => oracle.binary_term(op as usize, ins[0], ins[1]),
            _ => None,
        };
        match tabled {
            Some(Some(id)) => return Ok(Some(id)),
            Some(None) if pruning => return Err(Reject::Expr),
            Some(None) => return Ok(None),
            None => {}
        }
        let kind = step.code.kind(self.env.eps);
        let dims = [a.shape.dims(), b.shape.dims()];
        let labels = [a.shape.labels(), b.shape.labels()];
        let n = if step.a == step.b && !two { 1 } else { 2 };
        let mut sink = self.env.oracle.sink();
        match op_term(&mut sink, OpRef::Block(&kind, self.ctx), &ins[..n], &dims[..n], &labels[..n]) {
            Ok(Some(id)) => Ok(Some(id)),
            Ok(None) | Err(_) if pruning => Err(Reject::Expr),
            _ => Ok(None),
        }
    }

    /// Where each grid axis places this tile in the output: omap, device dims and labels.
    fn place(&self, n: &Node) -> Option<([i64; 3], Vec<usize>, Vec<Label>)> {
        let r = n.shape.rank;
        let mut dims = n.shape.dims().to_vec();
        let mut labels = n.shape.labels().to_vec();
        let mut omap = [-1i64; 3];
        let mut used = [false; 4];
        for (slot, (&g, &axis)) in omap.iter_mut().zip(self.plan.grid.iter().zip(&self.plan.axis)) {
            if g == 1 {
                continue;
            }
            let l = axis?;
            let d = match labels.iter().position(|&x| x == l) {
                Some(d) => d,
                None if !self.env.parallel(l) && n.reduced & l.bit() != 0 => {
                    // Partial sums over a split reduction label: side by side along the last dim.
                    let d = r - 1;
                    let of = match labels[d] {
                        Label::Index(i) => Some(i),
                        Label::Unit => None,
                        Label::Partial { .. } => return None,
                    };
                    labels[d] = Label::Partial { of, parts: g as u32, over: l.index() };
                    d
                }
                None => return None,
            };
            if used[d] {
                return None;
            }
            used[d] = true;
            dims[d] *= g;
            *slot = d as i64;
        }
        if self.env.cfg.omaps.as_ref().is_some_and(|list| !list.contains(&omap)) {
            return None;
        }
        Some((omap, dims, labels))
    }

    /// The block graph `st` completes to, if any.
    fn complete(&mut self, st: &State) -> Option<BlockSolution> {
        if st.nodes[..st.n_inputs].iter().any(|n| n.uses == 0) {
            return None;
        }
        let mut outs: Vec<usize> = Vec::new();
        for (i, n) in st.nodes.iter().enumerate().skip(st.n_inputs) {
            if n.uses == 0 {
                if n.phase == Phase::Loop {
                    return None;
                }
                outs.push(i);
            }
        }
        if outs.is_empty() || outs.len() < self.out_min || outs.len() > self.out_max {
            return None;
        }
        if st.n_inputs + st.steps.len() + outs.len() > self.env.cfg.max_block_ops {
            return None;
        }
        let mut placed: Vec<(usize, [i64; 3], TensorInfo)> = Vec::with_capacity(outs.len());
        for &i in &outs {
            let n = &st.nodes[i];
            let (omap, dims, labels) = self.place(n)?;
            let class = n.class?;
            placed.push((i, omap, TensorInfo { dims, labels, class: Some(class), dtype: self.inputs[0].dtype }));
        }
        match self.mode {
            Mode::Final(targets) => {
                let mut ordered = Vec::with_capacity(targets.len());
                let mut taken = vec![false; placed.len()];
                for t in targets {
                    let k = (0..placed.len()).find(|&k| !taken[k] && placed[k].2 == *t)?;
                    taken[k] = true;
                    ordered.push(placed[k].clone());
                }
                placed = ordered;
            }
            Mode::Intermediate => {
                let targets = self.env.oracle.targets();
                if placed.iter().any(|p| p.2.class.is_some_and(|c| targets.contains(&c))) {
                    return None;
                }
            }
        }
        let graph = match self.build(st, &placed) {
            Some(g) => g,
            None => {
                self.env.ctl.counters.builder_rejects.fetch_add(1, Relaxed);
                return None;
            }
        };
        let cost = block_graph_cost(&graph, &self.env.cfg.cost_model, &self.env.cfg.target);
        let key = self.key(st, &placed);
        Some(BlockSolution { graph, outputs: placed.into_iter().map(|p| p.2).collect(), cost, key })
    }

    fn build(&self, st: &State, outs: &[(usize, [i64; 3], TensorInfo)]) -> Option<BlockGraph> {
        let p = self.plan;
        let mut bg = BlockGraph::new(p.grid, p.block, p.frange, p.dimx).ok()?;
        for (pi, t) in p.inputs.iter().zip(self.inputs) {
            bg.new_input(&pi.dims, t.dtype, pi.imap, pi.fmap).ok()?;
        }
        for s in &st.steps {
            let (a, b) = (s.a as usize, s.b as usize);
            let r = match s.code.kind(self.env.eps) {
                BlockOpKind::Matmul => bg.matmul(a, b),
                BlockOpKind::Unary { op } => bg.unary(op, a),
                BlockOpKind::RmsNorm { eps } => bg.rms_norm_eps(a, eps),
                BlockOpKind::Reduction { dim } => bg.reduction(a, dim as i64),
                BlockOpKind::Binary { op } => bg.binary(op, a, b),
                BlockOpKind::ForloopAccum { acc, eps } => bg.forloop_accum_eps(a, acc, eps),
                _ => return None,
            };
            r.ok()?;
        }
        for (t, omap, _) in outs {
            bg.new_output(*t, *omap, -1).ok()?;
        }
        let limit = self.env.cfg.shared_memory_limit;
        (bg.shared_memory_upper_bound() <= limit || bg.shared_memory_peak() <= limit).then_some(bg)
    }

    /// A deterministic key of the solution (configuration, ops, outputs).
    fn key(&self, st: &State, outs: &[(usize, [i64; 3], TensorInfo)]) -> u64 {
        let p = self.plan;
        let mut h = DefaultHasher::new();
        (p.grid, p.block, p.frange, p.dimx).hash(&mut h);
        for pi in &p.inputs {
            (pi.imap, pi.fmap).hash(&mut h);
        }
        st.steps.hash(&mut h);
        for (t, omap, _) in outs {
            (t, omap).hash(&mut h);
        }
        h.finish()
    }
}

/// The shape of an element-wise op on tiles of shapes `a` and `b`: equal ranks, each dim equal
/// (with its label) or 1 on one side.
fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, Reject> {
    let r = a.rank;
    if b.rank != r {
        return Err(Reject::IllTyped);
    }
    let mut s = *a;
    for i in 0..r {
        let (x, y) = (a.dims[i], b.dims[i]);
        if x > 1 && y > 1 {
            if x != y || a.labels[i] != b.labels[i] {
                return Err(Reject::IllTyped);
            }
        } else if y > 1 {
            s.dims[i] = y;
            s.labels[i] = b.labels[i];
        }
    }
    Ok(s)
}

fn phase2(a: Phase, b: Phase) -> Result<Phase, Reject> {
    match (a, b) {
        (Phase::Loop, Phase::Post) | (Phase::Post, Phase::Loop) => Err(Reject::IllTyped),
        (Phase::Invariant, p) | (p, Phase::Invariant) => Ok(p),
        (p, _) => Ok(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_tries_every_registry_op_in_registry_order() {
        let ops: Vec<UnaryOp> = unary_ops().collect();
        assert_eq!(ops, UNARY_OPS.iter().map(|d| d.op).collect::<Vec<_>>());
        for (u, d) in UNARY_OPS.iter().enumerate() {
            let code = u8::try_from(u).expect("fewer than 256 unary ops");
            assert_eq!(Code::Unary(code).kind(0.0), BlockOpKind::Unary { op: d.op }, "{}", d.name);
        }
        let tried: Vec<_> = block_binary_ops().map(|(b, d)| (Code::Binary(b).kind(0.0), d.name)).collect();
        let want: Vec<_> =
            BINARY_OPS.iter().filter(|d| d.block_search).map(|d| (BlockOpKind::Binary { op: d.op }, d.name)).collect();
        assert_eq!(tried, want);
        assert!(!want.is_empty());
        // The canonical key orders binary steps by registry order, after reductions.
        assert!(Code::Reduction(u8::MAX) < Code::Binary(0) && Code::Binary(u8::MAX) < Code::Accum(0));
        for w in tried.windows(2) {
            let pos = |k: &BlockOpKind| BINARY_OPS.iter().position(|d| BlockOpKind::Binary { op: d.op } == *k);
            assert!(pos(&w[0].0) < pos(&w[1].0));
        }
    }
}
