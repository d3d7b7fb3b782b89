//! The kernel-level search and [`superoptimize`].
//!
//! Iterative deepening over the number of kernel ops (1, then 2, ... up to `max_kernel_ops`):
//! every op but the last is *intermediate* (a predefined op, or a customized kernel whose
//! outputs later ops consume), the last one is *final* (it produces exactly the target outputs
//! and consumes every tensor not consumed yet). Intermediate kernels are grouped by what they
//! output (dims, labels, term): each group continues once, with its `keep_per_signature`
//! cheapest block graphs as alternatives. Work is split with rayon over kernel-level states
//! and, inside each block search, over configurations; results are collected in order and
//! sorted by (cost, graph hash), so the candidate set does not depend on the thread count.
//! After checking, equivalent candidates that accumulate a plain `exp` (unstable in fp16, and
//! past logits of 88 in bf16 and fp32 too) are replaced by their online-softmax rewrite
//! ([`crate::online_softmax`]) when the rewrite checks as stable (`SearchConfig::online_softmax`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use mirage_ugraph::types::row_major_strides;
use mirage_ugraph::{
    graph_hash, BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, KernelSearch, Target, UnaryOp, BINARY_OPS,
};
use rayon::prelude::*;

use crate::axioms::SaturationReport;
use crate::config::{Phase, SearchConfig};
use crate::control::{Control, StopReason};
use crate::cost::{block_graph_cost, kernel_graph_cost, stage_bytes, Cost, CostModel};
use crate::error::{Result, SearchError};
use crate::expr::{op_term, OpRef};
use crate::generator::{count_plans, search_block_graphs, unary_ops, BlockSolution, Env, Mode, TensorInfo};
use crate::labels::{analyze, Label, LabelInfo};
use crate::online_softmax::rewrite_online_softmax;
use crate::oracle::ExprOracle;
use crate::sizes;
use crate::verify::{Checker, Verification};

/// A µGraph equivalent (abstractly, and as checked) to the reference.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The kernel graph (same inputs in the same order, same outputs).
    pub graph: KernelGraph,
    /// Its modelled cost.
    pub cost: Cost,
    /// Its structural hash ([`mirage_ugraph::graph_hash`]).
    pub hash: String,
    /// Customized (block-graph) kernels in it.
    pub customized_kernels: usize,
    /// The outcome of checking it.
    pub verification: Verification,
}

/// Statistics of one search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchStats {
    /// Block-graph states visited (prefixes that passed every check).
    pub states_visited: u64,
    /// Candidate ops pruned because their abstract expression is not in the target's e-graph.
    pub pruned_by_expression: u64,
    /// States pruned by limits: shared memory, op count (with the ops completion still needs).
    pub pruned_by_limits: u64,
    /// Candidate ops rejected as ill-typed (shapes, labels, loop phases).
    pub ill_typed: u64,
    /// Block-graph configurations (grid, maps, loop, block dims) explored.
    pub configurations: u64,
    /// Complete block graphs found (final and intermediate).
    pub block_graphs: u64,
    /// Distinct candidate µGraphs found.
    pub candidates: usize,
    /// Candidates checked and found equivalent.
    pub verified: usize,
    /// Candidates checked and found wrong (dropped from the result).
    pub verification_failed: usize,
    /// Graphs the IR builder rejected after the generator accepted them (should be 0).
    pub builder_rejects: u64,
    /// Unstable candidates replaced by their online-softmax rewrite
    /// ([`crate::online_softmax::rewrite_online_softmax`]), which verified equivalent and stable.
    pub online_softmax_rewrites: usize,
    /// Deepest number of kernel ops explored.
    pub kernel_ops_explored: usize,
    /// Wall time of the whole search, saturation and verification included.
    pub elapsed: Duration,
    /// What the e-graph saturation did (see `limit_hit`).
    pub saturation: SaturationReport,
}

/// The result of [`superoptimize`].
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// Candidates, cheapest first by the cost model; `VerifyOptions::top_n` stable ones are
    /// checked (see [`Candidate::verification`]), candidates that failed are dropped.
    pub candidates: Vec<Candidate>,
    /// Statistics.
    pub stats: SearchStats,
    /// Set when the time budget or the cancellation flag stopped the search early.
    pub stopped: Option<StopReason>,
    /// Why `candidates` is empty, when it is.
    pub empty_reason: Option<String>,
}

impl SearchResult {
    /// The cheapest candidate that passed checking, preferring ones that are also numerically
    /// stable in their own precision over [`Verification::Unstable`] ones.
    pub fn best(&self) -> Option<&Candidate> {
        let stable = self.candidates.iter().find(|c| c.verification == Verification::Passed);
        stable.or_else(|| self.candidates.iter().find(|c| c.verification.passed()))
    }
}

#[derive(Clone)]
struct KTensor {
    info: TensorInfo,
    consumed: bool,
}

#[derive(Clone)]
enum KStep {
    Predefined { kind: KernelOpKind, inputs: Vec<usize> },
    Customized { inputs: Vec<usize>, alts: Vec<Arc<BlockSolution>> },
}

#[derive(Clone)]
struct KState {
    tensors: Vec<KTensor>,
    steps: Vec<KStep>,
    customized: usize,
}

