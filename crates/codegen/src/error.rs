//! Errors of code generation, compilation and launch: each names what failed and why.

/// What went wrong while generating, compiling, loading or launching CUDA code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The graph uses something the emitter does not support (named in the message).
    #[error("codegen: {0}")]
    Unsupported(String),
    /// The graph itself is invalid (it failed the IR's validation).
    #[error("codegen: invalid graph: {0}")]
    Graph(String),
    /// A kernel needs more shared memory than the device allows per block.
    #[error(
        "codegen: kernel {kernel} needs {needed} bytes of shared memory per block, but the device allows {limit} \
         (try a smaller grid split, forloop_range or tile)"
    )]
    SharedMemory {
        /// The generated kernel's name.
        kernel: String,
        /// Bytes the kernel's shared-memory plan needs.
        needed: usize,
        /// The device's (opt-in) per-block limit.
        limit: usize,
    },
    /// The NVRTC library could not be found or loaded.
    #[error("NVRTC is not available: {0}")]
    NvrtcUnavailable(String),
    /// The CUDA driver library could not be found, loaded or initialized.
    #[error("the CUDA driver is not available: {0}")]
    DriverUnavailable(String),
    /// No usable CUDA headers (`cuda_fp16.h`) were found.
    #[error("CUDA headers not found: {0}")]
    HeadersNotFound(String),
    /// NVRTC rejected the generated source; `log` is NVRTC's compile log.
    #[error("NVRTC failed to compile the generated CUDA for sm_{arch}: {log}")]
    Compile {
        /// The target architecture (e.g. 90).
        arch: u32,
        /// NVRTC's log.
        log: String,
    },
    /// An NVRTC call failed outside compilation.
    #[error("NVRTC call {call} failed: {msg}")]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// The error.
        msg: String,
    },
    /// The disassembler (`nvdisasm`) could not be found or failed on a CUBIN.
    #[error("SASS disassembly failed: {0}")]
    Disassembler(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {msg}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The error name and description.
        msg: String,
    },
    /// cuBLAS could not be loaded, or a cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {msg}")]
    Cublas {
        /// The cuBLAS function (or `load` for the library itself).
        call: &'static str,
        /// The status name and description.
        msg: String,
    },
    /// Launch arguments do not fit the compiled program.
    #[error("launch: {0}")]
    Launch(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl From<mirage_ugraph::Error> for Error {
    fn from(e: mirage_ugraph::Error) -> Self {
        Error::Graph(e.to_string())
    }
}

/// Builds an [`Error::Unsupported`].
pub(crate) fn unsupported<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Unsupported(msg.into()))
}
