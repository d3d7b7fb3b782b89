//! Lowering a kernel graph to a [`Program`]: device buffers for every tensor, one kernel per
//! op (block-graph kernels for customized ops, default kernels for predefined ops), the
//! workspace plan and the assembled CUDA source.

use mirage_ugraph::{BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, Target, TensorId, UnaryOp};

use crate::block_kernel;
use crate::default_kernels::{self as dk, Ew};
use crate::error::{Error, Result};
use crate::gemm;
use crate::program::{BufferRef, DevBuffer, KernelSpec, Program, Step, Storage, TensorDesc};
use crate::runtime::Parts;

/// The line between the runtime header and the generated kernels in a generated source.
pub const KERNELS_MARK: &str = "// ---------------------------------------------------------------- generated kernels";

/// Alignment of workspace buffers in bytes.
const WORKSPACE_ALIGN: usize = 256;

/// Options of code generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The GPU generated for: its architecture (`target.arch`, e.g. 90 for sm_90), shared
    /// memory, one-wave grids and register budgets.
    pub target: Target,
    /// Per-block shared-memory limit to enforce (the device's opt-in limit); `None` checks
    /// nothing (compile-only use, the limit is checked when the module is loaded).
    pub smem_limit: Option<usize>,
    /// Consumer warpgroups of the interleaved warp-specialised attention loop.
    pub ws_warpgroups: WsWarpgroups,
    /// A summing cluster split's first block adds the other blocks' sums where its epilogue
    /// reads them instead of in a pass of its own (`block_kernel::Knobs::lazy_merge`; on by
    /// default: on the H200, the nine RMSNorm+Linear and gated-MLP winners took 0.1-0.3 us
    /// less or the same, e.g. RMSNorm+Linear 4096x6144 b=1 16.64-16.72 -> 16.37-16.46 us).
    pub lazy_merge: bool,
    /// A summing cluster split's other blocks send their sums with `st.async`, completing on
    /// an mbarrier of the first block, instead of stores released on the cluster barrier
    /// (`block_kernel::Knobs::async_push`; on by default).
    pub async_push: bool,
    /// Every kernel's loop matmuls summed in registers take the warpgroup tensor cores where
    /// they fit, on sm_90 (`block_kernel::Knobs::wgmma_acc`; `MIRAGE_WGMMA_ACC=1`), not only
    /// those of block graphs that ask for it (`BlockGraph::warpgroup_acc`, the search's
    /// warpgroup twins): off by default.
    pub wgmma_acc: bool,
    /// Copies of graph-input tiles that only one block reads, once, carry the L2 policy
    /// evict_first (`block_kernel::Knobs::evict_first`; `MIRAGE_EVICT_FIRST=0` turns it off).
    pub evict_first: bool,
    /// Predefined matmuls whose layout cuBLAS takes become cuBLAS GEMM steps
    /// ([`crate::program::Step::Gemm`]) instead of default kernels (`MIRAGE_CUBLAS=0` turns
    /// it off; [`crate::Executable`] turns it off where libcublas cannot be loaded).
    pub cublas: bool,
}

/// Consumer warpgroups of the interleaved warp-specialised attention loop (64 query rows a
/// block, key stages taken in turn; see `block_kernel::plan::ws_three`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WsWarpgroups {
    /// Three (64-key stages) where the region normalises V, else two (128-key stages): on the
    /// H100, QK-norm b=8 19.3-19.5 us against 19.8-20.2 with two, GQA b=8 16.2-16.4 against
    /// 15.4-15.6.
    #[default]
    Auto,
    /// Two warpgroups of 128-key stages.
    Two,
    /// Three warpgroups of 64-key stages wherever the form applies.
    Three,
}

impl Options {
    /// Options for `arch`'s preset target ([`Target::for_arch`]) with no shared-memory check
    /// and the attention warpgroups chosen per region ([`WsWarpgroups::Auto`]).
    pub fn for_arch(arch: u32) -> Self {
        Self::for_target(Target::for_arch(arch))
    }