impl KState {
    fn push(&self, step: KStep, outputs: Vec<TensorInfo>) -> KState {
        let mut s = self.clone();
        let ins = match &step {
            KStep::Predefined { inputs, .. } | KStep::Customized { inputs, .. } => inputs.clone(),
        };
        for i in ins {
            s.tensors[i].consumed = true;
        }
        if matches!(step, KStep::Customized { .. }) {
            s.customized += 1;
        }
        s.tensors.extend(outputs.into_iter().map(|info| KTensor { info, consumed: false }));
        s.steps.push(step);
        s
    }

    fn has(&self, info: &TensorInfo) -> bool {
        self.tensors.iter().any(|t| t.info == *info)
    }
}

struct Ctx<'a> {
    env: Env<'a>,
    targets: Vec<TensorInfo>,
    /// Whether kernel steps may also be the row ops and `sub` / `pow` as predefined kernels
    /// (the second pass, when the first finds no µGraph).
    row_ops: bool,
}

/// Searches µGraphs equivalent to `reference` (a program of predefined ops with marked
/// outputs, or whose unconsumed tensors are its outputs) and returns them cheapest first.
///
/// ```
/// use mirage_search::{superoptimize, SearchConfig};
/// use mirage_ugraph::zoo;
/// let pair = zoo::rmsnorm_linear(16, 256, 256, 4, 4, mirage_ugraph::DType::Float16).unwrap();
/// let cfg = SearchConfig { max_kernel_ops: 1, ..SearchConfig::default() };
/// let result = superoptimize(&pair.reference, &cfg).unwrap();
/// let best = result.best().expect("a fused kernel");
/// assert_eq!(best.customized_kernels, 1);
/// ```
pub fn superoptimize(reference: &KernelGraph, cfg: &SearchConfig) -> Result<SearchResult> {
    // The time budget covers building the thread pool.
    let start = std::time::Instant::now();
    check_config(cfg)?;
    match cfg.num_threads {
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| SearchError::ThreadPool { threads: n, why: e.to_string() })?;
            pool.install(|| run(reference, cfg, start))
        }
        None => run(reference, cfg, start),
    }
}

/// Most search threads a configuration may ask for.
pub const MAX_THREADS: usize = 4096;

fn check_config(cfg: &SearchConfig) -> Result<()> {
    let bad = |name: &'static str, why: &str| Err(SearchError::InvalidConfig { name, why: why.to_string() });
    if cfg.max_block_ops < 2 {
        return bad("max_block_ops", "must be at least 2 (an input and an output)");
    }
    if cfg.max_kernel_ops == 0 {
        return bad("max_kernel_ops", "must be at least 1");
    }
    if cfg.franges().is_empty() || cfg.franges().contains(&0) {
        return bad("franges", "must be a non-empty list of positive loop ranges");
    }
    if cfg.grid_sizes.contains(&0) {
        return bad("grid_sizes", "must be positive");
    }
    if cfg.blockdims().iter().any(|b| b.contains(&0) || b.iter().product::<usize>() > 1024) {
        return bad("blockdims", "each must have 1 to 1024 threads and no zero entry");
    }
    if cfg.num_threads == Some(0) {
        return bad("num_threads", "must be at least 1");
    }
    if cfg.num_threads.is_some_and(|n| n > MAX_THREADS) {
        return bad("num_threads", &format!("must be at most {MAX_THREADS}"));
    }
    Ok(())
}

/// The sizes the e-graph may split sums by: the configuration's ([`SearchConfig::sum_factors`])
/// and those derived from the program's reduction indices ([`crate::sizes`]).
fn sum_factors(cfg: &SearchConfig, labels: &LabelInfo) -> Vec<u64> {
    let reductions: Vec<usize> = (0..labels.sizes.len())
        .filter(|&i| u16::try_from(i).is_ok_and(|i| !labels.is_parallel(Label::Index(i))))
        .map(|i| labels.sizes[i])
        .collect();
    let mut f = cfg.sum_factors();
    f.extend(sizes::derived_factors(&reductions, &cfg.grid_sizes, &cfg.franges()));
    f.sort_unstable();
    f.dedup();
    f
}

