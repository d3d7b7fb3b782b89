//! The embeddable Rust API of the mirage superoptimizer: re-exports of the µGraph IR and its
//! interpreter (`ugraph`), the verifier (`verify`), the search (`search`) and code generation
//! (`codegen`).
//!
//! ```
//! use mirage::{DType, KernelGraph, Tensor};
//! let mut g = KernelGraph::new();
//! let x = g.new_input(&[2, 4], DType::Float32, None).unwrap();
//! let y = g.rms_norm(x, &[4], None).unwrap();
//! g.mark_output(y, None).unwrap();
//! let out = mirage::run(&g, &[Tensor::new(vec![2, 4], vec![1.0f32; 8]).unwrap()]).unwrap();
//! assert!(out[0].data.iter().all(|&v| (v - 1.0).abs() < 1e-6));
//! ```

pub use mirage_ugraph::*;

/// The code generation crate.
pub use mirage_codegen as codegen;
/// The search crate.
pub use mirage_search as search;
/// The µGraph IR crate.
pub use mirage_ugraph as ugraph;
/// The equivalence verifier crate.
pub use mirage_verify as verify;
