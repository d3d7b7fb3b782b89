//! `mirage._core` CUDA glue: code generation, NVRTC compilation, loaded executables launched
//! on raw device pointers, and the zoo's graphs as JSON (for tests and benchmarks).
//!
//! Errors: shape/graph errors raise `ValueError`; everything about NVRTC, the driver, shared
//! memory or launches raises `RuntimeError` with the full message (a compile error carries
//! NVRTC's log). Long work (compilation, module loads) runs with the GIL released.

use std::path::PathBuf;

use mirage::codegen::{generate, nvrtc, sass, Error, Executable, Options, Program};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::kernel::KernelGraph;

fn to_py(e: Error) -> PyErr {
    match e {
        Error::Graph(_) | Error::Unsupported(_) => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Adds NVRTC library paths (files or folders) and CUDA include folders to the search.
#[pyfunction]
fn cuda_configure(lib_paths: Vec<String>, include_dirs: Vec<String>) {
    let l: Vec<PathBuf> = lib_paths.into_iter().map(PathBuf::from).collect();
    let i: Vec<PathBuf> = include_dirs.into_iter().map(PathBuf::from).collect();
    nvrtc::configure(&l, &i);
}

/// `(major, minor, library path or None, include dirs)` of the NVRTC in use; raises
/// `RuntimeError` with the reason when NVRTC cannot be loaded.
#[pyfunction]
fn nvrtc_info() -> PyResult<(i32, i32, Option<String>, Vec<String>)> {
    let i = nvrtc::info().map_err(to_py)?;
    Ok((
        i.version.0,
        i.version.1,
        i.library.map(|p| p.display().to_string()),
        i.include_dirs.iter().map(|p| p.display().to_string()).collect(),
    ))
}

/// Generates the CUDA program of `graph` for `sm_{arch}`: `(source, launch summary JSON)`.
#[pyfunction]
fn cuda_generate(py: Python<'_>, graph: PyRef<'_, KernelGraph>, arch: u32) -> PyResult<(String, String)> {
    let g = graph.inner.clone();
    let p: Program = py.detach(|| generate(&g, &Options::for_arch_from_env(arch)?)).map_err(to_py)?;
    let summary = p.launch_summary();
    Ok((p.source, summary))
}

/// Generates and compiles `graph` for `sm_{arch}` with NVRTC; returns the CUBIN.
#[pyfunction]
fn cuda_compile<'py>(py: Python<'py>, graph: PyRef<'_, KernelGraph>, arch: u32) -> PyResult<Bound<'py, PyBytes>> {
    let g = graph.inner.clone();
    let cubin = py
        .detach(|| -> mirage::codegen::Result<_> {
            let p = generate(&g, &Options::for_arch_from_env(arch)?)?;
            nvrtc::compile(&p.source, arch)
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &cubin))
}

/// Generates `graph`'s program for `sm_{arch}` and compiles it with ptxas's verbose report:
/// the launch summary JSON with each kernel's registers, spills, stack frame, barriers and
/// static shared memory, and ptxas's warnings (`Program::resource_summary`).
#[pyfunction]
fn cuda_resources(py: Python<'_>, graph: PyRef<'_, KernelGraph>, arch: u32) -> PyResult<String> {
    let g = graph.inner.clone();
    py.detach(|| -> mirage::codegen::Result<_> {
        let p = generate(&g, &Options::for_arch_from_env(arch)?)?;
        Ok(p.resource_summary(&nvrtc::resources(&p.source, arch)?))
    })
    .map_err(to_py)
}

/// Generates and compiles `graph` for `sm_{arch}` (cached) and disassembles the CUBIN with
/// `nvdisasm`: `[(kernel name, instructions, [(opcode, count)])]` in the CUBIN's order.
#[pyfunction]
fn cuda_sass(py: Python<'_>, graph: PyRef<'_, KernelGraph>, arch: u32) -> PyResult<Vec<SassRow>> {
    let g = graph.inner.clone();
    let kernels = py
        .detach(|| -> mirage::codegen::Result<_> {
            let p = generate(&g, &Options::for_arch_from_env(arch)?)?;
            sass::disassemble(&nvrtc::compile(&p.source, arch)?)
        })
        .map_err(to_py)?;
    Ok(sass_rows(kernels))
}

/// Disassembles a CUBIN (from `nvrtc_compile`) with `nvdisasm`, as `cuda_sass` reports a graph's.
#[pyfunction]
fn cuda_disassemble(py: Python<'_>, cubin: Vec<u8>) -> PyResult<Vec<SassRow>> {
    let kernels = py.detach(|| sass::disassemble(&cubin)).map_err(to_py)?;
    Ok(sass_rows(kernels))
}

/// `cuda_sass`'s rows of disassembled kernels.
fn sass_rows(kernels: Vec<sass::KernelSass>) -> Vec<SassRow> {
    kernels
        .into_iter()
        .map(|k| {
            let counts = k.opcode_counts().into_iter().map(|(o, n)| (o.to_string(), n)).collect();
            (k.name, k.instructions, counts)
        })
        .collect()
}

/// One kernel's SASS as `cuda_sass` returns it.
type SassRow = (String, Vec<String>, Vec<(String, usize)>);

/// Compiles a CUDA source for `sm_{arch}` with NVRTC; returns the CUBIN.
#[pyfunction]
fn nvrtc_compile<'py>(py: Python<'py>, source: String, arch: u32) -> PyResult<Bound<'py, PyBytes>> {
    let cubin = py.detach(|| nvrtc::compile(&source, arch)).map_err(to_py)?;
    Ok(PyBytes::new(py, &cubin))
}

