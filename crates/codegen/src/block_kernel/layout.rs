//! How tiles sit in shared memory ([`Layout`]: row pitch, padding, swizzle, column blocks,
//! staging) and the rules that choose it: [`Planner::layouts`] for input tiles, computed
//! 16-bit matmul operands and the attention region's operands.

use mirage_ugraph::{Accum, BlockGraph, BlockOpKind, Phase, STensorId};

use super::load::column_walk;
use super::plan::{Planner, RowSums};
use super::{Section, Step};
use crate::emit::numel;
use crate::program::Storage;

/// How an input tile sits in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Elements per row (the tile's last dim).
    pub inner: usize,
    /// Row pitch in elements (`inner`, or `inner` plus 16 or 32 bytes of padding).
    pub ld: usize,
    /// Elements per 16-byte chunk when the rows are unpadded and their chunks XOR-swizzled by
    /// the row (`mi::swz`): rows of 2 or 4 chunks read only as a tensor-core B operand, rows of
    /// a multiple of 8 chunks read only as register-accumulated matmul operands or row sums
    /// (the 128-byte pattern in each 128-byte segment), or the attention's wgmma operands.
    pub swz: Option<usize>,
    /// With `swz`: rows wider than 8 chunks stored as column blocks of 8 chunks (`mi::swzb`,
    /// the wgmma attention's K).
    pub blocks: bool,
    /// Rows (product of the other dims).
    pub rows: usize,
    /// Whether 16-byte vector copies apply (checked again at run time for the pointer).
    pub vector: bool,
    /// Whether the loop prefetches it in `stages` buffers (a per-iteration tile).
    pub staged: bool,
    /// Stored transposed: the tile's `inner` columns as rows of `ld` elements (`mi::tidx`), a
    /// [K, N] matmul B operand whose device dim of stride 1 is K (a weight as `nn.Linear`
    /// keeps it), copied down its columns with `cp.async` and read as is by `mi::matmul_tile`
    /// and `mi::MmaAcc`.
    pub trans: bool,
}

impl Layout {
    /// Shared-memory index of tile element `i` (row-major), in Rust.
    pub(super) fn offset(&self, i: usize) -> usize {
        let (row, col) = (i / self.inner, i % self.inner);
        if self.trans {
            return col * self.ld + row;
        }
        match self.swz {
            Some(ce) if self.blocks && self.inner > 8 * ce => {
                let (blk, c) = (8 * ce, col % (8 * ce));
                (col / blk) * self.rows * blk + row * blk + ((c / ce) ^ (row % 8)) * ce + c % ce
            }
            Some(ce) => {
                let xw = (self.inner / ce).min(8);
                row * self.inner + ((col / ce) ^ ((row / (8 / xw)) % xw)) * ce + col % ce
            }
            None => row * self.ld + col,
        }
    }

    /// Elements of shared memory the tile takes (one stage of a staged tile).
    pub(super) fn elems(&self) -> usize {
        if self.trans {
            self.inner * self.ld
        } else {
            self.rows * self.ld
        }
    }

    /// Shared-memory index of tile element `idx` (a C++ expression).
    pub(super) fn index(&self, idx: &str) -> String {
        if self.trans {
            return format!("mi::tidx<{}, {}>({idx})", self.inner, self.ld);
        }
        match self.swz {
            Some(ce) if self.blocks && self.inner > 8 * ce => format!("mi::swzb<{}, {}>({idx})", self.inner, self.rows),
            Some(ce) => format!("mi::swz<{}, {ce}>({idx})", self.inner),
            None if self.ld != self.inner => format!("mi::pidx<{}, {}>({idx})", self.inner, self.ld),
            None => idx.to_string(),
        }
    }
}

/// Whether loop matmul `op` fits `mi::MmaAccWG` (the transposed warpgroup form): the shape
/// `BlockGraph::warpgroup_matmul` takes, with A staged in 16-bit storage unpadded with the
/// 128-byte swizzle (its rows then go in column blocks of 64) and B stored likewise (no
/// blocks).
pub(super) fn wg_acc_fits(bg: &BlockGraph, op: usize, layout: &[Option<Layout>], storage: &[Option<Storage>]) -> bool {
    if !bg.warpgroup_matmul(op) {
        return false;
    }
    let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
    let k = *bg.tensors[a].dims.last().unwrap_or(&0);
    let half = |t: STensorId| storage[t].is_some_and(|st| st != Storage::F32);
    half(a)
        && half(b)
        && layout[a].is_some_and(|l| l.staged && l.vector && l.swz == Some(8) && l.inner == k && l.ld == l.inner)
        && layout[b].is_some_and(|l| l.swz == Some(8) && !l.blocks && l.ld == 64)
}