fn run(reference: &KernelGraph, cfg: &SearchConfig, start: std::time::Instant) -> Result<SearchResult> {
    if reference.ops.is_empty() {
        return Err(SearchError::EmptyGraph);
    }
    let out_ids = reference.output_ids();
    if out_ids.is_empty() {
        return Err(SearchError::NoOutput);
    }
    let labels = analyze(reference)?;
    let oracle = ExprOracle::with_labels(reference, &labels, &sum_factors(cfg, &labels), &cfg.saturation)?;
    let ctl = Control::new(cfg, start);
    let env = Env {
        oracle: &oracle,
        labels: &labels,
        cfg,
        ctl: &ctl,
        franges: cfg.franges(),
        blockdims: cfg.blockdims(),
        eps: crate::generator::reference_eps(reference),
    };
    let in_ids = reference.input_ids();
    let info = |t: usize, class| TensorInfo {
        dims: reference.tensors[t].dims.clone(),
        labels: labels.tensors[t].clone(),
        class,
        dtype: reference.tensors[t].dtype,
    };
    let inputs: Vec<TensorInfo> = in_ids.iter().zip(oracle.inputs()).map(|(&t, &c)| info(t, c)).collect();
    let targets: Vec<TensorInfo> = out_ids.iter().zip(oracle.targets()).map(|(&t, &c)| info(t, Some(c))).collect();
    let mut ctx = Ctx { env, targets, row_ops: false };

    let n_final = count_plans(&ctx.env, &inputs, Mode::Final(&ctx.targets));
    let n_inter = count_plans(&ctx.env, &inputs, Mode::Intermediate);
    if n_final == 0 && n_inter == 0 {
        return Err(SearchError::Unsatisfiable(format!(
            "no grid / input map / for-loop configuration fits the inputs {:?} (griddims {:?}, imaps {:?}, fmaps {:?}, franges {:?}, shared memory limit {} bytes)",
            inputs.iter().map(|t| t.dims.clone()).collect::<Vec<_>>(),
            cfg.griddims,
            cfg.imaps,
            cfg.fmaps,
            cfg.franges(),
            cfg.shared_memory_limit
        )));
    }

    let start = KState {
        tensors: inputs.iter().cloned().map(|info| KTensor { info, consumed: false }).collect(),
        steps: vec![],
        customized: 0,
    };
    let mut specs: Vec<Vec<KStep>> = Vec::new();
    let explored = deepen(&ctx, &start, cfg.max_kernel_ops, &mut specs);
    // Nothing found: again with every op of the reference allowed as a kernel of its own, so
    // that what no block graph holds runs by itself while the rest is still searched.
    if specs.is_empty() && !ctl.stopped() {
        ctx.row_ops = true;
        deepen(&ctx, &start, cfg.max_kernel_ops, &mut specs);
    }
    ctl.report(true);

    let mut candidates = build_candidates(reference, &ctx, &specs)?;
    let total = candidates.len();
    ctl.counters.candidates.store(total as u64, Relaxed);
    ctl.enter(Phase::Verify);
    let (verified, failed, online_softmax_rewrites) = verify_all(reference, cfg, &ctl, &mut candidates);
    if cfg.verify.co_resident {
        add_twins(&mut candidates, &cfg.cost_model, &cfg.target);
    }
    ctl.enter(Phase::Done);
    let c = &ctl.counters;
    let stats = SearchStats {
        states_visited: c.states.load(Relaxed),
        pruned_by_expression: c.pruned_expr.load(Relaxed),
        pruned_by_limits: c.pruned_limits.load(Relaxed),
        ill_typed: c.ill_typed.load(Relaxed),
        configurations: c.configurations.load(Relaxed),
        block_graphs: c.block_graphs.load(Relaxed),
        candidates: total,
        verified,
        verification_failed: failed,
        online_softmax_rewrites,
        builder_rejects: c.builder_rejects.load(Relaxed),
        kernel_ops_explored: explored,
        elapsed: ctl.start.elapsed(),
        saturation: oracle.report().clone(),
    };
    let stopped = ctl.reason();
    let empty_reason = candidates.is_empty().then(|| {
        let mut why = match stopped {
            Some(StopReason::TimeBudget) => "the time budget ran out before a candidate was found".to_string(),
            Some(StopReason::Cancelled) => "the search was cancelled before a candidate was found".to_string(),
            None if failed > 0 => format!("all {failed} candidates found failed verification"),
            None => format!(
                "no µGraph with at most {} kernel ops ({} customized) and {} ops per block graph computes the reference within the limits ({} configurations explored)",
                cfg.max_kernel_ops, cfg.max_customized_ops, cfg.max_block_ops, stats.configurations
            ),
        };
        if stats.saturation.limit_hit {
            why.push_str(&format!("; e-graph saturation stopped at its {}, so valid candidates may have been pruned", stats.saturation.stop_reason));
        }
        why
    });
    Ok(SearchResult { candidates, stats, stopped, empty_reason })
}

/// Every candidate (as its list of kernel steps) with exactly `remaining` more kernel ops.
/// Kernel searches of 1, 2, ... `max_depth` kernel ops from `start`, until the search is
/// stopped; appends what they find to `specs` and returns the deepest depth searched.
fn deepen(ctx: &Ctx<'_>, start: &KState, max_depth: usize, specs: &mut Vec<Vec<KStep>>) -> usize {
    let ctl = ctx.env.ctl;
    let mut explored = 0;
    for depth in 1..=max_depth {
        if ctl.stopped() {
            break;
        }
        ctl.kernel_ops.store(depth, Relaxed);
        ctl.report(true);
        specs.extend(kernel_search(ctx, start, depth));
        explored = depth;
    }
    explored
}

fn kernel_search(ctx: &Ctx<'_>, state: &KState, remaining: usize) -> Vec<Vec<KStep>> {
    if ctx.env.ctl.stopped() {
        return Vec::new();
    }
    if remaining == 1 {
        return final_moves(ctx, state);
    }
    let children = intermediate_moves(ctx, state);
    children.par_iter().flat_map_iter(|c| kernel_search(ctx, c, remaining - 1)).collect()
}

/// Subsets (sorted tensor ids) of `0..n` that contain all of `required` and any of `optional`.
fn subsets(required: &[usize], optional: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for mask in 0u64..(1u64 << optional.len().min(16)) {
        let mut s: Vec<usize> = required.to_vec();
        s.extend(optional.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, &t)| t));
        if s.is_empty() {
            continue;
        }
        s.sort_unstable();
        out.push(s);
    }
    out
}

/// What an intermediate kernel outputs: dims, labels and e-class of each output.
type Signature = Vec<(Vec<usize>, Vec<Label>, Option<usize>)>;

