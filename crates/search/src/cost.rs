//! The static cost model that ranks candidates when no GPU profiles them.
//!
//! Per kernel launch: `time = max(max(DRAM bytes / DRAM bandwidth, L2 bytes / L2 bandwidth,
//! flops / peak + streamed-operand flops / their rate) / wave utilisation, waves * loop steps *
//! step latency) + launch overhead + exposed memory latency`. The exposed latency is one DRAM
//! round trip per wave when the generated kernel multi-buffers its per-iteration tiles
//! (`BlockGraph::pipeline_stages` > 1), one per loop iteration when it cannot: when the stages
//! do not fit, or when a streamed 16-bit tile's rows are not whole 16-byte chunks
//! ([`vector_tile`]: the code generator copies it element by element through registers). An
//! element-wise graph (`BlockGraph::is_elementwise`, kept in registers with its loop unrolled)
//! has no barrier in its loop steps and all its loads in flight at once.
//! A customized kernel reads each device input once from DRAM (replicated tiles are served by
//! L2) and writes its outputs once; every tile load of every block and iteration is L2 traffic.
//! Wave utilisation is `blocks / (waves * SMs)`: a grid smaller than the GPU leaves SMs idle,
//! which slows its L2 traffic and arithmetic; its DRAM traffic only where a wave has fewer
//! blocks than it takes to saturate DRAM (`CostModel::dram_saturating_blocks`).
//! Predefined ops are library kernels: they move their operands and result once, at full
//! utilisation, after one exposed DRAM round trip. A kernel whose loop the code generator splits across thread-block clusters
//! (`BlockGraph::cluster_split`) is priced in that form, plus the merge.
//! Defaults are the H100 numbers of docs/reference.md (baselines on the H100); the SM count,
//! pipelining budgets and cluster rules come from the [`Target`] the functions are given.

use mirage_ugraph::{BlockGraph, BlockOpKind, DType, KernelGraph, KernelOpKind, Phase, Target};

/// Machine parameters of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// DRAM bandwidth, bytes per microsecond.
    pub dram_bytes_per_us: f64,
    /// L2 bandwidth, bytes per microsecond.
    pub l2_bytes_per_us: f64,
    /// Arithmetic peak, flops per microsecond.
    pub flops_per_us: f64,
    /// Fixed cost of one kernel launch, microseconds.
    pub launch_us: f64,
    /// Latency of one for-loop step (stage wait, barrier, the step's dependent chain),
    /// microseconds: about 0.5-1 µs measured on the H100 for attention and GEMV loop bodies.
    pub loop_step_us: f64,
    /// Latency of one loop step of an element-wise graph kept in registers (no barrier, the
    /// loop unrolled), microseconds: split-KV combine kernels of 4-8 steps measured 1.5-2.2 µs
    /// on the H100, launch included.
    pub register_loop_step_us: f64,
    /// Latency of a DRAM round trip, microseconds.
    pub dram_latency_us: f64,
    /// Rate of the loop-body ops that compute a matmul operand from a streamed (for-loop)
    /// input tile, flops per microsecond (see [`streamed_operand_flops`]). Such an operand is
    /// rebuilt through shared memory every iteration, behind a barrier, on the CUDA cores
    /// and in the loop's critical path, and keeps the matmul off the asynchronous
    /// tensor-core path; calibrated on the H100 by a QKNorm attention that normalises each
    /// V tile in the loop (modelled 40 µs without this term, measured 100 µs).
    pub streamed_operand_flops_per_us: f64,
    /// Merging the partial results of a thread-block cluster that split a block's loop
    /// ([`BlockGraph::cluster_split`]) through distributed shared memory, microseconds.
    pub cluster_merge_us: f64,
    /// Blocks of one wave (one an SM) whose streaming loops saturate DRAM: a smaller wave
    /// reads at the fraction `blocks / this` of the bandwidth. On the H200, RMSNorm+Linear
    /// 4096x6144 in 96 blocks of 64 columns took 15.6-15.9 µs (b=1, b=8) against 17.1-17.5
    /// for the best 128-block forms (bench timing; docs/tuning.md).
    pub dram_saturating_blocks: usize,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            dram_bytes_per_us: 2.97e6,
            l2_bytes_per_us: 8.0e6,
            flops_per_us: 7.7e8,
            launch_us: 1.25,
            loop_step_us: 0.6,
            register_loop_step_us: 0.05,
            dram_latency_us: 0.8,
            streamed_operand_flops_per_us: 5.0e6,
            cluster_merge_us: 0.5,
            dram_saturating_blocks: 96,
        }
    }
}

