//! Errors of the µGraph IR: every message names the op, the operand and the offending dims.

/// What went wrong while building, loading or running a µGraph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shapes do not fit the op (wrong rank, non-matching or non-dividing dims).
    #[error("{op}: {msg}")]
    Shape {
        /// The op that rejected its operands, e.g. `matmul` or `tb.new_input`.
        op: String,
        /// What was wrong, naming operands and dims.
        msg: String,
    },
    /// Element types do not fit the op.
    #[error("{op}: {msg}")]
    DType {
        /// The op that rejected its operands.
        op: String,
        /// What was wrong.
        msg: String,
    },
    /// An argument or the graph structure is invalid (bad map, tensor of another graph, ...).
    #[error("{op}: {msg}")]
    Invalid {
        /// The op or API call that failed.
        op: String,
        /// What was wrong.
        msg: String,
    },
    /// A serialized graph could not be read.
    #[error("json: {0}")]
    Json(String),
    /// A run was stopped through its [`crate::Cancel`] handle.
    #[error("run: cancelled")]
    Cancelled,
    /// A serialized graph comes from a newer format version.
    #[error("json: file format version {found} is newer than the newest this build reads ({supported})")]
    Version {
        /// Version found in the file.
        found: u64,
        /// Newest version this build reads.
        supported: u64,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Builds an [`Error::Shape`].
pub(crate) fn shape_err<T>(op: &str, msg: impl Into<String>) -> Result<T> {
    Err(Error::Shape { op: op.to_string(), msg: msg.into() })
}

/// Builds an [`Error::Invalid`].
pub(crate) fn invalid<T>(op: &str, msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid { op: op.to_string(), msg: msg.into() })
}

/// Builds an [`Error::DType`].
pub(crate) fn dtype_err<T>(op: &str, msg: impl Into<String>) -> Result<T> {
    Err(Error::DType { op: op.to_string(), msg: msg.into() })
}
