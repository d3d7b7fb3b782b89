//! Shared memory of a block kernel: each tile's live range, the register accumulators'
//! finish scratch, first-fit placement of buffers by lifetime ([`place`]) and the pipeline
//! depth that fits the budget ([`Planner::memory`]).

use mirage_ugraph::block::MAX_PIPELINE_STAGES;
use mirage_ugraph::{Phase, STensorId};

use super::layout::{row_sum_slices, wg_acc_fits, Layout};
use super::plan::{combine_bytes, ws_barriers_bytes, ws_split_v, Planner, WS3_STAGES, WS_FACTOR_BYTES, WS_ILV_STAGES};
use super::schedule::accumulated_matmul;
use super::{Section, Step, SMEM_ALIGN, SWZ_ALIGN, WG_ALIGN};
use crate::emit::numel;
use crate::flash::FlashRegion;
use crate::program::Storage;

/// A shared-memory buffer: size, live interval over step positions, byte offset.
#[derive(Debug, Clone)]
pub(crate) struct Buffer {
    pub size: usize,
    pub start: usize,
    pub end: usize,
    pub offset: usize,
    /// Byte alignment of `offset`.
    pub align: usize,
}

/// First-fit placement of buffers by lifetime; returns the total bytes.
pub(super) fn place(buffers: &mut [Buffer]) -> usize {
    let mut idx: Vec<usize> = (0..buffers.len()).collect();
    idx.sort_by_key(|&b| (std::cmp::Reverse(buffers[b].size), buffers[b].start));
    let mut placed: Vec<usize> = Vec::new();
    let mut total = 0;
    for b in idx {
        let (s, e, size) = (buffers[b].start, buffers[b].end, buffers[b].size);
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&p| buffers[p].start <= e && s <= buffers[p].end)
            .map(|&p| (buffers[p].offset, buffers[p].offset + buffers[p].size))
            .collect();
        busy.sort_unstable();
        let align = buffers[b].align;
        let mut off = 0;
        for (lo, hi) in busy {
            if off + size <= lo {
                break;
            }
            off = off.max(hi.div_ceil(align) * align);
        }
        buffers[b].offset = off;
        total = total.max(off + size);
        placed.push(b);
    }
    total.div_ceil(SMEM_ALIGN) * SMEM_ALIGN
}

/// Floats of shared scratch that `mi::MmaAcc::finish` takes (its `SCRATCH`, by its `pick_ks`):
/// a float4 per lane, fragment and K slice when the warps split K, else none.
pub(super) fn mma_acc_scratch(nt: usize, batch: usize, m: usize, n: usize, k: usize) -> usize {
    let nw = nt / 32;
    let fr = batch * m.div_ceil(16) * (n / 8);
    let mut ks = 1;
    while nw.is_multiple_of(ks * 2) && ks * 2 <= k / 16 && fr.div_ceil(nw / (ks * 2)) <= 16 {
        ks *= 2;
    }
    if ks > 1 {
        ks * fr * 128
    } else {
        0
    }
}

/// The placed shared memory of a plan at its pipeline depth.
pub(super) struct Memory {
    /// Every buffer, placed.
    pub buffers: Vec<Buffer>,
    /// Each tile's buffer.
    pub buf_of: Vec<Option<usize>>,
    /// Bytes of the placed buffers.
    pub bytes: usize,
    /// The first of the finishes' scratch buffers (in `acc_scratch` order).
    pub first_scratch: usize,
    /// Pipeline stages of the loop's staged tiles.
    pub stages: usize,
    /// The cluster's remote partials have an area of their own (else after the combine scratch).
    pub own: bool,
    /// Bytes of the other blocks' partials of a cluster split.
    pub remote: usize,
    /// Floats of one block's slot in a summing cluster's receive area (`Step::ClusterMerge`).
    pub recv_slot: usize,
}

