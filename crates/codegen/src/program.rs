//! What code generation produces: the CUDA source, the kernels to launch in order, and where
//! every kernel argument's memory comes from (graph inputs, graph outputs, a workspace).

use mirage_ugraph::DType;
use serde_json::json;

use crate::resources::PtxasReport;
use crate::runtime::Parts;

/// How a device tensor's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// IEEE half (`__half`).
    F16,
    /// bfloat16 (`__nv_bfloat16`).
    BF16,
    /// IEEE single (`float`).
    F32,
}

impl Storage {
    /// The storage of a graph dtype.
    pub fn of(dtype: DType) -> Storage {
        match dtype {
            DType::Float16 => Storage::F16,
            DType::Bfloat16 => Storage::BF16,
            DType::Float32 => Storage::F32,
        }
    }

    /// The CUDA C++ type name.
    pub fn cty(self) -> &'static str {
        match self {
            Storage::F16 => "mi::f16",
            Storage::BF16 => "mi::bf16",
            Storage::F32 => "float",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Storage::F16 | Storage::BF16 => 2,
            Storage::F32 => 4,
        }
    }

    /// The dtype name (`float16`, `bfloat16`, `float32`).
    pub fn name(self) -> &'static str {
        match self {
            Storage::F16 => "float16",
            Storage::BF16 => "bfloat16",
            Storage::F32 => "float32",
        }
    }
}

/// Where a kernel argument's device memory comes from at launch time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferRef {
    /// The graph input with this position.
    Input(usize),
    /// The graph output with this position.
    Output(usize),
    /// Workspace memory at this byte offset (intermediate tensors between kernels).
    Workspace(usize),
}

/// A tensor in device memory as the generated code sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevBuffer {
    /// Logical dims.
    pub dims: Vec<usize>,
    /// Layout in elements.
    pub strides: Vec<usize>,
    /// Element storage.
    pub storage: Storage,
    /// Where its memory comes from.
    pub location: BufferRef,
}

/// One kernel launch of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// The `extern "C"` kernel name in the source.
    pub name: String,
    /// What the kernel computes (`customized`, `matmul`, `elementwise`, ...).
    pub kind: &'static str,
    /// Index of the kernel-graph op it implements.
    pub op: usize,
    /// Grid dims.
    pub grid: [u32; 3],
    /// Block dims.
    pub block: [u32; 3],
    /// Blocks per thread-block cluster along each grid axis (all 1: launched without clusters).
    pub cluster: [u32; 3],
    /// Dynamic shared memory per block in bytes.
    pub smem_bytes: usize,
    /// The kernel's pointer arguments, in order.
    pub args: Vec<BufferRef>,
    /// Whether the kernel waits for the previous grid of its stream before any global access
    /// (`mi::dep_enter` or `mi::dep_wait`), so that it may be launched as a programmatic
    /// dependent of it on sm_90.
    pub dep_wait: bool,
}

/// One operand of a cuBLAS GEMM call (column-major, as cuBLAS sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmOperand {
    /// Where its memory comes from.
    pub location: BufferRef,
    /// Whether cuBLAS reads the stored column-major matrix transposed (`CUBLAS_OP_T`).
    pub trans: bool,
    /// Leading dimension of the stored column-major matrix, in elements.
    pub ld: usize,
    /// Elements between consecutive matrices of the batch (0: the same matrix for all).
    pub batch_stride: usize,
}