    /// Options for `target` with no shared-memory check and the attention warpgroups chosen
    /// per region ([`WsWarpgroups::Auto`]).
    pub fn for_target(target: Target) -> Self {
        Options {
            target,
            smem_limit: None,
            ws_warpgroups: WsWarpgroups::Auto,
            lazy_merge: true,
            async_push: true,
            wgmma_acc: false,
            evict_first: true,
            cublas: true,
        }
    }

    /// [`Self::for_arch`] with the attention warpgroups and the cluster merge the environment
    /// asks for.
    pub fn for_arch_from_env(arch: u32) -> Result<Self> {
        Self::for_target_from_env(Target::for_arch(arch))
    }

    /// [`Self::for_target`] with the attention warpgroups and the cluster merge the
    /// environment asks for.
    pub fn for_target_from_env(target: Target) -> Result<Self> {
        Ok(Options {
            ws_warpgroups: Self::ws_warpgroups_from_env()?,
            lazy_merge: Self::flag_from_env("MIRAGE_LAZY_MERGE", true)?,
            async_push: Self::flag_from_env("MIRAGE_ASYNC_PUSH", true)?,
            wgmma_acc: Self::flag_from_env("MIRAGE_WGMMA_ACC", false)?,
            evict_first: Self::flag_from_env("MIRAGE_EVICT_FIRST", true)?,
            cublas: Self::flag_from_env("MIRAGE_CUBLAS", true)?,
            ..Self::for_target(target)
        })
    }

    /// The target architecture as `major * 10 + minor` (`target.arch`).
    pub fn arch(&self) -> u32 {
        self.target.arch
    }

    /// A setting environment variable `var` may turn on (1) or off (0), `default` when unset
    /// or empty: `MIRAGE_LAZY_MERGE` (0: the gathering cluster merge), `MIRAGE_ASYNC_PUSH` (0:
    /// the merge's pushes released on the cluster barrier), `MIRAGE_WGMMA_ACC` (1: loop
    /// matmuls on the warpgroup tensor cores), `MIRAGE_EVICT_FIRST` (0: no L2 policy on the
    /// copies of tiles read once), `MIRAGE_CUBLAS` (0: predefined matmuls on the default
    /// kernel, not cuBLAS). Any other value is an error naming the variable.
    pub fn flag_from_env(var: &str, default: bool) -> Result<bool> {
        let v = std::env::var(var).unwrap_or_default();
        match v.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            "" => Ok(default),
            other => Err(Error::Unsupported(format!("{var} must be 0 or 1, got {other:?}"))),
        }
    }

    /// The attention warpgroups `MIRAGE_WS_WARPGROUPS` asks for: 2 or 3, or per region when
    /// unset or empty; any other value is an error naming the variable.
    pub fn ws_warpgroups_from_env() -> Result<WsWarpgroups> {
        let v = std::env::var("MIRAGE_WS_WARPGROUPS").unwrap_or_default();
        match v.trim() {
            "" => Ok(WsWarpgroups::Auto),
            "2" => Ok(WsWarpgroups::Two),
            "3" => Ok(WsWarpgroups::Three),
            other => Err(Error::Unsupported(format!("MIRAGE_WS_WARPGROUPS must be 2 or 3, got {other:?}"))),
        }
    }
}

/// Whether output `k` of a customized kernel is a plain value of the program: computed from
/// its inputs by element-wise ops and normalisations only, with no sum (matmul, reduction,
/// accumulator) or `exp` behind it. Such a tensor (a normalised V, say) is stored in its
/// declared dtype, as the user's program would store it, so that the kernel consuming it
/// streams 16-bit tiles (and may take them straight into tensor cores).
fn plain_output(bg: &BlockGraph, k: usize) -> bool {
    let Some(out) = bg.output_ops().nth(k) else { return false };
    let mut todo = out.inputs.clone();
    while let Some(t) = todo.pop() {
        let Some(op) = bg.ops.iter().find(|o| o.outputs.contains(&t)) else { return false };
        match op.kind {
            BlockOpKind::Input { .. } => {}
            BlockOpKind::RmsNorm { .. } | BlockOpKind::Binary { .. } => todo.extend(&op.inputs),
            BlockOpKind::Unary { op: u } if u != UnaryOp::Exp => todo.extend(&op.inputs),
            _ => return false,
        }
    }
    true
}

