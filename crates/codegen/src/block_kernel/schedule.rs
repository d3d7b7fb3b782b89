//! The steps of a block kernel: which step each block op becomes, in which section, and in
//! what order ([`Planner::schedule`]); which tiles each step reads and writes
//! ([`Planner::rw`]); which loop-invariant tiles are read straight from device memory, and each
//! materialised tile's storage and live range ([`Planner::tiles`]).

use mirage_ugraph::{fuse_elementwise, Accum, BlockGraph, BlockOpKind, Phase, STensorId, ThreadOp, UnaryOp};

use super::load::rows_of;
use super::plan::{FlashMode, Planner};
use super::{Knobs, Section, Step};
use crate::emit::numel;
use crate::error::{unsupported, Result};
use crate::flash;
use crate::program::{DevBuffer, Storage};

/// Which tensors and ops an output needs, and each tensor's using ops.
pub(super) struct Liveness {
    pub tneed: Vec<bool>,
    pub opneed: Vec<bool>,
    pub uses: Vec<Vec<usize>>,
}

/// The [`Liveness`] of `bg`.
pub(super) fn liveness(bg: &BlockGraph) -> Liveness {
    let mut tneed = vec![false; bg.tensors.len()];
    let mut opneed = vec![false; bg.ops.len()];
    for (j, op) in bg.ops.iter().enumerate().rev() {
        let need = matches!(op.kind, BlockOpKind::Output { .. }) || op.outputs.iter().any(|&t| tneed[t]);
        if need {
            opneed[j] = true;
            for &t in &op.inputs {
                tneed[t] = true;
            }
        }
    }
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); bg.tensors.len()];
    for (j, op) in bg.ops.iter().enumerate() {
        for &t in &op.inputs {
            uses[t].push(j);
        }
    }
    Liveness { tneed, opneed, uses }
}

/// Whether an accumulator is finalised after the loop (a mean or an rms: `Step::Finalize`).
pub(super) fn finalized(k: &BlockOpKind) -> bool {
    matches!(k, BlockOpKind::ForloopAccum { acc: Accum::Mean | Accum::Rms, .. })
}

/// The loop matmul whose product accumulator op `acc` sums.
pub(super) fn accumulated_matmul(bg: &BlockGraph, acc: usize) -> Option<usize> {
    let x = bg.ops[acc].inputs[0];
    bg.ops.iter().position(|o| matches!(o.kind, BlockOpKind::Matmul) && o.outputs[0] == x)
}

