//! Errors of the verifier: problems that prevent a verdict (as opposed to a verdict of
//! non-equivalence).

/// Why two graphs could not be compared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// The graphs' inputs or outputs do not line up (count, dims or dtype).
    #[error("interface mismatch: {0}")]
    Interface(String),
    /// A graph has two exponentials on one path and `allow_non_lax` is off.
    #[error("the {graph} graph is not LAX: {reason}")]
    NotLax {
        /// `"reference"` or `"candidate"`.
        graph: &'static str,
        /// The two exp-bearing ops on one path.
        reason: String,
    },
    /// The options are unusable (e.g. zero trials).
    #[error("invalid options: {0}")]
    Options(String),
    /// The interpreter or the IR rejected a graph.
    #[error(transparent)]
    Graph(#[from] mirage_ugraph::Error),
}
