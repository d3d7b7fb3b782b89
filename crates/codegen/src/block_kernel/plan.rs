//! The plan of a block kernel: every decision made before any CUDA text is written.
//!
//! [`choose`] is where a customized op's kernel form is chosen, in order: register rows
//! (`rowreg`), register element-wise loops (`eltloop`), then the shared-memory schedule of
//! this module, for which it tries
//!
//! 1. on sm_90, where the attention region asks three consumer warpgroups
//!    ([`three_candidate`]), the graph's loop made twice as fine, kept only if the plan takes
//!    the three-warpgroup warp-specialised form ([`ws_three`]);
//! 2. on sm_90, a cluster split of a loop whose grid leaves SMs idle
//!    (`BlockGraph::cluster_split_within`), with the wgmma attention or, without a region,
//!    summing accumulators, in smaller clusters until the shared memory fits;
//! 3. the graph as it is, with the attention region as wgmma (sm_90), mma.sync, or op by op.
//!
//! Each try is a [`Planner`] run ([`plan_with`]): the steps (`schedule.rs`), the tile layouts
//! (`layout.rs`), the shared memory and pipeline depth (`smem.rs`), and the attention variant
//! ([`AttentionVariant`]: which loop, how many warpgroups, the warp-specialised loop's
//! options) whose predicates are the functions of this module. The result is a
//! [`KernelPlan`], plain data that emission (`ctx.rs`, `kernel.rs`, `step.rs`, ...) writes
//! out without deciding again.

use std::borrow::Cow;

use mirage_ugraph::block::MAX_CLUSTER_SPLIT;
use mirage_ugraph::{BlockGraph, BlockOpKind, Budgets, FusedGroup, STensorId, Target};

use super::layout::Layout;
use super::load::rows_of;
use super::schedule::liveness;
use super::smem::Buffer;
use super::{Emitted, Knobs, Section, Step};
use crate::emit::numel;
use crate::error::{unsupported, Result};
use crate::flash::{self, FlashRegion};
use crate::generate::WsWarpgroups;
use crate::program::{DevBuffer, Storage};

/// How the attention region, if any, is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlashMode {
    /// Not matched: the region's ops are emitted one by one.
    Off,
    /// `mi::Flash` (mma.sync).
    Mma,
    /// `mi::FlashWG` (wgmma, sm_90a).
    Wgmma,
}

/// The loop the attention region runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttentionForm {
    /// `mi::Flash::step`: mma.sync, every warp copies and computes.
    Mma,
    /// `mi::FlashWG::step`: wgmma, every warp copies and computes.
    Wgmma,
    /// `mi::FlashWG::run_ws`: a producer warpgroup fills the stages behind mbarriers for the
    /// consumer warpgroups ([`ws_form`]).
    WarpSpecialised,
}

/// How a normalised V (QK-norm's) is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VNorm {
    /// V is not normalised.
    None,
    /// Each stage's rows are normalised in place (`mi::rms_norm_rows_frag`).
    InPlace,
    /// The consumers scale P by V's row factors (the `mi::VRowFactors` hooks).
    RowFactors,
}

/// The runtime's attention variant struct (attention.cuh) that `mi::FlashWG` is instantiated
/// with: what the loop computes beyond softmax(Q K) V, through hooks `run_ws` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VariantHooks {
    /// `mi::PlainAttention`: every hook does nothing.
    Plain,
    /// `mi::QRowScales`: the softmax applies Q's rms norm (its rows' factors in the exponents).
    QRowScales,
    /// `mi::VRowFactors`: P is scaled by V's row factors before P V.
    VRowFactors,
    /// `mi::QkNormAttention`: both.
    QkNorm,
}

impl VariantHooks {
    /// The variant of a loop whose softmax applies Q's norm (`q`) and whose P takes V's row
    /// factors (`v`).
    pub(crate) fn of(q: bool, v: bool) -> Self {
        match (q, v) {
            (false, false) => Self::Plain,
            (true, false) => Self::QRowScales,
            (false, true) => Self::VRowFactors,
            (true, true) => Self::QkNorm,
        }
    }

    /// The C++ type.
    pub(crate) fn cpp(self) -> &'static str {
        match self {
            Self::Plain => "mi::PlainAttention",
            Self::QRowScales => "mi::QRowScales",
            Self::VRowFactors => "mi::VRowFactors",
            Self::QkNorm => "mi::QkNormAttention",
        }
    }
}