impl<'a> Planner<'a> {
    /// The planner of `bg` with its attention region in form `mode`, over a cluster of
    /// `cluster` blocks; `None` when the region was matched but does not suit that form, or
    /// the cluster cannot merge the graph's accumulators.
    pub(super) fn new(
        name: &'a str,
        bg: &'a BlockGraph,
        ins: &'a [DevBuffer],
        outs: &'a [DevBuffer],
        mode: FlashMode,
        cluster: usize,
        knobs: Knobs,
    ) -> Result<Option<Self>> {
        let nt: usize = bg.block_dim.iter().product();
        let n_ops = bg.ops.len();
        let input_ops: Vec<usize> =
            (0..n_ops).filter(|&j| matches!(bg.ops[j].kind, BlockOpKind::Input { .. })).collect();
        let output_ops: Vec<usize> =
            (0..n_ops).filter(|&j| matches!(bg.ops[j].kind, BlockOpKind::Output { .. })).collect();
        if input_ops.len() != ins.len() || output_ops.len() != outs.len() {
            return unsupported(format!(
                "{name}: the block graph has {} inputs and {} outputs but {} and {} device tensors were given",
                input_ops.len(),
                output_ops.len(),
                ins.len(),
                outs.len()
            ));
        }

        let Liveness { tneed, opneed, uses } = liveness(bg);

        let groups = fuse_elementwise(bg);
        let mut fr = if mode == FlashMode::Off { None } else { flash::find(bg, &opneed, &uses, &knobs.target) };
        if mode == FlashMode::Wgmma {
            match fr.as_mut() {
                Some(f) => match f.wgmma(nt) {
                    Some(w) => f.wg = Some(w),
                    None => return Ok(None),
                },
                None => return Ok(None),
            }
        } else if cluster > 1 && fr.is_some() {
            return Ok(None);
        }
        // Across a cluster only the attention region's accumulators are merged (by their maxima),
        // or without a region only plain sums (added): any other would hold one block's share of
        // the loop.
        if cluster > 1
            && (0..n_ops).any(|j| {
                let k = &bg.ops[j].kind;
                opneed[j]
                    && k.is_accumulator()
                    && match &fr {
                        Some(f) => !f.ops.contains(&j),
                        None => !matches!(k, BlockOpKind::ForloopAccum { .. }),
                    }
            })
        {
            return Ok(None);
        }
        let n_t = bg.tensors.len();
        Ok(Some(Planner {
            name,
            bg,
            ins,
            outs,
            knobs,
            cluster,
            nt,
            input_ops,
            tneed,
            opneed,
            uses,
            groups,
            fr,
            steps: Vec::new(),
            summing: false,
            merged_by_step: Vec::new(),
            lazy: false,
            streamed: vec![None; n_t],
            storage: vec![None; n_t],
            mm_operand: vec![false; n_t],
            def: vec![None; n_t],
            last: vec![None; n_t],
            carried: vec![false; n_t],
            group_out_pos: Vec::new(),
            layout: vec![None; n_t],
            interval: vec![None; n_t],
            wg_acc: Vec::new(),
            wg_tiles: Vec::new(),
            acc_scratch: Vec::new(),
        }))
    }

    /// Loop matmuls fused into their accumulator: (per matmul, its accumulator; per
    /// accumulator, its matmul).
    fn fused_matmuls(&self) -> (Vec<Option<usize>>, Vec<Option<usize>>) {
        let (bg, uses) = (self.bg, &self.uses);
        let n_ops = bg.ops.len();
        let mut fused_into: Vec<Option<usize>> = vec![None; n_ops];
        let mut fused_from: Vec<Option<usize>> = vec![None; n_ops];
        for (j, op) in bg.ops.iter().enumerate() {
            if !self.opneed[j] || !matches!(op.kind, BlockOpKind::Matmul) {
                continue;
            }
            let t = op.outputs[0];
            if bg.tensors[t].phase != Phase::Loop || uses[t].len() != 1 {
                continue;
            }
            let c = uses[t][0];
            let cop = &bg.ops[c];
            let ok = match cop.kind {
                BlockOpKind::ForloopAccum { acc: Accum::None, .. } => cop.inputs[0] == t,
                BlockOpKind::ForloopAccumRescale { acc: Accum::None } => cop.inputs[0] == t && cop.inputs[1] != t,
                _ => false,
            };
            if ok {
                fused_into[j] = Some(c);
                fused_from[c] = Some(j);
            }
        }
        (fused_into, fused_from)
    }

    /// Of the fused loop matmuls, whether matmul `m` into accumulator `c` keeps its sum in
    /// registers across iterations (`mi::MmaAcc`): plain sums of a 16-bit tensor-core matmul of
    /// two loaded tiles.
    fn reg_acc(&self, m: usize, c: usize) -> bool {
        let bg = self.bg;
        let n_ops = bg.ops.len();
        let loaded = |t: STensorId| {
            (0..n_ops)
                .find(|&j| bg.ops[j].outputs.first() == Some(&t))
                .and_then(|j| self.input_ops.iter().position(|&i| i == j).map(|k| self.ins[k].storage))
        };
        let (a, b) = (bg.ops[m].inputs[0], bg.ops[m].inputs[1]);
        let (da, db) = (&bg.tensors[a].dims, &bg.tensors[b].dims);
        let r = da.len();
        let (sa, sb) = (loaded(a), loaded(b));
        matches!(bg.ops[c].kind, BlockOpKind::ForloopAccum { acc: Accum::None, .. })
            && matches!(sa, Some(Storage::F16 | Storage::BF16))
            && sa == sb
            && r >= 2
            && db.len() == r
            && da[..r - 2] == db[..r - 2]
            && da[r - 1] % 16 == 0
            && db[r - 1] % 8 == 0
    }

