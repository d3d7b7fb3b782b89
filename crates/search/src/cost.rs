//! The static cost model that ranks candidates when no GPU profiles them.
//!
//! Per kernel launch: `time = max(max(DRAM bytes / DRAM bandwidth, L2 bytes / L2 bandwidth,
//! flops / peak) / wave utilisation, waves * loop steps * step latency) + launch overhead +
//! exposed memory latency`. The exposed latency is one DRAM round trip per wave when the generated
//! kernel multi-buffers its per-iteration tiles (`BlockGraph::pipeline_stages` > 1), one per
//! loop iteration when it cannot.
//! A customized kernel reads each device input once from DRAM (replicated tiles are served by
//! L2) and writes its outputs once; every tile load of every block and iteration is L2 traffic.
//! Wave utilisation is `blocks / (waves * SMs)`: a grid smaller than the GPU leaves SMs idle.
//! Predefined ops are library kernels: they move their operands and result once, at full
//! utilisation. Defaults are the H100 numbers of mirage-facts section 7.

use mirage_ugraph::{BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, Phase};

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
    /// Latency of a DRAM round trip, microseconds.
    pub dram_latency_us: f64,
    /// Streaming multiprocessors.
    pub num_sms: usize,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            dram_bytes_per_us: 2.97e6,
            l2_bytes_per_us: 8.0e6,
            flops_per_us: 7.7e8,
            launch_us: 1.25,
            loop_step_us: 0.6,
            dram_latency_us: 0.8,
            num_sms: 132,
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

fn numel(d: &[usize]) -> u64 {
    d.iter().map(|&x| x as u64).product()
}

fn matmul_flops(a: &[usize], b: &[usize]) -> u64 {
    let k = a.last().copied().unwrap_or(1) as u64;
    let n = b.last().copied().unwrap_or(1) as u64;
    2 * numel(&a[..a.len() - 1]) * k * n
}

/// Cost of one customized kernel.
pub fn block_graph_cost(bg: &BlockGraph, m: &CostModel) -> Cost {
    let blocks = bg.num_blocks() as u64;
    let f = bg.forloop_range as u64;
    let mut c = Cost { launches: 1, shared_memory: bg.shared_memory_upper_bound(), ..Cost::default() };
    let mut flops_per_block = 0u64;
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
    let stages = bg.pipeline_stages(staged, other);
    for op in &bg.ops {
        let times = match op.outputs.first().map(|&t| bg.tensors[t].phase) {
            Some(Phase::Loop) => f,
            _ => 1,
        };
        let dims = |i: usize| bg.tensors[op.inputs[i]].dims.as_slice();
        match &op.kind {
            BlockOpKind::Input { dims: dev, dtype, .. } => {
                let tile = &bg.tensors[op.outputs[0]];
                c.dram_bytes += numel(dev) * dtype.size_bytes() as u64;
                c.l2_bytes += numel(&tile.dims) * tile.dtype.size_bytes() as u64 * times * blocks;
            }
            BlockOpKind::Output { .. } => {
                let t = &bg.tensors[op.inputs[0]];
                c.dram_bytes += numel(&t.dims) * t.dtype.size_bytes() as u64 * blocks;
            }
            BlockOpKind::Matmul => flops_per_block += matmul_flops(dims(0), dims(1)) * times,
            BlockOpKind::RmsNorm => flops_per_block += 3 * numel(dims(0)) * times,
            // Accumulators run every iteration on their input.
            k if k.is_accumulator() => flops_per_block += numel(dims(0)) * f,
            _ => flops_per_block += numel(&bg.tensors[op.outputs[0]].dims) * times,
        }
    }
    c.flops = flops_per_block * blocks;
    let sms = m.num_sms.max(1) as u64;
    let waves = blocks.div_ceil(sms).max(1);
    let util = blocks as f64 / (waves * sms) as f64;
    let busy = (c.dram_bytes as f64 / m.dram_bytes_per_us)
        .max(c.l2_bytes as f64 / m.l2_bytes_per_us)
        .max(c.flops as f64 / m.flops_per_us);
    let exposed = if stages > 1 || f == 1 { 1.0 } else { f as f64 };
    // Each block runs its loop steps one after another: that chain overlaps the traffic, so
    // it only counts where it is longer.
    let serial = (waves * f) as f64 * m.loop_step_us;
    c.est_us = (busy / util).max(serial) + m.launch_us + exposed * m.dram_latency_us;
    c
}

/// Cost of a whole kernel graph (predefined ops and customized kernels).
pub fn kernel_graph_cost(g: &KernelGraph, m: &CostModel) -> Cost {
    let mut total = Cost::default();
    for op in &g.ops {
        let bytes = |t: usize| numel(&g.tensors[t].dims) * g.tensors[t].dtype.size_bytes() as u64;
        let c = match &op.kind {
            KernelOpKind::Input { .. } => continue,
            KernelOpKind::Customized { graph } => block_graph_cost(graph, m),
            kind => {
                let io: u64 = op.inputs.iter().chain(&op.outputs).map(|&t| bytes(t)).sum();
                let d = |i: usize| g.tensors[op.inputs[i]].dims.as_slice();
                let flops = match kind {
                    KernelOpKind::Matmul => matmul_flops(d(0), d(1)),
                    KernelOpKind::RmsNorm { .. } | KernelOpKind::Softmax { .. } => 3 * numel(d(0)),
                    _ => numel(d(0)),
                };
                let busy = (io as f64 / m.dram_bytes_per_us).max(flops as f64 / m.flops_per_us);
                Cost { est_us: busy + m.launch_us, dram_bytes: io, l2_bytes: 0, flops, launches: 1, shared_memory: 0 }
            }
        };
        total.add(c);
    }
    total
}