fn intermediate_moves(ctx: &Ctx<'_>, state: &KState) -> Vec<KState> {
    let targets: HashSet<_> = ctx.targets.iter().filter_map(|t| t.class).collect();
    let mut children = Vec::new();
    for (kind, ins, out) in predefined_ops(ctx, state) {
        if out.class.is_some_and(|c| targets.contains(&c)) || state.has(&out) {
            continue;
        }
        children.push(state.push(KStep::Predefined { kind, inputs: ins }, vec![out]));
    }
    if state.customized >= ctx.env.cfg.max_customized_ops {
        return children;
    }
    let n = state.tensors.len();
    let unconsumed: Vec<usize> = (0..n).filter(|&i| !state.tensors[i].consumed).collect();
    let all: Vec<usize> = (0..n).collect();
    let sets: Vec<Vec<usize>> =
        subsets(&[], &all).into_iter().filter(|s| s.iter().any(|i| unconsumed.contains(i))).collect();
    let found: Vec<(Vec<usize>, Vec<BlockSolution>)> = sets
        .par_iter()
        .map(|s| {
            let infos: Vec<TensorInfo> = s.iter().map(|&i| state.tensors[i].info.clone()).collect();
            (s.clone(), search_block_graphs(&ctx.env, &infos, Mode::Intermediate))
        })
        .collect();
    for (set, sols) in found {
        let mut groups: BTreeMap<Signature, Vec<BlockSolution>> = BTreeMap::new();
        for sol in sols {
            let sig =
                sol.outputs.iter().map(|o| (o.dims.clone(), o.labels.clone(), o.class.map(usize::from))).collect();
            groups.entry(sig).or_default().push(sol);
        }
        for (_, mut group) in groups {
            if group[0].outputs.iter().all(|o| state.has(o)) {
                continue;
            }
            group.sort_by(|a, b| a.cost.est_us.total_cmp(&b.cost.est_us).then(a.key.cmp(&b.key)));
            group.truncate(ctx.env.cfg.keep_per_signature.max(1));
            let outputs = group[0].outputs.clone();
            let alts = group.into_iter().map(Arc::new).collect();
            children.push(state.push(KStep::Customized { inputs: set.clone(), alts }, outputs));
        }
    }
    children
}

fn final_moves(ctx: &Ctx<'_>, state: &KState) -> Vec<Vec<KStep>> {
    let n = state.tensors.len();
    let required: Vec<usize> = (0..n).filter(|&i| !state.tensors[i].consumed).collect();
    let optional: Vec<usize> = (0..n).filter(|&i| state.tensors[i].consumed).collect();
    let mut out = Vec::new();
    if ctx.targets.len() == 1 {
        for (kind, ins, info) in predefined_ops(ctx, state) {
            if info == ctx.targets[0] && required.iter().all(|r| ins.contains(r)) {
                let mut steps = state.steps.clone();
                steps.push(KStep::Predefined { kind, inputs: ins });
                out.push(steps);
            }
        }
    }
    if state.customized >= ctx.env.cfg.max_customized_ops {
        return out;
    }
    let sets = subsets(&required, &optional);
    let found: Vec<Vec<Vec<KStep>>> = sets
        .par_iter()
        .map(|s| {
            let infos: Vec<TensorInfo> = s.iter().map(|&i| state.tensors[i].info.clone()).collect();
            search_block_graphs(&ctx.env, &infos, Mode::Final(&ctx.targets))
                .into_iter()
                .map(|sol| {
                    let mut steps = state.steps.clone();
                    steps.push(KStep::Customized { inputs: s.clone(), alts: vec![Arc::new(sol)] });
                    steps
                })
                .collect()
        })
        .collect();
    out.extend(found.into_iter().flatten());
    out
}

