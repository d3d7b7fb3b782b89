//! µGraph IR of the mirage superoptimizer: kernel graphs of device tensors, block graphs of
//! tiles run by a grid of thread blocks, thread graphs of fused element-wise chains; shape
//! inference and validation with errors naming the op, operand and dims; versioned JSON; DOT
//! export; and one interpreter generic over the scalar domain.
//!
//! ```
//! use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph};
//! // RMSNorm + Linear as one customized kernel (the reference's hand-written µGraph).
//! let mut g = KernelGraph::new();
//! let x = g.new_input(&[16, 256], DType::Float16, None).unwrap();
//! let w = g.new_input(&[256, 512], DType::Float16, None).unwrap();
//! let mut tb = BlockGraph::new([8, 1, 1], [128, 1, 1], 4, 64).unwrap();
//! let tx = tb.new_input(&[16, 256], DType::Float16, [-1, -1, -1], 1).unwrap();
//! let tw = tb.new_input(&[256, 512], DType::Float16, [1, -1, -1], 0).unwrap();
//! let mm = tb.matmul(tx, tw).unwrap();
//! let acc = tb.forloop_accum(mm, Accum::None).unwrap();
//! let rms = tb.forloop_accum(tx, Accum::Rms).unwrap();
//! let out = tb.binary(BinaryOp::Div, acc, rms).unwrap();
//! tb.new_output(out, [1, -1, -1], -1).unwrap();
//! let outs = g.customized(&[x, w], tb).unwrap();
//! assert_eq!(g.tensor(outs[0]).unwrap().dims, vec![16, 512]);
//! ```

pub mod block;
pub mod cancel;
pub mod dot;
pub mod error;
pub mod hash;
pub mod interp;
pub mod json;
pub mod kernel;
pub mod limits;
pub mod ops;
pub mod registry;
pub mod scalar;
pub mod smem;
pub mod structural;
pub mod target;
pub mod tensor;
pub mod thread;
pub mod types;
pub mod zoo;

pub use block::{BlockGraph, BlockOp, BlockOpKind, Phase, STensor, STensorId};
pub use cancel::Cancel;
pub use dot::to_dot;
pub use error::{Error, Result};
pub use hash::graph_hash;
pub use interp::{random_inputs, run, run_region, run_region_with, run_with, Region, Source};
pub use json::{from_json, to_json, FORMAT_VERSION};
pub use kernel::{lifted_rank, DTensor, KernelGraph, KernelOp, KernelOpKind, Output, TensorId};
pub use ops::{Accum, BinaryOp, UnaryOp};
pub use registry::{BinaryCuda, BinaryDef, BinaryLax, KernelSearch, Lax, UnaryDef, BINARY_OPS, UNARY_OPS};
pub use scalar::Scalar;
pub use structural::{structural, Level, StructuralDef, STRUCTURAL_OPS};
pub use target::{Budgets, DeviceAttr, Target};
pub use tensor::Tensor;
pub use thread::{fuse_elementwise, FusedGroup, ThreadGraph, ThreadOp};
pub use types::DType;