impl Planner<'_> {
    /// Live intervals. Staged tiles live through the whole loop (all their stages).
    pub(super) fn intervals(&mut self) {
        let loop_start = self.steps.iter().position(|(s, _)| *s == Section::Loop);
        let loop_end = self.steps.iter().rposition(|(s, _)| *s == Section::Loop);
        for t in 0..self.bg.tensors.len() {
            let (Some(d), Some(l)) = (self.def[t], self.last[t]) else { continue };
            let (mut s, mut e) = (d, l);
            if let (Some(ls), Some(le)) = (loop_start, loop_end) {
                if self.carried[t] || self.layout[t].is_some_and(|l| l.staged) {
                    s = s.min(ls);
                    e = e.max(le);
                } else if d < ls && l >= ls {
                    e = e.max(le);
                }
            }
            self.interval[t] = Some((s, e));
        }
    }

    /// Loop matmuls summed on the warpgroup tensor cores (`Knobs::wgmma_acc`), and their A and
    /// B tiles (1024-byte aligned, A in column blocks).
    pub(super) fn warpgroup_accs(&mut self) {
        let (bg, steps) = (self.bg, &self.steps);
        let n_ops = bg.ops.len();
        let loop_mm = |j: usize| steps.iter().any(|&(_, st)| matches!(st, Step::MatAcc { op, .. } if op == j));
        let mut wg_acc: Vec<bool> = (0..n_ops)
            .map(|j| self.knobs.wgmma_acc && loop_mm(j) && wg_acc_fits(bg, j, &self.layout, &self.storage))
            .collect();
        // Its A goes in column blocks, which `mi::MmaAcc` does not read: an A that another loop
        // matmul reads in the warp form keeps its rows.
        for j in 0..n_ops {
            let a = bg.ops[j].inputs.first().copied();
            if wg_acc[j] && (0..n_ops).any(|i| !wg_acc[i] && loop_mm(i) && bg.ops[i].inputs.first().copied() == a) {
                wg_acc[j] = false;
            }
        }
        self.wg_tiles =
            (0..n_ops).filter(|&j| wg_acc[j]).flat_map(|j| [bg.ops[j].inputs[0], bg.ops[j].inputs[1]]).collect();
        for j in (0..n_ops).filter(|&j| wg_acc[j]) {
            let a = bg.ops[j].inputs[0];
            if let Some(l) = self.layout[a] {
                self.layout[a] = Some(Layout { blocks: true, ..l });
            }
        }
        self.wg_acc = wg_acc;
    }

    /// Scratch of the register accumulators' finishes (live at their one step): (step, op, bytes).
    pub(super) fn finish_scratches(&mut self) {
        let (bg, nt) = (self.bg, self.nt);
        self.acc_scratch = self
            .steps
            .iter()
            .enumerate()
            .filter_map(|(pos, &(_, st))| {
                let (op, floats) = match st {
                    Step::MatAccEnd { acc } => {
                        let m = accumulated_matmul(bg, acc)?;
                        let (da, db) = (&bg.tensors[bg.ops[m].inputs[0]].dims, &bg.tensors[bg.ops[m].inputs[1]].dims);
                        let r = da.len();
                        if self.wg_acc[m] {
                            (acc, (nt / 128 - 1) * da[r - 2] * 64)
                        } else {
                            (acc, mma_acc_scratch(nt, numel(&da[..r - 2]), da[r - 2], db[r - 1], da[r - 1]))
                        }
                    }
                    Step::Finalize { op } => {
                        // Only what `Ctx::sum_acc` may keep in registers: a 16-bit loop tile's rows.
                        let x = &bg.tensors[bg.ops[op].inputs[0]];
                        if x.phase != Phase::Loop || x.dtype.size_bytes() != 2 {
                            return None;
                        }
                        let dx = &x.dims;
                        let len = dx[dx.len() - 1];
                        let rows = numel(&dx[..dx.len() - 1]);
                        let ks = row_sum_slices(nt, rows, len);
                        (op, if ks > 1 { ks * rows.div_ceil(16) * 16 } else { 0 })
                    }
                    _ => return None,
                };
                (floats > 0).then_some((pos, op, floats * 4))
            })
            .collect();
    }

    /// Buffers for a stage count, with in-place element-wise groups; first-fit placement. The
    /// accumulators' scratch buffers follow the tiles' (from the returned index, in
    /// `acc_scratch` order), the attention combine scratch comes last. `combine` is the
    /// region's combine scratch, `remote` the cluster's partials (an area of their own with
    /// `own`, else after the combine scratch), `recv_slot` a summing cluster's slot.
    fn place_buffers(
        &self,
        stages: usize,
        own: bool,
        combine: &dyn Fn(&FlashRegion) -> usize,
        remote: usize,
        recv_slot: usize,
    ) -> (Vec<Buffer>, Vec<Option<usize>>, usize, usize) {
        let (bg, steps, interval, storage, layout) =
            (self.bg, &self.steps, &self.interval, &self.storage, &self.layout);
        let n_t = bg.tensors.len();
        let flash_end = steps.iter().position(|(_, st)| *st == Step::FlashEnd);
        let mut buffers: Vec<Buffer> = Vec::new();
        let mut buf_of: Vec<Option<usize>> = vec![None; n_t];
        let mut order: Vec<STensorId> = (0..n_t).filter(|&t| interval[t].is_some()).collect();
        order.sort_by_key(|&t| interval[t].map(|(s, _)| s));
        for t in order {
            let Some((s, e)) = interval[t] else { continue };
            let es = storage[t].map_or(4, Storage::size_bytes);
            let size = match layout[t] {
                Some(l) => l.elems() * es * if l.staged { stages } else { 1 },
                None => numel(&bg.tensors[t].dims) * es,
            };
            let inplace = self.group_out_pos.iter().find(|(pos, _)| *pos == s).and_then(|&(pos, g)| {
                let grp = &self.groups[g];
                if grp.output != t {
                    return None;
                }
                grp.inputs.iter().copied().find(|&x| {
                    storage[x] == Some(Storage::F32)
                        && storage[t] == Some(Storage::F32)
                        && layout[x].is_none()
                        && bg.tensors[x].dims == bg.tensors[t].dims
                        && (!self.carried[x] || steps[pos].0 == Section::Post)
                        && interval[x].map(|(_, xe)| xe) == Some(pos)
                        && buf_of[x].is_some_and(|b| buffers[b].end == pos)
                })
            });
            match inplace.and_then(|x| buf_of[x]) {
                Some(b) => {
                    buffers[b].end = e;
                    buf_of[t] = Some(b);
                }
                None => {
                    let wg_tile =
                        self.fr.as_ref().is_some_and(|f| f.wg.is_some() && (t == f.k || t == f.v || t == f.q));
                    // Swizzled rows sit on whole 128-byte lines (their copies' and ldmatrix's
                    // bank pattern assumes it).
                    let align = if wg_tile || self.wg_tiles.contains(&t) {
                        WG_ALIGN
                    } else if layout[t].is_some_and(|l| l.swz.is_some()) {
                        SWZ_ALIGN
                    } else {
                        SMEM_ALIGN
                    };
                    buffers.push(Buffer { size, start: s, end: e, offset: 0, align });
                    buf_of[t] = Some(buffers.len() - 1);
                }
            }
        }
        // The finishes' scratch buffers live from the first finish to the last, so that they
        // take separate memory and one finish need not wait at a barrier for the one before.
        let first_scratch = buffers.len();
        let acc_scratch = &self.acc_scratch;
        let span =
            (acc_scratch.iter().map(|a| a.0).min().unwrap_or(0), acc_scratch.iter().map(|a| a.0).max().unwrap_or(0));
        for &(_, _, bytes) in acc_scratch {
            buffers.push(Buffer { size: bytes, start: span.0, end: span.1, offset: 0, align: SMEM_ALIGN });
        }
        if let (Some(f), Some(pos)) = (&self.fr, flash_end) {
            let bytes = combine(f) + if own { 0 } else { remote };
            if bytes > 0 {
                buffers.push(Buffer { size: bytes, start: pos, end: pos, offset: 0, align: SMEM_ALIGN });
            }
        }
        if own {
            buffers.push(Buffer { size: remote, start: 0, end: steps.len(), offset: 0, align: SMEM_ALIGN });
        }
        // A summing cluster's receive area lives through the whole kernel: the other blocks
        // push their sums into it whenever they finish, while this one may still be looping.
        if recv_slot > 0 {
            // (and the mbarrier of `Knobs::async_push` after the slots, 16 bytes)
            let size = (self.cluster - 1) * recv_slot * 4 + if self.knobs.async_push { 16 } else { 0 };
            buffers.push(Buffer { size, start: 0, end: steps.len(), offset: 0, align: SMEM_ALIGN });
        }
        let total = place(&mut buffers);
        (buffers, buf_of, total, first_scratch)
    }

    /// The shared memory at the deepest pipeline that fits: `ws3` and `ilv` are the
    /// warp-specialised forms the plan takes (`plan::ws_three`, `plan::ws_interleaved`), which set the
    /// most stages and the budget.
    pub(super) fn memory(&self, ws3: bool, ilv: bool) -> Memory {
        let (bg, nt, fr, cluster) = (self.bg, self.nt, &self.fr, self.cluster);
        let combine = |f: &FlashRegion| combine_bytes(f, nt, ws3);
        // A cluster split's partials for the first block: an area of its own for the whole kernel
        // (`own`), or after the combine scratch, over the loop's tiles, where an area of its own
        // would cost the loop a pipeline stage.
        let remote = fr.as_ref().map_or(0, |f| f.remote_bytes(cluster));
        // Floats of one block's slot in a summing cluster's receive area (`Step::ClusterMerge`).
        let recv_slot: usize =
            self.merged_by_step.iter().map(|&t| numel(&bg.tensors[t].dims).next_multiple_of(4)).sum();
        // Pipeline depth (the rule of `BlockGraph::pipeline_stages`, on the placed sizes): up to
        // MAX_PIPELINE_STAGES stages of the loop's input tiles, within the budget.
        let any_staged = self.layout.iter().any(|l| l.is_some_and(|l| l.staged));
        // The interleaved warp-specialised form takes more stages (three a warpgroup), within the
        // whole shared memory less its mbarriers and V-row factors.
        let most = if ws3 {
            WS3_STAGES
        } else if ilv {
            WS_ILV_STAGES
        } else {
            MAX_PIPELINE_STAGES
        };
        let stages = if any_staged { most.min(bg.forloop_range).max(1) } else { 1 };
        // A warpgroup attention normalising its V stages takes up to the whole shared memory: with
        // three stages or more each iteration normalises the next stage beside its own matmuls
        // (`Step::Flash`) instead of its own stage before them.
        let target = &self.knobs.target;
        let budget = match fr {
            Some(f) if ilv => {
                target.smem_per_block_optin.saturating_sub(ws_barriers_bytes(most, ws_split_v(f)) + WS_FACTOR_BYTES)
            }
            Some(f) if f.v_norm && f.wg.is_some() => target.smem_per_block_optin,
            _ => bg.pipeline_budget(target),
        };
        let depth = |own: bool| {
            let mut st = stages;
            while st > 1 && self.place_buffers(st, own, &combine, remote, recv_slot).2 > budget {
                st -= 1;
            }
            st
        };
        let shared = depth(false);
        let own = remote > 0 && depth(true) == shared;
        let (buffers, buf_of, bytes, first_scratch) = self.place_buffers(shared, own, &combine, remote, recv_slot);
        Memory { buffers, buf_of, bytes, first_scratch, stages: shared, own, remote, recv_slot }
    }
}