/// The modelled cost of a µGraph.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cost {
    /// Estimated run time, microseconds (the ranking key).
    pub est_us: f64,
    /// Bytes moved to and from device memory.
    pub dram_bytes: u64,
    /// Bytes of tile loads (served by L2 when repeated).
    pub l2_bytes: u64,
    /// Arithmetic operations.
    pub flops: u64,
    /// Kernel launches.
    pub launches: usize,
    /// Largest shared-memory footprint of one block (upper bound before planning), bytes.
    pub shared_memory: usize,
}

impl Cost {
    fn add(&mut self, o: Cost) {
        self.est_us += o.est_us;
        self.dram_bytes += o.dram_bytes;
        self.l2_bytes += o.l2_bytes;
        self.flops += o.flops;
        self.launches += o.launches;
        self.shared_memory = self.shared_memory.max(o.shared_memory);
    }
}

/// Whether the code generator copies a block input tile of `tile` dims from a row-major device
/// tensor of `dev` dims 16 bytes at a time (`cp.async`): the tile's rows whole 16-byte chunks,
/// and so the device rows wherever a dim above the last is larger than 1. Otherwise a 16-bit
/// tile goes element by element through registers (an fp32 one by 4-byte `cp.async`).
pub fn vector_tile(dev: &[usize], tile: &[usize], dtype: DType) -> bool {
    let es = dtype.size_bytes();
    let (Some(&inner), Some(&row)) = (tile.last(), dev.last()) else { return false };
    let outer = dev.len().saturating_sub(1);
    inner.saturating_mul(es).is_multiple_of(16)
        && (row.saturating_mul(es).is_multiple_of(16) || dev[..outer].iter().all(|&d| d == 1))
}

fn numel(d: &[usize]) -> u64 {
    d.iter().map(|&x| x as u64).product()
}

fn matmul_flops(a: &[usize], b: &[usize]) -> u64 {
    let k = a.last().copied().unwrap_or(1) as u64;
    let n = b.last().copied().unwrap_or(1) as u64;
    2 * numel(&a[..a.len() - 1]) * k * n
}

/// Cost of one customized kernel: of its thread-block-cluster form where it has one
/// ([`BlockGraph::cluster_split`]: what the code generator emits), plus the merge, on `t`.
pub fn block_graph_cost(bg: &BlockGraph, m: &CostModel, t: &Target) -> Cost {
    match bg.cluster_split(t) {
        Some((_, cs, g)) => {
            let mut c = launch_cost(&g, m, t, cs as u64);
            c.est_us += m.cluster_merge_us;
            c
        }
        None => launch_cost(bg, m, t, 1),
    }
}

/// The bytes of one pipeline stage of `bg`'s per-iteration input tiles and of its other tiles
/// (each counted whole, none sharing memory): the sizes [`BlockGraph::pipeline_stages`] takes.
pub fn stage_bytes(bg: &BlockGraph) -> (usize, usize) {
    let (mut staged, mut other) = (0usize, 0usize);
    for t in &bg.tensors {
        other += numel(&t.dims) as usize * t.dtype.size_bytes();
    }
    for op in &bg.ops {
        if let BlockOpKind::Input { forloop_dim, .. } = op.kind {
            if forloop_dim >= 0 {
                let t = &bg.tensors[op.outputs[0]];
                let b = numel(&t.dims) as usize * t.dtype.size_bytes();
                staged += b;
                other -= b;
            }
        }
    }
    (staged, other)
}

