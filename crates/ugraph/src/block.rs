//! Block graphs: what one thread block of a customized kernel op computes, on tiles.
//!
//! Semantics (one place): the grid runs `grid_dim.x * y * z` blocks. A block input splits each
//! data dim named by `imap[axis]` (for grid axes of size > 1; -1 replicates) evenly over that
//! axis, then splits `forloop_dim` of its part into `forloop_range` tiles, one per iteration
//! (-1: the same tile every iteration). The tile offset on the loop dim is
//! `(block part * forloop_range + iteration) * tile`. Ops inside the loop act on tiles; an
//! accumulator ([`Accum`]) closes the loop; ops after it run once. An output places each block's
//! tile at `block coord * tile` along `omap[axis]`, and with `forloop_dim >= 0` saves every
//! iteration's tile side by side along that dim instead of accumulating.
//!
//! Online softmax: `reduction_max(A, dim)` inside the loop returns `(M, D)` where `M` is the
//! running max of `A` over `dim` and all iterations so far and `D = M_prev - M` (0 at the first
//! iteration); `forloop_accum_rescale(A, s)` computes `acc = acc * s + A` (`acc = A` at the
//! first iteration); `forloop_accum_max(A)` is the element-wise max over iterations.

use serde::{Deserialize, Serialize};

use crate::error::{invalid, shape_err, Result};
use crate::limits::{check_size, checked_size_mul, MAX_EXTENT};
use crate::ops::{broadcast_dims, concat_dims, matmul_dims, reduce_dims, Accum, BinaryOp, UnaryOp};
use crate::structural::{self as st, StructuralDef};
use crate::target::Target;
use crate::types::{check_dims, numel, resolve_dim, same_dtype, DType};

/// Most buffers (pipeline stages) a per-iteration input tile gets in shared memory.
pub const MAX_PIPELINE_STAGES: usize = 4;
/// Most blocks of one thread-block cluster that share a block's for-loop
/// ([`BlockGraph::cluster_split`]), within the target's portable cluster size.
pub const MAX_CLUSTER_SPLIT: usize = 8;

/// Index of a tensor in its block graph.
pub type STensorId = usize;

/// When a block-graph tensor is computed relative to the for-loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Same value every iteration (depends only on inputs with `forloop_dim = -1`).
    Invariant,
    /// Changes every iteration.
    Loop,
    /// Computed once after the loop (depends on an accumulator).
    Post,
}

/// A tile-level tensor of a block graph (lives in shared memory / registers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct STensor {
    /// Tile dims.
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// When it is computed.
    pub phase: Phase,
}

/// The op of one block-graph node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BlockOpKind {
    /// Input iterator: loads tiles of the customized op's input with the same position.
    Input {
        /// Dims of the device tensor.
        dims: Vec<usize>,
        /// Element type of the device tensor.
        dtype: DType,
        /// Data dim split over each grid axis (x, y, z), -1 = replicate.
        imap: [i64; 3],
        /// Data dim split over the for-loop, -1 = same tile every iteration.
        forloop_dim: i64,
    },
    /// Output saver: writes the customized op's output with the same position.
    Output {
        /// Data dim each grid axis places blocks along.
        omap: [i64; 3],
        /// -1: save once after the loop; >= 0: save each iteration along this dim.
        forloop_dim: i64,
    },
    /// Tile matmul.
    Matmul,
    /// Element-wise unary op.
    Unary {
        /// The element-wise op.
        op: UnaryOp,
    },
    /// Element-wise binary op with broadcasting.
    Binary {
        /// The element-wise op.
        op: BinaryOp,
    },
    /// Sum over `dim`, kept with size 1.
    Reduction {
        /// Reduced dim.
        dim: usize,
    },
    /// Running max over `dim` and iterations, and its change (two outputs).
    ReductionMax {
        /// Reduced dim.
        dim: usize,
    },
    /// `x / sqrt(mean(x^2) + eps)` over the last dim.
    RmsNorm {
        /// Added to the mean of squares before the root (finite, `>= 0`).
        #[serde(default, skip_serializing_if = "crate::ops::eps_is_zero", with = "crate::json::float")]
        eps: f32,
    },
    /// Concatenation along `dim`.
    Concat {
        /// Concat dim.
        dim: usize,
    },
    /// For-loop accumulator.
    ForloopAccum {
        /// Accumulator kind.
        acc: Accum,
        /// `rms` only: added to the mean of squares before the root (finite, `>= 0`; 0 for
        /// every other kind).
        #[serde(default, skip_serializing_if = "crate::ops::eps_is_zero", with = "crate::json::float")]
        eps: f32,
    },
    /// Rescaling accumulator `acc = acc * scale + x` (inputs: x, scale).
    ForloopAccumRescale {
        /// `None` or `Sum` (sum the last dim of x first).
        acc: Accum,
    },
    /// Element-wise max over iterations.
    ForloopAccumMax,
}