    /// The steps of the kernel, by section: [`Self::op_steps`], then the cluster merge, the
    /// attention's end, the groups fused into their savers and the lazy merge's choice.
    pub(super) fn schedule(&mut self) {
        self.op_steps();
        self.merge_steps();
        self.group_saves();
        self.lazy = self.lazy_merge();
    }

    /// The steps of the block ops, by section, in op order.
    fn op_steps(&mut self) {
        let bg = self.bg;
        let n_ops = bg.ops.len();
        let in_region = |j: usize| self.fr.as_ref().is_some_and(|f| f.ops.contains(&j));
        let region_last = self.fr.as_ref().and_then(|f| f.ops.iter().copied().max());
        let mut group_root: Vec<Option<usize>> = vec![None; n_ops];
        for (g, grp) in self.groups.iter().enumerate() {
            if let Some(&root) = grp.ops.last() {
                group_root[root] = Some(g);
            }
        }
        let (fused_into, fused_from) = self.fused_matmuls();
        let opneed = &self.opneed;
        let mut steps: Vec<(Section, Step)> = Vec::new();
        let (mut k_in, mut j_out) = (0, 0);
        for j in 0..n_ops {
            let op = &bg.ops[j];
            let phase_sec = |t: STensorId| match bg.tensors[t].phase {
                Phase::Invariant => Section::Pre,
                Phase::Loop => Section::Loop,
                Phase::Post => Section::Post,
            };
            match &op.kind {
                BlockOpKind::Input { forloop_dim, .. } => {
                    let k = k_in;
                    k_in += 1;
                    if opneed[j] {
                        let sec = if *forloop_dim >= 0 { Section::Loop } else { Section::Pre };
                        steps.push((sec, Step::Load { k, op: j }));
                    }
                }
                BlockOpKind::Output { forloop_dim, .. } => {
                    let jj = j_out;
                    j_out += 1;
                    let sec = if *forloop_dim >= 0 { Section::Loop } else { Section::Post };
                    steps.push((sec, Step::Save { j: jj, op: j }));
                }
                _ if !opneed[j] => {}
                _ if in_region(j) => {
                    if Some(j) == region_last {
                        steps.push((Section::Loop, Step::Flash));
                    }
                }
                BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } => {
                    if let Some(g) = group_root[j] {
                        steps.push((phase_sec(op.outputs[0]), Step::Group { g }));
                    }
                }
                BlockOpKind::Matmul => {
                    if fused_into[j].is_none() {
                        steps.push((phase_sec(op.outputs[0]), Step::Matmul { op: j, acc: None }));
                    }
                }
                BlockOpKind::Reduction { .. } => steps.push((phase_sec(op.outputs[0]), Step::Reduce { op: j })),
                BlockOpKind::RmsNorm { .. } => steps.push((phase_sec(op.outputs[0]), Step::RmsNorm { op: j })),
                BlockOpKind::Concat { .. } => steps.push((phase_sec(op.outputs[0]), Step::Concat { op: j })),
                BlockOpKind::ReductionMax { .. } => {
                    let sec = if bg.tensors[op.inputs[0]].phase == Phase::Post { Section::Post } else { Section::Loop };
                    steps.push((sec, Step::RedMax { op: j }));
                }
                BlockOpKind::ForloopAccum { .. }
                | BlockOpKind::ForloopAccumRescale { .. }
                | BlockOpKind::ForloopAccumMax => {
                    match fused_from[j] {
                        Some(m) if self.reg_acc(m, j) => {
                            steps.push((Section::Loop, Step::MatAcc { op: m, acc: j }));
                            steps.push((Section::Post, Step::MatAccEnd { acc: j }));
                        }
                        Some(m) => steps.push((Section::Loop, Step::Matmul { op: m, acc: Some(j) })),
                        None => steps.push((Section::Loop, Step::Accum { op: j })),
                    }
                    if matches!(op.kind, BlockOpKind::ForloopAccum { acc: Accum::Mean | Accum::Rms, .. }) {
                        steps.push((Section::Post, Step::Finalize { op: j }));
                    }
                }
            }
        }
        // Stable by section (op order within each); register accumulators are written out first.
        steps.sort_by_key(|&(s, st)| (s, !matches!(st, Step::MatAccEnd { .. })));
        self.steps = steps;
    }

    /// The summing cluster split's merge step and the tiles it merges, and the attention's end.
    fn merge_steps(&mut self) {
        let (bg, cluster) = (self.bg, self.cluster);
        let n_ops = bg.ops.len();
        let steps = &mut self.steps;
        // A summing cluster split merges the accumulators right after the loop, before anything
        // else reads them, in one step between two cluster barriers: the register ones' tiles
        // (after their `MatAccEnd`), every plain sum, and each mean or rms (after the `Finalize`
        // that writes its block's sums; the merge then divides). One barrier pair instead of one
        // per mean or rms: on the H200, RMSNorm+Linear's cluster winners b=1 12.1 -> 11.7 us, b=16
        // 13.4 -> 12.9, 6144 b=1 17.3 -> 16.9 (saved winners, three alternations).
        let summing = cluster > 1 && self.fr.is_none();
        if summing {
            steps.sort_by_key(|&(s, st)| {
                (
                    s,
                    match st {
                        Step::MatAccEnd { .. } => 0,
                        Step::Finalize { .. } => 1,
                        _ => 3,
                    },
                )
            });
            let at = steps
                .iter()
                .position(|&(s, st)| {
                    s == Section::Post && !matches!(st, Step::MatAccEnd { .. } | Step::Finalize { .. })
                })
                .unwrap_or(steps.len());
            steps.insert(at, (Section::Post, Step::ClusterMerge));
        }
        self.merged_by_step = (0..n_ops)
            .filter(|&j| summing && self.opneed[j] && bg.ops[j].kind.is_accumulator())
            .map(|j| bg.ops[j].outputs[0])
            .collect();
        self.summing = summing;
        if self.fr.is_some() {
            let at = steps.iter().position(|(s, _)| *s == Section::Post).unwrap_or(steps.len());
            steps.insert(at, (Section::Post, Step::FlashEnd));
        }
    }

    /// A group right before the saver of its output, which nothing else reads, is computed in
    /// the saver's loop (`Step::GroupSave`) where the output rows take 16-byte stores and every
    /// thread gets eight elements or more. Saved winners: QKNorm b=8 30.4 -> 29.2 us, GQA and
    /// MQA b=8 -1.5%; with fewer elements than eight per thread (gated MLP's 512 over 256
    /// threads) the idle threads cost more than the tile pass saved (+2%). With four elements
    /// a thread (RMSNorm+Linear b=16's 1024 over 256), four at a time and 8-byte stores.
    fn group_saves(&mut self) {
        let (bg, nt, n_ops) = (self.bg, self.nt, self.bg.ops.len());
        let steps = &mut self.steps;
        let mut p = 0;
        while p + 1 < steps.len() {
            if let ((Section::Post, Step::Group { g }), (Section::Post, Step::Save { j, op })) =
                (steps[p], steps[p + 1])
            {
                let t = self.groups[g].output;
                let dims = &bg.tensors[t].dims;
                let readers = (0..n_ops).filter(|&k| self.opneed[k] && bg.ops[k].inputs.contains(&t)).count();
                let w = [8, 4].into_iter().find(|&w| {
                    numel(dims).is_multiple_of(w) && numel(dims) >= w * nt && rows_of(w, dims, &self.outs[j].strides)
                });
                if let (true, 1, Some(w)) = (bg.ops[op].inputs[0] == t, readers, w) {
                    steps[p] = (Section::Post, Step::GroupSave { g, j, op, w });
                    steps.remove(p + 1);
                }
            }
            p += 1;
        }
    }

    /// A lazy cluster merge (`Knobs::lazy_merge`) where only element-wise groups (and their
    /// output stores) read the merged tiles after it: the merge writes none of them.
    fn lazy_merge(&self) -> bool {
        let (bg, steps) = (self.bg, &self.steps);
        self.knobs.lazy_merge
            && self.summing
            && steps.iter().position(|&(_, st)| matches!(st, Step::ClusterMerge)).is_some_and(|m| {
                steps[m + 1..].iter().all(|&(_, st)| match st {
                    Step::Group { .. } | Step::GroupSave { .. } => true,
                    Step::Save { op, .. } => !self.merged_by_step.contains(&bg.ops[op].inputs[0]),
                    _ => false,
                })
            })
    }

    /// Reads and writes of a step: (written tiles, read tiles, whether the writes are carried
    /// across iterations).
    pub(super) fn rw(&self, sec: Section, step: Step) -> (Vec<STensorId>, Vec<STensorId>, bool) {
        let (bg, groups, fr) = (self.bg, &self.groups, &self.fr);
        match step {
            Step::Load { op, .. } => (vec![bg.ops[op].outputs[0]], vec![], false),
            Step::Group { g } => (vec![groups[g].output], groups[g].inputs.clone(), false),
            Step::Matmul { op, acc: None } => (vec![bg.ops[op].outputs[0]], bg.ops[op].inputs.clone(), false),
            Step::Matmul { op, acc: Some(a) } => {
                let mut r = bg.ops[op].inputs.clone();
                r.extend(bg.ops[a].inputs.iter().skip(1));
                (vec![bg.ops[a].outputs[0]], r, true)
            }
            Step::Reduce { op } | Step::RmsNorm { op } | Step::Concat { op } => {
                (vec![bg.ops[op].outputs[0]], bg.ops[op].inputs.clone(), false)
            }
            Step::RedMax { op } => {
                let o = &bg.ops[op].outputs;
                let mut w = vec![o[0]];
                if self.tneed[o[1]] {
                    w.push(o[1]);
                }
                (w, bg.ops[op].inputs.clone(), sec == Section::Loop)
            }
            Step::Accum { op } => (vec![bg.ops[op].outputs[0]], bg.ops[op].inputs.clone(), true),
            Step::Finalize { op } => (vec![bg.ops[op].outputs[0]], vec![bg.ops[op].outputs[0]], false),
            Step::Save { op, .. } => (vec![], bg.ops[op].inputs.clone(), false),
            Step::GroupSave { g, .. } => (vec![], groups[g].inputs.clone(), false),
            Step::Flash => fr.as_ref().map_or((vec![], vec![], false), |f| (vec![], vec![f.q, f.k, f.v], false)),
            Step::FlashEnd => fr.as_ref().map_or((vec![], vec![], false), |f| {
                let mut w = vec![f.o];
                w.extend(f.l);
                w.extend(f.x);
                (w, vec![], false)
            }),
            Step::MatAcc { op, .. } => (vec![], bg.ops[op].inputs.clone(), false),
            Step::MatAccEnd { acc } => (vec![bg.ops[acc].outputs[0]], vec![], false),
            Step::ClusterMerge => {
                (if self.lazy { vec![] } else { self.merged_by_step.clone() }, self.merged_by_step.clone(), false)
            }
        }
    }

    /// Loop-invariant input tiles read by exactly one step that is not a matmul are streamed:
    /// that step reads device memory directly and the tile takes no shared memory. (Tiles of
    /// the loop go through the cp.async pipeline instead, which hides their latency.) Then the
    /// steps before the loop are ordered for overlap ([`order_before_loop`]).
    pub(super) fn stream(&mut self) {
        let bg = self.bg;
        let mut streamed: Vec<Option<usize>> = vec![None; bg.tensors.len()]; // block input position
        for &(sec, step) in &self.steps {
            if let (Section::Pre, Step::Load { k, op }) = (sec, step) {
                let t = bg.ops[op].outputs[0];
                let readers: Vec<Step> = self
                    .steps
                    .iter()
                    .filter(|&&(sec, st)| self.rw(sec, st).1.contains(&t))
                    .map(|&(_, st)| st)
                    .collect();
                if readers.len() == 1 && !matches!(readers[0], Step::Matmul { .. } | Step::MatAcc { .. } | Step::Flash)
                {
                    streamed[t] = Some(k);
                }
            }
        }
        self.steps.retain(|(_, st)| !matches!(*st, Step::Load { op, .. } if streamed[bg.ops[op].outputs[0]].is_some()));
        let mut steps = std::mem::take(&mut self.steps);
        order_before_loop(&mut steps, &|sec, st| self.rw(sec, st), |k, op| {
            numel(&bg.tensors[bg.ops[op].outputs[0]].dims) * self.ins[k].storage.size_bytes()
        });
        self.steps = steps;
        self.streamed = streamed;
    }

    /// Materialised tensors, their storage, defining and reading steps.
    pub(super) fn tiles(&mut self) -> Result<()> {
        let (bg, n_t) = (self.bg, self.bg.tensors.len());
        let mut storage: Vec<Option<Storage>> = vec![None; n_t];
        for (t, k) in self.streamed.iter().enumerate() {
            if let Some(k) = k {
                storage[t] = Some(self.ins[*k].storage);
            }
        }
        let has_running_max = bg.ops.iter().any(|op| matches!(op.kind, BlockOpKind::ReductionMax { .. }));
        let unbounded_exp = |step: Step| match step {
            Step::Group { g } => {
                !has_running_max
                    && self.groups[g]
                        .thread_graph
                        .ops
                        .iter()
                        .any(|o| matches!(o, ThreadOp::Unary { op: UnaryOp::Exp, .. }))
            }
            _ => false,
        };
        let mut mm_operand = vec![false; n_t];
        for (j, op) in bg.ops.iter().enumerate() {
            if self.opneed[j] && matches!(op.kind, BlockOpKind::Matmul) {
                for &t in &op.inputs {
                    mm_operand[t] = true;
                }
            }
        }
        let mut def: Vec<Option<usize>> = vec![None; n_t];
        let mut last: Vec<Option<usize>> = vec![None; n_t];
        let mut carried = vec![false; n_t];
        let mut group_out_pos: Vec<(usize, usize)> = Vec::new(); // (step position, group)
        for (pos, &(sec, step)) in self.steps.iter().enumerate() {
            if let Step::Group { g } = step {
                group_out_pos.push((pos, g));
            }
            let (writes, reads, loop_carried) = self.rw(sec, step);
            for (wi, &t) in writes.iter().enumerate() {
                if storage[t].is_none() {
                    storage[t] = Some(match step {
                        Step::Load { k, .. } => self.ins[k].storage,
                        // A 16-bit tile computed once per iteration that feeds a matmul keeps
                        // its dtype, so the matmul runs on tensor cores (as torch would round it),
                        // unless it holds exponentials that are not known to be <= 1: an exp
                        // without the running max subtracted overflows fp16 past logits of ~11.
                        Step::Group { .. }
                        | Step::Matmul { acc: None, .. }
                        | Step::RmsNorm { .. }
                        | Step::Concat { .. }
                            if mm_operand[t] && bg.tensors[t].dtype.size_bytes() == 2 && !unbounded_exp(step) =>
                        {
                            Storage::of(bg.tensors[t].dtype)
                        }
                        _ => Storage::F32,
                    });
                }
                // Only the running max (first write of RedMax) is carried across iterations.
                let carry = loop_carried && !(matches!(step, Step::RedMax { .. }) && wi > 0);
                if carry {
                    carried[t] = true;
                }
                if def[t].is_none() {
                    def[t] = Some(pos);
                }
                last[t] = Some(last[t].map_or(pos, |l| l.max(pos)));
            }
            for &t in &reads {
                if storage[t].is_none() {
                    return unsupported(format!(
                        "{}: internal error: tile #{t} is read before it is computed (block op order)",
                        self.name
                    ));
                }
                if self.streamed[t].is_none() {
                    last[t] = Some(last[t].map_or(pos, |l| l.max(pos)));
                }
            }
        }
        (self.storage, self.mm_operand, self.def, self.last, self.carried, self.group_out_pos) =
            (storage, mm_operand, def, last, carried, group_out_pos);
        Ok(())
    }
}

