//! [`Ctx`]: a block graph with its [`KernelPlan`], as emission reads it: tile names, element
//! reads and conversions, template arguments of the runtime's accumulators, barriers.

use std::cell::Cell;
use std::ops::Deref;

use mirage_ugraph::{BlockGraph, BlockOpKind, STensorId};

use super::layout::vec_rows;
use super::load::{rows_of, tile_base};
use super::plan::{KernelPlan, RowSums, VariantHooks, WS3_THREADS};
use super::Step;
use crate::emit::{dev_offset, numel, wl};
use crate::program::{DevBuffer, Storage};
use crate::runtime::{Part, Parts};

/// Emission's view of one block kernel: the graph, its device tensors and its plan (whose
/// fields it reads as its own).
pub(super) struct Ctx<'a> {
    pub bg: &'a BlockGraph,
    pub ins: &'a [DevBuffer],
    pub outs: &'a [DevBuffer],
    pub plan: KernelPlan,
    /// The runtime header parts the code emitted so far uses.
    pub parts: Cell<Parts>,
}

impl Deref for Ctx<'_> {
    type Target = KernelPlan;
    fn deref(&self) -> &KernelPlan {
        &self.plan
    }
}

impl Ctx<'_> {
    /// Notes that the kernel's code uses runtime header part `p`.
    pub(super) fn uses(&self, p: Part) {
        self.parts.set(self.parts.get().with(p));
    }

    /// Elements of one pipeline stage of tile `t` (0 for a tile without a layout).
    pub(super) fn stage_elems(&self, t: STensorId) -> usize {
        self.layout[t].map_or(0, |l| l.elems())
    }

    /// Whether the wgmma attention step reads the next iteration's K a step ahead: with three
    /// stages or more, where the loop can wait for that stage too.
    pub(super) fn wg_lookahead(&self) -> bool {
        self.attention.is_some_and(|a| a.lookahead)
    }

    /// Whether the warp-specialised loop runs on three consumer warpgroups (`plan::ws_three`).
    pub(super) fn ws3(&self) -> bool {
        self.attention.is_some_and(|a| a.consumer_warpgroups == 3)
    }

    /// Elements of the output tile each warp of warpgroup 0 reads back after the attention's
    /// finish (`KernelPlan::own_rows`).
    pub(super) fn own_rows(&self) -> Option<usize> {
        self.plan.own_rows
    }

    /// Whether each block of the cluster pair finishes half the rows (`FlashWG::finish`'s
    /// HALVES; `Planner::finish_halves`).
    pub(super) fn halves(&self) -> bool {
        self.attention.is_some_and(|a| a.halves)
    }

    /// The variant struct the attention loop is instantiated with (`plan::VariantHooks`).
    pub(super) fn variant_hooks(&self) -> VariantHooks {
        self.attention.map_or(VariantHooks::Plain, |a| a.hooks)
    }

    /// Whether the region's two key slices (two warpgroups over the same 64 rows) take whole
    /// stages in turn in the warp-specialised form (`FlashWG`'s ILV).
    pub(super) fn ws_interleaved(&self) -> bool {
        self.attention.is_some_and(|a| a.interleaved)
    }

    /// Whether the warp-specialised form marks V full apart (`plan::ws_split_v`).
    pub(super) fn ws_split_v(&self) -> bool {
        self.attention.is_some_and(|a| a.split_v)
    }

    /// The rms norm whose output Q the warp-specialised softmax normalises (the
    /// `mi::QRowScales` hook; `Planner::q_norm_op`).
    pub(super) fn q_norm_in_softmax(&self) -> Option<usize> {
        self.q_norm_op
    }

    /// A barrier over the block's threads that run the kernel's steps (the consumers only in
    /// the warp-specialised form, whose producer has left by then: `NamedBarrier::Consumers`).
    pub(super) fn sync(&self) -> &'static str {
        if self.ws.is_some() {
            "mi::bar_sync_n<NT>();"
        } else {
            "__syncthreads();"
        }
    }

    /// Threads that run the attention loop: the block graph's, and a third warpgroup with
    /// `plan::ws_three`.
    pub(super) fn consumers(&self) -> usize {
        self.nt + if self.ws3() { WS3_THREADS } else { 0 }
    }

    /// [`Self::sync`], over the third attention warpgroup too where `wide` (`plan::ws_three`: from
    /// the loop to the slices' merge).
    pub(super) fn sync_wide(&self, wide: bool) -> &'static str {
        if wide {
            "mi::bar_sync_n<NC>();"
        } else {
            self.sync()
        }
    }

    pub(super) fn dims(&self, t: STensorId) -> &[usize] {
        &self.bg.tensors[t].dims
    }

    pub(super) fn tile(&self, t: STensorId) -> String {
        format!("t{t}")
    }

    /// Conversion of the fp32 expression `v` to tile `t`'s storage type.
    pub(super) fn conv(&self, t: STensorId, v: &str) -> String {
        match self.storage[t] {
            Some(Storage::F32) | None => v.to_string(),
            Some(st) => format!("mi::from_f32<{}>({v})", st.cty()),
        }
    }

    /// `to_f32` read of tile `t` at index expression `idx`.
    pub(super) fn read(&self, t: STensorId, idx: &str) -> String {
        if self.lazy && self.merged_by_step.contains(&t) {
            return self.merged_read(t, idx);
        }
        if let Some(k) = self.streamed[t] {
            let Some(at) = self.streamed_offset(t, &format!("({idx})")) else {
                return format!("t{t}[{idx}]");
            };
            let g = format!("in{k}[{at}]");
            return match self.ins[k].storage {
                Storage::F32 => g,
                _ => format!("mi::to_f32({g})"),
            };
        }
        match self.storage[t] {
            Some(Storage::F32) => self.at(t, idx),
            _ => format!("mi::to_f32({})", self.at(t, idx)),
        }
    }

    /// Row pitch and element type of tile `t` when it is a staged 16-bit tile whose rows can be
    /// read 16 bytes at a time, in order (`mi::row_sums_vec`; not swizzled: [`vec_rows`]).
    pub(super) fn vec_rows(&self, t: STensorId) -> Option<(usize, &'static str)> {
        vec_rows(self.layout[t], self.storage[t], self.streamed[t], self.dims(t)).map(|(ld, st)| (ld, st.cty()))
    }

    /// Element offset, inside its device tensor, of element `idx` of tile `t` read straight
    /// from device memory (not staged): the tile's base for this block and iteration plus
    /// the element's offset.
    pub(super) fn streamed_offset(&self, t: STensorId, idx: &str) -> Option<String> {
        let k = self.streamed[t]?;
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[self.input_ops[k]].kind else {
            return None;
        };
        let tile = self.dims(t);
        let strides = &self.ins[k].strides;
        let base = self.tile_base(imap, forloop_dim, tile, strides, Some("it"));
        Some(format!("{base} + {}", Self::tile_elem_offset(tile, strides, idx)))
    }

    /// For a tile `t` read straight from device memory (not staged) in 16-bit values whose
    /// rows are contiguous and start 16 bytes apart from an aligned base ([`rows_of`]): the
    /// input's index, a pointer expression to row `r` and the storage type.
    pub(super) fn device_rows(&self, t: STensorId) -> Option<(usize, String, &'static str)> {
        let k = self.streamed[t]?;
        let (tile, dev) = (self.dims(t), &self.ins[k]);
        if dev.storage == Storage::F32 || !rows_of(8, tile, &dev.strides) {
            return None;
        }
        let at = self.streamed_offset(t, &format!("((r) * {})", tile.last()?))?;
        Some((k, format!("in{k} + {at}"), dev.storage.cty()))
    }

    /// Template arguments `BATCH, M, N, K, LDA, LDB` of tile matmul `op` (row pitches through
    /// any padding), as `mi::matmul_tile` and `mi::MmaAcc` take them.
    pub(super) fn mm_shape(&self, op: usize) -> String {
        let (a, b) = (self.bg.ops[op].inputs[0], self.bg.ops[op].inputs[1]);
        let (da, db) = (self.dims(a), self.dims(b));
        let r = da.len();
        let (m, kk, n) = (da[r - 2], da[r - 1], db[r - 1]);
        let lda = self.layout[a].map_or(kk, |l| l.ld);
        let ldb = self.layout[b].map_or(n, |l| l.ld);
        format!("{}, {m}, {n}, {kk}, {lda}, {ldb}", numel(&da[..r - 2]))
    }

    /// The `mi::RowSumAcc` type of loop accumulator `op` where the plan keeps its row sums in
    /// registers (`KernelPlan::row_sums`).
    pub(super) fn sum_acc(&self, op: usize) -> Option<String> {
        let RowSums { rows, len, ld, storage, swizzled, blocks, rms } = self.row_sums[op]?;
        let sw = match (swizzled, blocks) {
            (false, _) => "",
            (true, false) => ", true",
            (true, true) => ", true, true",
        };
        self.uses(Part::Matmul);
        Some(format!("mi::RowSumAcc<NT, {rows}, {len}, {ld}, {}, {rms}{sw}>", storage.cty()))
    }

    /// The shared scratch (byte offset, bytes) of a register accumulator's finish at `step`.
    pub(super) fn finish_scratch(&self, step: Step) -> Option<(usize, usize)> {
        match step {
            Step::MatAccEnd { acc: op } | Step::Finalize { op } => self.acc_scratch[op],
            _ => None,
        }
    }

    /// The scratch pointer argument of the finish of accumulator type `ty` at `step`
    /// (`nullptr` when it needs none), after a compile-time check of its size into `s`.
    pub(super) fn scratch_arg(&self, step: Step, ty: &str, s: &mut String) -> String {
        let (ptr, bytes) = match self.finish_scratch(step) {
            Some((off, bytes)) => (format!("reinterpret_cast<float*>(mi_smem + {off})"), bytes),
            None => ("nullptr".to_string(), 0),
        };
        wl!(s, "static_assert({ty}::SCRATCH * 4 <= {bytes}, \"finish scratch\");");
        ptr
    }

    /// The `mi::MmaAcc` type of loop matmul `op` (operands: loaded 16-bit tiles).
    pub(super) fn mma_acc_type(&self, op: usize) -> String {
        let ty = self.storage[self.bg.ops[op].inputs[0]].map_or("mi::f16", Storage::cty);
        let sw = |t: STensorId| self.layout[t].is_some_and(|l| l.swz.is_some());
        let (swa, swb) = (sw(self.bg.ops[op].inputs[0]), sw(self.bg.ops[op].inputs[1]));
        let trb = self.layout[self.bg.ops[op].inputs[1]].is_some_and(|l| l.trans);
        let flags = match (swb, swa, trb) {
            (_, _, true) => format!(", {swb}, {swa}, true"),
            (_, true, false) => format!(", {swb}, true"),
            (true, false, false) => ", true".to_string(),
            (false, false, false) => String::new(),
        };
        let acc = if self.wg_acc[op] { "MmaAccWG" } else { "MmaAcc" };
        self.uses(if self.wg_acc[op] { Part::Wgmma } else { Part::Matmul });
        format!("mi::{acc}<NT, {}, {ty}{flags}>", self.mm_shape(op))
    }

    /// Shared-memory element `idx` (row-major over the tile's dims) of tile `t`, through its
    /// row padding or swizzle if it has one.
    pub(super) fn at(&self, t: STensorId, idx: &str) -> String {
        match self.layout[t] {
            Some(l) => format!("t{t}[{}]", l.index(idx)),
            None => format!("t{t}[{idx}]"),
        }
    }

    /// [`tile_base`] in this block graph.
    pub(super) fn tile_base(
        &self,
        map: [i64; 3],
        fdim: i64,
        tile: &[usize],
        strides: &[usize],
        iter: Option<&str>,
    ) -> String {
        tile_base(self.bg, map, fdim, tile, strides, iter)
    }

    /// Element offset inside a device tensor of tile element `idx` (tile dims, device strides).
    pub(super) fn tile_elem_offset(tile: &[usize], strides: &[usize], idx: &str) -> String {
        dev_offset(tile, idx, tile, strides)
    }
}