/// Cost of one launch of `bg` whose outputs are written by one block in `cs` (the rest of a
/// cluster merge into it), on `t`.
fn launch_cost(bg: &BlockGraph, m: &CostModel, t: &Target, cs: u64) -> Cost {
    let blocks = bg.num_blocks() as u64;
    let f = bg.forloop_range as u64;
    let mut c = Cost { launches: 1, shared_memory: bg.shared_memory_upper_bound(), ..Cost::default() };
    let mut flops_per_block = 0u64;
    let (staged, other) = stage_bytes(bg);
    let mut stages = bg.pipeline_stages(staged, other, t);
    for op in &bg.ops {
        let times = match op.outputs.first().map(|&t| bg.tensors[t].phase) {
            Some(Phase::Loop) => f,
            _ => 1,
        };
        let dims = |i: usize| bg.tensors[op.inputs[i]].dims.as_slice();
        match &op.kind {
            BlockOpKind::Input { dims: dev, dtype, forloop_dim, .. } => {
                let tile = &bg.tensors[op.outputs[0]];
                c.dram_bytes += numel(dev) * dtype.size_bytes() as u64;
                c.l2_bytes += numel(&tile.dims) * tile.dtype.size_bytes() as u64 * times * blocks;
                // A streamed 16-bit tile copied element by element: its plain loads stall their
                // own iteration, no copy runs ahead.
                if *forloop_dim >= 0 && dtype.size_bytes() == 2 && !vector_tile(dev, &tile.dims, *dtype) {
                    stages = 1;
                }
            }
            BlockOpKind::Output { .. } => {
                let t = &bg.tensors[op.inputs[0]];
                c.dram_bytes += numel(&t.dims) * t.dtype.size_bytes() as u64 * blocks / cs;
            }
            BlockOpKind::Matmul => flops_per_block += matmul_flops(dims(0), dims(1)) * times,
            BlockOpKind::RmsNorm { .. } => flops_per_block += 3 * numel(dims(0)) * times,
            // Accumulators run every iteration on their input.
            k if k.is_accumulator() => flops_per_block += numel(dims(0)) * f,
            _ => flops_per_block += numel(&bg.tensors[op.outputs[0]].dims) * times,
        }
    }
    c.flops = flops_per_block * blocks;
    let streamed_us = (streamed_operand_flops(bg) * f * blocks) as f64 / m.streamed_operand_flops_per_us;
    let sms = t.num_sms.max(1) as u64;
    let waves = blocks.div_ceil(sms).max(1);
    let util = blocks as f64 / (waves * sms) as f64;
    let saturating = m.dram_saturating_blocks.clamp(1, sms as usize) as u64;
    let dram_util = (blocks as f64 / (waves * saturating) as f64).min(1.0);
    let busy = (c.dram_bytes as f64 / m.dram_bytes_per_us / dram_util)
        .max(c.l2_bytes as f64 / m.l2_bytes_per_us / util)
        .max((c.flops as f64 / m.flops_per_us + streamed_us) / util);
    let registers = bg.is_elementwise();
    let exposed = if stages > 1 || f == 1 || registers { 1.0 } else { f as f64 };
    // Each block runs its loop steps one after another: that chain overlaps the traffic, so
    // it only counts where it is longer.
    let step_us = if registers { m.register_loop_step_us } else { m.loop_step_us };
    let serial = (waves * f) as f64 * step_us;
    c.est_us = busy.max(serial) + m.launch_us + exposed * m.dram_latency_us;
    c
}

/// Flops per block and iteration of the loop-phase ops that compute a matmul operand from a
/// streamed input tile (one with a for-loop dim), e.g. a V tile normalised in the loop before
/// `P V`. Ops on matmul results (the softmax of `Q K`) and accumulators are not counted.
pub fn streamed_operand_flops(bg: &BlockGraph) -> u64 {
    let n = bg.tensors.len();
    let plain = |k: &BlockOpKind| {
        !matches!(k, BlockOpKind::Input { .. } | BlockOpKind::Output { .. } | BlockOpKind::Matmul)
            && !k.is_accumulator()
    };
    let mut streamed = vec![false; n];
    for op in &bg.ops {
        let from_stream = match op.kind {
            BlockOpKind::Input { forloop_dim, .. } => forloop_dim >= 0,
            ref k => plain(k) && op.inputs.iter().any(|&t| streamed[t]),
        };
        if from_stream {
            op.outputs.iter().for_each(|&t| streamed[t] = true);
        }
    }
    let mut feeds_matmul = vec![false; n];
    for op in bg.ops.iter().rev() {
        if matches!(op.kind, BlockOpKind::Matmul) || (plain(&op.kind) && op.outputs.iter().any(|&t| feeds_matmul[t])) {
            op.inputs.iter().for_each(|&t| feeds_matmul[t] = true);
        }
    }
    bg.ops
        .iter()
        .filter(|op| plain(&op.kind))
        .filter_map(|op| op.outputs.first().map(|&o| (op, o)))
        .filter(|&(_, o)| streamed[o] && feeds_matmul[o] && bg.tensors[o].phase == Phase::Loop)
        .map(|(op, o)| match op.kind {
            BlockOpKind::RmsNorm { .. } => 3 * numel(&bg.tensors[op.inputs[0]].dims),
            _ => numel(&bg.tensors[o].dims),
        })
        .sum()
}

