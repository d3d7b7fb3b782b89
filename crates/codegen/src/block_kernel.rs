//! Block-graph kernels: one `__global__` per customized op, following the block-graph
//! semantics of `mirage_ugraph::block` exactly.
//!
//! The schedule has three sections: *pre* (input tiles with `forloop_dim = -1` and every
//! loop-invariant op, run once), the *loop* (per-iteration tiles, loop ops, accumulator
//! updates, per-iteration output savers) and *post* (accumulator finalisation, post-loop ops,
//! output savers). Every materialised tile lives in shared memory: input tiles in their
//! device storage type, computed tiles in fp32. Element-wise chains are fused into one pass
//! (`mirage_ugraph::fuse_elementwise`); a loop matmul whose only consumer is a plain or
//! rescaling accumulator writes into the accumulator directly. Buffers are placed by lifetime
//! (first fit), so tiles whose lifetimes do not overlap share memory; an element-wise group
//! may overwrite an fp32 operand whose last use it is.

use mirage_ugraph::block::{MAX_CLUSTER_SPLIT, MAX_PIPELINE_STAGES};
use mirage_ugraph::{
    fuse_elementwise, Accum, BinaryOp, BlockGraph, BlockOpKind, Budgets, FusedGroup, Phase, STensorId, Target,
    ThreadOp, UnaryOp,
};

use crate::emit::{
    bcast, binary_expr, coord, dev_offset, flit, kernel_open_with, kernel_params, numel, row_major, unary_expr, wl,
};
use crate::error::{unsupported, Result};
use crate::flash::{self, FlashRegion};
use crate::generate::WsWarpgroups;
use crate::program::{BufferRef, DevBuffer, Storage};

/// Alignment of every shared-memory buffer in bytes.
const SMEM_ALIGN: usize = 16;
/// Byte alignment of swizzled tiles: a 128-byte line.
const SWZ_ALIGN: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Pre,
    Loop,
    Post,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Load block input `k` (op `op`) into its tile.
    Load { k: usize, op: usize },
    /// A fused element-wise group.
    Group { g: usize },
    /// A tile matmul storing its result, or accumulating into accumulator op `acc`.
    Matmul { op: usize, acc: Option<usize> },
    /// Sum over a dim.
    Reduce { op: usize },
    /// Running max and its change.
    RedMax { op: usize },
    /// RMS normalisation over the last dim.
    RmsNorm { op: usize },
    /// Concatenation.
    Concat { op: usize },
    /// One accumulator update (in the loop).
    Accum { op: usize },
    /// Mean/rms finalisation of an accumulator (after the loop).
    Finalize { op: usize },
    /// Output saver `j` (op `op`).
    Save { j: usize, op: usize },
    /// After the loop, element-wise group `g` whose only reader is output saver `j` (op `op`):
    /// `w` (8 or 4) consecutive elements a thread computed in registers and stored together
    /// (16 or 8 bytes of a 16-bit output), with no tile and no barrier between the two.
    GroupSave { g: usize, j: usize, op: usize, w: usize },
    /// One iteration of the register-resident attention region (`flash.rs`).
    Flash,
    /// The region's accumulator tiles, written once after the loop.
    FlashEnd,
    /// In a summing cluster split (`BlockGraph::cluster_split`): the cluster's accumulator
    /// tiles (but those a `Finalize` merges) added into its first block's.
    ClusterMerge,
    /// One iteration of a loop matmul summed in registers (`mi::MmaAcc`) for accumulator `acc`.
    MatAcc { op: usize, acc: usize },
    /// That accumulator's tile, written once after the loop.
    MatAccEnd { acc: usize },
}

/// A shared-memory buffer: size, live interval over step positions, byte offset.
#[derive(Debug, Clone)]
struct Buffer {
    size: usize,
    start: usize,
    end: usize,
    offset: usize,
    /// Byte alignment of `offset`.
    align: usize,
}

/// Result of emitting one block kernel.
pub(crate) struct Emitted {
    /// The kernel's CUDA source.
    pub source: String,
    /// Dynamic shared memory in bytes.
    pub smem_bytes: usize,
    /// Blocks per thread-block cluster along each grid axis (all 1: no clusters). The kernel
    /// is launched with the block graph's grid times this.
    pub cluster: [usize; 3],
    /// Threads the kernel adds to the block graph's (a producer warpgroup: 128, and a third
    /// attention warpgroup with `ws_three`: 256; else 0).
    pub extra_threads: usize,
}

struct Ctx<'a> {
    bg: &'a BlockGraph,
    ins: &'a [DevBuffer],
    outs: &'a [DevBuffer],
    groups: Vec<FusedGroup>,
    nt: usize,
    /// The target's budgets (the warp-specialised form's register split).
    budgets: Budgets,
    /// Storage of each tile (None: not computed).
    storage: Vec<Option<Storage>>,
    /// For input tiles read straight from device memory: the block input position.
    streamed: Vec<Option<usize>>,
    /// For each block input position, its input op.
    input_ops: Vec<usize>,
    /// Shared-memory layout of input tiles loaded into shared memory.
    layout: Vec<Option<Layout>>,
    /// Pipeline stages of the loop's staged input tiles.
    stages: usize,
    /// The register-resident attention region and its combine scratch offset.
    flash: Option<(FlashRegion, Option<usize>)>,
    /// The offset of the area where the other blocks of its cluster leave their partials.
    flash_remote: Option<usize>,
    /// Blocks of a thread-block cluster that split the loop (1: none).
    cluster: usize,
    /// The accumulator tiles `Step::ClusterMerge` adds across the cluster.
    merged_by_step: Vec<STensorId>,
    /// The first block's receive area of that merge (`mi::cluster_push`): its byte offset and
    /// the floats of one block's slot.
    recv: Option<(usize, usize)>,
    /// The merge is lazy (`Knobs::lazy_merge`): the merged tiles' readers add the slots.
    lazy: bool,
    /// The merge's pushes complete on an mbarrier after the receive area (`Knobs::async_push`).
    async_push: bool,
    /// Copies of tiles read once carry the L2 policy evict_first (`Knobs::evict_first`).
    evict_first: bool,
    /// Per op: a loop matmul summed on the warpgroup tensor cores (`Knobs::wgmma_acc`).
    wg_acc: Vec<bool>,
    /// Per op: the shared scratch (byte offset, bytes) of the `finish` of its register
    /// accumulator (`mi::MmaAcc` of a loop matmul's accumulator, `mi::RowSumAcc`).
    acc_scratch: Vec<Option<(usize, usize)>>,
    /// Warp-specialised loop (`FlashWG::run_ws`): the byte offset of its stage mbarriers.
    ws: Option<usize>,
    /// The interleaved warp-specialised loop on three consumer warpgroups ([`ws_three`]).
    ws3: bool,
    /// Each block of the cluster pair finishes half the rows ([`Ctx::finish_halves`]).
    halves: bool,
}

/// How an input tile sits in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// Elements per row (the tile's last dim).
    inner: usize,
    /// Row pitch in elements (`inner`, or `inner` plus 16 or 32 bytes of padding).
    ld: usize,
    /// Elements per 16-byte chunk when the rows are unpadded and their chunks XOR-swizzled by
    /// the row (`mi::swz`): rows of 2 or 4 chunks read only as a tensor-core B operand, rows of
    /// a multiple of 8 chunks read only as register-accumulated matmul operands or row sums
    /// (the 128-byte pattern in each 128-byte segment), or the attention's wgmma operands.
    swz: Option<usize>,
    /// With `swz`: rows wider than 8 chunks stored as column blocks of 8 chunks (`mi::swzb`,
    /// the wgmma attention's K).
    blocks: bool,
    /// Rows (product of the other dims).
    rows: usize,
    /// Whether 16-byte vector copies apply (checked again at run time for the pointer).
    vector: bool,
    /// Whether the loop prefetches it in `stages` buffers (a per-iteration tile).
    staged: bool,
}

impl Layout {
    /// Shared-memory index of tile element `i` (row-major), in Rust.
    fn offset(&self, i: usize) -> usize {
        let (row, col) = (i / self.inner, i % self.inner);
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

    /// Shared-memory index of tile element `idx` (a C++ expression).
    fn index(&self, idx: &str) -> String {
        match self.swz {
            Some(ce) if self.blocks && self.inner > 8 * ce => format!("mi::swzb<{}, {}>({idx})", self.inner, self.rows),
            Some(ce) => format!("mi::swz<{}, {ce}>({idx})", self.inner),
            None if self.ld != self.inner => format!("mi::pidx<{}, {}>({idx})", self.inner, self.ld),
            None => idx.to_string(),
        }
    }
}

/// The emitter's choices that `Options` sets (from the environment where the Python package
/// generates).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Knobs {
    /// Consumer warpgroups of the interleaved warp-specialised attention loop ([`ws_three`]).
    pub wgs: WsWarpgroups,
    /// A summing cluster split's first block leaves its sums where they landed: every reader
    /// of a merged tile after the merge (element-wise groups and their output stores) adds the
    /// other blocks' slots of the receive area as it reads, and takes a mean's division or an
    /// rms's root there, instead of a gather pass, a division pass and their barriers
    /// (`Step::ClusterMerge`). The same sums in the same order.
    pub lazy_merge: bool,
    /// The other blocks of a summing cluster split send their tiles with `st.async`, each
    /// store completing its bytes on an mbarrier after the first block's receive area
    /// (`mi::cluster_push_async`), and the first block waits on that alone, instead of on the
    /// cluster barrier their release-arrivals complete.
    pub async_push: bool,
    /// Loop matmuls summed in registers take the warpgroup tensor cores (`mi::MmaAccWG`)
    /// where they fit ([`wg_acc_fits`]; sm_90 only): `BlockGraph::warpgroup_acc` or
    /// `Options::wgmma_acc`.
    pub wgmma_acc: bool,
    /// Copies of graph-input tiles that only one block reads, once ([`Ctx::read_once`]), carry
    /// the L2 policy evict_first (`Options::evict_first`).
    pub evict_first: bool,
    /// The GPU generated for (`Options::target`): shared memory, one-wave grids, register
    /// budgets.
    pub target: Target,
}

/// Emits the kernel `name` for block graph `bg` whose inputs and outputs are `ins` / `outs`.
/// `arch` (e.g. 90) picks the attention form: on sm_90 the warpgroup one where it fits.
pub(crate) fn emit(
    name: &str,
    bg: &BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    arch: u32,
    knobs: Knobs,
) -> Result<Emitted> {
    let wgs = knobs.wgs;
    if let Some(e) = crate::rowreg::emit(name, bg, ins, outs)? {
        return Ok(e);
    }
    if let Some(e) = crate::eltloop::emit(name, bg, ins, outs)? {
        return Ok(e);
    }
    // Three attention warpgroups take 64-key stages ([`ws_three`]): a loop of 128-key tiles
    // made twice as fine, where that takes the form; else the graph as it is.
    if arch == 90 && three_candidate(bg, wgs, &knobs.target) {
        if let Ok(fine) = bg.with_finer_loop(2) {
            let three = emit_any(name, &fine, ins, outs, arch, knobs).ok().flatten();
            if let Some(e) = three.filter(|e| e.extra_threads == WS3_THREADS + WS_PRODUCER_THREADS) {
                return Ok(e);
            }
        }
    }
    match emit_any(name, bg, ins, outs, arch, knobs)? {
        Some(e) => Ok(e),
        None => unsupported(format!("{name}: internal error: no schedule without flash")),
    }
}

