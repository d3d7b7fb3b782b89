//! The search's error type.

use thiserror::Error;

/// Why a search could not run.
#[derive(Debug, Error)]
pub enum SearchError {
    /// The reference graph has no ops at all.
    #[error("the reference graph is empty: add inputs and ops, then mark an output")]
    EmptyGraph,
    /// The reference graph computes nothing to search for.
    #[error("the reference graph has no output: mark one with mark_output (or leave a computed tensor unconsumed)")]
    NoOutput,
    /// The reference graph uses an op the search cannot abstract or relabel.
    #[error("the reference graph uses {op}, which the search does not support: {why}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// What is missing.
        why: String,
    },
    /// The configuration admits no grid/map/loop configuration at all.
    #[error("no configuration satisfies the search settings: {0}")]
    Unsatisfiable(String),
    /// A setting is out of range.
    #[error("invalid search setting {name}: {why}")]
    InvalidConfig {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The IR rejected a graph the search built (a bug in the search, reported rather than hidden).
    #[error("the µGraph IR rejected a graph built by the search: {0}")]
    Ir(#[from] mirage_ugraph::Error),
    /// The rayon pool for `num_threads` could not be built.
    #[error("could not start {threads} search threads: {why}")]
    ThreadPool {
        /// Requested threads.
        threads: usize,
        /// The pool builder's message.
        why: String,
    },
}

/// Result alias of the search.
pub type Result<T, E = SearchError> = std::result::Result<T, E>;