/// The attention region's variant: the form and the options of its loop (the template
/// arguments of `mi::Flash` / `mi::FlashWG` and `run_ws`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionVariant {
    /// The loop.
    pub form: AttentionForm,
    /// Row groups and key slices per warpgroup (wgmma forms) or per warp (`mi::Flash`).
    pub row_groups: usize,
    /// See `row_groups`.
    pub key_slices: usize,
    /// Consumer warpgroups of the warp-specialised loop (2, or 3 with [`ws_three`]; 0 in the
    /// other forms).
    pub consumer_warpgroups: usize,
    /// The warp-specialised loop's warpgroups take whole stages in turn ([`ws_interleaved`]).
    pub interleaved: bool,
    /// The wgmma step reads the next iteration's K a step ahead (three stages or more).
    pub lookahead: bool,
    /// How a normalised V is applied.
    pub v_norm: VNorm,
    /// The variant struct whose hooks the loop calls: Q's rms norm in the softmax
    /// ([`Planner::q_norm_op`]) and V's row factors ([`VNorm::RowFactors`]).
    pub hooks: VariantHooks,
    /// V is marked full on an mbarrier of its own ([`ws_split_v`], `run_ws`'s SPLITV).
    pub split_v: bool,
    /// Each block of a cluster pair finishes half the rows ([`Planner::finish_halves`]).
    pub halves: bool,
}

/// A mean or rms accumulator whose row sums stay in registers (`mi::RowSumAcc`;
/// [`Planner::row_sums`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowSums {
    /// Rows and row length of the summed loop tile.
    pub rows: usize,
    pub len: usize,
    /// Row pitch of the tile in shared memory.
    pub ld: usize,
    /// The tile's storage (16-bit).
    pub storage: Storage,
    /// The rows are swizzled (`swz<len, 8>`), and in column blocks (`swzb`).
    pub swizzled: bool,
    pub blocks: bool,
    /// Sums of squares (rms) rather than of values (mean).
    pub rms: bool,
}

/// Every decision of one shared-memory block kernel: its steps, tiles, layouts, shared memory,
/// pipeline, cluster merge and attention variant. Emission reads it and decides nothing.
#[derive(Debug, Clone)]
pub(crate) struct KernelPlan {
    /// Threads of the block graph.
    pub nt: usize,
    /// Elements of the output tile each warp of warpgroup 0 reads back after the attention's
    /// finish, where the steps after it run on that warpgroup alone ([`own_rows`]).
    pub own_rows: Option<usize>,
    /// The target's budgets (the warp-specialised form's register split).
    pub budgets: Budgets,
    /// The fused element-wise groups.
    pub groups: Vec<FusedGroup>,
    /// The steps in emission order, by section.
    pub steps: Vec<(Section, Step)>,
    /// Each step's written and read tiles.
    pub step_rw: Vec<(Vec<STensorId>, Vec<STensorId>)>,
    /// Storage of each tile (None: not computed).
    pub storage: Vec<Option<Storage>>,
    /// For input tiles read straight from device memory: the block input position.
    pub streamed: Vec<Option<usize>>,
    /// For each block input position, its input op.
    pub input_ops: Vec<usize>,
    /// Shared-memory layout of input tiles loaded into shared memory.
    pub layout: Vec<Option<Layout>>,
    /// Pipeline stages of the loop's staged input tiles.
    pub stages: usize,
    /// The register-resident attention region and its combine scratch offset.
    pub flash: Option<(FlashRegion, Option<usize>)>,
    /// The attention region's variant.
    pub attention: Option<AttentionVariant>,
    /// The offset of the area where the other blocks of its cluster leave their partials.
    pub flash_remote: Option<usize>,
    /// Blocks of a thread-block cluster that split the loop (1: none).
    pub cluster: usize,
    /// Blocks per cluster along each grid axis (all 1: no clusters).
    pub cluster_dims: [usize; 3],
    /// The accumulator tiles `Step::ClusterMerge` adds across the cluster.
    pub merged_by_step: Vec<STensorId>,
    /// The first block's receive area of that merge (`mi::cluster_push`): its byte offset and
    /// the floats of one block's slot.
    pub recv: Option<(usize, usize)>,
    /// The merge is lazy (`Knobs::lazy_merge`): the merged tiles' readers add the slots.
    pub lazy: bool,
    /// The merge's pushes complete on an mbarrier after the receive area (`Knobs::async_push`).
    pub async_push: bool,
    /// Copies of tiles read once carry the L2 policy evict_first (`Knobs::evict_first`).
    pub evict_first: bool,
    /// Per op: a loop matmul summed on the warpgroup tensor cores (`Knobs::wgmma_acc`).
    pub wg_acc: Vec<bool>,
    /// Per op: the shared scratch (byte offset, bytes) of the `finish` of its register
    /// accumulator (`mi::MmaAcc` of a loop matmul's accumulator, `mi::RowSumAcc`).
    pub acc_scratch: Vec<Option<(usize, usize)>>,
    /// Per op: a mean or rms accumulator whose row sums stay in registers.
    pub row_sums: Vec<Option<RowSums>>,
    /// Warp-specialised loop (`FlashWG::run_ws`): the byte offset of its stage mbarriers.
    pub ws: Option<usize>,
    /// The rms norm op whose output Q the warp-specialised softmax normalises (the `mi::QRowScales` hook).
    pub q_norm_op: Option<usize>,
    /// The placed shared-memory buffers.
    pub buffers: Vec<Buffer>,
    /// Each tile's buffer.
    pub buf_of: Vec<Option<usize>>,
    /// Byte offset of the tile matmuls' split-K scratch, if any.
    pub scratch: Option<usize>,
    /// Dynamic shared memory in bytes.
    pub smem_bytes: usize,
    /// Threads the kernel adds to the block graph's (producer and third warpgroup).
    pub extra_threads: usize,
    /// Blocks an SM must hold at least (the launch bounds' second argument), if any
    /// ([`min_blocks`]).
    pub min_blocks: Option<usize>,
    /// A kernel streaming its inputs through a pipelined loop (cp.async stages, no attention
    /// region) lets the next kernel go only once its last copies are issued: the iteration
    /// after whose copies it calls `mi::dep_launch` (negative: after the prologue's). The next
    /// call's blocks then arrive while this one drains and prefetch their first stages into L2
    /// (`Ctx::prefetches`) before their wait, while the memory would otherwise idle. None: the
    /// kernel waits and lets the next go at once (`mi::dep_enter`).
    pub late_launch: Option<i64>,
}