/// Predefined kernel ops on the state's tensors whose result is in the target's e-graph.
fn predefined_ops(ctx: &Ctx<'_>, state: &KState) -> Vec<(KernelOpKind, Vec<usize>, TensorInfo)> {
    let n = state.tensors.len();
    let mut out = Vec::new();
    let t = |i: usize| &state.tensors[i].info;
    let mut emit = |kind: KernelOpKind, ins: Vec<usize>, dims: Vec<usize>, labels: Vec<Label>| {
        let classes: Option<Vec<_>> = ins.iter().map(|&i| t(i).class).collect();
        let Some(classes) = classes else { return };
        let in_dims: Vec<&[usize]> = ins.iter().map(|&i| t(i).dims.as_slice()).collect();
        let in_labels: Vec<&[Label]> = ins.iter().map(|&i| t(i).labels.as_slice()).collect();
        let mut sink = ctx.env.oracle.sink();
        if let Ok(Some(class)) = op_term(&mut sink, OpRef::Kernel(&kind), &classes, &in_dims, &in_labels) {
            let info = TensorInfo { dims, labels, class: Some(class), dtype: t(ins[0]).dtype };
            out.push((kind, ins, info));
        }
    };
    for a in 0..n {
        for u in unary_ops() {
            emit(KernelOpKind::Unary { op: u }, vec![a], t(a).dims.clone(), t(a).labels.clone());
        }
        for b in 0..n {
            let (x, y) = (t(a), t(b));
            let r = x.dims.len();
            if r >= 2
                && y.dims.len() == r
                && x.dims[r - 1] == y.dims[r - 2]
                && x.labels[r - 1] == y.labels[r - 2]
                && x.dims[..r - 2] == y.dims[..r - 2]
                && x.labels[..r - 2] == y.labels[..r - 2]
            {
                let mut dims = x.dims.clone();
                let mut labels = x.labels.clone();
                dims[r - 1] = y.dims[r - 1];
                labels[r - 1] = y.labels[r - 1];
                emit(KernelOpKind::Matmul, vec![a, b], dims, labels);
            }
            if let Some((dims, labels)) = broadcast(x, y) {
                // The registry's binary ops (docs/ops.md): those searched always, then those of
                // the second pass; a commutative op once per unordered pair (`a <= b`), the
                // others once per ordered pair of distinct tensors.
                let passes: &[KernelSearch] = if ctx.row_ops {
                    &[KernelSearch::Always, KernelSearch::SecondPass]
                } else {
                    &[KernelSearch::Always]
                };
                for &pass in passes {
                    for d in BINARY_OPS.iter().filter(|d| d.kernel_search == pass) {
                        let once = if d.commutative { a <= b } else { a != b };
                        if once {
                            emit(KernelOpKind::Binary { op: d.op }, vec![a, b], dims.clone(), labels.clone());
                        }
                    }
                }
            }
            // rms_norm over the last dim with a weight of that dim.
            let r = x.dims.len();
            if ctx.row_ops
                && r >= 1
                && a != b
                && y.dims.len() == 1
                && y.dims[0] == x.dims[r - 1]
                && y.labels[0] == x.labels[r - 1]
            {
                emit(
                    KernelOpKind::RmsNorm { normalized_ndims: 1, eps: ctx.env.eps },
                    vec![a, b],
                    x.dims.clone(),
                    x.labels.clone(),
                );
            }
        }
        // The reference's row ops as kernels of their own: what the block graphs cannot hold
        // still has a plan.
        let x = t(a);
        if !ctx.row_ops {
            continue;
        }
        if !x.dims.is_empty() {
            emit(
                KernelOpKind::RmsNorm { normalized_ndims: 1, eps: ctx.env.eps },
                vec![a],
                x.dims.clone(),
                x.labels.clone(),
            );
        }
        for dim in 0..x.dims.len() {
            emit(KernelOpKind::Softmax { dim }, vec![a], x.dims.clone(), x.labels.clone());
            let (mut dims, mut labels) = (x.dims.clone(), x.labels.clone());
            dims[dim] = 1;
            labels[dim] = Label::Unit;
            emit(KernelOpKind::Reduction { dim }, vec![a], dims, labels);
        }
    }
    out
}

fn broadcast(x: &TensorInfo, y: &TensorInfo) -> Option<(Vec<usize>, Vec<Label>)> {
    if x.dims.len() != y.dims.len() {
        return None;
    }
    let mut dims = x.dims.clone();
    let mut labels = x.labels.clone();
    for i in 0..dims.len() {
        let (a, b) = (x.dims[i], y.dims[i]);
        if a > 1 && b > 1 {
            if a != b || x.labels[i] != y.labels[i] {
                return None;
            }
        } else if b > 1 {
            dims[i] = b;
            labels[i] = y.labels[i];
        }
    }
    Some((dims, labels))
}

/// Kernel graphs of every spec (each choice of alternatives), deduplicated, cheapest first.
fn build_candidates(reference: &KernelGraph, ctx: &Ctx<'_>, specs: &[Vec<KStep>]) -> Result<Vec<Candidate>> {
    let built: Vec<Result<Vec<Candidate>>> = specs
        .par_iter()
        .map(|steps| {
            let mut out = Vec::new();
            for choice in choices(steps) {
                let g = build_graph(reference, ctx, steps, &choice)?;
                let customized = g.ops.iter().filter(|o| matches!(o.kind, KernelOpKind::Customized { .. })).count();
                out.push(Candidate {
                    cost: kernel_graph_cost(&g, &ctx.env.cfg.cost_model, &ctx.env.cfg.target),
                    hash: graph_hash(&g),
                    graph: g,
                    customized_kernels: customized,
                    verification: Verification::NotChecked,
                });
            }
            Ok(out)
        })
        .collect();
    let mut all = Vec::new();
    for b in built {
        all.extend(b?);
    }
    sort_dedup(&mut all);
    Ok(all)
}

/// Order of preference among checks of the same graph: passed, unstable, not checked, failed.
fn check_rank(v: &Verification) -> u8 {
    match v {
        Verification::Passed => 0,
        Verification::Unstable(_) => 1,
        Verification::NotChecked => 2,
        Verification::Failed(_) => 3,
    }
}

/// Sorts candidates cheapest first (ties by launches, shared memory, hash) and drops repeats.
fn sort_dedup(all: &mut Vec<Candidate>) {
    all.sort_by(|a, b| {
        a.cost
            .est_us
            .total_cmp(&b.cost.est_us)
            .then(a.cost.launches.cmp(&b.cost.launches))
            .then(a.cost.shared_memory.cmp(&b.cost.shared_memory))
            .then(a.hash.cmp(&b.hash))
            .then(check_rank(&a.verification).cmp(&check_rank(&b.verification)))
    });
    // Of equal graphs (a rewrite can equal another candidate) the best-checked one stays.
    all.dedup_by(|a, b| a.hash == b.hash);
}