/// Whether tile matmul `op` can read its operand `t` (a 16-bit tile of rows of 2, 4 or a
/// multiple of 8 chunks) unpadded and swizzled (`mi::matmul_tile`'s SWA / SWB): as A, k-steps
/// of whole 16 columns read by ldmatrix or words, and in a loop only 16-row groups (a loop's
/// word-at-a-time reads paid more in index arithmetic than the copies gained); as B, whole
/// 16-row k-steps and 8-column fragments read by ldmatrix.
pub(super) fn swizzled_mm_operand(bg: &BlockGraph, op: usize, t: STensorId, in_loop: bool) -> bool {
    let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
    let (da, db) = (&bg.tensors[a].dims, &bg.tensors[b].dims);
    let (r, rb) = (da.len(), db.len());
    if r < 2 || rb < 2 {
        return false;
    }
    let (m, k, n) = (da[r - 2], da[r - 1], db[rb - 1]);
    let a_ok = k.is_multiple_of(16) && (!in_loop || m.is_multiple_of(16));
    let b_ok = k.is_multiple_of(16) && n.is_multiple_of(8);
    (a != t || a_ok) && (b != t || b_ok) && (a == t || b == t)
}

/// Rows and row length of the loop tile that accumulator op `op` sums when `mi::RowSumAcc`
/// can keep its sums in registers (the shape rule; the tile's storage is the caller's): a
/// mean or rms accumulator of a loop tile, 16-column steps, at most four row groups per warp.
pub(super) fn row_sum_acc_shape(bg: &BlockGraph, nt: usize, op: usize) -> Option<(usize, usize)> {
    let BlockOpKind::ForloopAccum { acc: Accum::Rms | Accum::Mean, .. } = bg.ops[op].kind else { return None };
    let x = &bg.tensors[bg.ops[op].inputs[0]];
    let len = *x.dims.last()?;
    let rows = numel(&x.dims[..x.dims.len() - 1]);
    let mt = rows.div_ceil(16);
    let fits = x.phase == Phase::Loop && len.is_multiple_of(16) && mt.div_ceil(mt.min(nt / 32)) <= 4;
    fits.then_some((rows, len))
}

/// Row pitch and storage of a tile (its `layout`, `storage`, whether `streamed`, its `dims`)
/// whose rows a thread can read 16 bytes at a time, in order: a 16-bit tile in shared memory,
/// rows unswizzled, whole and 16-byte aligned.
pub(super) fn vec_rows(
    layout: Option<Layout>,
    storage: Option<Storage>,
    streamed: Option<usize>,
    dims: &[usize],
) -> Option<(usize, Storage)> {
    let l = layout?;
    let st = storage?;
    let ok = streamed.is_none()
        && st != Storage::F32
        && l.swz.is_none()
        && l.inner == *dims.last()?
        && l.inner % 8 == 0
        && l.ld % 8 == 0;
    ok.then_some((l.ld, st))
}

/// K slices of `mi::RowSumAcc` over `rows` rows of `len` (its `KS`).
pub(super) fn row_sum_slices(nt: usize, rows: usize, len: usize) -> usize {
    let nw = nt / 32;
    let g = rows.div_ceil(16).min(nw);
    (nw / g).min(len / 16).max(1)
}