/// Cost of a whole kernel graph (predefined ops and customized kernels) on `t`: the sum of
/// [`kernel_op_costs`].
pub fn kernel_graph_cost(g: &KernelGraph, m: &CostModel, t: &Target) -> Cost {
    let mut total = Cost::default();
    for (_, c) in kernel_op_costs(g, m, t) {
        total.add(c);
    }
    total
}

/// Cost of each kernel op of `g` on `t` but the inputs, as `(op index, cost)` in graph order.
pub fn kernel_op_costs(g: &KernelGraph, m: &CostModel, t: &Target) -> Vec<(usize, Cost)> {
    let mut out = Vec::with_capacity(g.ops.len());
    for (i, op) in g.ops.iter().enumerate() {
        let bytes = |t: usize| numel(&g.tensors[t].dims) * g.tensors[t].dtype.size_bytes() as u64;
        let c = match &op.kind {
            KernelOpKind::Input { .. } => continue,
            KernelOpKind::Customized { graph } => block_graph_cost(graph, m, t),
            kind => {
                let io: u64 = op.inputs.iter().chain(&op.outputs).map(|&t| bytes(t)).sum();
                let d = |i: usize| g.tensors[op.inputs[i]].dims.as_slice();
                let flops = match kind {
                    KernelOpKind::Matmul => matmul_flops(d(0), d(1)),
                    KernelOpKind::RmsNorm { .. } | KernelOpKind::Softmax { .. } => 3 * numel(d(0)),
                    _ => numel(d(0)),
                };
                let busy = (io as f64 / m.dram_bytes_per_us).max(flops as f64 / m.flops_per_us);
                // Its first loads wait one DRAM round trip, as a customized kernel's do.
                let est_us = busy + m.launch_us + m.dram_latency_us;
                Cost { est_us, dram_bytes: io, l2_bytes: 0, flops, launches: 1, shared_memory: 0 }
            }
        };
        out.push((i, c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirage_ugraph::{Accum, DType};

    const H100: Target = Target::sm90();

    /// `P (norm(V_tile))` summed over the loop: with or without the norm of the streamed tile.
    fn pv(norm_v: bool) -> BlockGraph {
        let mut bg = BlockGraph::new([1, 1, 1], [128, 1, 1], 4, 64).expect("grid");
        let p = bg.new_input(&[64, 256], DType::Float16, [-1, -1, -1], 1).expect("p");
        let v = bg.new_input(&[256, 64], DType::Float16, [-1, -1, -1], 0).expect("v");
        let v = if norm_v { bg.rms_norm(v).expect("norm") } else { v };
        let o = bg.matmul(p, v).expect("matmul");
        let acc = bg.forloop_accum(o, Accum::None).expect("accum");
        bg.new_output(acc, [-1, -1, -1], -1).expect("output");
        bg
    }

    #[test]
    fn a_streamed_operand_built_in_the_loop_is_priced() {
        // 3 flops per element of the 64 x 64 V tile of each iteration.
        assert_eq!(streamed_operand_flops(&pv(true)), 3 * 64 * 64);
        assert_eq!(streamed_operand_flops(&pv(false)), 0);
        // Priced in the compute term, which here is under the loop's serial chain; a model
        // with a slow enough rate shows it.
        let slow = CostModel { streamed_operand_flops_per_us: 1.0, ..CostModel::default() };
        let extra =
            block_graph_cost(&pv(true), &slow, &H100).est_us - block_graph_cost(&pv(false), &slow, &H100).est_us;
        assert!(extra >= (3 * 64 * 64 * 4) as f64 * 0.99, "extra {extra} us");
    }

    /// RMSNorm+Linear 4096x6144 at b=1 without the norm: `x W` streamed in `blocks` blocks
    /// of 6144 / `blocks` columns, 16 loop steps.
    fn gemv(blocks: usize) -> BlockGraph {
        let mut bg = BlockGraph::new([blocks, 1, 1], [256, 1, 1], 16, 64).expect("grid");
        let x = bg.new_input(&[2, 4096], DType::Float16, [-1, -1, -1], 1).expect("x");
        let w = bg.new_input(&[4096, 6144], DType::Float16, [1, -1, -1], 0).expect("w");
        let o = bg.matmul(x, w).expect("matmul");
        let acc = bg.forloop_accum(o, Accum::None).expect("accum");
        bg.new_output(acc, [1, -1, -1], -1).expect("output");
        bg
    }

    #[test]
    fn a_wave_of_fewer_blocks_than_sms_still_saturates_dram() {
        let m = CostModel::default();
        let (g96, g128) = (gemv(96), gemv(128));
        assert!(g96.cluster_split(&H100).is_none() && g128.cluster_split(&H100).is_none());
        // DRAM-bound either way: 96 blocks of 64 columns are not priced above 128 of 48.
        let (e96, e128) = (block_graph_cost(&g96, &m, &H100).est_us, block_graph_cost(&g128, &m, &H100).est_us);
        assert!(e96 <= e128 + 1e-9, "96 blocks {e96} us, 128 blocks {e128} us");
        // Counting every SM as needed for DRAM's bandwidth prices the 96 over a fifth higher.
        let all = CostModel { dram_saturating_blocks: H100.num_sms, ..m.clone() };
        assert!(block_graph_cost(&g96, &all, &H100).est_us > 1.2 * e128, "the idle SMs' share");
    }

    /// Split-KV attention's combine step over `splits` slices (4 rows of 64 per block), or
    /// with a matmul in its loop when `matmul` (`zoo::combine`).
    fn combine(splits: usize, matmul: bool) -> BlockGraph {
        let g = mirage_ugraph::zoo::combine(splits, 256, DType::Float16, matmul).expect("zoo");
        let graph = g.ops.into_iter().find_map(|op| match op.kind {
            mirage_ugraph::KernelOpKind::Customized { graph } => Some(graph),
            _ => None,
        });
        graph.expect("a customized op")
    }

    #[test]
    fn element_wise_loops_are_priced_without_barrier_steps() {
        let m = CostModel::default();
        let (reg, gen) = (combine(64, false), combine(64, true));
        assert!(reg.is_elementwise() && !gen.is_elementwise());
        // 128 blocks, one wave: 64 steps of the register loop instead of 64 barrier steps.
        let est = block_graph_cost(&reg, &m, &H100).est_us;
        assert!(est < 64.0 * m.loop_step_us / 4.0, "register loop {est} us");
        assert!(block_graph_cost(&gen, &m, &H100).est_us >= 64.0 * m.loop_step_us, "general loop");
    }

    /// Decode-shaped `Q K` (head dim 16) over `keys` in `frange` tiles of `keys / frange`.
    fn qk(keys: usize, frange: usize) -> BlockGraph {
        let mut bg = BlockGraph::new([8, 1, 1], [128, 1, 1], frange, 64).expect("grid");
        let q = bg.new_input(&[8, 4, 16], DType::Bfloat16, [0, -1, -1], -1).expect("q");
        let k = bg.new_input(&[8, 16, keys], DType::Bfloat16, [0, -1, -1], 2).expect("k");
        let s = bg.matmul(q, k).expect("matmul");
        let acc = bg.forloop_accum(s, Accum::None).expect("accum");
        bg.new_output(acc, [0, -1, -1], -1).expect("output");
        bg
    }

    #[test]
    fn ragged_streamed_tiles_are_copied_element_by_element_without_multi_buffering() {
        // Rows of whole 16-byte chunks, or a device tensor whose outer dims are all 1.
        assert!(vector_tile(&[8, 128, 32000], &[1, 128, 64], DType::Bfloat16));
        assert!(!vector_tile(&[8, 128, 32000], &[1, 128, 125], DType::Bfloat16));
        // A device row of 32,002 elements is not whole chunks: the tile's rows start misaligned.
        assert!(!vector_tile(&[8, 128, 32002], &[1, 128, 64], DType::Bfloat16));
        assert!(vector_tile(&[1, 1, 100], &[1, 1, 8], DType::Float16));
        assert!(vector_tile(&[64, 64], &[16, 4], DType::Float32));
        // 32,000 keys in 64 tiles of 500 (rows of 1000 bytes) against 32,768 in 64 of 512:
        // about the same bytes a step, but the ragged loop waits a DRAM round trip every step.
        let m = CostModel::default();
        let (ragged, whole) = (qk(32000, 64), qk(32768, 64));
        let (pr, pw) = (stage_bytes(&ragged), stage_bytes(&whole));
        assert!(ragged.pipeline_stages(pr.0, pr.1, &H100) > 1 && whole.pipeline_stages(pw.0, pw.1, &H100) > 1);
        // One block a head, without the cluster split `block_graph_cost` would price.
        let (er, ew) = (launch_cost(&ragged, &m, &H100, 1).est_us, launch_cost(&whole, &m, &H100, 1).est_us);
        assert!(er >= ew + 56.0 * m.dram_latency_us, "ragged {er} us, whole {ew} us");
    }
}