/// Checks one candidate: its verification, and, for an equivalent one that contains `exp`,
/// its online-softmax rewrite ([`rewrite_online_softmax`]) when `online_softmax` is set and
/// the rewrite checks as [`Verification::Passed`] (equivalent and stable in its own
/// precision), to take its place. Stable candidates are rewritten too: a plain `exp` that
/// passes in bf16 or fp32 (their range reaches e^88) still overflows on logits past 88, and
/// the code generator's attention forms take the online form only.
fn check_candidate(checker: &Checker<'_>, cfg: &SearchConfig, c: &Candidate) -> (Verification, Option<Candidate>) {
    let v = checker.check(&c.graph);
    let equivalent = matches!(v, Verification::Unstable(_) | Verification::Passed);
    let rewrite = (equivalent && cfg.online_softmax && has_exp(&c.graph))
        .then(|| rewrite_online_softmax(&c.graph))
        .flatten()
        .filter(|g| checker.check(g) == Verification::Passed)
        .map(|g| Candidate {
            cost: kernel_graph_cost(&g, &cfg.cost_model, &cfg.target),
            hash: graph_hash(&g),
            customized_kernels: c.customized_kernels,
            graph: g,
            verification: Verification::Passed,
        });
    (v, rewrite)
}

/// Whether any kernel or block op of `g` is `exp`.
fn has_exp(g: &KernelGraph) -> bool {
    g.ops.iter().any(|o| match &o.kind {
        KernelOpKind::Unary { op } => *op == UnaryOp::Exp,
        KernelOpKind::Customized { graph } => {
            graph.ops.iter().any(|b| matches!(b.kind, mirage_ugraph::BlockOpKind::Unary { op: UnaryOp::Exp }))
        }
        _ => false,
    })
}

/// Every choice of one alternative per customized step.
fn choices(steps: &[KStep]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![vec![]];
    for s in steps {
        let k = match s {
            KStep::Customized { alts, .. } => alts.len().max(1),
            KStep::Predefined { .. } => 1,
        };
        out = out.into_iter().flat_map(|c| (0..k).map(move |i| [c.clone(), vec![i]].concat())).collect();
    }
    out
}

fn build_graph(reference: &KernelGraph, ctx: &Ctx<'_>, steps: &[KStep], choice: &[usize]) -> Result<KernelGraph> {
    let mut g = KernelGraph::new();
    for op in &reference.ops {
        if let KernelOpKind::Input { dims, dtype, strides } = &op.kind {
            g.new_input(dims, *dtype, Some(strides))?;
        }
    }
    let mut last_outputs = Vec::new();
    for (s, &c) in steps.iter().zip(choice) {
        last_outputs = match s {
            KStep::Predefined { kind, inputs } => vec![match kind {
                KernelOpKind::Matmul => g.matmul(inputs[0], inputs[1])?,
                KernelOpKind::Unary { op } => g.unary(*op, inputs[0])?,
                KernelOpKind::Binary { op } => g.binary(*op, inputs[0], inputs[1])?,
                KernelOpKind::Reduction { dim } => g.reduction(inputs[0], *dim as i64)?,
                KernelOpKind::Softmax { dim } => g.softmax(inputs[0], *dim as i64)?,
                KernelOpKind::RmsNorm { eps, .. } => {
                    let d = &g.tensor(inputs[0])?.dims;
                    let last = d[d.len() - 1..].to_vec();
                    g.rms_norm_eps(inputs[0], &last, inputs.get(1).copied(), *eps)?
                }
                other => {
                    return Err(SearchError::Unsupported {
                        op: other.name().into(),
                        why: "not a searched kernel op".into(),
                    })
                }
            }],
            KStep::Customized { inputs, alts } => g.customized(inputs, alts[c].graph.clone())?,
        };
    }
    let ref_outs = reference.output_ids();
    for (k, &t) in last_outputs.iter().enumerate().take(ctx.targets.len()) {
        let strides = reference
            .outputs
            .iter()
            .find(|o| o.tensor == ref_outs[k])
            .map(|o| o.strides.clone())
            .unwrap_or_else(|| row_major_strides(&reference.tensors[ref_outs[k]].dims));
        g.mark_output(t, Some(&strides))?;
    }
    Ok(g)
}

/// The launch shape of a candidate: (blocks, threads per block, for-loop range) of each
/// customized kernel, and the number of predefined kernels.
fn shape(g: &KernelGraph) -> (Vec<(usize, usize, usize)>, usize) {
    let mut custom = Vec::new();
    let mut predefined = 0;
    for op in &g.ops {
        match &op.kind {
            KernelOpKind::Customized { graph } => custom.push(launch(graph)),
            KernelOpKind::Input { .. } => {}
            _ => predefined += 1,
        }
    }
    (custom, predefined)
}

/// (blocks, threads per block, for-loop range) of one customized kernel.
fn launch(bg: &BlockGraph) -> (usize, usize, usize) {
    (bg.num_blocks(), bg.block_dim.iter().product(), bg.forloop_range)
}

/// The launch of the candidate's costliest customized kernel (by the model): the kernel whose
/// tile shape decides the run time, where the others (a split-KV combine, a norm of one
/// operand) change it little.
fn main_launch(g: &KernelGraph, m: &CostModel, t: &Target) -> Option<(usize, usize, usize)> {
    g.ops
        .iter()
        .filter_map(|op| match &op.kind {
            KernelOpKind::Customized { graph } => Some((block_graph_cost(graph, m, t).est_us, launch(graph))),
            _ => None,
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, l)| l)
}

/// How far above the cheapest candidate's modelled cost a new main shape is still checked
/// before the launch-shape variants (see [`check_order`]).
const MAIN_SHAPE_REACH: f64 = 4.0;