/// The form a customized op's kernel takes ([`choose`]).
pub(crate) enum KernelForm<'a> {
    /// Register rows or register element-wise loops (`rowreg`, `eltloop`), emitted by their
    /// own modules.
    Registers(Emitted),
    /// The shared-memory schedule of `graph` (the op's block graph, or the finer or cluster
    /// split graph the plan is for).
    Block { graph: Cow<'a, BlockGraph>, plan: Box<KernelPlan> },
}

/// Chooses the kernel form of block graph `bg` (inputs `ins`, outputs `outs`) for `arch`: see
/// the module's header for the order of the tries.
pub(crate) fn choose<'a>(
    name: &str,
    bg: &'a BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    arch: u32,
    knobs: Knobs,
) -> Result<KernelForm<'a>> {
    let wgs = knobs.wgs;
    if let Some(e) = crate::rowreg::emit(name, bg, ins, outs)? {
        return Ok(KernelForm::Registers(e));
    }
    if let Some(e) = crate::eltloop::emit(name, bg, ins, outs)? {
        return Ok(KernelForm::Registers(e));
    }
    // Three attention warpgroups take 64-key stages ([`ws_three`]): a loop of 128-key tiles
    // made twice as fine, where that takes the form; else the graph as it is.
    if arch == 90 && three_candidate(bg, wgs, &knobs.target) {
        if let Ok(fine) = bg.with_finer_loop(2) {
            let three = plan_any(name, &fine, ins, outs, arch, knobs).ok().flatten();
            if let Some((split, plan)) = three.filter(|(_, p)| p.extra_threads == WS3_THREADS + WS_PRODUCER_THREADS) {
                let graph = Cow::Owned(split.unwrap_or(fine));
                return Ok(KernelForm::Block { graph, plan: Box::new(plan) });
            }
        }
    }
    match plan_any(name, bg, ins, outs, arch, knobs)? {
        Some((split, plan)) => {
            let graph = split.map_or(Cow::Borrowed(bg), Cow::Owned);
            Ok(KernelForm::Block { graph, plan: Box::new(plan) })
        }
        None => unsupported(format!("{name}: internal error: no schedule without flash")),
    }
}