impl Planner<'_> {
    /// Whether tile `t` has readers and `each` holds for every one (its section and step).
    fn readers_all(&self, t: STensorId, each: &dyn Fn(Section, Step) -> bool) -> bool {
        let mut readers = self.steps.iter().filter(|&&(sec, st)| self.rw(sec, st).1.contains(&t)).peekable();
        readers.peek().is_some() && readers.all(|&(sec, st)| each(sec, st))
    }

    /// Whether tile `t` is read only as the B operand of register-accumulated loop matmuls.
    fn only_mma_b(&self, t: STensorId) -> bool {
        let bg = self.bg;
        self.readers_all(
            t,
            &|_, st| matches!(st, Step::MatAcc { op, .. } if bg.ops[op].inputs[1] == t && bg.ops[op].inputs[0] != t),
        )
    }

    /// Whether tile `t` is read only as the B operand of tile matmuls (`mi::matmul_tile`) and
    /// register-accumulated loop matmuls (`mi::MmaAcc`).
    fn only_mm_b(&self, t: STensorId) -> bool {
        let bg = self.bg;
        self.readers_all(t, &|_, st| match st {
            Step::Matmul { op, .. } | Step::MatAcc { op, .. } => bg.ops[op].inputs[1] == t && bg.ops[op].inputs[0] != t,
            _ => false,
        })
    }

    /// Whether tile `t` is read only by tile matmuls that can take it swizzled.
    fn only_swizzled_mm(&self, t: STensorId) -> bool {
        let bg = self.bg;
        self.readers_all(
            t,
            &|sec, st| matches!(st, Step::Matmul { op, .. } if swizzled_mm_operand(bg, op, t, sec == Section::Loop)),
        )
    }

    /// Whether every reader of tile `t` reads it through `mi::swz` with rows of a multiple of 8
    /// chunks, whole 16-row groups by ldmatrix: as one operand of a register-accumulated loop
    /// matmul or as the rows of a register row-sum accumulator (`Ctx::sum_acc`), or as an
    /// operand of a tile matmul (`swizzled_mm_operand`). (Fewer rows in a loop are read a word
    /// at a time, where the swizzle's index arithmetic cost more than the aligned copies
    /// gained: RMSNorm+Linear b=1, 2 rows, 14.6 -> 16.6 us.)
    fn only_swizzle_readers(&self, t: STensorId) -> bool {
        let (bg, nt) = (self.bg, self.nt);
        self.readers_all(t, &|sec, st| match st {
            Step::MatAcc { op, .. } => {
                let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
                let da = &bg.tensors[a].dims;
                (a == t) != (b == t) && (b == t || da[da.len() - 2].is_multiple_of(16))
            }
            Step::Accum { op } => {
                bg.ops[op].inputs[0] == t
                    && row_sum_acc_shape(bg, nt, op).is_some_and(|(rows, _)| rows.is_multiple_of(16))
            }
            Step::Matmul { op, .. } => swizzled_mm_operand(bg, op, t, sec == Section::Loop),
            _ => false,
        })
    }

    /// The layouts of every tile in shared memory; false when the attention region's operands
    /// do not suit its form ([`Self::attention_layouts`]).
    pub(super) fn layouts(&mut self) -> bool {
        self.input_layouts();
        self.padded_operands();
        self.attention_layouts()
    }

    /// Input tiles materialised in shared memory: their row pitch (padded against bank
    /// conflicts when the rows are whole 16-byte chunks) and whether the loop stages them.
    fn input_layouts(&mut self) {
        let bg = self.bg;
        for &(sec, step) in &self.steps {
            if let Step::Load { k, op } = step {
                let t = bg.ops[op].outputs[0];
                let tile = &bg.tensors[t].dims;
                let dev = &self.ins[k];
                let es = dev.storage.size_bytes();
                let r = tile.len();
                let inner = tile[r - 1];
                let rows = numel(tile) / inner;
                let vector = dev.strides[r - 1] == 1
                    && (inner * es).is_multiple_of(16)
                    && (0..r - 1).all(|d| dev.dims[d] == 1 || (dev.strides[d] * es).is_multiple_of(16));
                // Rows of 2 or 4 chunks: no padding keeps both a quarter warp's copies (spanning
                // rows) and ldmatrix's 8 rows of one chunk free of bank conflicts; a swizzle does.
                let chunks = inner * es / 16;
                // Rows of whole 128-byte lines (or of 2 or 4 chunks): a swizzle where the readers
                // take it, since padded rows make every cp.async write straddle 32-byte sectors
                // (2-5x slower from L2).
                let swz = (vector
                    && es == 2
                    && rows > 1
                    && (((chunks == 2 || chunks == 4) && (self.only_mma_b(t) || self.only_swizzled_mm(t)))
                        || (chunks.is_multiple_of(8) && self.only_swizzle_readers(t))))
                .then_some(16 / es);
                let ld = if swz.is_none() && vector && rows > 1 && chunks.is_multiple_of(2) {
                    inner + 16 / es
                } else {
                    inner
                };
                // A [K, N] B operand whose device dim of stride 1 is K, read only by matmuls
                // on mma.sync: stored transposed, each column a row of K elements padded by 16
                // bytes (ldmatrix's 8 rows of a chunk then meet no bank conflict), so that
                // 16-byte `cp.async` copies run down its columns.
                let walk = (es == 2).then(|| column_walk(tile, &dev.strides, 8)).flatten();
                if let Some((k_rows, _, _)) =
                    walk.filter(|&(k_rows, _, _)| r >= 2 && tile[r - 2] == k_rows && self.only_mm_b(t))
                {
                    self.layout[t] = Some(Layout {
                        inner,
                        ld: k_rows + 8,
                        swz: None,
                        blocks: false,
                        rows,
                        vector: false,
                        staged: sec == Section::Loop,
                        trans: true,
                    });
                    continue;
                }
                self.layout[t] = Some(Layout {
                    inner,
                    ld,
                    swz,
                    blocks: false,
                    rows,
                    vector,
                    staged: sec == Section::Loop,
                    trans: false,
                });
            }
        }
    }

    /// Computed 16-bit matmul operands get the same row padding (written through it).
    fn padded_operands(&mut self) {
        let bg = self.bg;
        for t in 0..bg.tensors.len() {
            let (Some(st), None) = (self.storage[t], self.layout[t]) else { continue };
            let tile = &bg.tensors[t].dims;
            let inner = tile[tile.len() - 1];
            let rows = numel(tile) / inner;
            if st != Storage::F32
                && self.streamed[t].is_none()
                && self.mm_operand[t]
                && rows > 1
                && (inner * 2).is_multiple_of(32)
            {
                self.layout[t] = Some(Layout {
                    inner,
                    ld: inner + 8,
                    swz: None,
                    blocks: false,
                    rows,
                    vector: false,
                    staged: false,
                    trans: false,
                });
            }
        }
    }

    /// The attention region reads Q, K and V with ldmatrix: one 16-bit type, rows 16-byte
    /// aligned; false where its tiles do not allow it (the caller tries the next form).
    fn attention_layouts(&mut self) -> bool {
        let bg = self.bg;
        let Some(f) = self.fr.clone() else { return true };
        // The tiles each step reads (the layouts do not change them).
        let reads: Vec<Vec<STensorId>> = self.steps.iter().map(|&(sec, st)| self.rw(sec, st).1).collect();
        let (storage, streamed) = (&self.storage, &self.streamed);
        let st = storage[f.k];
        let layout = &mut self.layout;
        let fits = |layout: &[Option<Layout>], t: STensorId| {
            streamed[t].is_none()
                && layout[t].map_or(bg.tensors[t].dims.last().is_some_and(|&d| d % 8 == 0), |l| l.ld % 8 == 0)
        };
        // Q may also be fp32 (a previous kernel's output): its fragments are converted once.
        let q_ok = storage[f.q] == st || (storage[f.q] == Some(Storage::F32) && streamed[f.q].is_none());
        if !matches!(st, Some(Storage::F16 | Storage::BF16))
            || storage[f.v] != st
            || !q_ok
            || ![f.k, f.v].iter().all(|&t| fits(layout, t))
            || (storage[f.q] == st && !fits(layout, f.q))
        {
            return false;
        }
        // A normalised V is rewritten in place by ldmatrix / stmatrix fragments
        // (`mi::rms_norm_rows_frag`): 16-row groups of 16 columns, padded rows or rows swizzled
        // by 16-byte chunks (`mi::tile_at`).
        if f.v_norm
            && !layout[f.v].is_some_and(|l| {
                l.rows % 16 == 0
                    && l.inner % 16 == 0
                    && l.ld % 8 == 0
                    && !l.blocks
                    && l.swz.is_none_or(|c| c == 8 && l.ld == l.inner)
            })
        {
            return false;
        }
        let steps = &self.steps;
        if f.wg.is_some() {
            // (A V normalised in place, `mi::rms_norm_rows_frag`, takes no column blocks.)
            if f.v_norm && f.dv > 64 {
                return false;
            }
            // The wgmma form reads K and V through descriptors: staged, unpadded 128-byte rows
            // swizzled as the hardware's 128-byte pattern (`swz<64, 8>`, 1024-byte aligned).
            // K wider than 64 keys and V wider than 64 values go in column blocks of 64
            // (`swzb`). Only the region reads them.
            let only_flash =
                |t: STensorId| steps.iter().zip(&reads).all(|(&(_, st), r)| st == Step::Flash || !r.contains(&t));
            for (t, inner) in [(f.k, f.n), (f.v, f.dv)] {
                match layout[t] {
                    Some(l) if l.staged && l.vector && l.inner == inner && only_flash(t) => {
                        layout[t] = Some(Layout { ld: inner, swz: Some(8), blocks: inner > 64, ..l });
                    }
                    _ => return false,
                }
            }
            // A loaded Q of K's type in rows of 64 read only by the region goes in the same
            // pattern: S = Q K then takes both operands through descriptors, which leaves no
            // register operand for the next S to define while the previous P V runs (see
            // `mi::FlashWG::step`).
            // So does a Q row-normalised before the loop (QK-norm's Q), written through the
            // swizzle; the loop's first proxy fence covers those writes.
            let q_normed = steps.iter().any(
                |&(sec, st)| matches!(st, Step::RmsNorm { op } if sec == Section::Pre && bg.ops[op].outputs[0] == f.q),
            );
            // A loaded Q of 128 or 256 (not normalised) goes in column blocks of 64 (`swzb`).
            if let Some(l) = layout[f.q] {
                let wide = matches!(l.inner, 128 | 256) && f.d == l.inner && l.vector && !q_normed;
                if storage[f.q] == st
                    && (l.vector || q_normed)
                    && (l.inner == 64 && f.d == 64 || wide)
                    && only_flash(f.q)
                {
                    layout[f.q] = Some(Layout { ld: l.inner, swz: Some(8), blocks: wide, ..l });
                }
            }
        } else {
            // The mma.sync form reads K and V with ldmatrix through a pitch: rows of whole
            // 128-byte lines are padded by 32 bytes, not 16, so that every copied sector lands
            // on a 32-byte boundary.
            for t in [f.k, f.v] {
                if let Some(l) = layout[t] {
                    if l.staged && l.vector && l.swz.is_none() && l.inner % 64 == 0 && l.ld == l.inner + 8 {
                        layout[t] = Some(Layout { ld: l.inner + 16, ..l });
                    }
                }
            }
        }
        true
    }
}