/// A predefined matmul run as one `cublasGemmStridedBatchedEx` call (fp32 accumulation).
///
/// The graph's product is `C[m, n] = A[m, k] · B[k, n]`, `batch` times. cuBLAS is
/// column-major, so a row-major C is computed as `C^T = B^T · A^T` (`swapped`): the call's
/// first operand is then B and its m and n are the graph's n and m.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmSpec {
    /// Step name (the name the op's default kernel would have).
    pub name: String,
    /// Index of the kernel-graph op it implements.
    pub op: usize,
    /// The graph's rows of C.
    pub m: usize,
    /// The graph's columns of C.
    pub n: usize,
    /// The graph's inner dimension.
    pub k: usize,
    /// Number of matrices (product of the batch dims; 1 without).
    pub batch: usize,
    /// Whether the call computes `C^T = B^T · A^T` (first operand B) instead of `C = A · B`.
    pub swapped: bool,
    /// The call's first operand (`A` argument of cuBLAS).
    pub first: GemmOperand,
    /// The call's second operand (`B` argument of cuBLAS).
    pub second: GemmOperand,
    /// The result (`C` argument of cuBLAS, never transposed).
    pub out: GemmOperand,
    /// Storage of both inputs.
    pub input_storage: Storage,
    /// Storage of the result (the inputs' or fp32).
    pub out_storage: Storage,
    /// cuBLAS's own workspace for the call (set with `cublasSetWorkspace`), inside the
    /// program's workspace.
    pub workspace: BufferRef,
    /// Bytes of that workspace.
    pub workspace_bytes: usize,
}

impl GemmSpec {
    /// cuBLAS's `(m, n, k)` of the call.
    pub fn call_dims(&self) -> (usize, usize, usize) {
        if self.swapped {
            (self.n, self.m, self.k)
        } else {
            (self.m, self.n, self.k)
        }
    }
}

/// One step of a program, in launch order on the caller's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Launch `Program::kernels[i]`.
    Kernel(usize),
    /// A cuBLAS GEMM.
    Gemm(Box<GemmSpec>),
}

/// Dims, dtype and layout of a graph input or output as the compiled program expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Dims.
    pub dims: Vec<usize>,
    /// Layout in elements.
    pub strides: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

/// A generated program: the CUDA source and how to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Complete CUDA C++ source (the runtime header's parts in `runtime_parts` are inlined;
    /// only CUDA's own headers are included).
    pub source: String,
    /// Target architecture (e.g. 90 for sm_90).
    pub arch: u32,
    /// Kernels in launch order.
    pub kernels: Vec<KernelSpec>,
    /// Every step in order: each kernel of `kernels` once, in its order, with the cuBLAS
    /// GEMMs between them.
    pub steps: Vec<Step>,
    /// Graph inputs in call order.
    pub inputs: Vec<TensorDesc>,
    /// Graph outputs in output order.
    pub outputs: Vec<TensorDesc>,
    /// Bytes of device workspace the launch needs (0: none).
    pub workspace_bytes: usize,
    /// The runtime header parts the source inlines: those its kernels use and those they need.
    pub runtime_parts: Parts,
}

impl Program {
    /// The generated kernels' code: the source after the runtime header.
    pub fn kernels_source(&self) -> &str {
        self.source.find(crate::generate::KERNELS_MARK).map_or(self.source.as_str(), |i| &self.source[i..])
    }

    /// The cuBLAS GEMM steps in order.
    pub fn gemms(&self) -> impl Iterator<Item = &GemmSpec> {
        self.steps.iter().filter_map(|s| match s {
            Step::Gemm(g) => Some(&**g),
            Step::Kernel(_) => None,
        })
    }

    /// Largest dynamic shared memory of any kernel, in bytes.
    pub fn max_smem_bytes(&self) -> usize {
        self.kernels.iter().map(|k| k.smem_bytes).max().unwrap_or(0)
    }

    /// A JSON summary of the launches (for inspection and the Python API).
    pub fn launch_summary(&self) -> String {
        self.summary_with(|_| json!({})).to_string()
    }