/// [`choose`]'s plans of `bg` other than the register kernels, with the cluster split graph
/// the plan is for where it splits the loop across a cluster (else `bg` itself).
fn plan_any(
    name: &str,
    bg: &BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    arch: u32,
    knobs: Knobs,
) -> Result<Option<(Option<BlockGraph>, KernelPlan)>> {
    // A loop whose grid leaves SMs idle is split across the blocks of thread-block clusters
    // (`BlockGraph::cluster_split`) where its attention region takes the warpgroup form or
    // it only sums, in smaller clusters where a block's shared memory would not fit; otherwise
    // it keeps its grid.
    if arch == 90 {
        let mut most = MAX_CLUSTER_SPLIT;
        while let Some((axis, cs, split)) = bg.cluster_split_within(most, &knobs.target) {
            for mode in [FlashMode::Wgmma, FlashMode::Off] {
                if let Some(mut p) = plan_with(name, &split, ins, outs, mode, cs, knobs)? {
                    if p.smem_bytes <= knobs.target.smem_per_block_optin {
                        p.cluster_dims[axis] = cs;
                        return Ok(Some((Some(split), p)));
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
        if let Some(p) = plan_with(name, bg, ins, outs, mode, 1, knobs)? {
            return Ok(Some((None, p)));
        }
    }
    Ok(None)
}

/// Threads of the producer warpgroup a warp-specialised loop adds (`FlashWG::run_ws`).
pub(super) const WS_PRODUCER_THREADS: usize = 128;
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
/// the consumers scale P by the rows' factors (the `mi::VRowFactors` variant): in the 128-row form that
/// measured slower than the plain loop's in-place norm (QK-norm b=16 on the H100: 35.1
/// against 32.4-33.6 us).
pub(super) fn ws_form(
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
        && f.dv == 64
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
pub(super) fn ws_interleaved(f: &FlashRegion) -> bool {
    f.wg == Some((1, 2)) && f.m == 64
}

/// Threads of the third consumer warpgroup of [`ws_three`].
pub(super) const WS3_THREADS: usize = 128;
// The registers a consumer thread of [`ws_three`] takes are the target's
// `Budgets::ws3_consumer_regs`.

/// Whether the interleaved warp-specialised form runs on three consumer warpgroups that take
/// whole 64-key stages in turn (`wgs`: `Options::ws_warpgroups`; by default where V is
/// normalised): S, P and O then fit 160 registers a thread where two warpgroups of 128-key
/// steps take 240. A loop of 128-key tiles takes it made twice as fine
/// (`BlockGraph::with_finer_loop`, see [`choose`]), the producer copying [`WS3_STAGES`] 64-key
/// stages. The block graph's 256 threads run every step; a third warpgroup (threads 256 to
/// 383) joins for the loop and the slices' merge only. On the H100 (saved winners, the
/// bench's timing) QK-norm b=8 took 19.3-19.5 us against 19.8-20.2 with two warpgroups, GQA
/// b=8 16.2-16.4 against 15.4-15.6 (docs/tuning.md).
pub(super) fn ws_three(f: &FlashRegion, wgs: WsWarpgroups) -> bool {
    asks_three(f, wgs) && ws_interleaved(f) && f.n == 64 && f.dv == 64
}

/// Whether `wgs` asks for [`ws_three`] in region `f`.
pub(super) fn asks_three(f: &FlashRegion, wgs: WsWarpgroups) -> bool {
    match wgs {
        WsWarpgroups::Auto => f.v_norm,
        WsWarpgroups::Two => false,
        WsWarpgroups::Three => true,
    }
}

/// Whether `bg` made twice as fine may take [`ws_three`]: an attention region of 64 rows,
/// 128-key tiles and 64-wide values that `wgs` asks three warpgroups for ([`choose`] plans the
/// finer graph only then).
pub(super) fn three_candidate(bg: &BlockGraph, wgs: WsWarpgroups, target: &Target) -> bool {
    let l = liveness(bg);
    flash::find(bg, &l.opneed, &l.uses, target)
        .is_some_and(|f| asks_three(&f, wgs) && f.m == 64 && f.n == 128 && f.dv == 64)
}

/// Bytes of the attention's combine scratch: `FlashRegion::combine_bytes`, or three slices'
/// with [`ws_three`].
pub(super) fn combine_bytes(f: &FlashRegion, nt: usize, ws3: bool) -> usize {
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
pub(super) const WS_ILV_STAGES: usize = 6;
/// Pipeline stages of [`ws_three`]: 160 KB of 64-key K and V stages at 16-bit.
pub(super) const WS3_STAGES: usize = 10;

/// Bytes of mbarriers a stage of the warp-specialised form takes (full and empty: 8 each; with
/// V marked full apart ([`ws_split_v`]) 8 more).
pub(super) const WS_BARRIER_BYTES: usize = 16;

/// Whether the warp-specialised form marks each stage's V full on an mbarrier of its own, after
/// K's (`FlashWG::run_ws`'s SPLITV): the interleaved form without a normalised V, whose S then
/// starts before V has landed. GQA on the H100 (saved winners, bench timing, four runs each):
/// b=8 16.7-17.4 -> 16.3-16.4 us, b=16 26.1-27.2 -> 25.3-25.7. Not the 128-row form (there
/// MQA b=16 went 41.3-42.5 -> 43.5) nor with V's row factors (its factors read V at the step's start).
pub(super) fn ws_split_v(f: &FlashRegion) -> bool {
    ws_interleaved(f) && !f.v_norm
}

/// Byte offset of the warp-specialised form's V-row factors from its first mbarrier: past
/// every stage's mbarriers, 16-byte aligned (read as 16-byte words); with no factors, the
/// mbarriers' bytes.
pub(super) fn ws_barriers_bytes(stages: usize, split_v: bool) -> usize {
    ((WS_BARRIER_BYTES + if split_v { 8 } else { 0 }) * stages).next_multiple_of(16)
}

/// Bytes of the warp-specialised form's V-row factors with a normalised V (`FlashWG::run_ws`'s
/// `rs`: two slots of 128 16-bit factors for each of the two consumer warpgroups).
pub(super) const WS_FACTOR_BYTES: usize = 2 * 2 * 128 * 2;

/// The state of planning one block kernel: the graph's facts and each decision as it is made
/// (the steps in `schedule.rs`, the layouts in `layout.rs`, the memory in `smem.rs`).
pub(super) struct Planner<'a> {
    /// The kernel's name (in error messages).
    pub name: &'a str,
    /// The block graph planned.
    pub bg: &'a BlockGraph,
    /// Its device inputs and outputs.
    pub ins: &'a [DevBuffer],
    pub outs: &'a [DevBuffer],
    /// The options that set choices (`Options`).
    pub knobs: Knobs,
    /// Blocks of the cluster that split the loop (1: none).
    pub cluster: usize,
    /// Threads of the block graph.
    pub nt: usize,
    /// For each block input position, its input op.
    pub input_ops: Vec<usize>,
    /// Tensors and ops some output needs, and each tensor's using ops.
    pub tneed: Vec<bool>,
    pub opneed: Vec<bool>,
    pub uses: Vec<Vec<usize>>,
    /// The fused element-wise groups.
    pub groups: Vec<FusedGroup>,
    /// The attention region in the form tried, if matched.
    pub fr: Option<FlashRegion>,
    /// The steps, by section.
    pub steps: Vec<(Section, Step)>,
    /// A summing cluster split (no attention region): its accumulators are added.
    pub summing: bool,
    /// The tiles `Step::ClusterMerge` merges.
    pub merged_by_step: Vec<STensorId>,
    /// The merge is lazy (`Knobs::lazy_merge`).
    pub lazy: bool,
    /// For input tiles read straight from device memory: the block input position.
    pub streamed: Vec<Option<usize>>,
    /// Storage of each tile (None: not computed).
    pub storage: Vec<Option<Storage>>,
    /// Tiles some matmul reads.
    pub mm_operand: Vec<bool>,
    /// Each tile's first writing and last touching step.
    pub def: Vec<Option<usize>>,
    pub last: Vec<Option<usize>>,
    /// Tiles whose values are carried across iterations.
    pub carried: Vec<bool>,
    /// (step position, group) of each element-wise group step.
    pub group_out_pos: Vec<(usize, usize)>,
    /// Shared-memory layout of each tile that has one.
    pub layout: Vec<Option<Layout>>,
    /// Each tile's live interval over step positions.
    pub interval: Vec<Option<(usize, usize)>>,
    /// Per op: a loop matmul summed on the warpgroup tensor cores.
    pub wg_acc: Vec<bool>,
    /// Those matmuls' operand tiles (1024-byte aligned).
    pub wg_tiles: Vec<STensorId>,
    /// Scratch of the register accumulators' finishes: (step, op, bytes).
    pub acc_scratch: Vec<(usize, usize, usize)>,
}

/// The plan of `bg` with the attention region in form `mode`; `None` when the region was
/// matched but its tiles do not suit that form (then the caller tries the next one). With
/// `cluster` > 1, `bg` is a cluster split ([`BlockGraph::cluster_split`]): with `mode` Wgmma
/// its attention region must take the warpgroup form, with `mode` Off it must have no such
/// region and only summing accumulators of fp32 tiles; either way the blocks merge their
/// accumulators into the cluster's first block, which alone goes on after the loop.
pub(crate) fn plan_with(
    name: &str,
    bg: &BlockGraph,
    ins: &[DevBuffer],
    outs: &[DevBuffer],
    mode: FlashMode,
    cluster: usize,
    knobs: Knobs,
) -> Result<Option<KernelPlan>> {
    let Some(mut p) = Planner::new(name, bg, ins, outs, mode, cluster, knobs)? else { return Ok(None) };
    p.schedule();
    p.stream();
    p.tiles()?;
    if !p.layouts() {
        return Ok(None);
    }
    p.intervals();
    p.warpgroup_accs();
    p.finish_scratches();
    p.finish()
}

impl Planner<'_> {
    /// The plan from the decisions made: the attention variant, the shared memory at its
    /// pipeline depth and the offsets of every area.
    fn finish(self) -> Result<Option<KernelPlan>> {
        let (bg, nt, n_ops, wgs) = (self.bg, self.nt, self.bg.ops.len(), self.knobs.wgs);
        // The interleaved warp-specialised form on three consumer warpgroups merges three slices.
        let ws3 =
            self.fr.as_ref().is_some_and(|f| ws_three(f, wgs) && ws_form(bg, nt, f, &self.layout, &self.steps, true));
        let ilv =
            self.fr.as_ref().is_some_and(|f| ws_interleaved(f) && ws_form(bg, nt, f, &self.layout, &self.steps, ws3));
        let mem = self.memory(ws3, ilv);
        let (buffers, stages) = (&mem.buffers, mem.stages);
        let step_rw: Vec<(Vec<STensorId>, Vec<STensorId>)> = self
            .steps
            .iter()
            .map(|&(sec, st)| {
                let (w, r, _) = self.rw(sec, st);
                (w, r)
            })
            .collect();

        // The combine scratch is the last buffer `place_buffers` pushed, or the one before the remote area
        // of its own; a remote area without one follows the slices' slots in the combine scratch.
        let combine = |f: &FlashRegion| combine_bytes(f, nt, ws3);
        let at = |back: usize| buffers.len().checked_sub(back).map_or(0, |i| buffers[i].offset);
        let combine_at = at(1 + usize::from(mem.own));
        let remote_at =
            (mem.remote > 0).then(|| if mem.own { at(1) } else { combine_at + self.fr.as_ref().map_or(0, combine) });
        // The receive area is the last buffer `place_buffers` pushed (a summing split has no combine).
        let recv = (mem.recv_slot > 0).then(|| (buffers.last().map_or(0, |b| b.offset), mem.recv_slot));
        let mut acc_scratch_at: Vec<Option<(usize, usize)>> = vec![None; n_ops];
        for (j, &(_, op, bytes)) in self.acc_scratch.iter().enumerate() {
            acc_scratch_at[op] = Some((buffers[mem.first_scratch + j].offset, bytes));
        }
        if self.summing
            && (0..n_ops).any(|j| {
                self.opneed[j]
                    && bg.ops[j].kind.is_accumulator()
                    && self.storage[bg.ops[j].outputs[0]] != Some(Storage::F32)
            })
        {
            return Ok(None);
        }
        // Split-K scratch of the tile matmuls (`mi::matmul_tile`): NT * 16 bytes after the tiles.
        let has_matmul = self.steps.iter().any(|(_, st)| matches!(st, Step::Matmul { .. }));
        let scratch = if has_matmul { Some(mem.bytes) } else { None };
        let mut total = mem.bytes + if has_matmul { nt * 16 } else { 0 };
        // The warp-specialised loop (with two stages or more): its full and empty mbarriers
        // (8 bytes each a stage) after it all, then, with V normalised, its rows' factors
        // (16-byte aligned). Without it the three-slice combine scratch goes unused.
        let warp_specialised =
            stages >= 2 && self.fr.as_ref().is_some_and(|f| ws_form(bg, nt, f, &self.layout, &self.steps, ws3));
        let (mut ws, mut halves, mut extra_threads) = (None, false, 0);
        if warp_specialised {
            let off = total.next_multiple_of(16);
            let f = self.fr.as_ref();
            let factors = if f.is_some_and(|f| f.v_norm) { WS_FACTOR_BYTES } else { 0 };
            total = off + ws_barriers_bytes(stages, f.is_some_and(ws_split_v)) + factors;
            ws = Some(off);
            halves = self.finish_halves();
            extra_threads = if ws3 { WS3_THREADS } else { 0 } + WS_PRODUCER_THREADS;
        }
        let ws3 = ws3 && warp_specialised;
        let q_norm_op = self.q_norm_op(ws.is_some(), ws3);
        let attention =
            self.fr.as_ref().map(|f| attention_variant(f, nt, stages, ws.is_some(), ws3, halves, q_norm_op));
        let min_blocks = min_blocks(self.fr.as_ref(), nt, ws.is_some());
        let row_sums: Vec<Option<RowSums>> = (0..n_ops).map(|op| self.row_sums(op)).collect();
        let staged = self.steps.iter().any(|&(_, st)| {
            matches!(st, Step::Load { op, .. } if self.layout[bg.ops[op].outputs[0]].is_some_and(|l| l.staged))
        });
        let late = ws.is_none() && self.fr.is_none() && bg.forloop_range > 1 && stages >= 2 && staged;
        let late_launch = late.then(|| bg.forloop_range as i64 - stages as i64);
        let flash = self.fr.map(|f| {
            let off = (combine(&f) > 0).then_some(combine_at);
            (f, off)
        });
        let mut plan = KernelPlan {
            nt,
            budgets: self.knobs.target.budgets,
            groups: self.groups,
            steps: self.steps,
            step_rw,
            storage: self.storage,
            streamed: self.streamed,
            input_ops: self.input_ops,
            layout: self.layout,
            stages,
            flash,
            attention,
            flash_remote: remote_at,
            cluster: self.cluster,
            cluster_dims: [1; 3],
            merged_by_step: self.merged_by_step,
            recv,
            lazy: self.lazy,
            async_push: self.knobs.async_push,
            evict_first: self.knobs.evict_first,
            wg_acc: self.wg_acc,
            acc_scratch: acc_scratch_at,
            row_sums,
            ws,
            q_norm_op,
            buffers: mem.buffers,
            buf_of: mem.buf_of,
            scratch,
            smem_bytes: total,
            extra_threads,
            min_blocks,
            late_launch,
            own_rows: None,
        };
        plan.own_rows = own_rows(&plan, bg);
        Ok(Some(plan))
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
    fn finish_halves(&self) -> bool {
        let Some(f) = &self.fr else { return false };
        let dims = |t: STensorId| &self.bg.tensors[t].dims;
        // A tile's leading dims (its rows) and its last.
        let rows_width = |t: STensorId| {
            let d = dims(t);
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
            && self.steps.iter().filter(|(sec, _)| *sec == Section::Post).all(|&(_, st)| match st {
                Step::FlashEnd => true,
                Step::GroupSave { g, .. } => row_wise(g),
                _ => false,
            })
    }

    /// The rms norm whose output is the warp-specialised attention's Q (`ws`), where the
    /// softmax applies it (the `mi::QRowScales` variant's hook): Q's 16-bit rows of 64 straight from device
    /// memory into the region's swizzled Q tile of the same type, copied as they are (the rows'
    /// factors scale the exponents); with V's factors too, only on three warpgroups (`ws3`,
    /// [`ws_three`]). QK-norm on the H200 (saved winners, four rounds, against Q normalised
    /// before the loop): b=8 17.48-17.87 against 17.75-17.83 µs, the block's set-up 2837 ->
    /// 2487 cycles; b=16 unchanged (docs/tuning.md); and no rounding of the
    /// normalised Q to 16 bits.
    fn q_norm_op(&self, ws: bool, ws3: bool) -> Option<usize> {
        let f = self.fr.as_ref()?;
        if !ws {
            return None;
        }
        let bg = self.bg;
        let op = bg.ops.iter().position(|o| o.kind == BlockOpKind::RmsNorm { eps: 0.0 } && o.outputs[0] == f.q)?;
        // Its input's rows contiguous in 16-bit device memory (`Ctx::device_rows`).
        let x = bg.ops[op].inputs[0];
        let k = self.streamed[x]?;
        let dev = &self.ins[k];
        if dev.storage == Storage::F32 || !rows_of(8, &bg.tensors[x].dims, &dev.strides) {
            return None;
        }
        let swizzled = self.layout[f.q].is_some_and(|l| l.swz == Some(8) && l.ld == 64 && l.inner == 64 && !l.blocks);
        // (Not in the two-warpgroup form with V's factors too: its 240 registers then spilled
        // 20 / 88 bytes against 4 / 20.)
        let room = ws3 || !f.v_norm;
        (room && swizzled && f.d == 64 && f.x.is_none() && self.storage[f.q] == Some(dev.storage)).then_some(op)
    }
}

/// Blocks an SM must hold at least, for the launch bounds: one for the warp-specialised loop
/// (`ws`); two for an attention region beyond one wave at 256 threads, so that each thread
/// asks for at most 128 registers and two blocks share an SM (latency hiding needs the warps;
/// a grid of one wave gains nothing from the cap; the wgmma form keeps S for a step ahead, so
/// only with two key slices, which halve it); else none.
fn min_blocks(fr: Option<&FlashRegion>, nt: usize, ws: bool) -> Option<usize> {
    let wg = fr.and_then(|f| f.wg);
    let two = fr.is_some_and(|f| !f.one_wave) && nt == 256 && wg.is_none_or(|(_, ks)| ks == 2);
    if ws {
        Some(1)
    } else if two {
        Some(2)
    } else {
        None
    }
}

/// The variant of attention region `f` in a plan of `nt` threads and `stages` stages: `ws`
/// the warp-specialised loop, `ws3` on three consumer warpgroups, `halves` and `q_norm_op`
/// as [`Planner::finish_halves`] and [`Planner::q_norm_op`] decided.
fn attention_variant(
    f: &FlashRegion,
    nt: usize,
    stages: usize,
    ws: bool,
    ws3: bool,
    halves: bool,
    q_norm_op: Option<usize>,
) -> AttentionVariant {
    let form = match f.wg {
        Some(_) if ws => AttentionForm::WarpSpecialised,
        Some(_) => AttentionForm::Wgmma,
        None => AttentionForm::Mma,
    };
    let (row_groups, key_slices) = f.wg.unwrap_or_else(|| f.warps(nt));
    let v_norm = match (f.v_norm, ws) {
        (false, _) => VNorm::None,
        (true, false) => VNorm::InPlace,
        (true, true) => VNorm::RowFactors,
    };
    AttentionVariant {
        form,
        row_groups,
        key_slices: if ws3 { 3 } else { key_slices },
        consumer_warpgroups: if ws3 {
            3
        } else if ws {
            2
        } else {
            0
        },
        interleaved: ws && ws_interleaved(f),
        lookahead: form == AttentionForm::Wgmma && stages >= 3,
        v_norm,
        hooks: VariantHooks::of(q_norm_op.is_some(), v_norm == VNorm::RowFactors),
        split_v: ws && ws_split_v(f),
        halves,
    }
}

/// Elements of the output tile each warp of warpgroup 0 reads back after the attention's
/// finish, where the steps after it run on that warpgroup alone, each warp over the rows it
/// stored itself with a warp barrier between (`FlashRows::store`: warp w of the finishing
/// warpgroup holds rows 16 w to 16 w + 15 of its 64). The form: three consumer warpgroups
/// without a cluster, one group of 64 rows, and every step after the finish a fused
/// element-wise save of the finish's tiles (O, L, X) over those rows, runs within a row.
/// Elsewhere (None) the block graph's threads read every row after a barrier.
/// compute-sanitizer's racecheck reports the second warpgroup's reads of rows the first
/// stored in that form after any barrier, even a `__syncthreads` of every thread of the
/// block, and none with the rows read back by the warps that stored them (docs/codegen.md,
/// "Attention epilogue").
fn own_rows(p: &KernelPlan, bg: &BlockGraph) -> Option<usize> {
    let (f, _) = p.flash.as_ref()?;
    let a = p.attention?;
    if a.consumer_warpgroups != 3 || a.halves || p.cluster > 1 || f.batch != 1 || f.m != 64 || f.wg?.0 != 1 {
        return None;
    }
    let end = p.steps.iter().position(|(_, st)| *st == Step::FlashEnd)?;
    // The saves' loop takes the mapping wherever it applies: none may run before the finish,
    // with every thread still there.
    if p.steps[..end].iter().any(|(_, st)| matches!(st, Step::GroupSave { .. })) {
        return None;
    }
    let finished: Vec<STensorId> = [Some(f.o), f.l, f.x].into_iter().flatten().collect();
    let mut per = None;
    for (_, st) in &p.steps[end + 1..] {
        let Step::GroupSave { g, w, .. } = *st else {
            return None;
        };
        let group = &p.groups[g];
        if !group.inputs.iter().all(|x| finished.contains(x)) {
            return None;
        }
        let (rows, cols) = match bg.tensors[group.output].dims.as_slice() {
            [lead @ .., r, c] if lead.iter().all(|&d| d == 1) => (*r, *c),
            _ => return None,
        };
        // One mapping serves every save: the same row width in each.
        if rows != 64 || w == 0 || cols % w != 0 || per.is_some_and(|p| p != 16 * cols) {
            return None;
        }
        per = Some(16 * cols);
    }
    per
}