/// Liveness: whether some output of `g` (`output_ids`) depends on each op.
fn needed_ops(g: &KernelGraph, output_ids: &[TensorId]) -> Vec<bool> {
    let mut tneed = vec![false; g.tensors.len()];
    for &t in output_ids {
        tneed[t] = true;
    }
    let mut opneed = vec![false; g.ops.len()];
    for (i, op) in g.ops.iter().enumerate().rev() {
        if op.outputs.iter().any(|&t| tneed[t]) {
            opneed[i] = true;
            for &t in &op.inputs {
                tneed[t] = true;
            }
        }
    }
    opneed
}

/// Generates the CUDA program of `g`.
///
/// Graph inputs and outputs keep their dtypes and layouts; intermediate tensors between
/// kernels are stored in a workspace: in fp32 where they carry sums or `exp` values (fp32
/// accumulation end to end, and no overflow of partial sums such as `exp` sums), in their
/// declared dtype where they are plain values (`plain_output`) or, with `opts.cublas`, where
/// a predefined matmul reads them (so that cuBLAS, which takes inputs of one storage, can run
/// it). Ops no output depends on are skipped.
pub fn generate(g: &KernelGraph, opts: &Options) -> Result<Program> {
    let g = g.revalidate()?;
    let n_t = g.tensors.len();
    let input_ids = g.input_ids();
    let output_ids = g.output_ids();
    if output_ids.is_empty() {
        return Err(Error::Unsupported("the graph has no outputs".into()));
    }
    let input_strides: Vec<Vec<usize>> = g
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            KernelOpKind::Input { strides, .. } => Some(strides.clone()),
            _ => None,
        })
        .collect();
    let out_strides: Vec<Vec<usize>> = output_ids
        .iter()
        .map(|&t| match g.outputs.iter().find(|o| o.tensor == t) {
            Some(o) => o.strides.clone(),
            None => dk::dense(&g.tensors[t].dims),
        })
        .collect();

    // Buffers: inputs, outputs, workspace for the rest.
    let mut buf: Vec<Option<DevBuffer>> = vec![None; n_t];
    for (i, &t) in input_ids.iter().enumerate() {
        let d = &g.tensors[t];
        buf[t] = Some(DevBuffer {
            dims: d.dims.clone(),
            strides: input_strides[i].clone(),
            storage: Storage::of(d.dtype),
            location: BufferRef::Input(i),
        });
    }
    let mut copies: Vec<(usize, TensorId)> = Vec::new();
    for (j, &t) in output_ids.iter().enumerate() {
        if buf[t].is_some() {
            copies.push((j, t)); // an output that is an input: copied at the end
        } else {
            let d = &g.tensors[t];
            buf[t] = Some(DevBuffer {
                dims: d.dims.clone(),
                strides: out_strides[j].clone(),
                storage: Storage::of(d.dtype),
                location: BufferRef::Output(j),
            });
        }
    }
    let opneed = needed_ops(&g, &output_ids);
    let mut workspace = place_intermediates(&g, &opneed, opts.cublas, &mut buf)?;
    let get = |t: TensorId| -> Result<&DevBuffer> {
        buf[t].as_ref().ok_or_else(|| Error::Unsupported(format!("internal error: tensor #{t} has no buffer")))
    };

    let mut kernels: Vec<KernelSpec> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut bodies: Vec<String> = Vec::new();
    let mut parts = Parts::NONE;
    // cuBLAS's workspace, after the intermediates (reserved once some matmul takes cuBLAS).
    let gemm_ws = BufferRef::Workspace(workspace);
    for (i, op) in g.ops.iter().enumerate() {
        if !opneed[i] || matches!(op.kind, KernelOpKind::Input { .. }) {
            continue;
        }
        let ins: Vec<&DevBuffer> = op.inputs.iter().map(|&t| get(t)).collect::<Result<_>>()?;
        let outs: Vec<&DevBuffer> = op.outputs.iter().map(|&t| get(t)).collect::<Result<_>>()?;
        let name = format!("mi_k{i}_{}", op.kind.name());
        let kind = op.kind.name();
        if opts.cublas && matches!(op.kind, KernelOpKind::Matmul) {
            if let Some(spec) = gemm::plan(&name, i, ins[0], ins[1], outs[0], gemm_ws) {
                bodies.push(gemm::comment(&spec));
                steps.push(Step::Gemm(Box::new(spec)));
                continue;
            }
        }
        let OpKernel { source: src, grid, block, smem, cluster } =
            emit_op(&name, &op.kind, &ins, &outs, opts, &mut parts)?;
        if let Some(limit) = opts.smem_limit {
            if smem > limit {
                return Err(Error::SharedMemory { kernel: name, needed: smem, limit });
            }
        }
        let mut args: Vec<BufferRef> = ins.iter().map(|b| b.location).collect();
        args.extend(outs.iter().map(|b| b.location));
        steps.push(Step::Kernel(kernels.len()));
        kernels.push(KernelSpec { name, kind, op: i, grid, block, cluster, smem_bytes: smem, args, dep_wait: true });
        bodies.push(src);
    }
    for (j, t) in copies {
        let src = get(t)?;
        let d = &g.tensors[t];
        let out = DevBuffer {
            dims: d.dims.clone(),
            strides: out_strides[j].clone(),
            storage: Storage::of(d.dtype),
            location: BufferRef::Output(j),
        };
        let name = format!("mi_copy_out{j}");
        let e = dk::elementwise(&name, &Ew::Copy, &[src], &out)?;
        steps.push(Step::Kernel(kernels.len()));
        kernels.push(KernelSpec {
            name,
            kind: "copy",
            op: g.ops.len(),
            grid: e.grid,
            block: e.block,
            cluster: [1; 3],
            smem_bytes: 0,
            args: vec![src.location, out.location],
            dep_wait: true,
        });
        bodies.push(e.source);
    }

    let n_gemms = steps.iter().filter(|s| matches!(s, Step::Gemm(_))).count();
    if n_gemms > 0 {
        workspace = workspace
            .checked_add(gemm::WORKSPACE_BYTES)
            .ok_or_else(|| Error::Unsupported("the workspace size overflows".into()))?;
    }
    let gemm_note =
        if n_gemms > 0 { format!(" and {n_gemms} cuBLAS GEMM(s) (shown as comments)") } else { String::new() };
    let mut source = String::new();
    source.push_str(&format!(
        "// Generated by mirage-codegen {} for sm_{}: {} kernel(s){gemm_note}. Self-contained apart from CUDA's headers.\n",
        env!("CARGO_PKG_VERSION"),
        opts.arch(),
        kernels.len()
    ));
    // The runtime header: the parts the kernels use and the parts those need.
    let runtime_parts = parts.closure();
    source.push_str(&runtime_parts.header());
    source.push('\n');
    source.push_str(KERNELS_MARK);
    source.push('\n');
    for b in &bodies {
        source.push('\n');
        source.push_str(b);
    }
    let inputs = input_ids
        .iter()
        .zip(&input_strides)
        .map(|(&t, s)| TensorDesc { dims: g.tensors[t].dims.clone(), strides: s.clone(), dtype: g.tensors[t].dtype })
        .collect();
    let outputs = output_ids
        .iter()
        .zip(&out_strides)
        .map(|(&t, s)| TensorDesc { dims: g.tensors[t].dims.clone(), strides: s.clone(), dtype: g.tensors[t].dtype })
        .collect();
    Ok(Program {
        source,
        arch: opts.arch(),
        kernels,
        steps,
        inputs,
        outputs,
        workspace_bytes: workspace,
        runtime_parts,
    })
}