/// Forgets the CUBINs compiled in this process (the on-disk cache stays).
#[pyfunction]
fn nvrtc_clear_memory_cache() {
    nvrtc::clear_memory_cache();
}

/// A kernel graph compiled for and loaded on one CUDA device.
#[pyclass(module = "mirage._core")]
pub struct CudaExecutable {
    inner: Executable,
}

#[pymethods]
impl CudaExecutable {
    /// Generates (for the device's arch and shared-memory limit), compiles (cached) and loads;
    /// with `source`, that source is compiled in place of the generated one (same kernels and
    /// parameters: the launches stay the generated program's but for its `// mirage-launch:`
    /// lines, see `Executable::with_source`).
    #[new]
    #[pyo3(signature = (graph, device, source=None))]
    fn new(py: Python<'_>, graph: PyRef<'_, KernelGraph>, device: i32, source: Option<String>) -> PyResult<Self> {
        let g = graph.inner.clone();
        let inner = py.detach(|| Executable::with_source(&g, device, source)).map_err(to_py)?;
        Ok(CudaExecutable { inner })
    }

    /// Runs every step (kernels and cuBLAS GEMMs) on `stream` (raw `cudaStream_t`, 0 = default
    /// stream).
    ///
    /// The caller (the Python package) guarantees that every pointer is a live allocation on
    /// this device with the dims, dtype and strides of `input_specs` / `output_specs`, and
    /// that `workspace` holds `workspace_bytes` bytes.
    fn launch(&self, inputs: Vec<u64>, outputs: Vec<u64>, workspace: u64, stream: u64) -> PyResult<()> {
        // SAFETY: the Python wrapper checks device, dtype, shape and strides of every tensor
        // and allocates the outputs and the workspace itself (see python/mirage/_cuda.py).
        unsafe { self.inner.launch(&inputs, &outputs, workspace, stream) }.map_err(to_py)
    }

    /// Bytes of device workspace a launch needs.
    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.inner.program().workspace_bytes
    }

    /// The device's architecture (`major * 10 + minor`).
    #[getter]
    fn arch(&self) -> u32 {
        self.inner.program().arch
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> i32 {
        self.inner.device().ordinal
    }

    /// The generated CUDA source.
    #[getter]
    fn source(&self) -> String {
        self.inner.program().source.clone()
    }

    /// Why predefined matmuls do not run on cuBLAS in this executable (cuBLAS not loadable,
    /// or `MIRAGE_CUBLAS=0`), or None.
    #[getter]
    fn cublas_note(&self) -> Option<String> {
        self.inner.cublas_note().map(str::to_string)
    }

    /// The launches as JSON (names, grids, shared memory, arguments; cuBLAS GEMM steps under
    /// `gemms`, every step's name in order under `steps`).
    #[getter]
    fn summary(&self) -> String {
        self.inner.program().launch_summary()
    }

    /// `(dims, strides, dtype name)` of every input, in order.
    #[getter]
    fn input_specs(&self) -> Vec<(Vec<usize>, Vec<usize>, &'static str)> {
        self.inner.program().inputs.iter().map(|t| (t.dims.clone(), t.strides.clone(), t.dtype.name())).collect()
    }

    /// `(dims, strides, dtype name)` of every output, in order.
    #[getter]
    fn output_specs(&self) -> Vec<(Vec<usize>, Vec<usize>, &'static str)> {
        self.inner.program().outputs.iter().map(|t| (t.dims.clone(), t.strides.clone(), t.dtype.name())).collect()
    }

    fn __repr__(&self) -> String {
        let p = self.inner.program();
        format!(
            "CudaExecutable(sm_{}, {} kernel(s), {} cuBLAS GEMM(s), device {})",
            p.arch,
            p.kernels.len(),
            p.gemms().count(),
            self.inner.device().ordinal
        )
    }
}

/// Registers the CUDA functions and classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CudaExecutable>()?;
    m.add_function(wrap_pyfunction!(cuda_configure, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_info, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_generate, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_compile, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_compile, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_clear_memory_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_resources, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sass, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_disassemble, m)?)?;
    Ok(())
}