impl BlockOpKind {
    /// The op's name in the Python API.
    pub fn name(&self) -> &'static str {
        match (self, self.def()) {
            (_, Some(d)) => d.name,
            (BlockOpKind::Unary { op }, None) => op.name(),
            (BlockOpKind::Binary { op }, None) => op.name(),
            (_, None) => unreachable!("every block op but the element-wise ones has a structural entry"),
        }
    }

    /// The op's structural registry entry (`None` for the element-wise ops, whose entries are
    /// in [`crate::registry`]).
    pub fn def(&self) -> Option<&'static StructuralDef> {
        match self {
            BlockOpKind::Input { .. } => Some(&st::TB_INPUT),
            BlockOpKind::Output { .. } => Some(&st::TB_OUTPUT),
            BlockOpKind::Matmul => Some(&st::TB_MATMUL),
            BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } => None,
            BlockOpKind::Reduction { .. } => Some(&st::TB_REDUCTION),
            BlockOpKind::ReductionMax { .. } => Some(&st::TB_REDUCTION_MAX),
            BlockOpKind::RmsNorm { .. } => Some(&st::TB_RMS_NORM),
            BlockOpKind::Concat { .. } => Some(&st::TB_CONCAT),
            BlockOpKind::ForloopAccum { .. } => Some(&st::TB_FORLOOP_ACCUM),
            BlockOpKind::ForloopAccumRescale { .. } => Some(&st::TB_FORLOOP_ACCUM_RESCALE),
            BlockOpKind::ForloopAccumMax => Some(&st::TB_FORLOOP_ACCUM_MAX),
        }
    }

    /// Operands the op takes (every block op takes a fixed number).
    pub fn arity(&self) -> usize {
        match (self, self.def()) {
            (_, Some(d)) => d.min_operands,
            (BlockOpKind::Binary { op }, None) => op.def().arity,
            (_, None) => 1,
        }
    }

    /// Whether the op is an accumulator (runs in the loop, produces a post-loop tensor).
    pub fn is_accumulator(&self) -> bool {
        matches!(
            self,
            BlockOpKind::ForloopAccum { .. } | BlockOpKind::ForloopAccumRescale { .. } | BlockOpKind::ForloopAccumMax
        )
    }
}

/// One node of a block graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockOp {
    /// What the node computes.
    pub kind: BlockOpKind,
    /// Operand tensors.
    pub inputs: Vec<STensorId>,
    /// Result tensors.
    pub outputs: Vec<STensorId>,
}

/// What one thread block computes; run by a grid of blocks as one customized kernel op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockGraph {
    /// Blocks per grid axis (x, y, z).
    pub grid_dim: [usize; 3],
    /// Threads per block axis (x, y, z).
    pub block_dim: [usize; 3],
    /// Iterations of the for-loop.
    pub forloop_range: usize,
    /// Width the `sum_todimx` accumulator folds the last dim to.
    pub reduction_dimx: usize,
    /// Nodes in creation (topological) order.
    pub ops: Vec<BlockOp>,
    /// Tensors, indexed by [`STensorId`].
    pub tensors: Vec<STensor>,
    /// A cap on the shared memory the loop's pipeline stages may take
    /// ([`BlockGraph::pipeline_budget`]); None: the grid's budget. The search's co-resident
    /// twin of a one-wave streaming kernel sets [`Target::co_resident_smem`], so that the next call's
    /// blocks fit beside this call's and prefetch while it drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smem_cap: Option<usize>,
    /// Sum the loop's matmuls on the warpgroup tensor cores where the code generator's
    /// transposed form fits (sm_90; 16 or 32 rows times 64 columns): the search's warpgroup
    /// twin sets it, and the GPU's timing decides between the two forms.
    #[serde(default, skip_serializing_if = "is_false")]
    pub warpgroup_acc: bool,
}

/// Serde's test for a default `false`.
fn is_false(b: &bool) -> bool {
    !*b
}

const AXES: [&str; 3] = ["x", "y", "z"];