/// Places every needed intermediate tensor (no buffer yet in `buf`) in the workspace; returns
/// the workspace's size in bytes. Storage: fp32 where the tensor carries sums or `exp` values,
/// the declared dtype where it is a plain value (`plain_output`, an RMS norm's) or, with
/// `cublas`, where a predefined matmul reads it (cuBLAS takes two inputs of one storage only,
/// and the user's program stores it so).
fn place_intermediates(g: &KernelGraph, opneed: &[bool], cublas: bool, buf: &mut [Option<DevBuffer>]) -> Result<usize> {
    let overflow = || Error::Unsupported("the workspace size overflows".into());
    let mut feeds_matmul = vec![false; g.tensors.len()];
    if cublas {
        for (i, op) in g.ops.iter().enumerate() {
            if opneed[i] && matches!(op.kind, KernelOpKind::Matmul) {
                for &t in &op.inputs {
                    feeds_matmul[t] = true;
                }
            }
        }
    }
    let mut workspace = 0usize;
    for (i, op) in g.ops.iter().enumerate() {
        if !opneed[i] {
            continue;
        }
        for (k, &t) in op.outputs.iter().enumerate() {
            if buf[t].is_some() {
                continue;
            }
            let dims = g.tensors[t].dims.clone();
            let storage = match &op.kind {
                KernelOpKind::Customized { graph } if plain_output(graph, k) => Storage::of(g.tensors[t].dtype),
                KernelOpKind::RmsNorm { .. } => Storage::of(g.tensors[t].dtype),
                _ if feeds_matmul[t] => Storage::of(g.tensors[t].dtype),
                _ => Storage::F32,
            };
            let bytes = dims
                .iter()
                .try_fold(storage.size_bytes(), |acc, &d| acc.checked_mul(d))
                .and_then(|b| b.checked_next_multiple_of(WORKSPACE_ALIGN))
                .ok_or_else(overflow)?;
            buf[t] =
                Some(DevBuffer { strides: dk::dense(&dims), dims, storage, location: BufferRef::Workspace(workspace) });
            workspace = workspace.checked_add(bytes).ok_or_else(overflow)?;
        }
    }
    Ok(workspace)
}

