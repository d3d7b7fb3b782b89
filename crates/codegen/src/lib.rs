//! CUDA code generation for µGraphs, compiled with NVRTC and launched through the driver API.
//!
//! * [`generate()`] lowers a kernel graph to a [`Program`]: CUDA C++ source with one
//!   `__global__` per customized op (block-graph semantics of `mirage_ugraph::block`: input
//!   iterators, tile ops, fp32 accumulators, post-loop ops, output savers) and default kernels
//!   for predefined ops (matmul, element-wise with broadcasting, reduction, rms_norm with
//!   weight, softmax), or a cuBLAS GEMM step ([`Step::Gemm`], [`gemm::plan`]) for a
//!   predefined matmul whose layout cuBLAS takes; the runtime header's parts the kernels use (`runtime/*.cuh`, [`runtime`]) are inlined. A
//!   customized op takes the first kernel form that fits its block graph: register rows
//!   (`rowreg`: loop-free element-wise ops and RMS norms), register loops (`eltloop`:
//!   [`mirage_ugraph::BlockGraph::is_elementwise`] graphs, a split-KV combine step) or the
//!   general shared-memory schedule (`block_kernel`, with `flash`'s attention region; a
//!   one-wave wgmma attention block of two warpgroups gets a producer warpgroup on top of the
//!   graph's threads, which fills its K/V stages behind mbarriers, and with three consumer
//!   warpgroups ([`WsWarpgroups`]) a third attention warpgroup: `Emitted::extra_threads`).
//! * [`nvrtc::compile`] compiles a source to a CUBIN for an exact `sm_XX`, with an in-memory
//!   and on-disk cache; a missing NVRTC is an error, never a panic. [`nvrtc::resources`]
//!   compiles with ptxas's verbose report ([`PtxasReport`]: registers, spills, warnings);
//!   [`sass::disassemble`] reads a CUBIN's machine code per kernel with `nvdisasm`.
//! * [`Executable`] loads a program on a device and launches it on raw device pointers on a
//!   caller's stream (PyTorch tensors and streams from the Python package). On sm_90 every
//!   kernel goes out as a programmatic dependent of the previous kernel in the stream: it
//!   waits for it (`mi::dep_enter`, `mi::dep_wait`) before touching memory, so only its
//!   launch and L2 prefetches of its first input tiles overlap that kernel's drain (a kernel
//!   streaming a pipelined loop lets the next one go once its last copies are issued).
//!
//! ```
//! use mirage_codegen::{generate, Options};
//! use mirage_ugraph::{DType, KernelGraph};
//! let mut g = KernelGraph::new();
//! let x = g.new_input(&[8, 64], DType::Float16, None).unwrap();
//! let y = g.softmax(x, -1).unwrap();
//! g.mark_output(y, None).unwrap();
//! let p = generate(&g, &Options::for_arch(90)).unwrap();
//! assert_eq!(p.kernels.len(), 1);
//! assert!(p.source.contains("extern \"C\" __global__"));
//! ```

mod block_kernel;
pub mod cublas;
mod default_kernels;
pub mod driver;
mod eltloop;
mod emit;
pub mod error;
pub mod exec;
mod flash;
pub mod gemm;
pub mod generate;
pub mod nvrtc;
pub mod program;
pub mod resources;
mod rowreg;
pub mod runtime;
pub mod sass;

pub use error::{Error, Result};
pub use exec::Executable;
pub use generate::{generate, Options, WsWarpgroups};
pub use mirage_ugraph::Target;
pub use program::{BufferRef, DevBuffer, GemmOperand, GemmSpec, KernelSpec, Program, Step, Storage, TensorDesc};
pub use resources::{KernelResources, PtxasReport};
pub use runtime::{NamedBarrier, Part, Parts, RUNTIME_HEADER};
pub use sass::KernelSass;