impl BlockGraph {
    /// Creates an empty block graph, checking the launch parameters.
    pub fn new(
        grid_dim: [usize; 3],
        block_dim: [usize; 3],
        forloop_range: usize,
        reduction_dimx: usize,
    ) -> Result<Self> {
        let op = "new_threadblock_graph";
        if grid_dim.contains(&0) {
            return invalid(op, format!("grid_dim {grid_dim:?} has a zero entry"));
        }
        match grid_dim.iter().try_fold(1usize, |n, &g| n.checked_mul(g)) {
            Some(n) if n <= MAX_EXTENT => {}
            _ => {
                return invalid(
                    op,
                    format!("grid_dim {grid_dim:?} has more than {MAX_EXTENT} (2^31) blocks, the most supported"),
                )
            }
        }
        let threads = block_dim.iter().try_fold(1usize, |n, &b| n.checked_mul(b)).unwrap_or(usize::MAX);
        if threads == 0 || threads > 1024 {
            let n = if threads == usize::MAX { "too many".to_string() } else { threads.to_string() };
            return invalid(op, format!("block_dim {block_dim:?} has {n} threads; 1 to 1024 are allowed"));
        }
        for (name, v) in [("forloop_range", forloop_range), ("reduction_dimx", reduction_dimx)] {
            if v == 0 || v > MAX_EXTENT {
                return invalid(op, format!("{name} is {v}; 1 to {MAX_EXTENT} (2^31) are supported"));
            }
        }
        Ok(BlockGraph {
            grid_dim,
            block_dim,
            forloop_range,
            reduction_dimx,
            ops: Vec::new(),
            tensors: Vec::new(),
            smem_cap: None,
            warpgroup_acc: false,
        })
    }

    /// Sets [`BlockGraph::smem_cap`] (None: the grid's budget); a cap of zero is an error.
    pub fn set_smem_cap(&mut self, cap: Option<usize>) -> Result<()> {
        if cap == Some(0) {
            return invalid("smem_cap", "a shared-memory cap must be at least 1 byte");
        }
        self.smem_cap = cap;
        Ok(())
    }

    /// Number of thread blocks in the grid.
    pub fn num_blocks(&self) -> usize {
        self.grid_dim.iter().product()
    }

    /// Whether op `op` is a loop matmul of the shape the warpgroup form sums
    /// ([`BlockGraph::warpgroup_acc`]): one batch item of 16 or 32 rows of a 16-bit A, K a
    /// multiple of 64, a 16-bit B of 64 columns, in a block of whole warpgroups (128
    /// threads). The rule the search's warpgroup twins and the code generator share; the
    /// generator adds its tile layouts' conditions.
    pub fn warpgroup_matmul(&self, op: usize) -> bool {
        let o = &self.ops[op];
        let threads: usize = self.block_dim.iter().product();
        let (BlockOpKind::Matmul, &[a, b]) = (&o.kind, &o.inputs[..]) else { return false };
        let (ta, tb) = (&self.tensors[a], &self.tensors[b]);
        let (da, r) = (&ta.dims, ta.dims.len());
        threads.is_multiple_of(128)
            && self.tensors[o.outputs[0]].phase == Phase::Loop
            && ta.dtype.size_bytes() == 2
            && tb.dtype.size_bytes() == 2
            && r >= 2
            && numel(&da[..r - 2]) == 1
            && matches!(da[r - 2], 16 | 32)
            && da[r - 1].is_multiple_of(64)
            && tb.dims.last() == Some(&64)
    }

    /// Shared memory up to which the loop's input tiles are multi-buffered
    /// on `target` ([`Target::pipeline_budget`] of the grid's block count, within
    /// [`BlockGraph::smem_cap`]).
    pub fn pipeline_budget(&self, target: &Target) -> usize {
        let b = target.pipeline_budget(self.num_blocks());
        self.smem_cap.map_or(b, |c| c.min(b))
    }

    /// Pipeline stages the code generator gives the per-iteration input tiles: up to
    /// [`MAX_PIPELINE_STAGES`] (never more than the loop's range) while the block's shared
    /// memory stays within [`BlockGraph::pipeline_budget`] on `target`. `staged` and `other` are the bytes of one
    /// stage of those tiles and of everything else. The rule both the generator and the cost
    /// model follow, but for one form: a warpgroup attention that normalises its V stages may
    /// take stages up to the whole shared memory (the generator's `Step::Flash`).
    pub fn pipeline_stages(&self, staged: usize, other: usize, target: &Target) -> usize {
        if staged == 0 {
            return 1;
        }
        let mut s = MAX_PIPELINE_STAGES.min(self.forloop_range).max(1);
        while s > 1 && other.saturating_add(s.saturating_mul(staged)) > self.pipeline_budget(target) {
            s -= 1;
        }
        s
    }