/// One op's generated kernel: source and launch shape.
struct OpKernel {
    source: String,
    grid: [u32; 3],
    block: [u32; 3],
    /// Dynamic shared memory in bytes.
    smem: usize,
    cluster: [u32; 3],
}

/// The kernel of one op (not an input, not a cuBLAS step): its source, grid, block, dynamic
/// shared memory and cluster; the runtime header parts it uses join `parts`.
fn emit_op(
    name: &str,
    kind: &KernelOpKind,
    ins: &[&DevBuffer],
    outs: &[&DevBuffer],
    opts: &Options,
    parts: &mut Parts,
) -> Result<OpKernel> {
    if let KernelOpKind::Customized { graph } = kind {
        // A block input declared with leading 1s reads the buffer as that view.
        let in_bufs: Vec<DevBuffer> = ins.iter().zip(graph.input_ops()).map(|(b, bop)| lifted(b, graph, bop)).collect();
        let out_bufs: Vec<DevBuffer> = outs.iter().map(|b| (*b).clone()).collect();
        let knobs = block_kernel::Knobs {
            wgs: opts.ws_warpgroups,
            lazy_merge: opts.lazy_merge,
            async_push: opts.async_push,
            wgmma_acc: (opts.wgmma_acc || graph.warpgroup_acc) && opts.arch() == 90,
            evict_first: opts.evict_first && opts.arch() >= 80,
            target: opts.target,
        };
        let e = block_kernel::emit(name, graph, &in_bufs, &out_bufs, opts.arch(), knobs)?;
        let grid = [0, 1, 2].map(|a| (graph.grid_dim[a] * e.cluster[a]) as u32);
        let mut block = graph.block_dim.map(|x| x as u32);
        block[0] += e.extra_threads as u32;
        *parts = parts.union(e.parts);
        return Ok(OpKernel {
            source: e.source,
            grid,
            block,
            smem: e.smem_bytes,
            cluster: e.cluster.map(|x| x as u32),
        });
    }
    let out = outs[0];
    let e = match kind {
        KernelOpKind::Matmul => dk::matmul(name, ins[0], ins[1], out)?,
        KernelOpKind::Unary { op: u } => dk::elementwise(name, &Ew::Unary(*u), ins, out)?,
        KernelOpKind::Binary { op: b } => dk::elementwise(name, &Ew::Binary(*b), ins, out)?,
        KernelOpKind::Reduction { dim } => dk::reduction(name, *dim, ins[0], out)?,
        KernelOpKind::RmsNorm { normalized_ndims, eps } => {
            dk::rms_norm(name, *normalized_ndims, *eps, ins[0], ins.get(1).copied(), out)?
        }
        KernelOpKind::Softmax { dim } => dk::softmax(name, *dim, ins[0], out)?,
        KernelOpKind::Input { .. } | KernelOpKind::Customized { .. } => {
            return Err(Error::Unsupported("internal error: op handled above".into()))
        }
    };
    *parts = parts.union(e.parts);
    Ok(OpKernel { source: e.source, grid: e.grid, block: e.block, smem: e.smem_bytes, cluster: [1; 3] })
}