/// Most launch-shape variants of one main shape (its other kernels' shapes) checked before
/// the rest (see [`check_order`]).
const VARIANTS_PER_MAIN: usize = 6;

/// The order in which candidates are checked. With `spread`: the cheapest candidate of each
/// distinct structure (loop ranges of the customized kernels, predefined ops), by cost; then,
/// taking one of each in turn, the cheapest of each distinct main shape (the structure and
/// the launch shape of its costliest kernel) within [`MAIN_SHAPE_REACH`] of the cheapest cost
/// and the cheapest of each distinct launch shape (every kernel's), at most
/// [`VARIANTS_PER_MAIN`] per main shape, each list by cost; then the rest. Without `spread`:
/// launch shapes, then the rest. The cost model ranks shapes only roughly (loop latency,
/// occupancy, which operands the generated code can stream), so the verified set, which a GPU
/// then times, spans structures and main-kernel shapes as well as a few variants of each
/// (one attention kernel with several shapes of its small combine kernel).
fn check_order(cands: &[Candidate], spread: bool, m: &CostModel, t: &Target) -> Vec<usize> {
    let (mut structures, mut mains, mut shapes) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut variants: HashMap<_, usize> = HashMap::new();
    let reach = cands.first().map_or(0.0, |c| c.cost.est_us * MAIN_SHAPE_REACH);
    let mut tiers: [Vec<usize>; 4] = Default::default();
    for (i, c) in cands.iter().enumerate() {
        let (custom, predefined) = shape(&c.graph);
        let structure: (Vec<usize>, usize) = (custom.iter().map(|k| k.2).collect(), predefined);
        let new_shape = shapes.insert((custom, predefined));
        let tier = if !spread {
            if new_shape {
                2
            } else {
                3
            }
        } else {
            let main = (structure.clone(), main_launch(&c.graph, m, t));
            let n = variants.entry(main.clone()).or_insert(0);
            *n += usize::from(new_shape);
            if structures.insert(structure) {
                mains.insert(main);
                0
            } else if c.cost.est_us <= reach && mains.insert(main) {
                1
            } else if new_shape && *n <= VARIANTS_PER_MAIN {
                2
            } else {
                3
            }
        };
        tiers[tier].push(i);
    }
    let [first, mains, shapes, rest] = tiers;
    let mut order = first;
    let (mut a, mut b) = (mains.into_iter(), shapes.into_iter());
    loop {
        match (a.next(), b.next()) {
            (None, None) => break,
            (x, y) => order.extend(x.into_iter().chain(y)),
        }
    }
    order.extend(rest);
    order
}

/// Verified candidates, the first this many in order, that get a co-resident twin
/// ([`add_twins`]).
const CO_RESIDENT_TWINS: usize = 32;

/// Places after each of the first [`CO_RESIDENT_TWINS`] verified candidates that has a
/// one-wave streaming kernel ([`co_resident`]) its twin: the same graph with those kernels'
/// stages capped at the target's [`Target::co_resident_smem`] (`BlockGraph::smem_cap`), so that two blocks share
/// an SM. Consecutive calls of a kernel launched as a programmatic dependent then overlap:
/// the next call's blocks arrive while this call's drain and prefetch their first stages,
/// which one block per SM forbids; fewer stages keep fewer loads in flight. Which pays is a
/// GPU's timing to decide (RMSNorm+Linear 4096 b=1 on the H200: 10.48-10.68 us against
/// 10.82-10.99 us; b=16 14.3 against 12.0), so the twin goes beside its original, checked
/// as it is (the cap changes no value).
///
/// Each of the first [`WARPGROUP_TWINS`] verified candidates, and its co-resident twin, also
/// gets a warpgroup twin ([`warpgroup_twin`]) after it.
fn add_twins(cands: &mut Vec<Candidate>, m: &CostModel, t: &Target) {
    let mut out = Vec::with_capacity(cands.len() + CO_RESIDENT_TWINS + 2 * WARPGROUP_TWINS);
    let mut twins = 0;
    for c in cands.drain(..) {
        let passed = c.verification == Verification::Passed;
        let twin_of = |g: KernelGraph| Candidate {
            cost: kernel_graph_cost(&g, m, t),
            hash: graph_hash(&g),
            customized_kernels: c.customized_kernels,
            graph: g,
            verification: Verification::Passed,
        };
        let co = (twins < CO_RESIDENT_TWINS && passed).then(|| co_resident_twin(&c.graph, t)).flatten().map(twin_of);
        let wg =
            |g: &KernelGraph| (twins < WARPGROUP_TWINS && passed).then(|| warpgroup_twin(g)).flatten().map(twin_of);
        let (wg_c, wg_co) = (wg(&c.graph), co.as_ref().and_then(|t| wg(&t.graph)));
        if passed {
            twins += 1;
        }
        out.push(c);
        out.extend(wg_c);
        out.extend(co);
        out.extend(wg_co);
    }
    *cands = out;
}

/// Verified candidates, the first this many in order, that get a warpgroup twin (and their
/// co-resident twins one).
const WARPGROUP_TWINS: usize = 32;