/// Reorders the steps before the loop (those of loop-invariant tiles) so that copies and
/// compute overlap: the copies go out smallest tile first (one cp.async group each), and the
/// other steps run as soon as their operands can be there, those needing only early copies
/// first (a list schedule over the tile dependencies, ties in op order). The kernel waits for
/// each step's newest copy group only, so LoRA computes X A and (X A) B while W lands
/// (saved winners, nvcc harness, with the swizzled copies: 3.2-3.45 -> 2.65-3.1 us).
fn order_before_loop(
    steps: &mut [(Section, Step)],
    rw: &impl Fn(Section, Step) -> (Vec<STensorId>, Vec<STensorId>, bool),
    bytes: impl Fn(usize, usize) -> usize,
) {
    let n = steps.iter().position(|(s, _)| *s != Section::Pre).unwrap_or(steps.len());
    let region = &mut steps[..n];
    let (mut loads, rest): (Vec<_>, Vec<_>) =
        region.iter().copied().partition(|(_, st)| matches!(st, Step::Load { .. }));
    loads.sort_by_key(|&(_, st)| if let Step::Load { k, op } = st { bytes(k, op) } else { 0 });
    // The copy each tile waits on (its position among the loads), through computed tiles.
    let mut level: std::collections::HashMap<STensorId, usize> = std::collections::HashMap::new();
    for (i, &(sec, st)) in loads.iter().enumerate() {
        for t in rw(sec, st).0 {
            level.insert(t, i);
        }
    }
    let mut done: Vec<bool> = vec![false; rest.len()];
    let written: Vec<Vec<STensorId>> = rest.iter().map(|&(sec, st)| rw(sec, st).0).collect();
    let read: Vec<Vec<STensorId>> = rest.iter().map(|&(sec, st)| rw(sec, st).1).collect();
    let mut order: Vec<(Section, Step)> = loads;
    for _ in 0..rest.len() {
        // Ready: every tile it reads that an earlier unscheduled step writes is written.
        let ready = |i: usize, done: &[bool]| {
            (0..i).all(|j| done[j] || !written[j].iter().any(|t| read[i].contains(t) || written[i].contains(t)))
                && (0..i).all(|j| done[j] || !read[j].iter().any(|t| written[i].contains(t)))
        };
        let lvl = |i: usize| read[i].iter().filter_map(|t| level.get(t).copied()).max();
        let Some(i) = (0..rest.len()).filter(|&i| !done[i] && ready(i, &done)).min_by_key(|&i| (lvl(i), i)) else {
            break;
        };
        done[i] = true;
        if let Some(l) = lvl(i) {
            for &t in &written[i] {
                level.insert(t, l);
            }
        }
        order.push(rest[i]);
    }
    if order.len() == region.len() {
        region.copy_from_slice(&order);
    }
}