impl Planner<'_> {
    /// Where loop accumulator `op`'s row sums (of squares, for rms) stay in registers on the
    /// tensor cores (`mi::RowSumAcc`): a mean or rms accumulator (finalised after the loop) of
    /// a 16-bit shared tile whose rows are 16-multiples of whole 16-byte vectors, at most four
    /// row groups per warp; read row-major ([`vec_rows`]) or unpadded rows swizzled as
    /// `swz<len, 8>`.
    pub(super) fn row_sums(&self, op: usize) -> Option<RowSums> {
        let aop = &self.bg.ops[op];
        let BlockOpKind::ForloopAccum { acc, .. } = aop.kind else { return None };
        let x = aop.inputs[0];
        let (rows, len) = row_sum_acc_shape(self.bg, self.nt, op)?;
        let dims = &self.bg.tensors[x].dims;
        let (ld, storage, swizzled, blocks) = match (
            vec_rows(self.layout[x], self.storage[x], self.streamed[x], dims),
            self.layout[x],
            self.storage[x],
        ) {
            (Some((ld, st)), ..) => (ld, st, false, false),
            (None, Some(l), Some(st)) if l.swz == Some(8) && l.inner == len && st != Storage::F32 => {
                (len, st, true, l.blocks && l.inner > 64)
            }
            _ => return None,
        };
        Some(RowSums { rows, len, ld, storage, swizzled, blocks, rms: acc == Accum::Rms })
    }
}
