//! cuBLAS through cudarc's bindings, for the GEMM steps of programs ([`crate::program::Step::Gemm`]).
//!
//! The library is optional: [`available`] finds and loads it once (files named `libcublas.so*`
//! and `libcublasLt.so*` in the library search paths — the nvidia pip packages' folders that
//! the Python package configures, `CUDA_HOME` — then the loader's own search, which also finds
//! a libcublas torch already loaded) and checks every symbol used, so that no cudarc call can
//! panic on a missing library or symbol. Where it cannot be loaded, [`crate::Executable`] keeps
//! predefined matmuls on the default kernel and records why.
//!
//! One handle per device, created in the device's primary context and kept for the life of
//! the process, behind a mutex. Each GEMM sets the caller's stream and then the workspace
//! (`cublasSetStream` resets it): the workspace is a slice of the launch's own workspace, so
//! it follows the caller's stream order and the call is legal inside CUDA-graph capture.
//! Math: fp32 accumulation (`CUBLAS_COMPUTE_32F`, no TF32 for fp32 storage) and no reduced
//! precision split-K reductions.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::sys as cb;

use crate::driver::{CtxGuard, Device};
use crate::error::{Error, Result};
use crate::program::{GemmSpec, Storage};

/// The cuBLAS functions used; all must resolve before any is called.
const SYMBOLS: [&str; 6] = [
    "cublasCreate_v2",
    "cublasSetMathMode",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasGemmStridedBatchedEx",
    "cublasGetStatusString",
];

/// Libraries preloaded by path; kept loaded for the life of the process.
fn keep() -> &'static Mutex<Vec<libloading::os::unix::Library>> {
    static K: OnceLock<Mutex<Vec<libloading::os::unix::Library>>> = OnceLock::new();
    K.get_or_init(|| Mutex::new(Vec::new()))
}

/// `libcublasLt.so*` then `libcublas.so*` files of the search paths (versioned names first),
/// in priority order.
fn candidates(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        let dir = if p.is_file() { p.parent().map(Path::to_path_buf) } else { Some(p.clone()) };
        let Some(dir) = dir.filter(|d| d.is_dir()) else { continue };
        out.extend(crate::nvrtc::libraries_in(&dir, "libcublasLt.so", |_| true));
        out.extend(crate::nvrtc::libraries_in(&dir, "libcublas.so", |_| true));
    }
    out
}

/// Loads cuBLAS once: `Ok` when the library and every used symbol are there, else why not.
pub fn available() -> std::result::Result<(), String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
            let paths = crate::nvrtc::library_search_paths();
            if let Ok(mut kept) = keep().lock() {
                for f in candidates(&paths) {
                    // SAFETY: loading cuBLAS runs only its own initialisers.
                    if let Ok(l) = unsafe { Library::open(Some(&f), RTLD_NOW | RTLD_GLOBAL) } {
                        kept.push(l);
                    }
                }
            }
            // SAFETY: probing only dlopens candidate names; a panic (none expected) is caught.
            let present = std::panic::catch_unwind(|| unsafe { cb::is_culib_present() }).unwrap_or(false);
            if !present {
                return Err(format!(
                    "libcublas was not found (searched {paths:?} and the loader's path); install the \
                     nvidia-cublas pip package or a CUDA toolkit"
                ));
            }
            for s in SYMBOLS {
                // SAFETY: the library is present (so `culib` does not panic; a panic is caught);
                // the symbol is only looked up.
                let found =
                    std::panic::catch_unwind(|| unsafe { cb::culib().get::<*const c_void>(s.as_bytes()).is_ok() })
                        .unwrap_or(false);
                if !found {
                    return Err(format!("the loaded libcublas lacks {s}"));
                }
            }
            Ok(())
        })
        .clone()
}

fn status_err(call: &'static str, s: cb::cublasStatus_t) -> Error {
    // SAFETY: the symbol was checked in `available`; the string is static.
    let text = unsafe {
        let p = cb::cublasGetStatusString(s);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Error::Cublas { call, msg: format!("{s:?}: {text}") }
}

fn check(call: &'static str, s: cb::cublasStatus_t) -> Result<()> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status_err(call, s))
    }
}