/// `b` as the block input `bop` of `graph` declares it: its dims with leading 1s added
/// (strides of the whole buffer there), or `b` itself.
fn lifted(b: &DevBuffer, graph: &mirage_ugraph::BlockGraph, bop: &mirage_ugraph::BlockOp) -> DevBuffer {
    let rank = bop.outputs.first().map_or(0, |&o| graph.tensors[o].dims.len());
    let lift = rank.saturating_sub(b.dims.len());
    if lift == 0 {
        return b.clone();
    }
    let span = b.dims.iter().zip(&b.strides).map(|(&d, &s)| d.saturating_sub(1) * s).sum::<usize>() + 1;
    DevBuffer {
        dims: [vec![1; lift], b.dims.clone()].concat(),
        strides: [vec![span; lift], b.strides.clone()].concat(),
        ..b.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirage_ugraph::{Accum, DType};

    #[test]
    fn options_for_an_arch_take_its_preset() {
        assert_eq!(Options::for_arch(90).target, Target::sm90());
        assert_eq!(Options::for_arch(80).target, Target::sm80());
        let o = Options::for_arch(86);
        assert_eq!((o.arch(), o.target.num_sms), (86, Target::sm80().num_sms));
    }

    /// Kernel 1 computes `norm(X)` (with `exp` first when `exp`; the predefined kernel when
    /// "predefined norm") or the sum of X's rows; kernel 2 adds it to X. Returns the generated
    /// source.
    fn two_kernels(first: &str) -> String {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[64, 64], DType::Float16, None).expect("input");
        let y = if first == "predefined norm" {
            g.rms_norm(x, &[64], None).expect("rms_norm")
        } else {
            let mut k1 = BlockGraph::new([4, 1, 1], [128, 1, 1], 1, 64).expect("grid");
            let t = k1.new_input(&[64, 64], DType::Float16, [0, -1, -1], -1).expect("tile");
            let y = match first {
                "norm" => k1.rms_norm(t),
                "exp" => k1.unary(UnaryOp::Exp, t).and_then(|e| k1.rms_norm(e)),
                _ => k1.forloop_accum(t, Accum::None),
            }
            .expect("op");
            k1.new_output(y, [0, -1, -1], -1).expect("output");
            g.customized(&[x], k1).expect("kernel 1")[0]
        };
        let mut k2 = BlockGraph::new([4, 1, 1], [128, 1, 1], 1, 64).expect("grid");
        let a = k2.new_input(&[64, 64], DType::Float16, [0, -1, -1], -1).expect("a");
        let b = k2.new_input(&[64, 64], DType::Float16, [0, -1, -1], -1).expect("b");
        let z = k2.binary(mirage_ugraph::BinaryOp::Add, a, b).expect("add");
        k2.new_output(z, [0, -1, -1], -1).expect("output");
        let z = g.customized(&[x, y], k2).expect("kernel 2")[0];
        g.mark_output(z, None).expect("mark");
        generate(&g, &Options::for_arch(90)).expect("generates").source
    }

    #[test]
    fn a_predefined_matmul_becomes_a_gemm_step_in_launch_order() {
        // A customized kernel (x + x) feeding a predefined matmul, then an element-wise op.
        let mut g = KernelGraph::new();
        let x = g.new_input(&[64, 64], DType::Float16, None).expect("x");
        let w = g.new_input(&[64, 32], DType::Float16, None).expect("w");
        let mut k1 = BlockGraph::new([4, 1, 1], [128, 1, 1], 1, 64).expect("grid");
        let a = k1.new_input(&[64, 64], DType::Float16, [0, -1, -1], -1).expect("a");
        let s = k1.binary(mirage_ugraph::BinaryOp::Add, a, a).expect("add");
        k1.new_output(s, [0, -1, -1], -1).expect("output");
        let s = g.customized(&[x], k1).expect("kernel")[0];
        let y = g.matmul(s, w).expect("matmul");
        let z = g.unary(UnaryOp::Exp, y).expect("exp");
        g.mark_output(z, None).expect("mark");
        let p = generate(&g, &Options::for_arch(90)).expect("generates");
        let kinds: Vec<String> = p
            .steps
            .iter()
            .map(|st| match st {
                Step::Kernel(i) => p.kernels[*i].kind.to_string(),
                Step::Gemm(gs) => format!("gemm {}x{}x{}", gs.m, gs.n, gs.k),
            })
            .collect();
        assert_eq!(kinds, ["customized", "gemm 64x32x64", "exp"]);
        let gs = p.gemms().next().expect("a gemm");
        // The matmul reads the customized kernel's f16 output and writes an fp32 intermediate.
        assert_eq!((gs.input_storage, gs.out_storage), (Storage::F16, Storage::F32));
        let BufferRef::Workspace(ws) = gs.workspace else { panic!("{gs:?}") };
        assert_eq!(p.workspace_bytes, ws + gemm::WORKSPACE_BYTES);
        assert!(p.source.contains("// mi_k3_matmul: cuBLAS gemm 64 x 32 x 64"), "{}", p.kernels_source());
        assert!(!p.source.contains("mi_k3_matmul("));
        let off = generate(&g, &Options { cublas: false, ..Options::for_arch(90) }).expect("generates");
        assert_eq!(off.gemms().count(), 0);
        assert_eq!(off.kernels.iter().map(|k| k.kind).collect::<Vec<_>>(), ["customized", "matmul", "exp"]);
        assert!(off.workspace_bytes < gemm::WORKSPACE_BYTES);
        // The customized kernel's code is the same either way.
        let first = |src: &str| src.split("\n}\n").next().map(str::to_string);
        assert_eq!(first(p.kernels_source()), first(off.kernels_source()));
    }

    #[test]
    fn plain_intermediates_keep_their_dtype_and_sums_stay_fp32() {
        let second = |src: &str| src.split("mi_k2_customized(").nth(1).map(|s| s[..120].to_string());
        let norm = second(&two_kernels("norm")).expect("kernel 2");
        assert!(norm.contains("const mi::f16* __restrict__ in1"), "{norm}");
        for first in ["exp", "sum"] {
            let s = second(&two_kernels(first)).expect("kernel 2");
            assert!(s.contains("const float* __restrict__ in1"), "{first}: {s}");
        }
        // A predefined RMS norm's output is a plain value too: the next kernel reads it as f16
        // (its matmuls then take both operands on tensor cores).
        let s = second(&two_kernels("predefined norm")).expect("kernel 2");
        assert!(s.contains("const mi::f16* __restrict__ in1"), "{s}");
    }
}
