//! Probabilistic equivalence verification of µGraphs over finite fields (docs/verifier.md;
//! the reference's theorem in docs/reference.md, "Verification"), fast enough for a search loop.
//!
//! ```
//! use mirage_ugraph::{zoo, DType};
//! use mirage_verify::{equivalent, Options, Verdict};
//! let pair = zoo::rmsnorm_linear(4, 64, 128, 4, 4, DType::Float16).unwrap();
//! let v = equivalent(&pair.reference, &pair.ugraph, &Options::default()).unwrap();
//! assert!(v.is_accepted());
//! if let Verdict::Equivalent { trials, false_accept_bound, .. } = v {
//!     assert!(trials >= 1 && false_accept_bound < 1e-9);
//! }
//! ```
//!
//! # How it decides
//!
//! 1. **Interface.** Inputs must agree in count, dims and dtype and outputs must pair up by
//!    dims; otherwise [`VerifyError::Interface`] (an error, not a verdict).
//! 2. **LAX check** ([`lax`]). A path with two exponentials is [`VerifyError::NotLax`] (unless
//!    [`Options::allow_non_lax`]); ops without algebraic meaning make the pair
//!    "probabilistic, outside LAX" (still tested the same way). The check yields the degree
//!    bound `d` and exp count `k`.
//! 3. **Trials.** Each trial draws fresh lazy random inputs in `Z_P x Z_Q` ([`inputs`]) and a
//!    fresh generator `w` of order `Q` ([`field`]: `P = 2147481143 = 2Q + 1`,
//!    `Q = 1073740571`), and evaluates a sample of output elements of both graphs with the
//!    demand-driven interpreter ([`mirage_ugraph::run_region`]), which computes only each
//!    element's dependency cone (an RMSNorm+Linear element costs O(k), an attention element
//!    O(s·d)); inputs are hashed on demand, never materialized. The sample ([`sample`]) is
//!    random elements of every output, the first and last element, and one element in each
//!    tile of the candidate's final customized op (up to [`Options::tile_samples`] tiles,
//!    dealt over the trials).
//! 4. **Assignment.** Candidate outputs are matched to reference outputs of equal dims by the
//!    values ([`matching`]): all assignments are considered, not just the identity.
//! 5. **Bound.** Trials default to the smallest `t` with `b^t < 1e-9` for the paper's per-test
//!    bound `b = 8 d k^4 / Q + Q^(-1/k^2)` ([`bound`]).
//! 6. **Float cross-check** ([`float_check`]) of an accepted candidate in its own precision
//!    (fp16/bf16 simulated), reported in [`Verdict::Equivalent::numerics`], separately.
//!
//! # What the bound covers, and what it does not
//!
//! `false_accept_bound` bounds the probability that, **for one compared output element** whose
//! value differs between the graphs as a function of the inputs (over LAX semantics), every
//! trial agrees there. It does not cover:
//!
//! - **Elements that are not compared.** A difference confined to a few output elements is
//!   caught only if one of them is sampled: with `s` random elements per output out of `n`,
//!   the chance is about `s·t·(differing fraction)`. Tile coverage guarantees one element of
//!   every tile of the final customized op (when there are at most `tile_samples` tiles), so a
//!   wrong tile placement or a per-block fault is caught; a fault affecting one element inside
//!   a tile is not guaranteed to be. Mutants of real µGraphs (wrong maps, ranges, accumulators,
//!   operands) differ almost everywhere, which is why sampling is sound in practice; the
//!   mutation test measures it.
//! - **Graphs outside LAX.** With uninterpreted ops (max, relu, clamp, gelu, pow) the bound is
//!   the same formula used as an estimate; `sqrt` is evaluated as the multiplicative power map
//!   `x^((P+1)/4)` (so `sqrt(a·b) = sqrt(a)·sqrt(b)` holds but `sqrt(x)^2 = x` only up to sign),
//!   and its degree is counted as half, an extension the theorem does not state.
//! - **Floating-point behaviour.** Field equivalence is equivalence over exact arithmetic;
//!   rounding, overflow and cancellation are the float cross-check's job.
//! - **Our reading of `d` and `k`.** `k` counts exp-bearing ops in both graphs (each op once,
//!   however many elements it touches); `d` is the sum of both graphs' degree bounds.

pub mod bound;
pub mod check;
pub mod error;
pub mod every;
pub mod field;
pub mod float_check;
mod fmatmul;
pub mod inputs;
pub mod lax;
pub mod lowp;
pub mod matching;
pub mod mutants;
pub mod sample;

pub use check::{equivalent, Options, Verdict, Verifier};
pub use error::VerifyError;
pub use every::Coverage;
pub use field::Fp;
pub use float_check::Numerics;
pub use lax::{analyze, Fragment, LaxReport};
pub use lowp::{BHalf, Half};