/// `g` with its kernels that have a loop matmul the code generator may sum on the
/// warpgroup tensor cores (`BlockGraph::warpgroup_acc`: 16 or 32 rows of a 16-bit A, K a
/// multiple of 64, 64 columns, whole warpgroups) asking for it; None where none has. Which
/// form pays is the GPU's timing to decide (on the H200 it took RMSNorm+Linear 4096x6144
/// b=16 from 17.4-17.5 to 17.0-17.2 us and gated MLP b=16 from 17.9 to 17.7, but 4096x6144
/// b=8, two warpgroups over 16 rows, from 14.95 to 16.2).
fn warpgroup_twin(g: &KernelGraph) -> Option<KernelGraph> {
    let mut twin = g.clone();
    let mut any = false;
    for op in &mut twin.ops {
        if let KernelOpKind::Customized { graph } = &mut op.kind {
            if !graph.warpgroup_acc && (0..graph.ops.len()).any(|j| graph.warpgroup_matmul(j)) {
                graph.warpgroup_acc = true;
                any = true;
            }
        }
    }
    any.then_some(twin)
}

/// `g` with the stages of its one-wave streaming kernels ([`co_resident`]) capped at
/// `t`'s [`Target::co_resident_smem`]; None where it has none.
fn co_resident_twin(g: &KernelGraph, t: &Target) -> Option<KernelGraph> {
    let mut twin = g.clone();
    let mut any = false;
    for op in &mut twin.ops {
        if let KernelOpKind::Customized { graph } = &mut op.kind {
            if co_resident(graph, t) {
                graph.smem_cap = Some(t.co_resident_smem());
                any = true;
            }
        }
    }
    any.then_some(twin)
}

/// Whether capping `bg`'s stages at `t`'s [`Target::co_resident_smem`] changes its kernel and leaves it
/// pipelined: a loop of one wave of blocks (in its cluster form, as generated) whose stages
/// take more than the cap, and of which two stages or more fit under it; no attention loop.
fn co_resident(bg: &BlockGraph, t: &Target) -> bool {
    // (An attention loop, its running max and rescaled sums, takes its stages by the
    // generator's own rules, not the cap.)
    let attention =
        bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::ForloopAccumMax | BlockOpKind::ForloopAccumRescale { .. }));
    if attention || bg.smem_cap.is_some() || bg.forloop_range < 2 {
        return false;
    }
    let g = bg.cluster_split(t).map_or_else(|| bg.clone(), |(_, _, g)| g);
    let (staged, other) = stage_bytes(&g);
    let full = g.pipeline_stages(staged, other, t);
    let cap = t.co_resident_smem();
    let capped = BlockGraph { smem_cap: Some(cap), ..g };
    staged > 0
        && capped.num_blocks() <= t.budgets.one_wave_blocks
        && other + full * staged > cap
        && capped.pipeline_stages(staged, other, t) >= 2
}

/// Checks candidates in [`check_order`] until `top_n` distinct ones pass as stable
/// ([`Verification::Passed`], directly or through their online-softmax rewrite, see
/// [`check_candidate`]), or twice as many were found equivalent, or four times as many were
/// tried. Unstable ones do not count towards `top_n`: they are kept only as the fallback when
/// nothing stable exists, and a GPU profiles only stable ones. Drops the failures and re-sorts
/// cheapest first. Returns (equivalent, failed, online-softmax rewrites).
fn verify_all(
    reference: &KernelGraph,
    cfg: &SearchConfig,
    ctl: &Control,
    cands: &mut Vec<Candidate>,
) -> (usize, usize, usize) {
    let want = cfg.verify.top_n;
    let order = check_order(cands, cfg.verify.spread, &cfg.cost_model, &cfg.target);
    let counters = &ctl.counters;
    counters.verify_goal.store(want.min(order.len()) as u64, Relaxed);
    let (mut stable, mut unstable, mut failed, mut rewrites, mut next) = (0, 0, 0, 0, 0);
    let mut seen: HashSet<String> = HashSet::new();
    let checker = Checker::new(reference, &cfg.verify);
    // Saturating: `top_n` may be any usize (e.g. "check everything").
    while stable < want
        && stable + unstable < want.saturating_mul(2)
        && next < order.len()
        && next < want.max(1).saturating_mul(4)
    {
        if ctl.cancelled() || (stable + unstable > 0 && ctl.past_grace()) {
            break;
        }
        // When the time budget cut the search, a batch per thread; past the budget's grace,
        // only until one passes.
        let cut = ctl.reason() == Some(StopReason::TimeBudget);
        let batch = if cut { rayon::current_num_threads().min(want - stable) } else { want - stable };
        let end = next.saturating_add(batch).min(order.len());
        let idx = &order[next..end];
        let checked: Vec<_> = idx
            .par_iter()
            .map(|&i| {
                let r = check_candidate(&checker, cfg, &cands[i]);
                counters.checked.fetch_add(1, Relaxed);
                r
            })
            .collect();
        for (&i, (v, rewrite)) in idx.iter().zip(checked) {
            if let Some(new) = rewrite {
                rewrites += 1;
                cands[i] = new;
            } else {
                cands[i].verification = v;
            }
            match cands[i].verification {
                Verification::Passed => stable += usize::from(seen.insert(cands[i].hash.clone())),
                Verification::Unstable(_) => unstable += 1,
                _ => failed += 1,
            }
        }
        counters.verified.store((stable + unstable) as u64, Relaxed);
        counters.verification_failed.store(failed as u64, Relaxed);
        ctl.report(false);
        next = end;
    }
    cands.retain(|c| !matches!(c.verification, Verification::Failed(_)));
    if rewrites > 0 {
        sort_dedup(cands);
    }
    (stable + unstable, failed, rewrites)
}