    /// Whether the graph is element-wise over one tile shape: every tile has the shape of
    /// the largest one or broadcasts to it (dims of 1); the ops are inputs, unary and binary
    /// ops, sums and maxima over a dim of size 1 (the running max in the loop), element-wise
    /// loop accumulators (plain, rescaled, max) and outputs saved after the loop. Such a graph
    /// needs no value of another element, so its kernel can keep every value in registers
    /// (the code generator's register loop form; split-KV attention's combine step is one).
    /// The one rule both the generator and the cost model follow.
    pub fn is_elementwise(&self) -> bool {
        let Some(full) = self.tensors.iter().map(|t| &t.dims).max_by_key(|d| d.iter().product::<usize>()) else {
            return false;
        };
        let fits = |d: &[usize]| d.len() == full.len() && d.iter().zip(full).all(|(&a, &f)| a == f || a == 1);
        self.tensors.iter().all(|t| fits(&t.dims))
            && self.ops.iter().all(|op| {
                let unit = |dim: usize| op.inputs.first().is_some_and(|&t| self.tensors[t].dims.get(dim) == Some(&1));
                match op.kind {
                    BlockOpKind::Input { .. } | BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } => true,
                    BlockOpKind::Output { forloop_dim, .. } => forloop_dim < 0,
                    BlockOpKind::Reduction { dim } | BlockOpKind::ReductionMax { dim } => unit(dim),
                    BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => {
                        acc == Accum::None
                    }
                    BlockOpKind::ForloopAccumMax => true,
                    _ => false,
                }
            })
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: STensorId) -> Result<&STensor> {
        self.tensors.get(id).ok_or_else(|| crate::Error::Invalid {
            op: "threadblock graph".into(),
            msg: format!("stensor #{id} does not belong to this threadblock graph"),
        })
    }

    /// Input ops in order (their position is the customized op's input position).
    pub fn input_ops(&self) -> impl Iterator<Item = &BlockOp> {
        self.ops.iter().filter(|o| matches!(o.kind, BlockOpKind::Input { .. }))
    }

    /// Output ops in order (their position is the customized op's output position).
    pub fn output_ops(&self) -> impl Iterator<Item = &BlockOp> {
        self.ops.iter().filter(|o| matches!(o.kind, BlockOpKind::Output { .. }))
    }

    /// Appends an op; every result tile must fit the size limits ([`crate::limits`]).
    fn push(&mut self, kind: BlockOpKind, inputs: Vec<STensorId>, outs: Vec<STensor>) -> Result<Vec<STensorId>> {
        for (i, t) in outs.iter().enumerate() {
            let what = if outs.len() == 1 { "the result tile".to_string() } else { format!("result tile {i}") };
            check_size(kind.name(), &what, &t.dims)?;
        }
        let ids: Vec<STensorId> = (self.tensors.len()..self.tensors.len() + outs.len()).collect();
        self.tensors.extend(outs);
        self.ops.push(BlockOp { kind, inputs, outputs: ids.clone() });
        Ok(ids)
    }

    /// Tile dims of a device tensor of `dims` under `imap`/`forloop_dim`, with full checks.
    pub fn input_tile_dims(&self, dims: &[usize], imap: [i64; 3], forloop_dim: i64) -> Result<Vec<usize>> {
        let op = "tb.new_input";
        check_dims(op, "the input", dims)?;
        let mut tile = dims.to_vec();
        let mut used = [false; 4];
        for (a, &g) in self.grid_dim.iter().enumerate() {
            let d = imap[a];
            if g == 1 || d == -1 {
                continue;
            }
            if d < -1 || d >= dims.len() as i64 {
                return shape_err(
                    op,
                    format!(
                        "input_map {imap:?}: grid axis {} maps to dim {d}, out of range for input dims {dims:?}",
                        AXES[a]
                    ),
                );
            }
            let d = d as usize;
            if used[d] {
                return shape_err(op, format!("input_map {imap:?}: dim {d} is mapped by two grid axes"));
            }
            used[d] = true;
            if !tile[d].is_multiple_of(g) {
                return shape_err(
                    op,
                    format!("input_map {imap:?}: input dim {d} of size {} (dims {dims:?}) is not divisible by grid_dim.{} = {g}", dims[d], AXES[a]),
                );
            }
            tile[d] /= g;
        }
        if forloop_dim != -1 {
            let fd = resolve_loop_dim(op, forloop_dim, dims.len())?;
            if !tile[fd].is_multiple_of(self.forloop_range) {
                return shape_err(
                    op,
                    format!(
                        "forloop_dim {fd}: the block's part of input dim {fd} has size {} (dims {dims:?}), not divisible by forloop_range {}",
                        tile[fd], self.forloop_range
                    ),
                );
            }
            tile[fd] /= self.forloop_range;
        }
        Ok(tile)
    }

    /// Adds an input iterator over a device tensor of `dims`/`dtype`; returns its tile tensor.
    pub fn new_input(&mut self, dims: &[usize], dtype: DType, imap: [i64; 3], forloop_dim: i64) -> Result<STensorId> {
        let tile = self.input_tile_dims(dims, imap, forloop_dim)?;
        let phase = if forloop_dim == -1 { Phase::Invariant } else { Phase::Loop };
        let kind = BlockOpKind::Input { dims: dims.to_vec(), dtype, imap, forloop_dim };
        Ok(self.push(kind, vec![], vec![STensor { dims: tile, dtype, phase }])?[0])
    }

    /// Dims of the device tensor an output saver with these maps writes for a tile of `tile`.
    pub fn output_dims_for(
        &self,
        tile: &[usize],
        phase: Phase,
        omap: [i64; 3],
        forloop_dim: i64,
    ) -> Result<Vec<usize>> {
        let op = "tb.new_output";
        let mut out = tile.to_vec();
        let mut used = [false; 4];
        for (a, &g) in self.grid_dim.iter().enumerate() {
            if g == 1 {
                continue;
            }
            let d = omap[a];
            if d < 0 || d >= tile.len() as i64 {
                return shape_err(
                    op,
                    format!(
                        "output_map {omap:?}: grid axis {} has {g} blocks and must map to a dim of the output tile {tile:?} (each block writes its own part), got {d}",
                        AXES[a]
                    ),
                );
            }
            let d = d as usize;
            if used[d] {
                return shape_err(op, format!("output_map {omap:?}: dim {d} is mapped by two grid axes"));
            }
            used[d] = true;
            out[d] =
                checked_size_mul(op, &format!("output dim {d} over grid axis {}", AXES[a]), out[d], g, MAX_EXTENT)?;
        }
        if forloop_dim == -1 {
            if phase == Phase::Loop {
                return invalid(
                    op,
                    "the saved tensor is computed inside the for-loop: pass it through an accumulator (forloop_accum) first, or save every iteration with forloop_dim >= 0",
                );
            }
        } else {
            if phase == Phase::Post {
                return invalid(op, "forloop_dim >= 0 saves every iteration, but the tensor is computed after the for-loop; use forloop_dim=-1");
            }
            let fd = resolve_loop_dim(op, forloop_dim, tile.len())?;
            out[fd] = checked_size_mul(
                op,
                &format!("output dim {fd} over the for-loop"),
                out[fd],
                self.forloop_range,
                MAX_EXTENT,
            )?;
        }
        check_size(op, "the output", &out)?;
        Ok(out)
    }

    /// Adds an output saver for `t`; returns the output's position.
    pub fn new_output(&mut self, t: STensorId, omap: [i64; 3], forloop_dim: i64) -> Result<usize> {
        let st = self.tensor(t)?.clone();
        self.output_dims_for(&st.dims, st.phase, omap, forloop_dim)?;
        let pos = self.output_ops().count();
        self.push(BlockOpKind::Output { omap, forloop_dim }, vec![t], vec![])?;
        Ok(pos)
    }

    /// Dims of the device tensors of every output, in output order.
    pub fn output_dims(&self) -> Vec<Vec<usize>> {
        self.output_ops()
            .map(|o| match o.kind {
                BlockOpKind::Output { omap, forloop_dim } => {
                    let st = &self.tensors[o.inputs[0]];
                    self.output_dims_for(&st.dims, st.phase, omap, forloop_dim).unwrap_or_default()
                }
                _ => unreachable!("output_ops yields outputs only"),
            })
            .collect()
    }

    fn phase2(&self, op: &str, a: &STensor, b: &STensor) -> Result<Phase> {
        use Phase::*;
        match (a.phase, b.phase) {
            (Loop, Post) | (Post, Loop) => invalid(
                op,
                "mixes a tensor computed inside the for-loop with one computed after the accumulator; accumulate first or move the op",
            ),
            (Invariant, p) | (p, Invariant) => Ok(p),
            (p, _) => Ok(p),
        }
    }

    /// Tile matmul `[.., m, k] x [.., k, n]`.
    pub fn matmul(&mut self, a: STensorId, b: STensorId) -> Result<STensorId> {
        let op = "tb.matmul";
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = matmul_dims(op, &ta.dims, &tb.dims)?;
        let dtype = same_dtype(op, ta.dtype, tb.dtype)?;
        let phase = self.phase2(op, &ta, &tb)?;
        Ok(self.push(BlockOpKind::Matmul, vec![a, b], vec![STensor { dims, dtype, phase }])?[0])
    }

    /// Element-wise unary op.
    pub fn unary(&mut self, u: UnaryOp, a: STensorId) -> Result<STensorId> {
        u.validate()?;
        let t = self.tensor(a)?.clone();
        Ok(self.push(BlockOpKind::Unary { op: u }, vec![a], vec![t])?[0])
    }

    /// Element-wise binary op with broadcasting.
    pub fn binary(&mut self, bop: BinaryOp, a: STensorId, b: STensorId) -> Result<STensorId> {
        let op = &format!("tb.{}", bop.name());
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = broadcast_dims(op, &ta.dims, &tb.dims)?;
        let dtype = same_dtype(op, ta.dtype, tb.dtype)?;
        let phase = self.phase2(op, &ta, &tb)?;
        Ok(self.push(BlockOpKind::Binary { op: bop }, vec![a, b], vec![STensor { dims, dtype, phase }])?[0])
    }

    /// Sum over `dim` (negative counts from the end), kept with size 1.
    pub fn reduction(&mut self, a: STensorId, dim: i64) -> Result<STensorId> {
        let t = self.tensor(a)?.clone();
        let d = resolve_dim("tb.reduction", "the input", dim, t.dims.len())?;
        let out = STensor { dims: reduce_dims(&t.dims, d), ..t };
        Ok(self.push(BlockOpKind::Reduction { dim: d }, vec![a], vec![out])?[0])
    }

    /// Running max over `dim` and over iterations, and its change: returns `(max, diff)`.
    pub fn reduction_max(&mut self, a: STensorId, dim: i64) -> Result<(STensorId, STensorId)> {
        let t = self.tensor(a)?.clone();
        let d = resolve_dim("tb.reduction_max", "the input", dim, t.dims.len())?;
        let phase = if t.phase == Phase::Post { Phase::Post } else { Phase::Loop };
        let out = STensor { dims: reduce_dims(&t.dims, d), dtype: t.dtype, phase };
        let ids = self.push(BlockOpKind::ReductionMax { dim: d }, vec![a], vec![out.clone(), out])?;
        Ok((ids[0], ids[1]))
    }

    /// RMS normalisation over the last dim.
    pub fn rms_norm(&mut self, a: STensorId) -> Result<STensorId> {
        self.rms_norm_eps(a, 0.0)
    }

    /// RMS normalisation over the last dim with `eps` added to the mean of squares.
    pub fn rms_norm_eps(&mut self, a: STensorId, eps: f32) -> Result<STensorId> {
        let eps = crate::ops::check_eps("tb.rms_norm", eps)?;
        let t = self.tensor(a)?.clone();
        Ok(self.push(BlockOpKind::RmsNorm { eps }, vec![a], vec![t])?[0])
    }

    /// Concatenation along `dim`.
    pub fn concat(&mut self, a: STensorId, b: STensorId, dim: i64) -> Result<STensorId> {
        let op = "tb.concat";
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let d = resolve_dim(op, "A", dim, ta.dims.len())?;
        let dims = concat_dims(op, &ta.dims, &tb.dims, d)?;
        let dtype = same_dtype(op, ta.dtype, tb.dtype)?;
        let phase = self.phase2(op, &ta, &tb)?;
        Ok(self.push(BlockOpKind::Concat { dim: d }, vec![a, b], vec![STensor { dims, dtype, phase }])?[0])
    }

    fn accum_input(&self, op: &str, a: STensorId) -> Result<STensor> {
        let t = self.tensor(a)?.clone();
        if t.phase == Phase::Post {
            return invalid(op, "the input is already computed after the for-loop (it went through an accumulator); a path may pass only one accumulator");
        }
        Ok(t)
    }

    /// For-loop accumulator (see [`Accum`]).
    pub fn forloop_accum(&mut self, a: STensorId, acc: Accum) -> Result<STensorId> {
        self.forloop_accum_eps(a, acc, 0.0)
    }

    /// [`BlockGraph::forloop_accum`] with an epsilon: `rms` adds `eps` to the mean of squares
    /// before the root; every other kind requires `eps = 0`.
    pub fn forloop_accum_eps(&mut self, a: STensorId, acc: Accum, eps: f32) -> Result<STensorId> {
        let op = "tb.forloop_accum";
        let eps = crate::ops::check_eps(op, eps)?;
        if eps != 0.0 && acc != Accum::Rms {
            return invalid(op, format!("eps {eps} is only allowed with acc=\"rms\", got {:?}", acc.name()));
        }
        let t = self.accum_input(op, a)?;
        let dims = acc.out_dims(&t.dims, self.reduction_dimx)?;
        let out = STensor { dims, dtype: t.dtype, phase: Phase::Post };
        Ok(self.push(BlockOpKind::ForloopAccum { acc, eps }, vec![a], vec![out])?[0])
    }

    /// Rescaling accumulator `acc = acc * scale + x`; `acc` is `None` or `Sum`.
    pub fn forloop_accum_rescale(&mut self, a: STensorId, scale: STensorId, acc: Accum) -> Result<STensorId> {
        let op = "tb.forloop_accum_rescale";
        if !matches!(acc, Accum::None | Accum::Sum) {
            return invalid(op, format!("acc must be None or \"sum\", got {:?}", acc.name()));
        }
        let t = self.accum_input(op, a)?;
        let s = self.accum_input(op, scale)?;
        same_dtype(op, t.dtype, s.dtype)?;
        let dims = acc.out_dims(&t.dims, self.reduction_dimx)?;
        if broadcast_dims(op, &dims, &s.dims)? != dims {
            return shape_err(op, format!("scale dims {:?} do not broadcast to the accumulator dims {dims:?}", s.dims));
        }
        let out = STensor { dims, dtype: t.dtype, phase: Phase::Post };
        Ok(self.push(BlockOpKind::ForloopAccumRescale { acc }, vec![a, scale], vec![out])?[0])
    }

    /// Element-wise max over iterations.
    pub fn forloop_accum_max(&mut self, a: STensorId) -> Result<STensorId> {
        let t = self.accum_input("tb.forloop_accum_max", a)?;
        let out = STensor { phase: Phase::Post, ..t };
        Ok(self.push(BlockOpKind::ForloopAccumMax, vec![a], vec![out])?[0])
    }

    /// The thread-block-cluster form of a loop whose grid leaves SMs idle: `(axis, cs, graph)`,
    /// where `graph` has `cs` times the blocks along the free grid `axis` and
    /// `forloop_range / cs` iterations, each per-iteration input split along `axis` over its
    /// for-loop dim, so that the `cs` blocks of one cluster (consecutive along `axis`) each run
    /// a `cs`-th of one original block's loop (split-K). The code generator merges the
    /// cluster's partial accumulators through distributed shared memory (sm_90) into the
    /// cluster's first block, which alone runs what follows the loop; the cost model prices the
    /// same form. The one rule both follow: the loop has a matmul and either online-softmax
    /// accumulators (`forloop_accum_rescale`, merged by their maxima; attention) or only
    /// summing ones (`forloop_accum`, merged by addition; matmul and norm sums), the outputs
    /// are saved after the loop, a grid axis has size 1 and no grid axis of more than one
    /// block runs along a for-loop dim; `cs` is the largest of [`MAX_CLUSTER_SPLIT`] (within
    /// `target`'s portable cluster size), ..., 2 that leaves at least two iterations per block
    /// and at most `target`'s [`one_wave_blocks`](crate::target::Budgets::one_wave_blocks)
    /// blocks ([`wide_cluster_blocks`](crate::target::Budgets::wide_cluster_blocks) for
    /// clusters of more than two). `None` where no `cs` > 1 fits.
    pub fn cluster_split(&self, target: &Target) -> Option<(usize, usize, BlockGraph)> {
        self.cluster_split_within(MAX_CLUSTER_SPLIT, target)
    }

    /// [`BlockGraph::cluster_split`] with clusters of at most `most` blocks (the code generator
    /// retries with smaller clusters where a split block would need too much shared memory).
    pub fn cluster_split_within(&self, most: usize, target: &Target) -> Option<(usize, usize, BlockGraph)> {
        let blocks = self.num_blocks();
        let loop_matmul = self
            .ops
            .iter()
            .any(|o| matches!(o.kind, BlockOpKind::Matmul) && self.tensors[o.outputs[0]].phase == Phase::Loop);
        let accs: Vec<&BlockOpKind> = self.ops.iter().map(|o| &o.kind).filter(|k| k.is_accumulator()).collect();
        let softmax = accs.iter().any(|k| matches!(k, BlockOpKind::ForloopAccumRescale { .. }));
        let summing = !accs.is_empty() && accs.iter().all(|k| matches!(k, BlockOpKind::ForloopAccum { .. }));
        let saved_after =
            self.output_ops().all(|o| matches!(o.kind, BlockOpKind::Output { forloop_dim, .. } if forloop_dim < 0));
        let loop_axis = self.input_ops().any(|o| match o.kind {
            BlockOpKind::Input { imap, forloop_dim, .. } => {
                forloop_dim >= 0 && (0..3).any(|a| imap[a] == forloop_dim && self.grid_dim[a] > 1)
            }
            _ => false,
        });
        let axis = self.grid_dim.iter().position(|&g| g == 1)?;
        if !loop_matmul || !(softmax || summing) || !saved_after || loop_axis {
            return None;
        }
        let f = self.forloop_range;
        let b = &target.budgets;
        let cs = (2..=most.min(MAX_CLUSTER_SPLIT).min(target.max_cluster_portable)).rev().find(|&cs| {
            let most = if cs > 2 { b.wide_cluster_blocks } else { b.one_wave_blocks };
            f.is_multiple_of(cs) && f / cs >= 2 && blocks * cs <= most
        })?;
        let mut g = self.clone();
        g.grid_dim[axis] = cs;
        g.forloop_range = f / cs;
        for op in &mut g.ops {
            match &mut op.kind {
                BlockOpKind::Input { imap, forloop_dim, .. } => imap[axis] = *forloop_dim,
                BlockOpKind::Output { omap, .. } => omap[axis] = -1,
                _ => {}
            }
        }
        Some((axis, cs, g))
    }

    /// Appends an op of `kind` on `ins` through its builder method (shape rule and checks
    /// included); returns its outputs (none for an output saver). Copies an op into another
    /// graph, where its tile shapes may differ.
    pub fn replay(&mut self, kind: &BlockOpKind, ins: &[STensorId]) -> Result<Vec<STensorId>> {
        let arity = kind.arity();
        if ins.len() != arity {
            return invalid(kind.name(), format!("takes {arity} inputs, {} given", ins.len()));
        }
        let one = |r: Result<STensorId>| r.map(|t| vec![t]);
        match kind {
            BlockOpKind::Input { dims, dtype, imap, forloop_dim } => {
                one(self.new_input(dims, *dtype, *imap, *forloop_dim))
            }
            BlockOpKind::Output { omap, forloop_dim } => self.new_output(ins[0], *omap, *forloop_dim).map(|_| vec![]),
            BlockOpKind::Matmul => one(self.matmul(ins[0], ins[1])),
            BlockOpKind::Unary { op } => one(self.unary(*op, ins[0])),
            BlockOpKind::Binary { op } => one(self.binary(*op, ins[0], ins[1])),
            BlockOpKind::Reduction { dim } => one(self.reduction(ins[0], *dim as i64)),
            BlockOpKind::ReductionMax { dim } => self.reduction_max(ins[0], *dim as i64).map(|(m, d)| vec![m, d]),
            BlockOpKind::RmsNorm { eps } => one(self.rms_norm_eps(ins[0], *eps)),
            BlockOpKind::Concat { dim } => one(self.concat(ins[0], ins[1], *dim as i64)),
            BlockOpKind::ForloopAccum { acc, eps } => one(self.forloop_accum_eps(ins[0], *acc, *eps)),
            BlockOpKind::ForloopAccumRescale { acc } => one(self.forloop_accum_rescale(ins[0], ins[1], *acc)),
            BlockOpKind::ForloopAccumMax => one(self.forloop_accum_max(ins[0])),
        }
    }

    /// The same ops over `k` times the iterations, each per-iteration tile `k` times smaller
    /// along its for-loop dim (every op replayed, so every shape follows). Equal in value where
    /// each loop op is local to a position of the loop dim or sums or maxes over it into an
    /// accumulator (matmuls over it, running maxima with their rescales: an attention loop,
    /// where the code generator uses it for finer pipeline stages); an op that normalises or
    /// concatenates along the loop dim within a tile would change its meaning. Errors where a
    /// loop tile's dim is not divisible by `k`.
    pub fn with_finer_loop(&self, k: usize) -> Result<BlockGraph> {
        let range = checked_size_mul("with_finer_loop", "forloop_range", self.forloop_range, k, MAX_EXTENT)?;
        let mut g = BlockGraph::new(self.grid_dim, self.block_dim, range, self.reduction_dimx)?;
        let mut map: Vec<STensorId> = vec![0; self.tensors.len()];
        for op in &self.ops {
            let ins: Vec<STensorId> = op.inputs.iter().map(|&t| map[t]).collect();
            for (&old, new) in op.outputs.iter().zip(g.replay(&op.kind, &ins)?) {
                map[old] = new;
            }
        }
        Ok(g)
    }

    /// Bytes of shared memory if every tile had its own buffer (an upper bound before planning).
    pub fn shared_memory_upper_bound(&self) -> usize {
        self.tensors.iter().fold(0usize, |n, t| n.saturating_add(numel(&t.dims).saturating_mul(t.dtype.size_bytes())))
    }

    /// Checks the graph is complete: at least one input and one output (unused inputs are allowed).
    pub fn check_complete(&self) -> Result<()> {
        let op = "customized";
        if self.output_ops().count() == 0 {
            return invalid(op, "the threadblock graph has no output (call tb.new_output)");
        }
        if self.input_ops().count() == 0 {
            return invalid(op, "the threadblock graph has no input (call tb.new_input)");
        }
        Ok(())
    }
}

fn resolve_loop_dim(op: &str, forloop_dim: i64, rank: usize) -> Result<usize> {
    if forloop_dim < 0 || forloop_dim >= rank as i64 {
        return shape_err(op, format!("forloop_dim {forloop_dim} is out of range for rank {rank} (use -1 for none)"));
    }
    Ok(forloop_dim as usize)
}