    /// [`Program::launch_summary`] with what ptxas reported for each kernel (`report`, from
    /// [`crate::nvrtc::resources`] of this program's source): `registers`, `barriers`,
    /// `stack_frame_bytes`, `spill_store_bytes`, `spill_load_bytes` and `static_smem_bytes`
    /// beside each launch (absent for a kernel the report lacks), and ptxas's `warnings`;
    /// where the report lacks a kernel, NVRTC's whole log too (`ptxas_log`).
    pub fn resource_summary(&self, report: &PtxasReport) -> String {
        let mut v = self.summary_with(|name| match report.kernel(name) {
            Some(r) => json!({
                "registers": r.registers, "barriers": r.barriers, "stack_frame_bytes": r.stack_frame_bytes,
                "spill_store_bytes": r.spill_store_bytes, "spill_load_bytes": r.spill_load_bytes,
                "static_smem_bytes": r.static_smem_bytes,
            }),
            None => json!({}),
        });
        v["warnings"] = json!(report.warnings);
        // A kernel ptxas's report does not name: the log itself, to see why.
        if self.kernels.iter().any(|k| report.kernel(&k.name).is_none()) {
            v["ptxas_log"] = json!(report.log);
        }
        v.to_string()
    }

    /// The launch summary, each kernel's object extended by `extra(name)`'s fields.
    fn summary_with(&self, extra: impl Fn(&str) -> serde_json::Value) -> serde_json::Value {
        let loc = |r: &BufferRef| match r {
            BufferRef::Input(i) => format!("input{i}"),
            BufferRef::Output(i) => format!("output{i}"),
            BufferRef::Workspace(o) => format!("workspace+{o}"),
        };
        let kernels: Vec<_> = self
            .kernels
            .iter()
            .map(|k| {
                let mut o = json!({
                    "name": k.name, "kind": k.kind, "op": k.op, "grid": k.grid, "block": k.block, "cluster": k.cluster,
                    "smem_bytes": k.smem_bytes, "args": k.args.iter().map(loc).collect::<Vec<_>>(),
                });
                if let (Some(o), serde_json::Value::Object(e)) = (o.as_object_mut(), extra(&k.name)) {
                    o.extend(e);
                }
                o
            })
            .collect();
        let gemms: Vec<_> = self
            .gemms()
            .map(|g| {
                json!({
                    "name": g.name, "kind": "cublas_gemm", "op": g.op, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch,
                    "swapped": g.swapped, "trans_first": g.first.trans, "trans_second": g.second.trans,
                    "lda": g.first.ld, "ldb": g.second.ld, "ldc": g.out.ld,
                    "input_dtype": g.input_storage.name(), "output_dtype": g.out_storage.name(),
                    "args": [loc(&g.first.location), loc(&g.second.location), loc(&g.out.location)],
                })
            })
            .collect();
        let steps: Vec<&str> = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Kernel(i) => self.kernels.get(*i).map_or("?", |k| k.name.as_str()),
                Step::Gemm(g) => g.name.as_str(),
            })
            .collect();
        json!({
            "arch": self.arch, "workspace_bytes": self.workspace_bytes, "kernels": kernels, "gemms": gemms,
            "steps": steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{generate, Options, PtxasReport};
    use mirage_ugraph::{zoo, DType};

    #[test]
    fn the_resource_summary_keeps_the_log_only_where_a_kernel_is_missing() {
        let pair = zoo::rmsnorm_linear(8, 1024, 1024, 64, 8, DType::Float16).expect("zoo");
        let p = generate(&pair.ugraph, &Options::for_arch(90)).expect("generates");
        let log: String = p
            .kernels
            .iter()
            .map(|k| {
                format!(
                    "ptxas info    : Compiling entry function '{0}' for 'sm_90a'\n\
                     ptxas info    : Function properties for {0}\n\
                     ptxas info    : Used 64 registers, used 1 barriers\n",
                    k.name
                )
            })
            .collect();
        let full: serde_json::Value =
            serde_json::from_str(&p.resource_summary(&PtxasReport::parse(&log))).expect("json");
        assert!(full.get("ptxas_log").is_none(), "{full}");
        assert!(full["kernels"].as_array().is_some_and(|ks| ks.iter().all(|k| k["registers"] == 64)), "{full}");
        let short = &log[..log.rfind("ptxas info    : Compiling").expect("a kernel")];
        let part: serde_json::Value =
            serde_json::from_str(&p.resource_summary(&PtxasReport::parse(short))).expect("json");
        assert_eq!(part["ptxas_log"], short, "{part}");
    }
}
