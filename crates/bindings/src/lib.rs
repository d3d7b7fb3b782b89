//! PyO3 glue exposing the mirage Rust core to Python as `mirage._core`.
//!
//! Glue only: every class wraps a builder of the `mirage` crate, takes and returns tensor ids
//! (`int`), and maps errors in one place (`convert::to_py_err`). The user-facing API (dtype
//! objects, tensor handles, input checks, torch/numpy conversion) lives in the pure-Python
//! package `mirage`.

use pyo3::prelude::*;

mod block;
mod convert;
mod cuda;
mod interrupt;
mod kernel;
mod search;
mod verify;

/// Shared memory a block may opt into on `sm_{arch}` as NVIDIA publishes it (`None`: unknown).
#[pyfunction]
fn published_smem_optin(arch: u32) -> Option<usize> {
    mirage::ugraph::Target::published_smem_optin(arch)
}

/// The extension module `mirage._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<kernel::KernelGraph>()?;
    m.add_class::<block::BlockGraph>()?;
    cuda::register(m)?;
    verify::register(m)?;
    search::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_EXTENT", mirage::limits::MAX_EXTENT)?;
    m.add("MAX_NUMEL", mirage::limits::MAX_NUMEL)?;
    m.add("MAX_RUN_NUMEL", mirage::limits::MAX_RUN_NUMEL)?;
    m.add("MAX_RUN_BLOCKS", mirage::limits::MAX_RUN_BLOCKS)?;
    // The element-wise op registry, `(name, doc)` pairs (docs/ops.md).
    m.add("UNARY_OPS", convert::unary_ops())?;
    m.add("BINARY_OPS", convert::binary_ops())?;
    m.add_function(wrap_pyfunction!(published_smem_optin, m)?)?;
    // SHA-256 of the sources behind search results and generated code (see build.rs).
    m.add("__build_hash__", env!("MIRAGE_BUILD_HASH"))?;
    Ok(())
}