/// [`emit`]'s schedules of `bg` other than the row-register and element-wise loop kernels.
fn emit_any(
    name: &str,
    bg: &BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    arch: u32,
    knobs: Knobs,
) -> Result<Option<Emitted>> {
    // A loop whose grid leaves SMs idle is split across the blocks of thread-block clusters
    // (`BlockGraph::cluster_split`) where its attention region takes the warpgroup form or
    // it only sums, in smaller clusters where the first block's gathered partials would not
    // fit its shared memory; otherwise it keeps its grid.
    if arch == 90 {
        let mut most = MAX_CLUSTER_SPLIT;
        while let Some((axis, cs, split)) = bg.cluster_split_within(most, &knobs.target) {
            for mode in [FlashMode::Wgmma, FlashMode::Off] {
                if let Some(mut e) = emit_with(name, &split, ins, outs, mode, cs, knobs)? {
                    if e.smem_bytes <= knobs.target.smem_per_block_optin {
                        e.cluster[axis] = cs;
                        return Ok(Some(e));
                    }
                }
            }
            most = cs - 1;
        }
    }
    let modes: &[FlashMode] = if arch == 90 {
        &[FlashMode::Wgmma, FlashMode::Mma, FlashMode::Off]
    } else {
        &[FlashMode::Mma, FlashMode::Off]
    };
    for &mode in modes {
        if let Some(e) = emit_with(name, bg, ins, outs, mode, 1, knobs)? {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// How the attention region, if any, is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlashMode {
    /// Not matched: the region's ops are emitted one by one.
    Off,
    /// `mi::Flash` (mma.sync).
    Mma,
    /// `mi::FlashWG` (wgmma, sm_90a).
    Wgmma,
}

/// Threads of the producer warpgroup a warp-specialised loop adds (`FlashWG::run_ws`).
const WS_PRODUCER_THREADS: usize = 128;
// The registers a thread of that producer keeps (`setmaxnreg`; it only copies) and each of
// the 256 consumer threads then takes are the target's `Budgets::ws_producer_regs` and
// `Budgets::ws_consumer_regs`.

/// Whether a block takes the warp-specialised form (`FlashWG::run_ws`: a producer warpgroup
/// filling the stages for two consumer warpgroups of 64 rows each, no block barrier in the
/// loop). A one-wave wgmma attention region of one row group a
/// warpgroup over 128 rows, or of two key slices over 64 rows (which then take alternate
/// stages: [`ws_interleaved`]), Q by descriptor, 128 keys an iteration (64 where `three`:
/// [`ws_three`]) and no running-max output, whose loop holds nothing but the region and its
/// staged K and V, and whose other steps are loads, norms, element-wise groups and saves
/// (they run on the consumers alone, with a consumer barrier for the block's). A cluster
/// split merges after the loop as without. A normalised V only in the interleaved form, where
/// the consumers scale P by the rows' factors (`run_ws`'s VN): in the 128-row form that
/// measured slower than the plain loop's in-place norm (QK-norm b=16 on the H100: 35.1
/// against 32.4-33.6 us).
fn ws_form(
    bg: &BlockGraph,
    nt: usize,
    f: &FlashRegion,
    layout: &[Option<Layout>],
    steps: &[(Section, Step)],
    three: bool,
) -> bool {
    let qss = layout[f.q].is_some_and(|l| l.swz.is_some());
    let v_ok = !f.v_norm
        || ws_interleaved(f) && layout[f.v].is_some_and(|l| l.rows == f.n && l.inner == 64 && l.swz == Some(8));
    (f.wg == Some((1, 1)) && f.m == 128 || ws_interleaved(f))
        && f.one_wave
        && nt == 256
        && bg.block_dim[1..].iter().all(|&d| d == 1)
        && f.batch == 1
        && f.d == 64
        && f.n == if three { 64 } else { 128 }
        && qss
        && f.x.is_none()
        && v_ok
        && steps.iter().all(|&(sec, st)| match st {
            Step::Load { op, .. } => {
                let staged = layout[bg.ops[op].outputs[0]].is_some_and(|l| l.staged);
                staged == (sec == Section::Loop)
            }
            Step::Flash => sec == Section::Loop,
            Step::FlashEnd | Step::Group { .. } | Step::GroupSave { .. } | Step::Save { .. } | Step::RmsNorm { .. } => {
                sec != Section::Loop
            }
            _ => false,
        })
}

/// Whether two warpgroups over the same 64 rows (two key slices) take whole stages in turn
/// in the warp-specialised form (`FlashWG`'s ILV): each then steps like a warpgroup of the
/// 128-row form, and `finish` merges them as slices. Each holds the stage whose P V is in
/// flight and the one it computes while the next is copied: [`WS_ILV_STAGES`] stages.
fn ws_interleaved(f: &FlashRegion) -> bool {
    f.wg == Some((1, 2)) && f.m == 64
}

/// Threads of the third consumer warpgroup of [`ws_three`].
const WS3_THREADS: usize = 128;
// The registers a consumer thread of [`ws_three`] takes are the target's
// `Budgets::ws3_consumer_regs`.

/// Whether the interleaved warp-specialised form runs on three consumer warpgroups that take
/// whole 64-key stages in turn (`wgs`: `Options::ws_warpgroups`; by default where V is
/// normalised): S, P and O then fit 160 registers a thread where two warpgroups of 128-key
/// steps take 240. A loop of 128-key tiles takes it made twice as fine
/// (`BlockGraph::with_finer_loop`, see [`emit`]), the producer copying [`WS3_STAGES`] 64-key
/// stages. The block graph's 256 threads run every step; a third warpgroup (threads 256 to
/// 383) joins for the loop and the slices' merge only. On the H100 (saved winners, the
/// bench's timing) QK-norm b=8 took 19.3-19.5 us against 19.8-20.2 with two warpgroups, GQA
/// b=8 16.2-16.4 against 15.4-15.6 (docs/tuning.md).
fn ws_three(f: &FlashRegion, wgs: WsWarpgroups) -> bool {
    asks_three(f, wgs) && ws_interleaved(f) && f.n == 64 && f.dv == 64
}

/// Whether `wgs` asks for [`ws_three`] in region `f`.
fn asks_three(f: &FlashRegion, wgs: WsWarpgroups) -> bool {
    match wgs {
        WsWarpgroups::Auto => f.v_norm,
        WsWarpgroups::Two => false,
        WsWarpgroups::Three => true,
    }
}

/// Whether `bg` made twice as fine may take [`ws_three`]: an attention region of 64 rows,
/// 128-key tiles and 64-wide values that `wgs` asks three warpgroups for ([`emit`] emits the
/// finer graph only then).
fn three_candidate(bg: &BlockGraph, wgs: WsWarpgroups, target: &Target) -> bool {
    let l = liveness(bg);
    flash::find(bg, &l.opneed, &l.uses, target)
        .is_some_and(|f| asks_three(&f, wgs) && f.m == 64 && f.n == 128 && f.dv == 64)
}

/// Which tensors and ops an output needs, and each tensor's using ops.
struct Liveness {
    tneed: Vec<bool>,
    opneed: Vec<bool>,
    uses: Vec<Vec<usize>>,
}

/// The [`Liveness`] of `bg`.
fn liveness(bg: &BlockGraph) -> Liveness {
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

/// Bytes of the attention's combine scratch: `FlashRegion::combine_bytes`, or three slices'
/// with [`ws_three`].
fn combine_bytes(f: &FlashRegion, nt: usize, ws3: bool) -> usize {
    if ws3 {
        f.combine_bytes_slices(3)
    } else {
        f.combine_bytes(nt)
    }
}

/// Pipeline stages of the interleaved warp-specialised form (three a warpgroup: 192 KB of
/// 128-key K and V stages at 16-bit). With four, a warpgroup released a stage and at once
/// waited for the copy into it (GQA b=8 on the H100: 20.5 us; 16.0-16.7 with six, 17.1 for the
/// two-stage plain loop).
const WS_ILV_STAGES: usize = 6;
/// Pipeline stages of [`ws_three`]: 160 KB of 64-key K and V stages at 16-bit.
const WS3_STAGES: usize = 10;

/// Bytes of mbarriers a stage of the warp-specialised form takes (full and empty: 8 each; with
/// V marked full apart ([`ws_split_v`]) 8 more).
const WS_BARRIER_BYTES: usize = 16;

/// Whether the warp-specialised form marks each stage's V full on an mbarrier of its own, after
/// K's (`FlashWG::run_ws`'s SPLITV): the interleaved form without a normalised V, whose S then
/// starts before V has landed. GQA on the H100 (saved winners, bench timing, four runs each):
/// b=8 16.7-17.4 -> 16.3-16.4 us, b=16 26.1-27.2 -> 25.3-25.7. Not the 128-row form (there
/// MQA b=16 went 41.3-42.5 -> 43.5) nor with VN (its factors read V at the step's start).
fn ws_split_v(f: &FlashRegion) -> bool {
    ws_interleaved(f) && !f.v_norm
}

/// Byte offset of the warp-specialised form's V-row factors from its first mbarrier: past
/// every stage's mbarriers, 16-byte aligned (read as 16-byte words); with no factors, the
/// mbarriers' bytes.
fn ws_barriers_bytes(stages: usize, split_v: bool) -> usize {
    ((WS_BARRIER_BYTES + if split_v { 8 } else { 0 }) * stages).next_multiple_of(16)
}

/// Bytes of the warp-specialised form's V-row factors with a normalised V (`FlashWG::run_ws`'s
/// `rs`: two slots of 128 16-bit factors for each of the two consumer warpgroups).
const WS_FACTOR_BYTES: usize = 2 * 2 * 128 * 2;

/// Alignment of the attention's K and V tiles under the wgmma form (the 128-byte swizzle
/// repeats every 1024 bytes and is taken from address bits).
const WG_ALIGN: usize = 1024;

/// [`emit`] with the attention region in form `mode`; `None` when the region was matched but
/// its tiles do not suit that form (then the caller tries the next one). With `cluster` > 1,
/// `bg` is a cluster split ([`BlockGraph::cluster_split`]): with `mode` Wgmma its attention
/// region must take the warpgroup form, with `mode` Off it must have no such region and only
/// summing accumulators of fp32 tiles; either way the blocks merge their accumulators into
/// the cluster's first block, which alone goes on after the loop.
fn emit_with(
    name: &str,
    bg: &BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    mode: FlashMode,
    cluster: usize,
    knobs: Knobs,
) -> Result<Option<Emitted>> {
    let wgs = knobs.wgs;
    let nt: usize = bg.block_dim.iter().product();
    let n_ops = bg.ops.len();
    let n_t = bg.tensors.len();
    let input_ops: Vec<usize> = (0..n_ops).filter(|&j| matches!(bg.ops[j].kind, BlockOpKind::Input { .. })).collect();
    let output_ops: Vec<usize> = (0..n_ops).filter(|&j| matches!(bg.ops[j].kind, BlockOpKind::Output { .. })).collect();
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
    let in_region = |j: usize| fr.as_ref().is_some_and(|f| f.ops.contains(&j));
    let region_last = fr.as_ref().and_then(|f| f.ops.iter().copied().max());
    let mut group_root: Vec<Option<usize>> = vec![None; n_ops];
    for (g, grp) in groups.iter().enumerate() {
        if let Some(&root) = grp.ops.last() {
            group_root[root] = Some(g);
        }
    }

    // Loop matmuls fused into their accumulator.
    let mut fused_into: Vec<Option<usize>> = vec![None; n_ops];
    let mut fused_from: Vec<Option<usize>> = vec![None; n_ops];
    for j in 0..n_ops {
        if !opneed[j] || !matches!(bg.ops[j].kind, BlockOpKind::Matmul) {
            continue;
        }
        let t = bg.ops[j].outputs[0];
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
    // Of those, plain sums of a 16-bit tensor-core matmul of two loaded tiles keep their sum in
    // registers across iterations (`mi::MmaAcc`).
    let loaded = |t: STensorId| {
        (0..n_ops)
            .find(|&j| bg.ops[j].outputs.first() == Some(&t))
            .and_then(|j| input_ops.iter().position(|&i| i == j).map(|k| ins[k].storage))
    };
    let reg_acc = |m: usize, c: usize| -> bool {
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
    };

    // Steps, by section, in op order.
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
                    Some(m) if reg_acc(m, j) => {
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
    // A summing cluster split merges the accumulators right after the loop, before anything
    // else reads them, in one step between two cluster barriers: the register ones' tiles
    // (after their `MatAccEnd`), every plain sum, and each mean or rms (after the `Finalize`
    // that writes its block's sums; the merge then divides). One barrier pair instead of one
    // per mean or rms: on the H200, RMSNorm+Linear's cluster winners b=1 12.1 -> 11.7 us, b=16
    // 13.4 -> 12.9, 6144 b=1 17.3 -> 16.9 (saved winners, three alternations).
    let summing = cluster > 1 && fr.is_none();
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
            .position(|&(s, st)| s == Section::Post && !matches!(st, Step::MatAccEnd { .. } | Step::Finalize { .. }))
            .unwrap_or(steps.len());
        steps.insert(at, (Section::Post, Step::ClusterMerge));
    }
    let merged_by_step: Vec<STensorId> = (0..n_ops)
        .filter(|&j| summing && opneed[j] && bg.ops[j].kind.is_accumulator())
        .map(|j| bg.ops[j].outputs[0])
        .collect();
    if fr.is_some() {
        let at = steps.iter().position(|(s, _)| *s == Section::Post).unwrap_or(steps.len());
        steps.insert(at, (Section::Post, Step::FlashEnd));
    }
    // A group right before the saver of its output, which nothing else reads, is computed in
    // the saver's loop (`Step::GroupSave`) where the output rows take 16-byte stores and every
    // thread gets eight elements or more. Saved winners: QKNorm b=8 30.4 -> 29.2 us, GQA and
    // MQA b=8 -1.5%; with fewer elements than eight per thread (gated MLP's 512 over 256
    // threads) the idle threads cost more than the tile pass saved (+2%). With four elements
    // a thread (RMSNorm+Linear b=16's 1024 over 256), four at a time and 8-byte stores.
    let mut p = 0;
    while p + 1 < steps.len() {
        if let ((Section::Post, Step::Group { g }), (Section::Post, Step::Save { j, op })) = (steps[p], steps[p + 1]) {
            let t = groups[g].output;
            let dims = &bg.tensors[t].dims;
            let readers = (0..n_ops).filter(|&k| opneed[k] && bg.ops[k].inputs.contains(&t)).count();
            let w = [8, 4].into_iter().find(|&w| {
                numel(dims).is_multiple_of(w) && numel(dims) >= w * nt && rows_of(w, dims, &outs[j].strides)
            });
            if let (true, 1, Some(w)) = (bg.ops[op].inputs[0] == t, readers, w) {
                steps[p] = (Section::Post, Step::GroupSave { g, j, op, w });
                steps.remove(p + 1);
            }
        }
        p += 1;
    }

    // A lazy cluster merge (`Knobs::lazy_merge`) where only element-wise groups (and their
    // output stores) read the merged tiles after it: the merge writes none of them.
    let lazy = knobs.lazy_merge
        && summing
        && steps.iter().position(|&(_, st)| matches!(st, Step::ClusterMerge)).is_some_and(|m| {
            steps[m + 1..].iter().all(|&(_, st)| match st {
                Step::Group { .. } | Step::GroupSave { .. } => true,
                Step::Save { op, .. } => !merged_by_step.contains(&bg.ops[op].inputs[0]),
                _ => false,
            })
        });
    // Reads and writes of a step: (written tiles, read tiles, whether the writes are carried
    // across iterations).
    let rw = |sec: Section, step: Step| -> (Vec<STensorId>, Vec<STensorId>, bool) {
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
                if tneed[o[1]] {
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
            Step::ClusterMerge => (if lazy { vec![] } else { merged_by_step.clone() }, merged_by_step.clone(), false),
        }
    };

    // Loop-invariant input tiles read by exactly one step that is not a matmul are streamed:
    // that step reads device memory directly and the tile takes no shared memory. (Tiles of
    // the loop go through the cp.async pipeline instead, which hides their latency.)
    let mut streamed: Vec<Option<usize>> = vec![None; n_t]; // block input position
    for &(sec, step) in &steps {
        if let (Section::Pre, Step::Load { k, op }) = (sec, step) {
            let t = bg.ops[op].outputs[0];
            let readers: Vec<Step> =
                steps.iter().filter(|&&(sec, st)| rw(sec, st).1.contains(&t)).map(|&(_, st)| st).collect();
            if readers.len() == 1 && !matches!(readers[0], Step::Matmul { .. } | Step::MatAcc { .. } | Step::Flash) {
                streamed[t] = Some(k);
            }
        }
    }
    steps.retain(|(_, st)| !matches!(*st, Step::Load { op, .. } if streamed[bg.ops[op].outputs[0]].is_some()));
    order_before_loop(&mut steps, &rw, |k, op| {
        numel(&bg.tensors[bg.ops[op].outputs[0]].dims) * ins[k].storage.size_bytes()
    });
    let loop_start = steps.iter().position(|(s, _)| *s == Section::Loop);
    let loop_end = steps.iter().rposition(|(s, _)| *s == Section::Loop);

    // Materialised tensors, their storage, defining and reading steps.
    let mut storage: Vec<Option<Storage>> = vec![None; n_t];
    for (t, k) in streamed.iter().enumerate() {
        if let Some(k) = k {
            storage[t] = Some(ins[*k].storage);
        }
    }
    let has_running_max = bg.ops.iter().any(|op| matches!(op.kind, BlockOpKind::ReductionMax { .. }));
    let unbounded_exp = |step: Step| match step {
        Step::Group { g } => {
            !has_running_max
                && groups[g].thread_graph.ops.iter().any(|o| matches!(o, ThreadOp::Unary { op: UnaryOp::Exp, .. }))
        }
        _ => false,
    };
    let mut mm_operand = vec![false; n_t];
    for (j, op) in bg.ops.iter().enumerate() {
        if opneed[j] && matches!(op.kind, BlockOpKind::Matmul) {
            for &t in &op.inputs {
                mm_operand[t] = true;
            }
        }
    }
    let mut def: Vec<Option<usize>> = vec![None; n_t];
    let mut last: Vec<Option<usize>> = vec![None; n_t];
    let mut carried = vec![false; n_t];
    let mut group_out_pos: Vec<(usize, usize)> = Vec::new(); // (step position, group)
    for (pos, &(sec, step)) in steps.iter().enumerate() {
        if let Step::Group { g } = step {
            group_out_pos.push((pos, g));
        }
        let (writes, reads, loop_carried) = rw(sec, step);
        for (wi, &t) in writes.iter().enumerate() {
            if storage[t].is_none() {
                storage[t] = Some(match step {
                    Step::Load { k, .. } => ins[k].storage,
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
                    "{name}: internal error: tile #{t} is read before it is computed (block op order)"
                ));
            }
            if streamed[t].is_none() {
                last[t] = Some(last[t].map_or(pos, |l| l.max(pos)));
            }
        }
    }

    // Whether tile `t` has readers and `each` holds for every one (its section and step).
    let readers_all = |t: STensorId, each: &dyn Fn(Section, Step) -> bool| {
        let mut readers = steps.iter().filter(|&&(sec, st)| rw(sec, st).1.contains(&t)).peekable();
        readers.peek().is_some() && readers.all(|&(sec, st)| each(sec, st))
    };
    // Whether tile `t` is read only as the B operand of register-accumulated loop matmuls.
    let only_mma_b = |t: STensorId| {
        readers_all(
            t,
            &|_, st| matches!(st, Step::MatAcc { op, .. } if bg.ops[op].inputs[1] == t && bg.ops[op].inputs[0] != t),
        )
    };
    // Whether tile `t` is read only by tile matmuls that can take it swizzled.
    let only_swizzled_mm = |t: STensorId| {
        readers_all(
            t,
            &|sec, st| matches!(st, Step::Matmul { op, .. } if swizzled_mm_operand(bg, op, t, sec == Section::Loop)),
        )
    };
    // Whether every reader of tile `t` reads it through `mi::swz` with rows of a multiple of 8
    // chunks, whole 16-row groups by ldmatrix: as one operand of a register-accumulated loop
    // matmul or as the rows of a register row-sum accumulator (`Ctx::sum_acc`), or as an
    // operand of a tile matmul (`swizzled_mm_operand`). (Fewer rows in a loop are read a word
    // at a time, where the swizzle's index arithmetic cost more than the aligned copies
    // gained: RMSNorm+Linear b=1, 2 rows, 14.6 -> 16.6 us.)
    let only_swizzle_readers = |t: STensorId| {
        readers_all(t, &|sec, st| match st {
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
    };
    // Input tiles materialised in shared memory: their row pitch (padded against bank
    // conflicts when the rows are whole 16-byte chunks) and whether the loop stages them.
    let mut layout: Vec<Option<Layout>> = vec![None; n_t];
    for &(sec, step) in &steps {
        if let Step::Load { k, op } = step {
            let t = bg.ops[op].outputs[0];
            let tile = &bg.tensors[t].dims;
            let dev = &ins[k];
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
                && (((chunks == 2 || chunks == 4) && (only_mma_b(t) || only_swizzled_mm(t)))
                    || (chunks.is_multiple_of(8) && only_swizzle_readers(t))))
            .then_some(16 / es);
            let ld =
                if swz.is_none() && vector && rows > 1 && chunks.is_multiple_of(2) { inner + 16 / es } else { inner };
            layout[t] = Some(Layout { inner, ld, swz, blocks: false, rows, vector, staged: sec == Section::Loop });
        }
    }

    // Computed 16-bit matmul operands get the same row padding (written through it).
    for t in 0..n_t {
        let (Some(st), None) = (storage[t], layout[t]) else { continue };
        let tile = &bg.tensors[t].dims;
        let inner = tile[tile.len() - 1];
        let rows = numel(tile) / inner;
        if st != Storage::F32 && streamed[t].is_none() && mm_operand[t] && rows > 1 && (inner * 2).is_multiple_of(32) {
            layout[t] =
                Some(Layout { inner, ld: inner + 8, swz: None, blocks: false, rows, vector: false, staged: false });
        }
    }

    // The attention region reads Q, K and V with ldmatrix: one 16-bit type, rows 16-byte aligned.
    if let Some(f) = &fr {
        let st = storage[f.k];
        let fits = |t: STensorId| {
            streamed[t].is_none()
                && layout[t].map_or(bg.tensors[t].dims.last().is_some_and(|&d| d % 8 == 0), |l| l.ld % 8 == 0)
        };
        // Q may also be fp32 (a previous kernel's output): its fragments are converted once.
        let q_ok = storage[f.q] == st || (storage[f.q] == Some(Storage::F32) && streamed[f.q].is_none());
        if !matches!(st, Some(Storage::F16 | Storage::BF16))
            || storage[f.v] != st
            || !q_ok
            || ![f.k, f.v].iter().all(|&t| fits(t))
            || (storage[f.q] == st && !fits(f.q))
        {
            return Ok(None);
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
            return Ok(None);
        }
        // The wgmma form reads K and V through descriptors: staged, unpadded 128-byte rows
        // swizzled as the hardware's 128-byte pattern (`swz<64, 8>`, 1024-byte aligned).
        // K wider than 64 keys goes in column blocks of 64 (`swzb`). Only the region reads them.
        if f.wg.is_some() {
            let only_flash =
                |t: STensorId| steps.iter().all(|&(sec, st)| st == Step::Flash || !rw(sec, st).1.contains(&t));
            for (t, inner) in [(f.k, f.n), (f.v, 64)] {
                match layout[t] {
                    Some(l) if l.staged && l.vector && l.inner == inner && only_flash(t) => {
                        layout[t] = Some(Layout { ld: inner, swz: Some(8), blocks: inner > 64, ..l });
                    }
                    _ => return Ok(None),
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
            if let Some(l) = layout[f.q] {
                if storage[f.q] == st && (l.vector || q_normed) && l.inner == 64 && f.d == 64 && only_flash(f.q) {
                    layout[f.q] = Some(Layout { ld: 64, swz: Some(8), blocks: false, ..l });
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
    }

    // Live intervals. Staged tiles live through the whole loop (all their stages).
    let mut interval: Vec<Option<(usize, usize)>> = vec![None; n_t];
    for t in 0..n_t {
        let (Some(d), Some(l)) = (def[t], last[t]) else { continue };
        let (mut s, mut e) = (d, l);
        if let (Some(ls), Some(le)) = (loop_start, loop_end) {
            if carried[t] || layout[t].is_some_and(|l| l.staged) {
                s = s.min(ls);
                e = e.max(le);
            } else if d < ls && l >= ls {
                e = e.max(le);
            }
        }
        interval[t] = Some((s, e));
    }

    let flash_end = steps.iter().position(|(_, st)| *st == Step::FlashEnd);
    // Loop matmuls summed on the warpgroup tensor cores (`Knobs::wgmma_acc`), and their A and
    // B tiles (1024-byte aligned, A in column blocks).
    let loop_mm = |j: usize| steps.iter().any(|&(_, st)| matches!(st, Step::MatAcc { op, .. } if op == j));
    let mut wg_acc: Vec<bool> =
        (0..n_ops).map(|j| knobs.wgmma_acc && loop_mm(j) && wg_acc_fits(bg, j, &layout, &storage)).collect();
    // Its A goes in column blocks, which `mi::MmaAcc` does not read: an A that another loop
    // matmul reads in the warp form keeps its rows.
    for j in 0..n_ops {
        let a = bg.ops[j].inputs.first().copied();
        if wg_acc[j] && (0..n_ops).any(|i| !wg_acc[i] && loop_mm(i) && bg.ops[i].inputs.first().copied() == a) {
            wg_acc[j] = false;
        }
    }
    let wg_tiles: Vec<STensorId> =
        (0..n_ops).filter(|&j| wg_acc[j]).flat_map(|j| [bg.ops[j].inputs[0], bg.ops[j].inputs[1]]).collect();
    for j in (0..n_ops).filter(|&j| wg_acc[j]) {
        let a = bg.ops[j].inputs[0];
        if let Some(l) = layout[a] {
            layout[a] = Some(Layout { blocks: true, ..l });
        }
    }
    // Scratch of the register accumulators' finishes (live at their one step): (step, op, bytes).
    let acc_scratch: Vec<(usize, usize, usize)> = steps
        .iter()
        .enumerate()
        .filter_map(|(pos, &(_, st))| {
            let (op, floats) = match st {
                Step::MatAccEnd { acc } => {
                    let m = accumulated_matmul(bg, acc)?;
                    let (da, db) = (&bg.tensors[bg.ops[m].inputs[0]].dims, &bg.tensors[bg.ops[m].inputs[1]].dims);
                    let r = da.len();
                    if wg_acc[m] {
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
    // Buffers for a stage count, with in-place element-wise groups; first-fit placement. The
    // accumulators' scratch buffers follow the tiles' (from the returned index, in
    // `acc_scratch` order), the attention combine scratch comes last.
    // The interleaved warp-specialised form on three consumer warpgroups merges three slices.
    let ws3 = fr.as_ref().is_some_and(|f| ws_three(f, wgs) && ws_form(bg, nt, f, &layout, &steps, true));
    let combine = |f: &FlashRegion| combine_bytes(f, nt, ws3);
    // The other blocks' partials of a cluster split: an area of its own for the whole kernel
    // (`own`), or after the combine scratch, over the loop's tiles, where an area of its own
    // would cost the loop a pipeline stage.
    let remote = fr.as_ref().map_or(0, |f| f.remote_bytes(cluster));
    // Floats of one block's slot in a summing cluster's receive area (`Step::ClusterMerge`).
    let recv_slot: usize = merged_by_step.iter().map(|&t| numel(&bg.tensors[t].dims).next_multiple_of(4)).sum();
    let plan = |stages: usize, own: bool| -> (Vec<Buffer>, Vec<Option<usize>>, usize, usize) {
        let mut buffers: Vec<Buffer> = Vec::new();
        let mut buf_of: Vec<Option<usize>> = vec![None; n_t];
        let mut order: Vec<STensorId> = (0..n_t).filter(|&t| interval[t].is_some()).collect();
        order.sort_by_key(|&t| interval[t].map(|(s, _)| s));
        for t in order {
            let Some((s, e)) = interval[t] else { continue };
            let es = storage[t].map_or(4, Storage::size_bytes);
            let size = match layout[t] {
                Some(l) => l.rows * l.ld * es * if l.staged { stages } else { 1 },
                None => numel(&bg.tensors[t].dims) * es,
            };
            let inplace = group_out_pos.iter().find(|(pos, _)| *pos == s).and_then(|&(pos, g)| {
                let grp = &groups[g];
                if grp.output != t {
                    return None;
                }
                grp.inputs.iter().copied().find(|&x| {
                    storage[x] == Some(Storage::F32)
                        && storage[t] == Some(Storage::F32)
                        && layout[x].is_none()
                        && bg.tensors[x].dims == bg.tensors[t].dims
                        && (!carried[x] || steps[pos].0 == Section::Post)
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
                    let wg_tile = fr.as_ref().is_some_and(|f| f.wg.is_some() && (t == f.k || t == f.v || t == f.q));
                    // Swizzled rows sit on whole 128-byte lines (their copies' and ldmatrix's
                    // bank pattern assumes it).
                    let align = if wg_tile || wg_tiles.contains(&t) {
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
        let span =
            (acc_scratch.iter().map(|a| a.0).min().unwrap_or(0), acc_scratch.iter().map(|a| a.0).max().unwrap_or(0));
        for &(_, _, bytes) in &acc_scratch {
            buffers.push(Buffer { size: bytes, start: span.0, end: span.1, offset: 0, align: SMEM_ALIGN });
        }
        if let (Some(f), Some(pos)) = (&fr, flash_end) {
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
            let size = (cluster - 1) * recv_slot * 4 + if knobs.async_push { 16 } else { 0 };
            buffers.push(Buffer { size, start: 0, end: steps.len(), offset: 0, align: SMEM_ALIGN });
        }
        let total = place(&mut buffers);
        (buffers, buf_of, total, first_scratch)
    };
    // Pipeline depth (the rule of `BlockGraph::pipeline_stages`, on the placed sizes): up to
    // MAX_PIPELINE_STAGES stages of the loop's input tiles, within the budget.
    let any_staged = layout.iter().any(|l| l.is_some_and(|l| l.staged));
    // The interleaved warp-specialised form takes more stages (three a warpgroup), within the
    // whole shared memory less its mbarriers and V-row factors.
    let ilv = fr.as_ref().is_some_and(|f| ws_interleaved(f) && ws_form(bg, nt, f, &layout, &steps, ws3));
    let most = if ws3 {
        WS3_STAGES
    } else if ilv {
        WS_ILV_STAGES
    } else {
        MAX_PIPELINE_STAGES
    };
    let mut stages = if any_staged { most.min(bg.forloop_range).max(1) } else { 1 };
    // A warpgroup attention normalising its V stages takes up to the whole shared memory: with
    // three stages or more each iteration normalises the next stage beside its own matmuls
    // (`Step::Flash`) instead of its own stage before them.
    let budget = match &fr {
        Some(f) if ilv => {
            knobs.target.smem_per_block_optin.saturating_sub(ws_barriers_bytes(most, ws_split_v(f)) + WS_FACTOR_BYTES)
        }
        Some(f) if f.v_norm && f.wg.is_some() => knobs.target.smem_per_block_optin,
        _ => bg.pipeline_budget(&knobs.target),
    };
    let depth = |own: bool| {
        let mut st = stages;
        while st > 1 && plan(st, own).2 > budget {
            st -= 1;
        }
        st
    };
    let shared = depth(false);
    let own = remote > 0 && depth(true) == shared;
    stages = shared;
    let (buffers, buf_of, smem_bytes, first_scratch) = plan(stages, own);

    let step_rw: Vec<(Vec<STensorId>, Vec<STensorId>)> = steps
        .iter()
        .map(|&(sec, st)| {
            let (w, r, _) = rw(sec, st);
            (w, r)
        })
        .collect();

    // The combine scratch is the last buffer `plan` pushed, or the one before the remote area
    // of its own; a remote area without one follows the slices' slots in the combine scratch.
    let at = |back: usize| buffers.len().checked_sub(back).map_or(0, |i| buffers[i].offset);
    let combine_at = at(1 + usize::from(own));
    let remote_at = (remote > 0).then(|| if own { at(1) } else { combine_at + fr.as_ref().map_or(0, combine) });
    let flash = fr.map(|f| {
        let off = (combine(&f) > 0).then_some(combine_at);
        (f, off)
    });
    // The receive area is the last buffer `plan` pushed (a summing split has no combine).
    let recv = (recv_slot > 0).then(|| (buffers.last().map_or(0, |b| b.offset), recv_slot));
    let mut acc_scratch_at: Vec<Option<(usize, usize)>> = vec![None; n_ops];
    for (j, &(_, op, bytes)) in acc_scratch.iter().enumerate() {
        acc_scratch_at[op] = Some((buffers[first_scratch + j].offset, bytes));
    }
    if summing
        && (0..n_ops).any(|j| {
            opneed[j] && bg.ops[j].kind.is_accumulator() && storage[bg.ops[j].outputs[0]] != Some(Storage::F32)
        })
    {
        return Ok(None);
    }
    let mut ctx = Ctx {
        budgets: knobs.target.budgets,
        bg,
        ins,
        outs,
        groups,
        nt,
        storage,
        streamed,
        input_ops,
        layout,
        stages,
        flash,
        flash_remote: remote_at,
        cluster,
        merged_by_step,
        recv,
        lazy,
        async_push: knobs.async_push,
        evict_first: knobs.evict_first,
        wg_acc,
        acc_scratch: acc_scratch_at,
        ws: None,
        ws3,
        halves: false,
    };
    // Split-K scratch of the tile matmuls (`mi::matmul_tile`): NT * 16 bytes after the tiles.
    let has_matmul = steps.iter().any(|(_, st)| matches!(st, Step::Matmul { .. }));
    let scratch = if has_matmul { Some(smem_bytes) } else { None };
    let mut total = smem_bytes + if has_matmul { nt * 16 } else { 0 };
    // The warp-specialised loop's full and empty mbarriers (8 bytes each a stage) after it all,
    // then, with V normalised, its rows' factors (16-byte aligned).
    let mut extra_threads = 0;
    if !ctx.warp_specialised(&steps) {
        // (Its larger combine scratch goes unused.)
        ctx.ws3 = false;
    } else {
        let off = total.next_multiple_of(16);
        let factors = if ctx.flash.as_ref().is_some_and(|(f, _)| f.v_norm) { WS_FACTOR_BYTES } else { 0 };
        total = off + ws_barriers_bytes(ctx.stages, ctx.ws_split_v()) + factors;
        ctx.ws = Some(off);
        ctx.halves = ctx.finish_halves(&steps);
        extra_threads = ctx.consumers() - nt + WS_PRODUCER_THREADS;
    }
    let src = ctx.kernel(name, &steps, &step_rw, &buffers, &buf_of, scratch, total)?;
    Ok(Some(Emitted { source: src, smem_bytes: total, cluster: [1; 3], extra_threads }))
}

/// Whether an accumulator is finalised after the loop (a mean or an rms: `Step::Finalize`).
fn finalized(k: &BlockOpKind) -> bool {
    matches!(k, BlockOpKind::ForloopAccum { acc: Accum::Mean | Accum::Rms, .. })
}

/// The loop matmul whose product accumulator op `acc` sums.
fn accumulated_matmul(bg: &BlockGraph, acc: usize) -> Option<usize> {
    let x = bg.ops[acc].inputs[0];
    bg.ops.iter().position(|o| matches!(o.kind, BlockOpKind::Matmul) && o.outputs[0] == x)
}

/// Whether loop matmul `op` fits `mi::MmaAccWG` (the transposed warpgroup form): the shape
/// `BlockGraph::warpgroup_matmul` takes, with A staged in 16-bit storage unpadded with the
/// 128-byte swizzle (its rows then go in column blocks of 64) and B stored likewise (no
/// blocks).
fn wg_acc_fits(bg: &BlockGraph, op: usize, layout: &[Option<Layout>], storage: &[Option<Storage>]) -> bool {
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

/// Floats of shared scratch that `mi::MmaAcc::finish` takes (its `SCRATCH`, by its `pick_ks`):
/// a float4 per lane, fragment and K slice when the warps split K, else none.
pub(crate) fn mma_acc_scratch(nt: usize, batch: usize, m: usize, n: usize, k: usize) -> usize {
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

/// Whether tile matmul `op` can read its operand `t` (a 16-bit tile of rows of 2, 4 or a
/// multiple of 8 chunks) unpadded and swizzled (`mi::matmul_tile`'s SWA / SWB): as A, k-steps
/// of whole 16 columns read by ldmatrix or words, and in a loop only 16-row groups (a loop's
/// word-at-a-time reads paid more in index arithmetic than the copies gained); as B, whole
/// 16-row k-steps and 8-column fragments read by ldmatrix.
fn swizzled_mm_operand(bg: &BlockGraph, op: usize, t: STensorId, in_loop: bool) -> bool {
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
fn row_sum_acc_shape(bg: &BlockGraph, nt: usize, op: usize) -> Option<(usize, usize)> {
    let BlockOpKind::ForloopAccum { acc: Accum::Rms | Accum::Mean, .. } = bg.ops[op].kind else { return None };
    let x = &bg.tensors[bg.ops[op].inputs[0]];
    let len = *x.dims.last()?;
    let rows = numel(&x.dims[..x.dims.len() - 1]);
    let mt = rows.div_ceil(16);
    let fits = x.phase == Phase::Loop && len.is_multiple_of(16) && mt.div_ceil(mt.min(nt / 32)) <= 4;
    fits.then_some((rows, len))
}

/// K slices of `mi::RowSumAcc` over `rows` rows of `len` (its `KS`).
pub(crate) fn row_sum_slices(nt: usize, rows: usize, len: usize) -> usize {
    let nw = nt / 32;
    let g = rows.div_ceil(16).min(nw);
    (nw / g).min(len / 16).max(1)
}

/// First-fit placement of buffers by lifetime; returns the total bytes.
fn place(buffers: &mut [Buffer]) -> usize {
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

/// Byte-offset-free base expression (in elements) of a block's tile in a device tensor: the
/// block's offset along the grid-mapped dims (`map`), plus iteration `iter` along `fdim`.
pub(crate) fn tile_base(
    bg: &BlockGraph,
    map: [i64; 3],
    fdim: i64,
    tile: &[usize],
    strides: &[usize],
    iter: Option<&str>,
) -> String {
    let mut terms = Vec::new();
    let axes = ["blockIdx.x", "blockIdx.y", "blockIdx.z"];
    for a in 0..3 {
        if bg.grid_dim[a] > 1 && map[a] >= 0 {
            let d = map[a] as usize;
            let part = if d as i64 == fdim { tile[d] * bg.forloop_range } else { tile[d] };
            terms.push(format!("(long long){} * {}LL", axes[a], part * strides[d]));
        }
    }
    if let (true, Some(it)) = (fdim >= 0, iter) {
        let f = fdim as usize;
        terms.push(format!("(long long)({it}) * {}LL", tile[f] * strides[f]));
    }
    if terms.is_empty() {
        "0LL".into()
    } else {
        terms.join(" + ")
    }
}

/// The unrolled 16-byte copies of a tile (`vec` elements each, `nt` threads, a whole number of
/// copies per thread) as constant (source, destination) element steps from each thread's first
/// copy, when every thread's steps are the same: copy `u` of thread `t` moves element
/// `i = (t + u nt) vec`, from device offset `src(i)` (tile dims over device strides) to shared
/// index `layout.offset(i)` (padded or swizzled rows). The kernel then computes one address pair
/// per tile and thread instead of one per copy (about seven integer instructions each).
fn copy_steps(tile: &[usize], strides: &[usize], layout: &Layout, nt: usize, vec: usize) -> Option<Vec<(i64, i64)>> {
    let n = numel(tile);
    let reps = n / vec / nt;
    let src = |i: usize| -> i64 {
        let (mut rest, mut off) = (i, 0i64);
        for (&d, &st) in tile.iter().zip(strides).rev() {
            off += (rest % d) as i64 * st as i64;
            rest /= d;
        }
        off
    };
    let dst = |i: usize| layout.offset(i) as i64;
    let steps: Vec<(i64, i64)> = (0..reps).map(|u| (src(u * nt * vec) - src(0), dst(u * nt * vec) - dst(0))).collect();
    let same = (0..nt).all(|t| {
        let i0 = t * vec;
        steps.iter().enumerate().all(|(u, &(sc, dc))| {
            let i = i0 + u * nt * vec;
            src(i) - src(i0) == sc && dst(i) - dst(i0) == dc
        })
    });
    (same && reps <= 64).then_some(steps)
}

/// Whether a tile's rows are whole runs of `w` elements, contiguous and `w`-aligned in device
/// memory (the last stride 1, every other stride a multiple of `w`): from an aligned base,
/// with `w` = 8 each row starts 16-byte aligned for 16-bit values.
fn rows_of(w: usize, tile: &[usize], strides: &[usize]) -> bool {
    tile.last().is_some_and(|l| l % w == 0)
        && strides.last() == Some(&1)
        && strides.iter().rev().skip(1).all(|s| s % w == 0)
}

impl Ctx<'_> {
    /// Elements of one pipeline stage of tile `t` (0 for a tile without a layout).
    fn stage_elems(&self, t: STensorId) -> usize {
        self.layout[t].map_or(0, |l| l.rows * l.ld)
    }

    /// Whether the wgmma attention step reads the next iteration's K a step ahead: with three
    /// stages or more, where the loop can wait for that stage too.
    fn wg_lookahead(&self) -> bool {
        self.flash.as_ref().is_some_and(|(f, _)| f.wg.is_some()) && self.stages >= 3
    }

    /// Whether the loop takes the warp-specialised form ([`ws_form`], with two stages or
    /// more).
    fn warp_specialised(&self, steps: &[(Section, Step)]) -> bool {
        self.flash.as_ref().is_some_and(|(f, _)| ws_form(self.bg, self.nt, f, &self.layout, steps, self.ws3))
            && self.stages >= 2
    }

    /// Whether the two blocks of a warp-specialised attention's cluster pair (a key split over
    /// one group of 64 rows) each finish half the rows (`FlashWG::finish`'s HALVES): each
    /// block's slice-0 warps of the other block's half save their partials there, and each
    /// block merges and writes its own 32 rows. Only where every step after the region writes
    /// an output row by row (element-wise groups over the rows of O, each input either of
    /// those rows or a row broadcast), so that each block runs them over its half. On the
    /// H200 (saved winners, hand edits, four rounds, µs): GQA b=8 14.45-14.71 -> 13.96-14.03,
    /// QK-norm b=8 17.07-17.24 -> 16.66-16.76, against the first block merging all 64 rows
    /// while the second leaves.
    fn finish_halves(&self, steps: &[(Section, Step)]) -> bool {
        let Some((f, _)) = &self.flash else { return false };
        // A tile's leading dims (its rows) and its last.
        let rows_width = |t: STensorId| {
            let d = self.dims(t);
            (d[..d.len() - 1].to_vec(), d[d.len() - 1])
        };
        let (orows, ow) = rows_width(f.o);
        let row_wise = |g: usize| {
            let (rows, w) = rows_width(self.groups[g].output);
            rows == orows
                && w == ow
                && self.groups[g].inputs.iter().all(|&x| {
                    let (xr, xw) = rows_width(x);
                    xr == rows && (xw == w || xw == 1)
                })
        };
        self.cluster == 2
            && f.m == 64
            && f.batch == 1
            && f.wg.is_some_and(|(rg, _)| rg == 1)
            && numel(&orows) == 64
            && steps.iter().filter(|(sec, _)| *sec == Section::Post).all(|&(_, st)| match st {
                Step::FlashEnd => true,
                Step::GroupSave { g, .. } => row_wise(g),
                _ => false,
            })
    }

    /// Whether the region's two key slices (two warpgroups over the same 64 rows) take whole
    /// stages in turn in the warp-specialised form (`FlashWG`'s ILV).
    fn ws_interleaved(&self) -> bool {
        self.flash.as_ref().is_some_and(|(f, _)| ws_interleaved(f))
    }

    /// Whether the warp-specialised form marks V full apart ([`ws_split_v`]).
    fn ws_split_v(&self) -> bool {
        self.flash.as_ref().is_some_and(|(f, _)| ws_split_v(f))
    }

    /// The warp-specialised form's set-up and producer (`FlashWG::run_ws`). Thread 0 sets up the
    /// stage mbarriers at byte `off` (full: one arrival a producer thread; empty: one a
    /// consumer warp of the stage, or a consumer thread with V's row factors); then the producer warpgroup (threads NT on) copies each
    /// iteration's staged tiles into stage `it % stages` once the consumers have emptied it,
    /// and leaves; the consumers take its registers. A producer thread's arrival is its copies
    /// landing (`cp.async.mbarrier.arrive`: it never waits, so it runs as far ahead as the
    /// empty stages let it); each consumer fences its view for the tensor cores after its
    /// wait. (A normalised V is not rewritten: `run_ws` scales P by the rows' factors.) With
    /// [`ws_split_v`], K and V of a stage are marked full on mbarriers of their own.
    fn ws_producer(&self, off: usize, staged: &[(usize, usize, STensorId)]) -> Result<String> {
        let (st, range) = (self.stages, self.bg.forloop_range);
        let mut s = String::new();
        wl!(s, "  unsigned long long* const mi_full = reinterpret_cast<unsigned long long*>(mi_smem + {off});");
        wl!(s, "  unsigned long long* const mi_empty = mi_full + {st};");
        let split = self.ws_split_v();
        if split {
            wl!(s, "  unsigned long long* const mi_vfull = mi_full + {};", 2 * st);
        }
        wl!(s, "  if (tid == 0) {{");
        wl!(s, "    for (int i = 0; i < {st}; ++i) {{");
        wl!(s, "      mi::mbar_init(mi_full + i, {WS_PRODUCER_THREADS});");
        // Consumer warps releasing a stage: its warpgroup's four (interleaved), else every
        // consumer warp; every thread of them where V's row factors read the stage with
        // ordinary loads (`run_ws`'s VN: each thread's arrival releases its own reads).
        let warps = if self.ws_interleaved() { 4 } else { self.nt / 32 };
        let readers = if self.flash.as_ref().is_some_and(|(f, _)| f.v_norm) { warps * 32 } else { warps };
        wl!(s, "      mi::mbar_init(mi_empty + i, {readers});");
        if split {
            wl!(s, "      mi::mbar_init(mi_vfull + i, {WS_PRODUCER_THREADS});");
        }
        wl!(s, "    }}");
        wl!(s, "  }}");
        wl!(s, "  __syncthreads();");
        wl!(s, "  if (tid >= {}) {{ // the producer", if self.ws3 { "NC" } else { "NT" });
        wl!(s, "    mi::setmaxnreg_dec<{}>();", self.budgets.ws_producer_regs);
        wl!(s, "    constexpr int NT = {WS_PRODUCER_THREADS};");
        wl!(s, "    const int tid = mi::lin_tid() - {};", self.consumers());
        wl!(s, "#pragma unroll 1");
        wl!(s, "    for (int it = 0; it < {range}; ++it) {{");
        wl!(s, "      const int st = it % {st};");
        wl!(s, "      if (it >= {st}) mi::mbar_wait(mi_empty + st, (it / {st} - 1) & 1);");
        // With V marked full apart: K, then V, each arrived for once landed (a thread's
        // arrival counts all its copies so far).
        let order: Vec<(usize, usize, STensorId)> = match &self.flash {
            Some((f, _)) if split => {
                let of = |tile| staged.iter().copied().find(|x| x.2 == tile);
                match (of(f.k), of(f.v)) {
                    (Some(k), Some(v)) if staged.len() == 2 => vec![k, v],
                    _ => return unsupported("internal error: the warp-specialised loop stages K and V only"),
                }
            }
            _ => staged.to_vec(),
        };
        for (i, &(k, op, t)) in order.iter().enumerate() {
            let dst = format!("(t{t}_st + st * {})", self.stage_elems(t));
            for l in self.load_by(k, op, t, Some("it"), &dst, true)?.lines() {
                wl!(s, "      {l}");
            }
            if split {
                wl!(s, "      mi::cp_async_mbar_arrive({} + st);", if i == 0 { "mi_full" } else { "mi_vfull" });
            }
        }
        wl!(s, "      mi::cp_async_commit();");
        if !split {
            wl!(s, "      mi::cp_async_mbar_arrive(mi_full + st);");
        }
        wl!(s, "    }}");
        wl!(s, "    mi::cp_async_wait<0>();");
        if self.cluster > 1 {
            // Its arrival on the cluster barrier the merge after the loop starts with, releasing
            // its copies.
            wl!(s, "    mi::cluster_arrive_release();");
        }
        wl!(s, "    return;");
        wl!(s, "  }}");
        let b = &self.budgets;
        wl!(s, "  mi::setmaxnreg_inc<{}>();", if self.ws3 { b.ws3_consumer_regs } else { b.ws_consumer_regs });
        Ok(s)
    }

    /// A barrier over the block's threads that run the kernel's steps (the consumers only in
    /// the warp-specialised form, whose producer has left by then).
    fn sync(&self) -> &'static str {
        if self.ws.is_some() {
            "mi::bar_sync_n<NT>();"
        } else {
            "__syncthreads();"
        }
    }

    /// Threads that run the attention loop: the block graph's, and a third warpgroup with
    /// [`ws_three`].
    fn consumers(&self) -> usize {
        self.nt + if self.ws3 { WS3_THREADS } else { 0 }
    }

    /// [`Self::sync`], over the third attention warpgroup too where `wide` ([`ws_three`]: from
    /// the loop to the slices' merge).
    fn sync_wide(&self, wide: bool) -> &'static str {
        if wide {
            "mi::bar_sync_n<NC>();"
        } else {
            self.sync()
        }
    }

    fn dims(&self, t: STensorId) -> &[usize] {
        &self.bg.tensors[t].dims
    }

    fn tile(&self, t: STensorId) -> String {
        format!("t{t}")
    }

    /// Conversion of the fp32 expression `v` to tile `t`'s storage type.
    fn conv(&self, t: STensorId, v: &str) -> String {
        match self.storage[t] {
            Some(Storage::F32) | None => v.to_string(),
            Some(st) => format!("mi::from_f32<{}>({v})", st.cty()),
        }
    }

    /// `to_f32` read of tile `t` at index expression `idx`.
    fn read(&self, t: STensorId, idx: &str) -> String {
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
    /// read 16 bytes at a time, in order (`mi::row_sums_vec`; not swizzled).
    fn vec_rows(&self, t: STensorId) -> Option<(usize, &'static str)> {
        let l = self.layout[t]?;
        let st = self.storage[t]?;
        let ok = self.streamed[t].is_none()
            && st != Storage::F32
            && l.swz.is_none()
            && l.inner == *self.dims(t).last()?
            && l.inner % 8 == 0
            && l.ld % 8 == 0;
        ok.then(|| (l.ld, st.cty()))
    }

    /// Element offset, inside its device tensor, of element `idx` of tile `t` read straight
    /// from device memory (not staged): the tile's base for this block and iteration plus
    /// the element's offset.
    fn streamed_offset(&self, t: STensorId, idx: &str) -> Option<String> {
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
    fn device_rows(&self, t: STensorId) -> Option<(usize, String, &'static str)> {
        let k = self.streamed[t]?;
        let (tile, dev) = (self.dims(t), &self.ins[k]);
        if dev.storage == Storage::F32 || !rows_of(8, tile, &dev.strides) {
            return None;
        }
        let at = self.streamed_offset(t, &format!("((r) * {})", tile.last()?))?;
        Some((k, format!("in{k} + {at}"), dev.storage.cty()))
    }

    /// The rms norm whose output is the warp-specialised attention's Q, where the softmax
    /// applies it (`FlashWG::run_ws`'s QN): Q's 16-bit rows of 64 straight from device memory
    /// into the region's swizzled Q tile of the same type, copied as they are (the rows'
    /// factors scale the exponents); with V's factors too, only on three warpgroups
    /// ([`ws_three`]). QK-norm on the H200 (saved winners, four rounds, against Q normalised
    /// before the loop): b=8 17.48-17.87 against 17.75-17.83 µs, the block's set-up 2837 ->
    /// 2487 cycles; b=16 unchanged (docs/tuning.md); and no rounding of the
    /// normalised Q to 16 bits.
    fn q_norm_in_softmax(&self) -> Option<usize> {
        let (f, _) = self.flash.as_ref()?;
        self.ws?;
        let op = self.bg.ops.iter().position(|o| o.kind == BlockOpKind::RmsNorm { eps: 0.0 } && o.outputs[0] == f.q)?;
        let (k, _, _) = self.device_rows(self.bg.ops[op].inputs[0])?;
        let swizzled = self.layout[f.q].is_some_and(|l| l.swz == Some(8) && l.ld == 64 && l.inner == 64 && !l.blocks);
        // (Not in the two-warpgroup form with V's factors too: its 240 registers then spilled
        // 20 / 88 bytes against 4 / 20.)
        let room = self.ws3 || !f.v_norm;
        (room && swizzled && f.d == 64 && f.x.is_none() && self.storage[f.q] == Some(self.ins[k].storage)).then_some(op)
    }

    /// Template arguments `BATCH, M, N, K, LDA, LDB` of tile matmul `op` (row pitches through
    /// any padding), as `mi::matmul_tile` and `mi::MmaAcc` take them.
    fn mm_shape(&self, op: usize) -> String {
        let (a, b) = (self.bg.ops[op].inputs[0], self.bg.ops[op].inputs[1]);
        let (da, db) = (self.dims(a), self.dims(b));
        let r = da.len();
        let (m, kk, n) = (da[r - 2], da[r - 1], db[r - 1]);
        let lda = self.layout[a].map_or(kk, |l| l.ld);
        let ldb = self.layout[b].map_or(n, |l| l.ld);
        format!("{}, {m}, {n}, {kk}, {lda}, {ldb}", numel(&da[..r - 2]))
    }

    /// The `mi::RowSumAcc` type for loop accumulator `op` when its row sums (of squares, for
    /// rms) are kept in registers on the tensor cores: a mean or rms accumulator (finalised
    /// after the loop) of a 16-bit shared tile whose rows are 16-multiples of whole 16-byte
    /// vectors, at most four row groups per warp.
    fn sum_acc(&self, op: usize) -> Option<String> {
        let aop = &self.bg.ops[op];
        let BlockOpKind::ForloopAccum { acc, .. } = aop.kind else { return None };
        let x = aop.inputs[0];
        let (rows, len) = row_sum_acc_shape(self.bg, self.nt, op)?;
        // Row-major rows, or unpadded rows swizzled as `swz<len, 8>`.
        let (ld, cty, sw) = match (self.vec_rows(x), self.layout[x], self.storage[x]) {
            (Some((ld, cty)), ..) => (ld, cty, ""),
            (None, Some(l), Some(st)) if l.swz == Some(8) && l.inner == len && st != Storage::F32 => {
                (len, st.cty(), if l.blocks && l.inner > 64 { ", true, true" } else { ", true" })
            }
            _ => return None,
        };
        Some(format!("mi::RowSumAcc<NT, {rows}, {len}, {ld}, {cty}, {}{sw}>", acc == Accum::Rms))
    }

    /// The shared scratch (byte offset, bytes) of a register accumulator's finish at `step`.
    fn finish_scratch(&self, step: Step) -> Option<(usize, usize)> {
        match step {
            Step::MatAccEnd { acc: op } | Step::Finalize { op } => self.acc_scratch[op],
            _ => None,
        }
    }

    /// The scratch pointer argument of the finish of accumulator type `ty` at `step`
    /// (`nullptr` when it needs none), after a compile-time check of its size into `s`.
    fn scratch_arg(&self, step: Step, ty: &str, s: &mut String) -> String {
        let (ptr, bytes) = match self.finish_scratch(step) {
            Some((off, bytes)) => (format!("reinterpret_cast<float*>(mi_smem + {off})"), bytes),
            None => ("nullptr".to_string(), 0),
        };
        wl!(s, "static_assert({ty}::SCRATCH * 4 <= {bytes}, \"finish scratch\");");
        ptr
    }

    /// The `mi::MmaAcc` type of loop matmul `op` (operands: loaded 16-bit tiles).
    fn mma_acc_type(&self, op: usize) -> String {
        let ty = self.storage[self.bg.ops[op].inputs[0]].map_or("mi::f16", Storage::cty);
        let sw = |t: STensorId| self.layout[t].is_some_and(|l| l.swz.is_some());
        let (swa, swb) = (sw(self.bg.ops[op].inputs[0]), sw(self.bg.ops[op].inputs[1]));
        let flags = match (swb, swa) {
            (_, true) => format!(", {swb}, true"),
            (true, false) => ", true".to_string(),
            (false, false) => String::new(),
        };
        let acc = if self.wg_acc[op] { "MmaAccWG" } else { "MmaAcc" };
        format!("mi::{acc}<NT, {}, {ty}{flags}>", self.mm_shape(op))
    }

    /// Shared-memory element `idx` (row-major over the tile's dims) of tile `t`, through its
    /// row padding or swizzle if it has one.
    fn at(&self, t: STensorId, idx: &str) -> String {
        match self.layout[t] {
            Some(l) => format!("t{t}[{}]", l.index(idx)),
            None => format!("t{t}[{idx}]"),
        }
    }

    /// Code copying block input `k` (op `op`, tile `t`) for loop iteration `iter` (None outside
    /// the loop) into shared memory at `dst`: 16-byte `cp.async` copies when the layout allows
    /// and the pointer is aligned, element copies otherwise. The caller commits the group.
    fn load(&self, k: usize, op: usize, t: STensorId, iter: Option<&str>, dst: &str) -> Result<String> {
        self.load_by(k, op, t, iter, dst, false)
    }

    /// [`Ctx::load`] by the block's threads, or with `producer` by the warp-specialised
    /// producer's (`tid` < `nt` and `NT` = `nt` in scope either way). In the interleaved
    /// form's producer (24 registers) the unaligned fallback is never unrolled: unrolled, it
    /// made ptxas spill in the vector path too (on the H100 GQA b=8 16.1-16.6 -> 15.4-15.6 us
    /// and QK-norm b=8 20.4-20.7 -> 19.8-20.0 with two warpgroups, GQA b=8 17.5-17.7 ->
    /// 16.2-16.4 with three: 40 bytes of spills -> none); in the 128-row form's it did not pay
    /// (MQA b=16 40.3-41.1 -> 42.1-43.8, with fewer spills).
    fn load_by(
        &self,
        k: usize,
        op: usize,
        t: STensorId,
        iter: Option<&str>,
        dst: &str,
        producer: bool,
    ) -> Result<String> {
        let nt = if producer { WS_PRODUCER_THREADS } else { self.nt };
        let rolled = producer && self.ws_interleaved();
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else {
            return unsupported("internal error: load of a non-input op");
        };
        let Some(l) = self.layout[t] else {
            return unsupported("internal error: load of a tile with no shared-memory layout");
        };
        let tile = self.dims(t);
        let dev = &self.ins[k];
        let base = self.tile_base(imap, forloop_dim, tile, &dev.strides, iter);
        let n = numel(tile);
        let mut s = String::new();
        wl!(s, "{{ // input {k} -> t{t}");
        wl!(s, "  const long long base = {base};");
        let once = self.evict_first && self.read_once(k, op);
        // Element by element: fp32 values through 4-byte cp.async (a staged tile's copies then
        // stay in flight like the vector ones; a plain load would stall its iteration).
        let (to, from) = (
            format!("{dst}[{}]", l.index("i")),
            format!("in{k}[base + {}]", Self::tile_elem_offset(tile, &dev.strides, "i")),
        );
        let copy = if dev.storage == Storage::F32 {
            format!("mi::cp_async4(&{to}, &{from})")
        } else {
            format!("{to} = {from}")
        };
        let scalar = format!("for (int i = tid; i < {n}; i += NT) {copy};");
        if l.vector {
            let vec = 16 / dev.storage.size_bytes();
            let chunks = n / vec;
            wl!(s, "  if (mi::aligned16(in{k})) {{");
            if once {
                wl!(s, "    const unsigned long long mi_once = mi::l2_policy<false>();");
            }
            // Unsigned indices (shifts and masks for power-of-two rows); a whole number of chunks
            // per thread unrolls with the addresses hoisted out of the loop.
            let whole = chunks.is_multiple_of(nt);
            if let Some(steps) = whole.then(|| copy_steps(tile, &dev.strides, &l, nt, vec)).flatten() {
                // Every copy of this thread is its first plus a constant: one address per tile.
                wl!(s, "    const unsigned i = (unsigned)tid * {vec}u;");
                wl!(
                    s,
                    "    const auto* const src = in{k} + base + {};",
                    Self::tile_elem_offset(tile, &dev.strides, "i")
                );
                wl!(s, "    auto* const dst = {dst} + {};", l.index("i"));
                if once {
                    // One shuffled shared address a tile (`mi::smem_lane`); copies add bytes.
                    wl!(s, "    const unsigned sdst = mi::smem_lane(dst);");
                }
                let bytes = dev.storage.size_bytes() as i64;
                for (sc, dc) in steps {
                    if once {
                        let (op, off) = if dc < 0 { ('-', -dc * bytes) } else { ('+', dc * bytes) };
                        wl!(s, "    mi::cp_async16_pol(sdst {op} {off}u, src + {sc}LL, mi_once);");
                    } else {
                        wl!(s, "    mi::cp_async16(dst + {dc}, src + {sc}LL);");
                    }
                }
            } else {
                if whole {
                    wl!(s, "#pragma unroll");
                    wl!(s, "    for (int u = 0; u < {}; ++u) {{", chunks / nt);
                    wl!(s, "      const unsigned i = (unsigned)(tid + u * NT) * {vec}u;");
                } else {
                    wl!(s, "    for (int c = tid; c < {chunks}; c += NT) {{");
                    wl!(s, "      const unsigned i = (unsigned)c * {vec}u;");
                }
                let (to, from) = (format!("{dst} + {}", l.index("i")), Self::tile_elem_offset(tile, &dev.strides, "i"));
                if once {
                    wl!(s, "      mi::cp_async16_pol(mi::smem_lane({to}), in{k} + base + {from}, mi_once);");
                } else {
                    wl!(s, "      mi::cp_async16({to}, in{k} + base + {from});");
                }
                wl!(s, "    }}");
            }
            wl!(s, "  }} else {{");
            if rolled {
                wl!(s, "#pragma unroll 1");
            }
            wl!(s, "    {scalar}");
            wl!(s, "  }}");
        } else {
            wl!(s, "  {scalar}");
        }
        wl!(s, "}}");
        Ok(s)
    }

    /// Whether block input `k` (op `op`) is a graph input of which each block reads a tile of
    /// its own, once: every grid axis of more than one block picks a part of it, and so does
    /// the loop if there is one. Its 16-byte copies then carry the L2 policy evict_first, so
    /// that these lines leave the L2 before those read again (a tile other blocks share, a
    /// later kernel's workspace) and before the next call's prefetched first stages
    /// (`prefetches`). H200, saved MLP-side winners, one call, medians of three
    /// rounds, µs (without -> with): RMSNorm+Linear 4096 b=1/8/16 10.3/10.4/11.0 ->
    /// 9.5/9.7/11.0, 4096x6144 14.9/15.2/16.7 -> 13.5/14.7/16.4, gated MLP 17.5/18.4/18.1 ->
    /// 16.5/17.1/17.3; LoRA +0.02-0.06, nTrans within 0.01.
    fn read_once(&self, k: usize, op: usize) -> bool {
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else { return false };
        matches!(self.ins[k].location, BufferRef::Input(_))
            && (0..3).all(|a| self.bg.grid_dim[a] == 1 || imap[a] >= 0)
            && (self.bg.forloop_range == 1 || forloop_dim >= 0)
    }

    /// The loop's staged input tiles: (block input position, input op, tile).
    fn staged(&self, steps: &[(Section, Step)]) -> Vec<(usize, usize, STensorId)> {
        let bg = self.bg;
        steps
            .iter()
            .filter_map(|&(_, st)| match st {
                Step::Load { k, op } if self.layout[bg.ops[op].outputs[0]].is_some_and(|l| l.staged) => {
                    Some((k, op, bg.ops[op].outputs[0]))
                }
                _ => None,
            })
            .collect()
    }

    /// A kernel streaming its inputs through a pipelined loop (cp.async stages, no attention
    /// region) lets the next kernel go only once its last copies are issued: the iteration
    /// after whose copies it calls `mi::dep_launch` (negative: after the prologue's). The next
    /// call's blocks then arrive while this one drains and prefetch their first stages into L2
    /// (`prefetches`) before their wait, while the memory would otherwise idle. None: the
    /// kernel waits and lets the next go at once (`mi::dep_enter`).
    fn late_launch(&self, steps: &[(Section, Step)]) -> Option<i64> {
        let late = self.ws.is_none()
            && self.flash.is_none()
            && self.bg.forloop_range > 1
            && self.stages >= 2
            && !self.staged(steps).is_empty();
        late.then(|| self.bg.forloop_range as i64 - self.stages as i64)
    }

    /// L2 prefetches of the graph-input tiles the kernel reads first, issued before the
    /// dependent-launch wait: a loop-free kernel's input tiles, or the first stages of a loop's
    /// staged tiles where the kernel lets the next one go late ([`Ctx::late_launch`]). They
    /// bring no data into the block, so the previous kernel may still be writing (the L2 is
    /// coherent); their DRAM latency overlaps that kernel's drain. Measured per call, saved
    /// winners: LoRA b=8 5.05 -> 4.4 us, b=16 5.7 -> 4.9 (H100). A loop whose blocks arrive at
    /// the previous call's start (early trigger) prefetches nothing: the lines would wait in
    /// L2 for a whole kernel, and on the H200 RMSNorm+Linear b=8 took 11.2 -> 12.2 us with
    /// three stages prefetched so. Inputs an earlier kernel of the program computes are left
    /// out too.
    fn prefetches(&self, steps: &[(Section, Step)]) -> String {
        let mut s = String::new();
        if self.late_launch(steps).is_some() {
            let (first, staged) = ((self.stages - 1).min(self.bg.forloop_range), self.staged(steps));
            for it in 0..first {
                for &(k, op, _) in &staged {
                    s.push_str(&self.prefetch_tile(k, op, Some(&it.to_string())));
                }
            }
            return s;
        }
        if self.bg.forloop_range != 1 {
            return s;
        }
        for &(_, st) in steps {
            let Step::Load { k, op } = st else { continue };
            s.push_str(&self.prefetch_tile(k, op, Some("0")));
        }
        s
    }

    /// L2 prefetches of input `k`'s tile (op `op`) at loop iteration `iter`, if it is a graph
    /// input: one per 128-byte line where the tile's rows are whole lines, else one per 16
    /// bytes (the copies' granularity).
    fn prefetch_tile(&self, k: usize, op: usize, iter: Option<&str>) -> String {
        let mut s = String::new();
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else { return s };
        let (t, dev) = (self.bg.ops[op].outputs[0], &self.ins[k]);
        if !matches!(dev.location, BufferRef::Input(_)) {
            return s;
        }
        let tile = self.dims(t);
        let es = dev.storage.size_bytes();
        let row_bytes = tile.last().map_or(0, |&n| n * es);
        let step = if row_bytes > 0 && row_bytes.is_multiple_of(128) { 128 / es } else { 16 / es };
        wl!(s, "    {{ // input {k}");
        wl!(s, "      const long long base = {};", self.tile_base(imap, forloop_dim, tile, &dev.strides, iter));
        wl!(s, "      for (int c = tid; c < {}; c += NT) {{", numel(tile).div_ceil(step));
        wl!(s, "        const unsigned i = (unsigned)c * {step}u;");
        wl!(s, "        mi::prefetch_l2(in{k} + base + {});", Self::tile_elem_offset(tile, &dev.strides, "i"));
        wl!(s, "      }}");
        wl!(s, "    }}");
        s
    }

    #[allow(clippy::too_many_lines, clippy::too_many_arguments)]
    fn kernel(
        &self,
        name: &str,
        steps: &[(Section, Step)],
        step_rw: &[(Vec<STensorId>, Vec<STensorId>)],
        buffers: &[Buffer],
        buf_of: &[Option<usize>],
        scratch: Option<usize>,
        smem: usize,
    ) -> Result<String> {
        let bg = self.bg;
        let mut s = String::new();
        let params = kernel_params(self.ins, self.outs);
        let staged = self.staged(steps);
        let late = self.late_launch(steps);
        let n_stages = self.stages;
        wl!(
            s,
            "// block graph: grid {:?}, block {:?}, forloop_range {}, {smem} bytes of shared memory, {} pipeline stage(s)",
            bg.grid_dim,
            bg.block_dim,
            bg.forloop_range,
            n_stages
        );
        // The attention region holds its tiles in registers: beyond one wave, ask for at most
        // 128 per thread at 256 threads so that two blocks share an SM (latency hiding needs
        // the warps); a grid of one wave gains nothing from the cap.
        // (The wgmma form keeps S for a step ahead: two blocks of 128 registers only with two
        // key slices, which halve it.)
        let wg = self.flash.as_ref().and_then(|(f, _)| f.wg);
        let two =
            self.flash.as_ref().is_some_and(|(f, _)| !f.one_wave) && self.nt == 256 && wg.is_none_or(|(_, ks)| ks == 2);
        let bounds = if self.ws.is_some() {
            format!("{}, 1", self.consumers() + WS_PRODUCER_THREADS)
        } else if two {
            format!("{}, 2", self.nt)
        } else {
            self.nt.to_string()
        };
        let wait = if late.is_some() {
            "mi::dep_wait(); // the next kernel goes after this loop's last copies"
        } else {
            "mi::dep_enter();"
        };
        s.push_str(&kernel_open_with(&bounds, name, &params, self.nt, &self.prefetches(steps), wait));
        let wgmma = wg.is_some() || self.wg_acc.contains(&true);
        wl!(s, "  extern __shared__ __align__({}) unsigned char mi_smem[];", if wgmma { WG_ALIGN } else { 16 });
        wl!(s, "  constexpr int NT = {};", self.nt);
        if self.ws3 {
            wl!(s, "  constexpr int NC = {}; // consumers: NT and a third attention warpgroup", self.consumers());
        }
        wl!(s, "  const int tid = mi::lin_tid();");
        wl!(s, "  (void)tid;");
        if let Some((off, slot)) = self.recv {
            if self.async_push {
                let bar = off + (self.cluster - 1) * slot * 4;
                wl!(s, "  unsigned long long* const mi_merge_bar = reinterpret_cast<unsigned long long*>(mi_smem + {bar}); // the merge's pushes land");
                wl!(s, "  if (mi::cluster_rank() == 0 && tid == 0) mi::cluster_merge_init(mi_merge_bar);");
            }
            wl!(s, "  mi::cluster_arrive_relaxed(); // its merge waits for every block of the cluster to start");
            if self.lazy {
                wl!(s, "  float* const mi_recv = reinterpret_cast<float*>(mi_smem + {off}); // the cluster merge's receive area");
            }
        }
        if let Some(off) = scratch {
            wl!(s, "  float* const mi_scratch = reinterpret_cast<float*>(mi_smem + {off}); // matmul split-K");
        }
        if let Some((_, Some(off))) = &self.flash {
            wl!(s, "  float* const mi_fa = reinterpret_cast<float*>(mi_smem + {off}); // attention slice combine");
        }
        if let Some(off) = self.flash_remote {
            wl!(
                s,
                "  float* const mi_fa_remote = reinterpret_cast<float*>(mi_smem + {off}); // the cluster's partials"
            );
        }
        // Byte range of each materialised tile (staged tiles: all stages).
        let mut range: Vec<Option<(usize, usize)>> = vec![None; bg.tensors.len()];
        for (t, b) in buf_of.iter().enumerate() {
            if let (Some(b), Some(st)) = (b, self.storage[t]) {
                let ty = st.cty();
                let off = buffers[*b].offset;
                range[t] = Some((off, off + buffers[*b].size));
                let is_staged = self.layout[t].is_some_and(|l| l.staged);
                let var = if is_staged { format!("t{t}_st") } else { format!("t{t}") };
                wl!(
                    s,
                    "  {ty}* const {var} = reinterpret_cast<{ty}*>(mi_smem + {off}); // {:?} {}",
                    bg.tensors[t].dims,
                    st.name()
                );
            }
        }
        if let Some(off) = self.ws {
            s.push_str(&self.ws_producer(off, &staged)?);
        }
        // With a third attention warpgroup (`ws_three`): the block graph's threads alone run
        // the steps before the loop (closed where the loop starts).
        if self.ws3 {
            wl!(s, "  if (tid < NT) {{ // the third attention warpgroup joins at the loop");
        }
        // Whether barriers span the third attention warpgroup too (the loop to `finish`).
        let mut wide = false;
        // Barriers only where a step reads bytes written, or writes bytes touched, since the
        // last barrier (buffers share memory across lifetimes, so this is by byte range).
        let mut dirty_w: Vec<(usize, usize)> = Vec::new();
        let mut dirty_r: Vec<(usize, usize)> = Vec::new();
        let overlaps = |a: &[(usize, usize)], b: &[(usize, usize)]| {
            a.iter().any(|&(lo, hi)| b.iter().any(|&(l2, h2)| lo < h2 && l2 < hi))
        };
        let ranges_of = |ts: &[STensorId]| -> Vec<(usize, usize)> { ts.iter().filter_map(|&t| range[t]).collect() };
        let mut in_loop = false;
        let mut exited = false;
        // Tiles whose copies were issued (outside the pipeline) but not yet waited for.
        let mut pending: Vec<STensorId> = Vec::new();
        let loop_start = steps.iter().position(|(sec, _)| *sec == Section::Loop);
        // Prologue: the first stages of every staged tile (one cp.async group per stage, empty
        // past the loop's end, so that waiting for all but the newest `stages - 2` groups
        // means "this stage").
        // (None in the warp-specialised form: its producer issues every stage.)
        let mut prologue = String::new();
        let prologue_stages = if self.ws.is_some() { 0 } else { n_stages.saturating_sub(1) };
        for st in 0..prologue_stages {
            if !staged.is_empty() && st < bg.forloop_range {
                for &(k, op, t) in &staged {
                    let dst = format!("(t{t}_st + {})", st * self.stage_elems(t));
                    for l in self.load(k, op, t, Some(&st.to_string()), &dst)?.lines() {
                        wl!(prologue, "  {l}");
                    }
                }
            }
            wl!(prologue, "  mi::cp_async_commit();");
        }
        if late.is_some_and(|at| at < 0) {
            wl!(prologue, "  mi::dep_launch(); // every copy is issued");
        }
        // Issued before the pre-loop computation (QK-norm's Q, normalised from device memory)
        // where none of its tiles shares bytes with the stages, so that the first stage's
        // copies are in flight meanwhile. (Waits on older copies then wait for these too.)
        let stage_bytes: Vec<(usize, usize)> = staged.iter().filter_map(|&(_, _, t)| range[t]).collect();
        let mut early = !staged.is_empty()
            && steps.iter().zip(step_rw).all(|(&(sec, _), (w, r))| {
                sec != Section::Pre || !(overlaps(&ranges_of(w), &stage_bytes) || overlaps(&ranges_of(r), &stage_bytes))
            });
        // Warpgroup products whose tiles are the loop's loaded inputs are issued first in the
        // iteration (right after its loads) and waited for before the first step that writes
        // bytes they read, or at the iteration's end, so that the steps between run beside
        // them (RMSNorm+Linear's row sums of squares).
        let order = self.wg_first_order(steps);
        // Warpgroup accumulators with products in flight, and the bytes those read.
        let mut inflight: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
        let waits = |inflight: &mut Vec<(usize, Vec<(usize, usize)>)>, ind: &str| -> String {
            inflight.drain(..).map(|(acc, _)| format!("{ind}mm{acc}.wait();\n")).collect()
        };
        for pos in order {
            let (sec, step) = &steps[pos];
            if early && *sec == Section::Pre && !matches!(step, Step::Load { .. }) {
                s.push_str(&prologue);
                prologue.clear();
                early = false;
            }
            if *sec == Section::Loop && !in_loop {
                if self.ws3 {
                    wl!(s, "  }}");
                    wide = true;
                }
                for (_, st) in steps {
                    if let Step::MatAcc { op, acc } = *st {
                        wl!(s, "  {} mm{acc};", self.mma_acc_type(op));
                    }
                    if let Step::Accum { op } = *st {
                        if let Some(ty) = self.sum_acc(op) {
                            wl!(s, "  {ty} rs{op};");
                        }
                    }
                }
                if let Some((f, off)) = &self.flash {
                    let ld = |t: STensorId| self.layout[t].map_or(self.dims(t)[self.dims(t).len() - 1], |l| l.ld);
                    let ty = self.storage[f.k].map_or("float", Storage::cty);
                    let tq = self.storage[f.q].map_or("float", Storage::cty);
                    if let Some((rg, ks)) = f.wg {
                        let ilv = if self.ws.is_some() && self.ws_interleaved() { ", true" } else { "" };
                        let (threads, ks) = if self.ws3 { ("NC", 3) } else { ("NT", ks) };
                        wl!(
                            s,
                            "  mi::FlashWG<{threads}, {}, {}, {}, {}, {}, {rg}, {ks}, {ty}, {tq}, {}, {}{ilv}> fa;",
                            f.batch,
                            f.m,
                            f.d,
                            f.n,
                            ld(f.q),
                            self.layout[f.q].is_some_and(|l| l.swz.is_some()),
                            f.x.is_some()
                        );
                    } else {
                        let (rg, ks) = f.warps(self.nt);
                        let cw = f.chunk(rg, ks);
                        wl!(
                            s,
                            "  mi::Flash<NT, {}, {}, {}, {}, {}, {}, {}, {}, {rg}, {ks}, {cw}, {ty}, {tq}, {}> fa;",
                            f.batch,
                            f.m,
                            f.d,
                            f.n,
                            f.dv,
                            ld(f.q),
                            ld(f.k),
                            ld(f.v),
                            f.x.is_some()
                        );
                    }
                    if off.is_some() {
                        // The planner's combine scratch must hold what the runtime's `finish`
                        // writes there.
                        wl!(
                            s,
                            "  static_assert(decltype(fa)::scratch_floats<{}>() * 4 <= {}, \"attention combine scratch\");",
                            self.cluster.max(1),
                            combine_bytes(f, self.nt, self.ws3)
                        );
                    }
                    if self.flash_remote.is_some() {
                        wl!(
                            s,
                            "  static_assert(decltype(fa)::remote_floats<{}>() * 4 <= {}, \"attention cluster partials\");",
                            self.cluster,
                            f.remote_bytes(self.cluster)
                        );
                    }
                    wl!(s, "  fa.init();");
                }
                // The prologue (unless issued earlier), then the loop.
                if !prologue.is_empty() {
                    if overlaps(&stage_bytes, &dirty_w) || overlaps(&stage_bytes, &dirty_r) {
                        wl!(s, "  __syncthreads();");
                    }
                    s.push_str(&prologue);
                    prologue.clear();
                }
                in_loop = true;
                if self.ws.is_some() {
                    // The whole loop is the region's `run_ws` (`Step::Flash`), fed by the
                    // producer: the consumers' own copies (Q) land and are published to the
                    // tensor cores first.
                    wl!(s, "  mi::cp_async_wait<0>();");
                    wl!(s, "  mi::fence_proxy_async();");
                    wl!(s, "  {}", self.sync_wide(wide));
                    pending.clear();
                } else {
                    if wg.is_some() {
                        // Two iterations per pass let the compiler rename the S registers the
                        // wgmma form carries a step ahead instead of copying them.
                        wl!(s, "#pragma unroll 2");
                    }
                    wl!(s, "  for (int it = 0; it < {}; ++it) {{", bg.forloop_range);
                    if staged.is_empty() {
                        // Copies issued before the loop and not yet waited for land before this
                        // barrier, which then publishes them (not a wait and a barrier in every
                        // iteration at their first reader).
                        if !pending.is_empty() {
                            wl!(s, "    mi::cp_async_wait<0>();");
                            pending.clear();
                        }
                        wl!(s, "    __syncthreads();");
                    } else if n_stages >= 2 {
                        // The wgmma form with three stages or more also reads the next iteration's
                        // K (a step ahead); its tiles are then made visible to the tensor cores'
                        // (async-proxy) reads.
                        wl!(s, "    mi::cp_async_wait<{}>();", n_stages - if self.wg_lookahead() { 3 } else { 2 });
                        if wgmma {
                            wl!(s, "    mi::fence_proxy_async();");
                        }
                        wl!(s, "    __syncthreads();");
                        for &(_, _, t) in &staged {
                            let ty = self.storage[t].map_or("float", Storage::cty);
                            wl!(s, "    {ty}* const t{t} = t{t}_st + (it % {n_stages}) * {};", self.stage_elems(t));
                        }
                        let ahead = n_stages - 1;
                        wl!(s, "    if (it + {ahead} < {}) {{", bg.forloop_range);
                        for &(k, op, t) in &staged {
                            let dst = format!("(t{t}_st + ((it + {ahead}) % {n_stages}) * {})", self.stage_elems(t));
                            for l in self.load(k, op, t, Some(&format!("(it + {ahead})")), &dst)?.lines() {
                                wl!(s, "      {l}");
                            }
                        }
                        wl!(s, "    }}");
                        wl!(s, "    mi::cp_async_commit();");
                        if let Some(at) = late.filter(|&at| at >= 0) {
                            wl!(s, "    if (it == {at}) mi::dep_launch(); // the last copies are issued");
                        }
                    } else {
                        wl!(s, "    __syncthreads();");
                        for &(k, op, t) in &staged {
                            let ty = self.storage[t].map_or("float", Storage::cty);
                            wl!(s, "    {ty}* const t{t} = t{t}_st;");
                            for l in self.load(k, op, t, Some("it"), &format!("t{t}"))?.lines() {
                                wl!(s, "    {l}");
                            }
                        }
                        wl!(s, "    mi::cp_async_commit();");
                        wl!(s, "    mi::cp_async_wait<0>();");
                        if wgmma {
                            wl!(s, "    mi::fence_proxy_async();");
                        }
                        wl!(s, "    __syncthreads();");
                    }
                }
                // A barrier publishes only the copies already waited for: tiles still in
                // flight stay dirty, so their first reader gets its wait and a barrier after it.
                dirty_w.clear();
                dirty_w.extend(ranges_of(&pending));
                dirty_r.clear();
            }
            if *sec == Section::Post && in_loop {
                // (The warp-specialised form has no loop statement: `run_ws` is the loop.)
                if self.ws.is_none() {
                    s.push_str(&waits(&mut inflight, "    "));
                    wl!(s, "  }}");
                    if !staged.is_empty() {
                        wl!(s, "  mi::cp_async_wait<0>();");
                    }
                }
                in_loop = false;
            }
            if let Step::Load { op, .. } = step {
                if self.layout[bg.ops[*op].outputs[0]].is_some_and(|l| l.staged) {
                    continue; // issued by the pipeline above
                }
            }
            // In a cluster split, the blocks but the first leave once the merges are done.
            if self.cluster > 1
                && !self.halves
                && *sec == Section::Post
                && !matches!(step, Step::MatAccEnd { .. } | Step::ClusterMerge | Step::Finalize { .. } | Step::FlashEnd)
                && !exited
            {
                wl!(s, "  if (mi::cluster_rank() != 0) return; // merged into the cluster's first block");
                exited = true;
            }
            let ind = if in_loop && self.ws.is_none() { "    " } else { "  " };
            let (mut w, mut r) = (ranges_of(&step_rw[pos].0), ranges_of(&step_rw[pos].1));
            if let Some((off, bytes)) = self.finish_scratch(*step) {
                w.push((off, off + bytes));
                r.push((off, off + bytes));
            }
            // The copies of tiles loaded outside the pipeline are waited for just before the
            // first step that touches one, so that every load before it is in flight at once
            // (LoRA issued its four inputs one round trip after another).
            // Before any loop, only up to the newest copy group the step touches (one group
            // per load, committed in order).
            if !matches!(step, Step::Load { .. }) {
                let newest = pending.iter().rposition(|&t| {
                    let tr = ranges_of(&[t]);
                    overlaps(&tr, &r) || overlaps(&tr, &w)
                });
                if let Some(i) = newest {
                    let before_loop = loop_start.is_none_or(|l| pos < l);
                    let keep = if before_loop { pending.len() - 1 - i } else { 0 };
                    wl!(s, "{ind}mi::cp_async_wait<{keep}>();");
                    pending.drain(..pending.len() - keep);
                }
            }
            // (One warpgroup chain at a time: two in flight, as two accumulators of one chain,
            // ran slower on the H200.)
            let wg_step = matches!(*step, Step::MatAcc { op, .. } if self.wg_acc[op]);
            if wg_step || inflight.iter().any(|(_, read)| overlaps(&w, read)) {
                s.push_str(&waits(&mut inflight, ind));
            }
            if overlaps(&r, &dirty_w) || overlaps(&w, &dirty_w) || overlaps(&w, &dirty_r) {
                wl!(s, "{ind}{}", self.sync_wide(wide));
                dirty_w.clear();
                dirty_w.extend(ranges_of(&pending));
                dirty_r.clear();
            }
            let body = match *step {
                Step::Load { k, op } => {
                    let t = bg.ops[op].outputs[0];
                    let mut b = self.load(k, op, t, None, &format!("t{t}"))?;
                    b.push_str("mi::cp_async_commit();\n");
                    // A tile first read in the loop is waited for there: the loop's first wait
                    // covers every older copy group, so its copies overlap the prologue's.
                    let read_before_loop = steps[pos + 1..]
                        .iter()
                        .zip(&step_rw[pos + 1..])
                        .any(|((sec, _), (_, r))| *sec == Section::Pre && r.contains(&t));
                    if staged.is_empty() || read_before_loop {
                        pending.push(t);
                    }
                    b
                }
                _ => self.step(*step, *sec)?,
            };
            for l in body.lines() {
                wl!(s, "{ind}{l}");
            }
            if let (true, Step::MatAcc { acc, .. }) = (wg_step, *step) {
                inflight.push((acc, r.clone()));
            }
            if wide && matches!(step, Step::FlashEnd) {
                wl!(s, "  if (tid >= NT) return; // the third attention warpgroup: merged");
                wide = false;
            }
            dirty_w.extend(w);
            dirty_r.extend(r);
        }
        if in_loop && self.ws.is_none() {
            s.push_str(&waits(&mut inflight, "    "));
            wl!(s, "  }}");
        }
        if !pending.is_empty() {
            wl!(s, "  mi::cp_async_wait<0>();");
        }
        wl!(s, "}}");
        Ok(s)
    }

    /// The order the kernel emits `steps` in: theirs, but for the loop's warpgroup
    /// accumulations ([`Ctx::wg_acc`]) whose two tiles are inputs loaded before the loop's
    /// first other step: those move right before that step.
    fn wg_first_order(&self, steps: &[(Section, Step)]) -> Vec<usize> {
        let bg = self.bg;
        let in_loop = |p: usize| steps[p].0 == Section::Loop;
        let Some(first) = (0..steps.len()).find(|&p| {
            in_loop(p)
                && !matches!(steps[p].1, Step::Load { .. })
                && !matches!(steps[p].1, Step::MatAcc { op, .. } if self.wg_acc[op])
        }) else {
            return (0..steps.len()).collect();
        };
        let loaded_before = |t: STensorId| {
            steps[..first].iter().any(|&(_, st)| matches!(st, Step::Load { op, .. } if bg.ops[op].outputs[0] == t))
        };
        let hoisted: Vec<usize> = (first..steps.len())
            .filter(|&p| in_loop(p))
            .filter(|&p| matches!(steps[p].1, Step::MatAcc { op, .. } if self.wg_acc[op] && bg.ops[op].inputs.iter().all(|&t| loaded_before(t))))
            .collect();
        let mut order: Vec<usize> = Vec::with_capacity(steps.len());
        for p in (0..steps.len()).filter(|p| !hoisted.contains(p)) {
            if p == first {
                order.extend(&hoisted);
            }
            order.push(p);
        }
        order
    }

    /// The division of mean or rms accumulator `op`'s summed tile, in place (and the root).
    fn finalize_divide(&self, op: usize) -> String {
        let o = self.bg.ops[op].outputs[0];
        let e = self.finalized(op, &format!("t{o}[i]"));
        format!("for (int i = tid; i < {}; i += NT) t{o}[i] = {e};\n", numel(self.dims(o)))
    }

    /// Mean or rms accumulator `op`'s value from its summed element `sum` (a C++ float).
    fn finalized(&self, op: usize, sum: &str) -> String {
        let aop = &self.bg.ops[op];
        let dx = self.dims(aop.inputs[0]);
        let n = dx[dx.len() - 1] * self.bg.forloop_range * self.cluster;
        match aop.kind {
            BlockOpKind::ForloopAccum { acc: Accum::Rms, eps } => {
                format!("sqrtf({sum} / {}{})", flit(n as f32), crate::default_kernels::plus_eps(eps))
            }
            _ => format!("{sum} / {}", flit(n as f32)),
        }
    }

    /// In a lazy cluster merge, the mean or rms accumulator op whose merged tile is `t`.
    fn lazily_finalized(&self, t: STensorId) -> Option<usize> {
        (0..self.bg.ops.len()).find(|&j| finalized(&self.bg.ops[j].kind) && self.bg.ops[j].outputs[0] == t)
    }

    /// Where merged tile `t` lies in a block's slot of the cluster merge's receive area (floats).
    fn slot_offset(&self, t: STensorId) -> usize {
        let before = self.merged_by_step.iter().take_while(|&&m| m != t);
        before.map(|&m| numel(self.dims(m)).next_multiple_of(4)).sum()
    }

    /// In a lazy cluster merge, merged tile `t`'s element `idx` as the eager merge leaves it:
    /// this block's sum plus every other block's slot, in rank order, then a mean's division
    /// or an rms's root.
    fn merged_read(&self, t: STensorId, idx: &str) -> String {
        let slot = self.recv.map_or(0, |(_, slot)| slot);
        let at = self.slot_offset(t);
        let mut sum = format!("t{t}[{idx}]");
        for r in 1..self.cluster {
            sum = format!("{sum} + mi_recv[{} + ({idx})]", (r - 1) * slot + at);
        }
        match self.lazily_finalized(t) {
            Some(op) => self.finalized(op, &format!("({sum})")),
            None => format!("({sum})"),
        }
    }

    /// A summing cluster's merge of its fp32 tiles `ts` (`mi::cluster_push`): every block but
    /// the first stores its tiles into the first block's receive area and leaves; the first
    /// block waits for them on the cluster barrier and adds them to its own.
    fn cluster_push(&self, ts: &[STensorId]) -> Result<String> {
        let Some((off, slot)) = self.recv else {
            return unsupported("internal error: a cluster merge without its receive area");
        };
        let mut s = if self.lazy {
            // (`mi_recv` is declared at the kernel's start: the readers after the merge use it.)
            String::from("{ // the cluster's sums into its first block's receive area, added where read\n")
        } else {
            format!("{{ // the cluster's sums into its first block\nfloat* const mi_recv = reinterpret_cast<float*>(mi_smem + {off});\n")
        };
        s.push_str("mi::cluster_wait(); // every block of the cluster has started\nif (mi::cluster_rank() != 0) {\n");
        let mut gather = String::new();
        let mut bytes = 0;
        for &t in ts {
            let (n, at) = (numel(self.dims(t)), self.slot_offset(t));
            if self.async_push {
                wl!(s, "  mi::cluster_push_async<NT>(t{t}, mi_recv + {at}, {slot}, {n}, mi_merge_bar);");
            } else {
                wl!(s, "  mi::cluster_push<NT>(t{t}, mi_recv + {at}, {slot}, {n});");
            }
            wl!(gather, "mi::cluster_gather<NT, {}>(t{t}, mi_recv + {at}, {slot}, {n});", self.cluster);
            bytes += n * 4;
        }
        if self.async_push {
            wl!(
                s,
                "  return;\n}}\nif (tid == 0) mi::cluster_merge_arm(mi_merge_bar, {}u);",
                (self.cluster - 1) * bytes
            );
            s.push_str("mi::mbar_wait(mi_merge_bar, 0);\n");
        } else {
            s.push_str(
                "  mi::cluster_arrive_release();\n  return;\n}\nmi::cluster_arrive_relaxed();\nmi::cluster_wait();\n",
            );
        }
        if !self.lazy {
            s.push_str(&gather);
            s.push_str("__syncthreads();\n");
        }
        s.push_str("}\n");
        Ok(s)
    }

    /// Adds fp32 tiles `ts` of every block of the cluster into the first block's, between two
    /// cluster barriers (the first makes every block's tiles visible, the second keeps them
    /// alive until read).
    fn cluster_sum(&self, ts: &[STensorId]) -> String {
        let mut s = String::from("mi::cluster_sync();\n");
        for &t in ts {
            wl!(s, "mi::cluster_sum<NT, {}>(t{t}, {});", self.cluster, numel(self.dims(t)));
        }
        s.push_str("mi::cluster_sync();\n");
        s
    }

    /// The body of element-wise group `g` at element `i` of its output (a C++ int in scope):
    /// its inputs and ops as `const float r..` lines into `s`, each line after `indent`;
    /// returns the name of the result.
    fn group_body(&self, g: usize, s: &mut String, indent: &str) -> String {
        let grp = &self.groups[g];
        let od = self.dims(grp.output);
        let reads: Vec<String> = grp.inputs.iter().map(|&x| self.read(x, &bcast(od, "i", self.dims(x)))).collect();
        self.group_ops(g, s, indent, &reads, &[])
    }

    /// The statements of group `g` over its input values `reads` (one expression each); returns
    /// the name of the result. A division by input `r` with `rcp[r]` multiplies by `x{r}_rcp`
    /// (its reciprocal, computed once by the caller).
    fn group_ops(&self, g: usize, s: &mut String, indent: &str, reads: &[String], rcp: &[bool]) -> String {
        let grp = &self.groups[g];
        for (r, x) in reads.iter().enumerate() {
            let unused = if rcp.get(r) == Some(&true) { "[[maybe_unused]] " } else { "" };
            wl!(s, "{indent}{unused}const float r{r} = {x};");
        }
        let n_in = grp.thread_graph.num_inputs;
        for (k, op) in grp.thread_graph.ops.iter().enumerate() {
            let e = match *op {
                ThreadOp::Unary { op, arg } => unary_expr(&op, &format!("r{arg}")),
                ThreadOp::Binary { op: BinaryOp::Div, lhs, rhs } if rcp.get(rhs) == Some(&true) => {
                    format!("(r{lhs} * x{rhs}_rcp)")
                }
                ThreadOp::Binary { op, lhs, rhs } => binary_expr(op, &format!("r{lhs}"), &format!("r{rhs}")),
            };
            wl!(s, "{indent}const float r{} = {e};", n_in + k);
        }
        format!("r{}", n_in + grp.thread_graph.ops.len() - 1)
    }

    /// [`tile_base`] in this block graph.
    fn tile_base(&self, map: [i64; 3], fdim: i64, tile: &[usize], strides: &[usize], iter: Option<&str>) -> String {
        tile_base(self.bg, map, fdim, tile, strides, iter)
    }

    /// Element offset inside a device tensor of tile element `idx` (tile dims, device strides).
    fn tile_elem_offset(tile: &[usize], strides: &[usize], idx: &str) -> String {
        dev_offset(tile, idx, tile, strides)
    }

    fn step(&self, step: Step, sec: Section) -> Result<String> {
        let bg = self.bg;
        let nt = "NT";
        let mut s = String::new();
        match step {
            Step::Load { .. } => return unsupported("internal error: loads are emitted by the kernel schedule"),
            Step::MatAcc { op, acc } => {
                let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
                // The warpgroup form's products stay in flight until `mm.wait()` (the loop's
                // emission places it).
                let call = if self.wg_acc[op] { "issue" } else { "step" };
                wl!(s, "mm{acc}.{call}({}, {});", self.tile(a), self.tile(b));
            }
            Step::ClusterMerge => {
                s.push_str(&self.cluster_push(&self.merged_by_step)?);
                let divided =
                    |j: &usize| finalized(&bg.ops[*j].kind) && self.merged_by_step.contains(&bg.ops[*j].outputs[0]);
                for op in (0..bg.ops.len()).filter(|j| !self.lazy && divided(j)) {
                    s.push_str(&self.finalize_divide(op));
                }
            }
            Step::MatAccEnd { acc } => {
                let o = bg.ops[acc].outputs[0];
                let c = self.at(o, "c");
                let sc = self.scratch_arg(step, &format!("decltype(mm{acc})"), &mut s);
                wl!(s, "mm{acc}.finish({sc}, [&](int c) -> float& {{ return {c}; }});");
            }
            Step::Flash => {
                let Some((f, _)) = &self.flash else { return unsupported("internal error: no attention region") };
                let (q, k, v) = (self.tile(f.q), self.tile(f.k), self.tile(f.v));
                // With V normalised (`mi::rms_norm_rows_frag`, in place): with the lookahead
                // (its next stage landed too) each iteration normalises the next stage a part
                // after each block's P V, and the first iteration its own stage first;
                // otherwise each iteration its own stage before the step. The loop's first
                // barrier, after a proxy fence, publishes the writes to the wgmma reads.
                let mut between = String::new();
                // (The warp-specialised form scales P by V's row factors instead: `run_ws`'s VN.)
                if f.v_norm && self.ws.is_none() {
                    let Some(l) = self.layout[f.v] else { return unsupported("internal error: V has no layout") };
                    let ty = self.storage[f.v].map_or("float", |st| st.cty());
                    let norm = format!(
                        "mi::rms_norm_rows_frag<NT, {}, {}, {}, {}, {ty}",
                        l.rows,
                        l.inner,
                        l.ld,
                        l.swz.is_some()
                    );
                    let lookahead = self.wg_lookahead();
                    if lookahead {
                        // One part per block of the step (`between(j)`, j < the step's NB).
                        let (st, elems) = (self.stages, self.stage_elems(f.v));
                        between = format!(
                            ", [&](int j) {{ if (it + 1 < {}) {norm}, decltype(fa)::NB>({v}_st + ((it + 1) % {st}) * {elems}, j); }}",
                            bg.forloop_range
                        );
                        wl!(s, "if (it == 0) {{");
                    }
                    let pad = if lookahead { "  " } else { "" };
                    wl!(s, "{pad}{norm}>({v});");
                    wl!(s, "{pad}mi::fence_proxy_async();");
                    wl!(s, "{pad}__syncthreads();");
                    if lookahead {
                        wl!(s, "}}");
                    }
                }
                if self.ws.is_some() {
                    // The whole loop, over the stages the producer fills.
                    let mut tmpl = self.stages.to_string();
                    let mut args = format!(
                        "{q}, {k}_st, {v}_st, {}, {}, mi_full, mi_empty, {}",
                        self.stage_elems(f.k),
                        self.stage_elems(f.v),
                        bg.forloop_range
                    );
                    let (mut vn, mut split) = ("false", "false");
                    let (mut rs, mut vfull) = ("nullptr".to_string(), "nullptr");
                    if f.v_norm {
                        // V's row factors, after the mbarriers (`ws_barriers_bytes`).
                        let ty = self.storage[f.v].map_or("float", |st| st.cty());
                        let at = ws_barriers_bytes(self.stages, self.ws_split_v());
                        vn = "true";
                        rs = format!("reinterpret_cast<{ty}*>(reinterpret_cast<unsigned char*>(mi_full) + {at})");
                    } else if self.ws_split_v() {
                        (split, vfull) = ("true", "mi_vfull");
                    }
                    // The optional template arguments and parameters, up to the last one that
                    // is not its default.
                    let trail = |given: Vec<String>, defaults: &[&str]| {
                        let keep = (0..given.len()).rev().find(|&i| given[i] != defaults[i]).map_or(0, |i| i + 1);
                        given[..keep].iter().map(|g| format!(", {g}")).collect::<String>()
                    };
                    let qn = if self.q_norm_in_softmax().is_some() { "true" } else { "false" };
                    tmpl.push_str(&trail(
                        vec![vn.to_string(), split.to_string(), qn.to_string()],
                        &["false", "false", "false"],
                    ));
                    args.push_str(&trail(vec![rs, vfull.to_string()], &["nullptr", "nullptr"]));
                    wl!(s, "fa.run_ws<{tmpl}>({args});");
                } else if f.wg.is_some() {
                    // With three stages or more, the next iteration's K stage (already waited
                    // for; at the last iteration a stale stage whose S is never used); else no
                    // lookahead across iterations (each step starts its own S).
                    let (st, elems) = (self.stages, self.stage_elems(f.k));
                    if self.wg_lookahead() {
                        wl!(
                            s,
                            "fa.step<true>({q}, {k}, {v}, {k}_st + ((it + 1) % {st}) * {elems}, it == 0, it + 1 == {}{between});",
                            bg.forloop_range
                        );
                    } else {
                        wl!(s, "fa.step<false>({q}, {k}, {v}, nullptr, true, false);");
                    }
                } else {
                    wl!(s, "fa.step({q}, {k}, {v}, it == 0);");
                }
            }
            Step::FlashEnd => {
                let Some((f, off)) = &self.flash else { return unsupported("internal error: no attention region") };
                let opt = |t: Option<STensorId>| t.map_or("nullptr".to_string(), |t| self.tile(t));
                let cs = if self.halves {
                    format!("<{}, true, true>", self.cluster)
                } else if self.ws.is_some() {
                    format!("<{}, true>", self.cluster.max(1))
                } else if self.cluster > 1 {
                    format!("<{}>", self.cluster)
                } else {
                    String::new()
                };
                wl!(
                    s,
                    "fa.finish{cs}({}, {}, {}, {}{});",
                    if off.is_some() { "mi_fa" } else { "nullptr" },
                    self.tile(f.o),
                    opt(f.l),
                    opt(f.x),
                    if self.flash_remote.is_some() { ", mi_fa_remote" } else { "" }
                );
            }
            Step::Save { j, op } => {
                let BlockOpKind::Output { omap, forloop_dim } = bg.ops[op].kind else {
                    return unsupported("internal error: save of a non-output op");
                };
                let t = bg.ops[op].inputs[0];
                let tile = self.dims(t);
                let dev = &self.outs[j];
                let base =
                    self.tile_base(omap, forloop_dim, tile, &dev.strides, (sec == Section::Loop).then_some("it"));
                wl!(s, "{{ // t{t} -> output {j}");
                wl!(s, "  const long long base = {base};");
                // A dense fp32 tile into rows of 8-element multiples: eight values a store.
                let dense = self.streamed[t].is_none()
                    && self.storage[t] == Some(Storage::F32)
                    && self.layout[t].is_none_or(|l| l.ld == l.inner && l.swz.is_none());
                if dense && rows_of(8, tile, &dev.strides) {
                    wl!(s, "  const bool vec = mi::aligned16(out{j});");
                    wl!(
                        s,
                        "  for (int i = tid * 8; i < {}; i += {nt} * 8) mi::store_n<8>(out{j} + base + {}, {} + i, vec);",
                        numel(tile),
                        Self::tile_elem_offset(tile, &dev.strides, "i"),
                        self.tile(t)
                    );
                } else {
                    wl!(
                        s,
                        "  for (int i = tid; i < {}; i += {nt}) out{j}[base + {}] = mi::from_f32<{}>({});",
                        numel(tile),
                        Self::tile_elem_offset(tile, &dev.strides, "i"),
                        dev.storage.cty(),
                        self.read(t, "i")
                    );
                }
                wl!(s, "}}");
            }
            Step::Group { g } => {
                let out = self.groups[g].output;
                wl!(
                    s,
                    "for (int i = tid; i < {}; i += {nt}) {{ // fused element-wise -> t{out}",
                    numel(self.dims(out))
                );
                let r = self.group_body(g, &mut s, "  ");
                wl!(s, "  {} = {};", self.at(out, "i"), self.conv(out, &r));
                wl!(s, "}}");
            }
            Step::GroupSave { g, j, op, w } => {
                let BlockOpKind::Output { omap, forloop_dim } = bg.ops[op].kind else {
                    return unsupported("internal error: save of a non-output op");
                };
                let out = self.groups[g].output;
                let tile = self.dims(out);
                let dev = &self.outs[j];
                let base = self.tile_base(omap, forloop_dim, tile, &dev.strides, None);
                wl!(s, "{{ // fused element-wise -> output {j}");
                wl!(s, "  const long long base = {base};");
                wl!(s, "  const bool vec = mi::aligned16(out{j});");
                if self.halves {
                    // This block's half of the rows ([`Ctx::finish_halves`]).
                    let half = numel(tile) / 2;
                    wl!(s, "  const int lo = (int)mi::cluster_rank() * {half};");
                    wl!(s, "  for (int i{w} = lo + tid * {w}; i{w} < lo + {half}; i{w} += {nt} * {w}) {{");
                } else {
                    wl!(s, "  for (int i{w} = tid * {w}; i{w} < {}; i{w} += {nt} * {w}) {{", numel(tile));
                }
                wl!(s, "    float v[{w}];");
                // Each thread's run of w elements lies in one output row. An input over the
                // whole tile in plain fp32 rows is read 16 bytes at a time before the run (one
                // float at a time, a warp's reads were 8-way bank conflicts: GQA b=8's output
                // pass took 1.1 us); one broadcast along the rows is read once for the run, and
                // a division by it multiplies by its reciprocal (within 1.5 ulp of the quotient
                // instead of 0.5, as the row norms' rsqrtf: the attention epilogue's O / L, an
                // IEEE division per element, cost GQA b=8 0.6 us).
                let n_in = self.groups[g].thread_graph.num_inputs;
                let divisor = |r: usize| {
                    self.groups[g]
                        .thread_graph
                        .ops
                        .iter()
                        .any(|op| matches!(*op, ThreadOp::Binary { op: BinaryOp::Div, rhs, .. } if rhs == r))
                };
                let mut rcp = vec![false; n_in];
                let mut reads = Vec::new();
                for (r, &x) in self.groups[g].inputs.iter().enumerate() {
                    let xd = self.dims(x);
                    let plain = self.streamed[x].is_none()
                        && self.storage[x] == Some(Storage::F32)
                        && self.layout[x].is_none_or(|l| l.index("i") == "i");
                    if plain && xd == tile {
                        wl!(s, "    float x{r}[{w}];");
                        wl!(s, "    mi::load_f32_n<{w}>(x{r}, t{x} + i{w});");
                        if self.lazy && self.merged_by_step.contains(&x) {
                            // The other blocks' sums, as `merged_read` (16 bytes at a time).
                            let (slot, at) = (self.recv.map_or(0, |(_, slot)| slot), self.slot_offset(x));
                            for rank in 1..self.cluster {
                                wl!(s, "    {{");
                                wl!(s, "      float y[{w}];");
                                wl!(s, "      mi::load_f32_n<{w}>(y, mi_recv + {} + i{w});", (rank - 1) * slot + at);
                                wl!(s, "#pragma unroll");
                                wl!(s, "      for (int e = 0; e < {w}; ++e) x{r}[e] += y[e];");
                                wl!(s, "    }}");
                            }
                            if let Some(op) = self.lazily_finalized(x) {
                                let e = self.finalized(op, &format!("x{r}[e]"));
                                wl!(s, "#pragma unroll");
                                wl!(s, "    for (int e = 0; e < {w}; ++e) x{r}[e] = {e};");
                            }
                        }
                        reads.push(format!("x{r}[e]"));
                    } else if xd.len() == tile.len() && xd.last() == Some(&1) {
                        wl!(s, "    const float x{r} = {};", self.read(x, &bcast(tile, &format!("i{w}"), xd)));
                        if r < n_in && divisor(r) {
                            wl!(s, "    const float x{r}_rcp = 1.0f / x{r};");
                            rcp[r] = true;
                        }
                        reads.push(format!("x{r}"));
                    } else {
                        reads.push(self.read(x, &bcast(tile, "i", xd)));
                    }
                }
                wl!(s, "#pragma unroll");
                wl!(s, "    for (int e = 0; e < {w}; ++e) {{");
                wl!(s, "      [[maybe_unused]] const int i = i{w} + e;");
                let r = self.group_ops(g, &mut s, "      ", &reads, &rcp);
                wl!(s, "      v[e] = {r};");
                wl!(s, "    }}");
                let at = Self::tile_elem_offset(tile, &dev.strides, &format!("i{w}"));
                wl!(s, "    mi::store_n<{w}>(out{j} + base + {at}, v, vec);");
                wl!(s, "  }}");
                wl!(s, "}}");
            }
            Step::Matmul { op, acc } => {
                let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
                let epi = match acc {
                    None => {
                        let o = bg.ops[op].outputs[0];
                        format!("{} = {};", self.at(o, "c"), self.conv(o, "v"))
                    }
                    Some(ac) => {
                        let aop = &bg.ops[ac];
                        let o = aop.outputs[0];
                        match aop.kind {
                            BlockOpKind::ForloopAccumRescale { .. } => {
                                let sc = aop.inputs[1];
                                format!(
                                    "t{o}[c] = it == 0 ? v : t{o}[c] * {} + v;",
                                    self.read(sc, &bcast(self.dims(o), "c", self.dims(sc)))
                                )
                            }
                            _ => format!("t{o}[c] = (it == 0 ? 0.0f : t{o}[c]) + v;"),
                        }
                    }
                };
                let sw = |t: STensorId| self.layout[t].is_some_and(|l| l.swz.is_some());
                let flags = if sw(a) || sw(b) { format!(", {}, {}", sw(a), sw(b)) } else { String::new() };
                wl!(
                    s,
                    "mi::matmul_tile<{nt}, {}{flags}>({}, {}, mi_scratch, [&](int c, float v) {{ {epi} }});",
                    self.mm_shape(op),
                    self.tile(a),
                    self.tile(b)
                );
            }
            Step::Reduce { op } => {
                let BlockOpKind::Reduction { dim } = bg.ops[op].kind else {
                    return unsupported("internal error: reduce of a non-reduction op");
                };
                let (x, o) = (bg.ops[op].inputs[0], bg.ops[op].outputs[0]);
                let d = self.dims(x);
                if let (true, Some((ld, cty))) = (dim + 1 == d.len(), self.vec_rows(x)) {
                    wl!(
                        s,
                        "mi::row_sums_vec<{nt}, {}, {}, {ld}>(static_cast<const {cty}*>({}), [](float x) {{ return x; }}, [&](int o, float v) {{ {} = {}; }});",
                        numel(&d[..dim]),
                        d[dim],
                        self.tile(x),
                        self.at(o, "o"),
                        self.conv(o, "v")
                    );
                    return Ok(s);
                }
                wl!(
                    s,
                    "mi::reduce<{nt}, {}, {}, {}, false>([&](int i) {{ return {}; }}, [&](int o, float v) {{ {} = {}; }});",
                    numel(&d[..dim]),
                    d[dim],
                    numel(&d[dim + 1..]),
                    self.read(x, "i"),
                    self.at(o, "o"),
                    self.conv(o, "v")
                );
            }
            Step::RedMax { op } => {
                let BlockOpKind::ReductionMax { dim } = bg.ops[op].kind else {
                    return unsupported("internal error: reduction_max of another op");
                };
                let x = bg.ops[op].inputs[0];
                let (mo, dd) = (bg.ops[op].outputs[0], bg.ops[op].outputs[1]);
                let d = self.dims(x);
                let has_d = self.storage[dd].is_some();
                let first = if sec == Section::Loop { "it == 0" } else { "true" };
                let wd0 = if has_d { format!(" t{dd}[o] = v - v;") } else { String::new() };
                let wd1 = if has_d { format!(" t{dd}[o] = p - nm;") } else { String::new() };
                wl!(
                    s,
                    "mi::reduce<{nt}, {}, {}, {}, true>([&](int i) {{ return {}; }}, [&](int o, float v) {{",
                    numel(&d[..dim]),
                    d[dim],
                    numel(&d[dim + 1..]),
                    self.read(x, "i")
                );
                wl!(s, "  if ({first}) {{ t{mo}[o] = v;{wd0} }}");
                wl!(s, "  else {{ const float p = t{mo}[o]; const float nm = fmaxf(p, v);{wd1} t{mo}[o] = nm; }}");
                wl!(s, "}});");
            }
            Step::RmsNorm { op } => {
                let (x, o) = (bg.ops[op].inputs[0], bg.ops[op].outputs[0]);
                let d = self.dims(x);
                let len = d[d.len() - 1];
                // With an epsilon: the rows as `mi::rms_norm_rows` shares them, eps added to the
                // mean of squares (the specialised forms below have none).
                if let BlockOpKind::RmsNorm { eps } = bg.ops[op].kind {
                    if eps != 0.0 {
                        wl!(
                            s,
                            "mi::share_reduce<{nt}, {}, {len}, 1>(0.0f, [&](int i) {{ const float x = {}; return x * x; }}, [](float a, float b) {{ return a + b; }}, [&](int r, float ss, int first, int step) {{ const float inv = 1.0f / sqrtf(ss / {} + {}); for (int l = first; l < {len}; l += step) {{ const int i = r * {len} + l; {} = {}; }} }});",
                            numel(d) / len,
                            self.read(x, "i"),
                            flit(len as f32),
                            flit(eps),
                            self.at(o, "i"),
                            self.conv(o, &format!("({}) * inv", self.read(x, "i")))
                        );
                        return Ok(s);
                    }
                }
                // The attention's Q, normalised by its softmax: the rows as they are.
                if self.q_norm_in_softmax() == Some(op) {
                    if let Some((k, row, _)) = self.device_rows(x) {
                        let n = numel(d);
                        wl!(s, "{{ // Q's rows as copied: the softmax applies their norm (`run_ws`'s QN)");
                        wl!(s, "  const auto row = [&](int r) {{ return {row}; }};");
                        wl!(s, "  if (mi::aligned16(in{k})) {{");
                        wl!(s, "    for (int i = tid * 8; i < {n}; i += {nt} * 8) mi::cp_async16({} + mi::swz<64, 8>(i), row(i / 64) + i % 64);", self.tile(o));
                        wl!(s, "  }} else {{");
                        wl!(s, "    for (int i = tid; i < {n}; i += {nt}) {} = row(i / 64)[i % 64];", self.at(o, "i"));
                        wl!(s, "  }}");
                        wl!(s, "  mi::cp_async_commit();");
                        wl!(s, "}}");
                        return Ok(s);
                    }
                }
                // A staged 16-bit tile into a 16-bit tile: whole rows in registers, 16 bytes a time.
                let ldo = self.layout[o].map_or(len, |l| l.ld);
                // QK-norm's Q under the wgmma form goes swizzled (see the layouts): the loop's
                // first proxy fence makes its writes visible to the tensor cores.
                let swz = self.layout[o].is_some_and(|l| l.swz.is_some());
                if let Some((ldi, cty)) = self.vec_rows(x) {
                    if !swz && self.storage[o] == self.storage[x] && ldo.is_multiple_of(8) && len / 8 <= 16 * 32 {
                        wl!(
                            s,
                            "mi::rms_norm_rows_vec<{nt}, {}, {len}, {ldi}, {ldo}, {cty}>({}, {});",
                            numel(d) / len,
                            self.tile(x),
                            self.tile(o)
                        );
                        return Ok(s);
                    }
                }
                let scalar = format!(
                    "mi::rms_norm_rows<{nt}, {}, {len}>([&](int i) {{ return {}; }}, [&](int i, float v) {{ {} = {}; }});",
                    numel(d) / len,
                    self.read(x, "i"),
                    self.at(o, "i"),
                    self.conv(o, "v")
                );
                // Rows straight from device memory: 16-byte loads, a row per few lanes.
                if let Some((k, row, cty)) = self.device_rows(x) {
                    wl!(s, "if (mi::aligned16(in{k})) {{");
                    wl!(
                        s,
                        "  mi::rms_norm_rows_ld<{nt}, {}, {len}, {cty}>([&](int r) {{ return {row}; }}, [&](int i, float v) {{ {} = {}; }});",
                        numel(d) / len,
                        self.at(o, "i"),
                        self.conv(o, "v")
                    );
                    wl!(s, "}} else {{");
                    wl!(s, "  {scalar}");
                    wl!(s, "}}");
                } else {
                    wl!(s, "{scalar}");
                }
            }
            Step::Concat { op } => {
                let BlockOpKind::Concat { dim } = bg.ops[op].kind else {
                    return unsupported("internal error: concat of another op");
                };
                let (a, b, o) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1], bg.ops[op].outputs[0]);
                let (da, db, od) = (self.dims(a), self.dims(b), self.dims(o));
                let (ra, rb) = (row_major(da), row_major(db));
                let la = da[dim];
                let cs: Vec<String> = (0..od.len()).map(|k| coord(od, k, "i")).collect();
                let ia: Vec<String> = (0..od.len()).map(|k| format!("({}) * {}", cs[k], ra[k])).collect();
                let ib: Vec<String> = (0..od.len())
                    .map(|k| {
                        if k == dim {
                            format!("({} - {la}) * {}", cs[k], rb[k])
                        } else {
                            format!("({}) * {}", cs[k], rb[k])
                        }
                    })
                    .collect();
                wl!(s, "for (int i = tid; i < {}; i += {nt}) {{ // concat -> t{o}", numel(od));
                wl!(
                    s,
                    "  {} = {};",
                    self.at(o, "i"),
                    self.conv(
                        o,
                        &format!(
                            "({}) < {la} ? {} : {}",
                            cs[dim],
                            self.read(a, &ia.join(" + ")),
                            self.read(b, &ib.join(" + "))
                        )
                    )
                );
                wl!(s, "}}");
            }
            Step::Accum { op } if self.sum_acc(op).is_some() => {
                wl!(s, "rs{op}.step({});", self.tile(bg.ops[op].inputs[0]));
            }
            Step::Accum { op } => {
                let aop = &bg.ops[op];
                let (x, o) = (aop.inputs[0], aop.outputs[0]);
                let dx = self.dims(x);
                let od = self.dims(o);
                let scale = |idx: &str| match aop.kind {
                    BlockOpKind::ForloopAccumRescale { .. } => {
                        let sc = aop.inputs[1];
                        Some(self.read(sc, &bcast(od, idx, self.dims(sc))))
                    }
                    _ => None,
                };
                let combine = |idx: &str, v: &str| -> String {
                    match (&aop.kind, scale(idx)) {
                        (BlockOpKind::ForloopAccumMax, _) => {
                            format!("t{o}[{idx}] = it == 0 ? {v} : fmaxf(t{o}[{idx}], {v});")
                        }
                        (_, Some(sc)) => format!("t{o}[{idx}] = it == 0 ? {v} : t{o}[{idx}] * {sc} + {v};"),
                        (_, None) => format!("t{o}[{idx}] = (it == 0 ? 0.0f : t{o}[{idx}]) + {v};"),
                    }
                };
                let acc = match aop.kind {
                    BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => acc,
                    _ => Accum::None,
                };
                let last = dx.len() - 1;
                let rows = numel(&dx[..last]);
                match acc {
                    Accum::None => {
                        wl!(s, "for (int i = tid; i < {}; i += {nt}) {{ // accumulate -> t{o}", numel(od));
                        wl!(s, "  const float x = {};", self.read(x, "i"));
                        wl!(s, "  {}", combine("i", "x"));
                        wl!(s, "}}");
                    }
                    Accum::Sum | Accum::Mean | Accum::Rms | Accum::SumToDimx => {
                        let (len, inner) = if acc == Accum::SumToDimx {
                            (dx[last] / bg.reduction_dimx, bg.reduction_dimx)
                        } else {
                            (dx[last], 1)
                        };
                        if let (1, Some((ld, cty))) = (inner, self.vec_rows(x)) {
                            let map = if acc == Accum::Rms { "x * x" } else { "x" };
                            wl!(
                                s,
                                "mi::row_sums_vec<{nt}, {rows}, {len}, {ld}>(static_cast<const {cty}*>({}), [](float x) {{ return {map}; }}, [&](int o, float v) {{ {} }});",
                                self.tile(x),
                                combine("o", "v")
                            );
                            return Ok(s);
                        }
                        let load = if acc == Accum::Rms {
                            format!("const float x = {}; return x * x;", self.read(x, "i"))
                        } else {
                            format!("return {};", self.read(x, "i"))
                        };
                        wl!(
                            s,
                            "mi::reduce<{nt}, {rows}, {len}, {inner}, false>([&](int i) {{ {load} }}, [&](int o, float v) {{ {} }});",
                            combine("o", "v")
                        );
                    }
                }
            }
            Step::Finalize { op } => {
                let o = bg.ops[op].outputs[0];
                if self.sum_acc(op).is_some() {
                    let sc = self.scratch_arg(step, &format!("decltype(rs{op})"), &mut s);
                    wl!(s, "rs{op}.finish({sc}, [&](int r) -> float& {{ return t{o}[r]; }});");
                    if sc == "nullptr" && self.cluster == 1 {
                        // One slice: rows are stored by their fragments' lanes, read below by others.
                        wl!(s, "__syncthreads();");
                    }
                }
                // A summing cluster divides in its merge, once every block's sums are added.
                if !self.merged_by_step.contains(&o) {
                    if self.cluster > 1 {
                        wl!(s, "{}", self.cluster_sum(&[o]));
                    }
                    s.push_str(&self.finalize_divide(op));
                }
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bank group (4 banks, 16 bytes) of 16-bit element `e` of a tile.
    fn group(l: &Layout, e: usize) -> usize {
        (l.offset(e) * 2 / 16) % 8
    }

    /// Whether 16-bit elements `es` of a tile (8 accesses of 16 bytes) fall in 8 distinct bank
    /// groups: one conflict-free shared-memory wavefront.
    fn conflict_free(l: &Layout, es: impl Iterator<Item = usize>) -> bool {
        let mut g: Vec<usize> = es.map(|e| group(l, e)).collect();
        g.sort_unstable();
        g.dedup();
        g.len() == 8
    }

    #[test]
    fn swizzled_narrow_rows_are_free_of_bank_conflicts() {
        for inner in [16, 32] {
            let l = Layout { inner, ld: inner, swz: Some(8), blocks: false, rows: 64, vector: true, staged: true };
            let chunks = inner / 8;
            for row0 in (0..64).step_by(8) {
                for c in 0..chunks {
                    // ldmatrix: one chunk of 8 consecutive rows.
                    let ldsm = (0..8).map(|r| (row0 + r) * inner + c * 8);
                    assert!(conflict_free(&l, ldsm), "inner {inner}, rows {row0}.., chunk {c}");
                }
                // cp.async: a quarter warp's 8 consecutive 16-byte chunks (spanning rows).
                let copies = (0..8).map(|q| row0 * inner + q * 8);
                assert!(conflict_free(&l, copies), "inner {inner}, copies from row {row0}");
            }
            // A permutation of each row's elements.
            for row in 0..64 {
                let mut o: Vec<usize> = (0..inner).map(|c| l.offset(row * inner + c)).collect();
                o.sort_unstable();
                assert_eq!(o, (row * inner..(row + 1) * inner).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn wide_swizzled_rows_are_column_blocks_of_one_atom_each() {
        // [64, 256] as 4 blocks of [64, 64]: a permutation; each block is 8 KiB of its own,
        // and within a block every row's 8 chunks are XOR-swizzled by the row (conflict-free).
        let l = Layout { inner: 256, ld: 256, swz: Some(8), blocks: true, rows: 64, vector: true, staged: true };
        let mut seen = vec![false; 64 * 256];
        for i in 0..64 * 256 {
            let o = l.offset(i);
            assert!(!seen[o], "element {i} shares offset {o}");
            seen[o] = true;
            let (row, col) = (i / 256, i % 256);
            assert_eq!(o / 4096, col / 64, "element {i} leaves its column block");
            assert_eq!((o % 4096) / 64, row, "element {i} leaves its row");
        }
        for blk in 0..4 {
            assert!(conflict_free(&l, (0..8).map(|r| r * 256 + blk * 64)), "block {blk}: one chunk of 8 rows");
        }
    }

    #[test]
    fn wide_row_major_swizzled_rows_keep_each_line_whole_and_ldmatrix_conflict_free() {
        // [32, 256] row-major: every 128-byte segment of a row is a permutation of itself (a
        // copy of one global line fills one aligned shared line), and one chunk of any 8
        // consecutive rows (an ldmatrix phase) meets 8 distinct bank groups.
        for inner in [64, 128, 256] {
            let l = Layout { inner, ld: inner, swz: Some(8), blocks: false, rows: 32, vector: true, staged: true };
            for row in 0..32 {
                for seg in 0..inner / 64 {
                    let mut o: Vec<usize> = (0..64).map(|c| l.offset(row * inner + seg * 64 + c)).collect();
                    o.sort_unstable();
                    let base = row * inner + seg * 64;
                    assert_eq!(o, (base..base + 64).collect::<Vec<_>>(), "inner {inner} row {row} segment {seg}");
                }
            }
            for row0 in (0..32).step_by(8) {
                for c in 0..inner / 8 {
                    let ldsm = (0..8).map(|r| (row0 + r) * inner + c * 8);
                    assert!(conflict_free(&l, ldsm), "inner {inner}, rows {row0}.., chunk {c}");
                }
            }
        }
    }

    #[test]
    fn padding_alone_cannot_serve_narrow_rows() {
        // The reason for the swizzle: with 64-byte rows at any 16-byte-multiple pitch, either an
        // ldmatrix phase or a quarter warp's copies hit a bank group twice.
        for pad in 0..8 {
            let l =
                Layout { inner: 32, ld: 32 + pad * 8, swz: None, blocks: false, rows: 64, vector: true, staged: true };
            let ldsm = conflict_free(&l, (0..8).map(|r| r * 32));
            let copies = conflict_free(&l, (0..8).map(|q| q * 8));
            assert!(!(ldsm && copies), "pitch {}", l.ld);
        }
    }
}
