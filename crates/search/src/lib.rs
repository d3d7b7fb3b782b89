//! Expression-guided exhaustive search for µGraphs (docs/reference.md: µGraph semantics, search): given a
//! reference program, enumerate kernel graphs of predefined ops and customized (block-graph)
//! kernels, prune every partial block graph whose abstract expression is not in the saturated
//! e-graph of the reference's ([`expr`], [`axioms`], [`oracle`]), generate grids, maps and loops
//! from index labels ([`labels`], [`generator`]), rank by a static cost model ([`cost`]) and
//! check the cheapest candidates ([`verify`]).
//!
//! ```
//! use mirage_search::{superoptimize, SearchConfig};
//! use mirage_ugraph::{zoo, DType};
//! // Gated MLP: silu(X W1) * (X W2) becomes one kernel accumulating both matmuls.
//! let pair = zoo::gated_mlp(8, 256, 256, 4, 4, DType::Float16).unwrap();
//! let result = superoptimize(&pair.reference, &SearchConfig { max_kernel_ops: 1, ..Default::default() }).unwrap();
//! assert_eq!(result.best().unwrap().customized_kernels, 1);
//! ```

#![warn(missing_docs)]

pub mod axioms;
pub mod config;
mod control;
pub mod cost;
pub mod error;
pub mod expr;
pub mod generator;
pub mod labels;
pub mod online_softmax;
pub mod oracle;
pub mod search;
pub mod sizes;
pub mod verify;

pub use axioms::{SaturationLimits, SaturationReport};
pub use config::{Phase, Progress, ProgressFn, SearchConfig, VerifyOptions};
pub use control::StopReason;
pub use cost::{Cost, CostModel};
pub use error::{Result, SearchError};
pub use online_softmax::rewrite_online_softmax;
pub use oracle::ExprOracle;
pub use search::{superoptimize, Candidate, SearchResult, SearchStats};
pub use verify::{verify_candidate, Checker, Verification};
