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
//!
//! Planning and emission are apart. Planning ([`plan`]: the form chosen and every decision
//! as a [`plan::KernelPlan`]) runs in `plan.rs` (the forms and their predicates),
//! `schedule.rs` (the steps), `layout.rs` (tile layouts) and `smem.rs` (shared memory and
//! pipeline depth). Emission writes a plan as CUDA through [`Ctx`](ctx::Ctx): `ctx.rs` (tile
//! reads and types), `kernel.rs` (the kernel's frame: declarations, pipeline, barriers),
//! `step.rs` (one step each), `load.rs` (copies and prefetches), `attention.rs` (the
//! attention region's loop and producer) and `merge.rs` (cluster merges and finalisation).

mod attention;
mod ctx;
mod kernel;
mod layout;
mod load;
mod merge;
pub(crate) mod plan;
#[cfg(test)]
mod plan_tests;
mod schedule;
mod smem;
mod step;
#[cfg(test)]
mod tests;

use std::cell::Cell;

use mirage_ugraph::{BlockGraph, Target};

use crate::error::Result;
use crate::generate::WsWarpgroups;
use crate::program::DevBuffer;
use crate::runtime::Parts;

pub(crate) use load::tile_base;

/// Alignment of every shared-memory buffer in bytes.
const SMEM_ALIGN: usize = 16;
/// Byte alignment of swizzled tiles: a 128-byte line.
const SWZ_ALIGN: usize = 128;
/// Alignment of the attention's K and V tiles under the wgmma form (the 128-byte swizzle
/// repeats every 1024 bytes and is taken from address bits).
const WG_ALIGN: usize = 1024;

/// The optional template arguments or parameters of a runtime call, `", a, b"`: `given` up to
/// the last one that differs from its default in `defaults` (the rest are left to the defaults).
fn trailing(given: &[String], defaults: &[&str]) -> String {
    let keep = (0..given.len()).rev().find(|&i| given[i] != defaults[i]).map_or(0, |i| i + 1);
    given[..keep].iter().map(|g| format!(", {g}")).collect()
}

/// Where a step runs: before the loop (once), in it (every iteration), or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Section {
    /// Before the loop.
    Pre,
    /// In the loop.
    Loop,
    /// After the loop.
    Post,
}

/// One unit of a block kernel's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
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
    /// The runtime header parts the kernel's code uses.
    pub parts: Parts,
}

/// The emitter's choices that `Options` sets (from the environment where the Python package
/// generates).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Knobs {
    /// Consumer warpgroups of the interleaved warp-specialised attention loop (`plan::ws_three`).
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
    /// where they fit (`layout::wg_acc_fits`; sm_90 only): `BlockGraph::warpgroup_acc` or
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
    match plan::choose(name, bg, ins, outs, arch, knobs)? {
        plan::KernelForm::Registers(e) => {
            #[cfg(test)]
            tests::record(name, None);
            Ok(e)
        }
        plan::KernelForm::Block { graph, plan } => {
            #[cfg(test)]
            tests::record(name, Some(&plan));
            let cluster = plan.cluster_dims;
            let (smem_bytes, extra_threads) = (plan.smem_bytes, plan.extra_threads);
            let ctx = ctx::Ctx { bg: &graph, ins, outs, plan: *plan, parts: Cell::new(Parts::NONE) };
            let source = ctx.kernel(name)?;
            Ok(Emitted { source, smem_bytes, cluster, extra_threads, parts: ctx.parts.get() })
        }
    }
}