struct Handle(cb::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one at a time (the mutex in `Blas`),
// with its context current (every use pushes it).
unsafe impl Send for Handle {}

/// A device's cuBLAS handle.
pub struct Blas {
    device: Arc<Device>,
    handle: Mutex<Handle>,
}

/// The cuBLAS handle of `device` (created on first use, then kept), or why there is none.
pub fn for_device(device: &Arc<Device>) -> std::result::Result<Arc<Blas>, String> {
    static HANDLES: OnceLock<Mutex<HashMap<i32, Arc<Blas>>>> = OnceLock::new();
    available()?;
    let map = HANDLES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().map_err(|_| "internal lock poisoned".to_string())?;
    if let Some(b) = map.get(&device.ordinal) {
        return Ok(b.clone());
    }
    let _ctx = CtxGuard::device(device).map_err(|e| e.to_string())?;
    let mut h: cb::cublasHandle_t = std::ptr::null_mut();
    // SAFETY: symbols checked in `available`; valid out-pointer; the device's context is current.
    check("cublasCreate", unsafe { cb::cublasCreate_v2(&mut h) }).map_err(|e| e.to_string())?;
    // SAFETY: `h` was just created.
    let math = unsafe { cb::cublasSetMathMode(h, cb::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) };
    check("cublasSetMathMode", math).map_err(|e| e.to_string())?;
    let b = Arc::new(Blas { device: device.clone(), handle: Mutex::new(Handle(h)) });
    map.insert(device.ordinal, b.clone());
    Ok(b)
}

fn data_type(s: Storage) -> cb::cudaDataType {
    match s {
        Storage::F16 => cb::cudaDataType::CUDA_R_16F,
        Storage::BF16 => cb::cudaDataType::CUDA_R_16BF,
        Storage::F32 => cb::cudaDataType::CUDA_R_32F,
    }
}

fn int(what: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Launch(format!("cuBLAS {what} {x} exceeds its int range")))
}

fn long(what: &str, x: usize) -> Result<i64> {
    i64::try_from(x).map_err(|_| Error::Launch(format!("cuBLAS {what} {x} exceeds its range")))
}

impl Blas {
    /// Runs GEMM step `g` on `stream` with the device pointers of its first and second
    /// operand, its result and its workspace.
    ///
    /// # Safety
    /// The pointers must be live allocations of this device holding the step's matrices (and
    /// `g.workspace_bytes` of workspace), `stream` a stream of the device's primary context
    /// (or 0).
    pub unsafe fn gemm(&self, g: &GemmSpec, first: u64, second: u64, out: u64, ws: u64, stream: u64) -> Result<()> {
        let (m, n, k) = g.call_dims();
        let (m, n, k, batch) = (int("m", m)?, int("n", n)?, int("k", k)?, int("batch count", g.batch)?);
        let (lda, ldb, ldc) = (int("lda", g.first.ld)?, int("ldb", g.second.ld)?, int("ldc", g.out.ld)?);
        let (sa, sb, sc) = (
            long("stride", g.first.batch_stride)?,
            long("stride", g.second.batch_stride)?,
            long("stride", g.out.batch_stride)?,
        );
        let op = |t: bool| if t { cb::cublasOperation_t::CUBLAS_OP_T } else { cb::cublasOperation_t::CUBLAS_OP_N };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let _ctx = CtxGuard::device(&self.device)?;
        let h = self.handle.lock().map_err(|_| Error::Launch("internal lock poisoned".into()))?;
        // SAFETY: symbols checked in `available`; the handle lives in this device's context,
        // current here; the caller guarantees the stream and the pointers.
        unsafe {
            check("cublasSetStream", cb::cublasSetStream_v2(h.0, stream as usize as cb::cudaStream_t))?;
            check("cublasSetWorkspace", cb::cublasSetWorkspace_v2(h.0, ws as usize as *mut c_void, g.workspace_bytes))?;
            check(
                "cublasGemmStridedBatchedEx",
                cb::cublasGemmStridedBatchedEx(
                    h.0,
                    op(g.first.trans),
                    op(g.second.trans),
                    m,
                    n,
                    k,
                    &alpha as *const f32 as *const c_void,
                    first as usize as *const c_void,
                    data_type(g.input_storage),
                    lda,
                    sa,
                    second as usize as *const c_void,
                    data_type(g.input_storage),
                    ldb,
                    sb,
                    &beta as *const f32 as *const c_void,
                    out as usize as *mut c_void,
                    data_type(g.out_storage),
                    ldc,
                    sc,
                    batch,
                    cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
            )
        }
    }
}
