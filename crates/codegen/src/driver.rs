//! The CUDA driver side: devices (primary context, architecture, shared-memory limit), loaded
//! modules and raw launches on a caller-given stream with raw device pointers.
//!
//! Contexts: every call pushes the device's primary context (the one PyTorch's runtime uses)
//! and pops it afterwards, so the caller's current context is left as it was.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use mirage_ugraph::{DeviceAttr, Target};

use crate::error::{Error, Result};
use crate::program::KernelSpec;

fn drv_err(call: &'static str, e: cu::DriverError) -> Error {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Error::Driver { call, msg: format!("{name}: {text}") }
}

/// Initialises the driver once; a clear error when libcuda is absent.
fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: probing only dlopens candidate names; a panic (none expected) is caught.
        let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("libcuda was not found (no NVIDIA driver on this machine?)".to_string());
        }
        cu::init().map_err(|e| drv_err("cuInit", e).to_string())
    })
    .clone()
    .map_err(Error::DriverUnavailable)
}

/// A CUDA device with its retained primary context.
#[derive(Debug)]
pub struct Device {
    /// Device ordinal.
    pub ordinal: i32,
    /// Architecture as `major * 10 + minor`.
    pub arch: u32,
    /// Opt-in per-block shared-memory limit in bytes.
    pub smem_optin: usize,
    /// Shared memory of one multiprocessor in bytes.
    pub smem_per_sm: usize,
    /// Multiprocessor count.
    pub sm_count: u32,
    /// Device name.
    pub name: String,
    /// The device's target: its attributes over the preset of its architecture
    /// ([`Target::from_attributes`]).
    pub target: Target,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (it is pushed where used); the
// primary context is retained for the life of the process and never destroyed here.
unsafe impl Send for Device {}
// SAFETY: as above; the struct is immutable after creation.
unsafe impl Sync for Device {}

/// Pushes a context on creation and pops it on drop.
pub(crate) struct CtxGuard;

impl CtxGuard {
    /// Pushes `device`'s primary context on this thread until the guard drops.
    pub(crate) fn device(device: &Device) -> Result<CtxGuard> {
        Self::push(device.ctx)
    }

    fn push(ctx: sys::CUcontext) -> Result<CtxGuard> {
        // SAFETY: `ctx` is a retained primary context.
        unsafe { sys::cuCtxPushCurrent_v2(ctx) }.result().map_err(|e| drv_err("cuCtxPushCurrent", e))?;
        Ok(CtxGuard)
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed by `push` on this thread.
        unsafe {
            let _ = sys::cuCtxPopCurrent_v2(&mut old);
        }
    }
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: `dev` comes from cuDeviceGet.
    unsafe { cu::device::get_attribute(dev, a) }.map_err(|e| drv_err("cuDeviceGetAttribute", e))
}

/// The device with this ordinal (cached; its primary context is retained once).
pub fn device(ordinal: i32) -> Result<Arc<Device>> {
    static DEVS: OnceLock<Mutex<HashMap<i32, Arc<Device>>>> = OnceLock::new();
    init()?;
    let map = DEVS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().map_err(|_| Error::DriverUnavailable("internal lock poisoned".into()))?;
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let count = cu::device::get_count().map_err(|e| drv_err("cuDeviceGetCount", e))?;
    if ordinal < 0 || ordinal >= count {
        return Err(Error::Launch(format!("CUDA device {ordinal} does not exist ({count} device(s) present)")));
    }
    let dev = cu::device::get(ordinal).map_err(|e| drv_err("cuDeviceGet", e))?;
    use sys::CUdevice_attribute as A;
    let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let smem = attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let sms = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let smem_sm = attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
    let name = cu::device::get_name(dev).unwrap_or_default();
    let arch = (major * 10 + minor) as u32;
    let target = Target::from_attributes(arch, |a| {
        let a = match a {
            DeviceAttr::SmCount => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            DeviceAttr::SmemPerBlockOptin => A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            DeviceAttr::SmemPerBlock => A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            DeviceAttr::SmemPerSm => A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            DeviceAttr::SmemReservedPerBlock => A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            DeviceAttr::RegsPerSm => A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            DeviceAttr::MaxThreadsPerBlock => A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            DeviceAttr::L2Bytes => A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        };
        attr(dev, a).ok().and_then(|v| usize::try_from(v).ok())
    });
    // SAFETY: `dev` is valid; the retained context is kept for the life of the process.
    let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(|e| drv_err("cuDevicePrimaryCtxRetain", e))?;
    let d = Arc::new(Device {
        ordinal,
        arch,
        smem_optin: smem.max(0) as usize,
        smem_per_sm: smem_sm.max(0) as usize,
        sm_count: sms.max(0) as u32,
        name,
        target,
        ctx,
    });
    map.insert(ordinal, d.clone());
    Ok(d)
}

/// A module loaded on a device, with one function per kernel of a program.
pub struct Module {
    device: Arc<Device>,
    module: sys::CUmodule,
    funcs: Vec<(sys::CUfunction, KernelSpec)>,
    dependent: bool,
}

/// Whether kernels that wait for their predecessor ([`KernelSpec::dep_wait`]) are launched as
/// programmatic dependents on sm_90 and later: their launch then overlaps the previous kernel's
/// drain. On unless the environment sets `MIRAGE_PDL=0` when a module is loaded.
pub fn dependent_launch_enabled(arch: u32) -> bool {
    arch >= 90 && std::env::var("MIRAGE_PDL").map_or(true, |v| v.trim() != "0")
}

// SAFETY: module and function handles are usable from any thread with the context pushed,
// which every method does; launches do not mutate the handles.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `cubin` on `device` and resolves every kernel of `kernels`, raising the dynamic
    /// shared-memory limit where a kernel needs more than a block gets without opting in.
    pub fn load(device: Arc<Device>, cubin: &[u8], kernels: &[KernelSpec]) -> Result<Module> {
        for k in kernels {
            if k.smem_bytes > device.smem_optin {
                return Err(Error::SharedMemory {
                    kernel: k.name.clone(),
                    needed: k.smem_bytes,
                    limit: device.smem_optin,
                });
            }
        }
        let _g = CtxGuard::push(device.ctx)?;
        // SAFETY: `cubin` is a complete CUBIN image produced by NVRTC.
        let module = unsafe { cu::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(|e| drv_err("cuModuleLoadData", e))?;
        let dependent = dependent_launch_enabled(device.arch);
        let mut m = Module { device: device.clone(), module, funcs: Vec::new(), dependent };
        for k in kernels {
            let name = CString::new(k.name.as_str()).map_err(|_| Error::Launch("kernel name has a NUL".into()))?;
            // SAFETY: the module is loaded.
            let f =
                unsafe { cu::module::get_function(m.module, name) }.map_err(|e| drv_err("cuModuleGetFunction", e))?;
            let mut k = k.clone();
            if k.smem_bytes > device.target.smem_per_block {
                set_max_dynamic_smem(f, k.smem_bytes)?;
                if dependent && k.dep_wait && k.cluster == [1; 3] {
                    let padded = one_wave_smem(f, &k, &device)?;
                    if padded > k.smem_bytes {
                        set_max_dynamic_smem(f, padded)?;
                        k.smem_bytes = padded;
                    }
                }
            }
            m.funcs.push((f, k));
        }
        Ok(m)
    }

    /// The device the module lives on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Launches kernels `first..first + args.len()` in order on `stream` (a raw `CUstream`, 0
    /// = the legacy default stream); `args[i]` holds kernel `first + i`'s pointer arguments.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the device, large enough for the
    /// tensor the kernel reads or writes there, and `stream` a stream of the device's primary
    /// context (or 0).
    pub unsafe fn launch(&self, first: usize, args: &[Vec<u64>], stream: u64) -> Result<()> {
        let funcs = first.checked_add(args.len()).and_then(|end| self.funcs.get(first..end)).ok_or_else(|| {
            Error::Launch(format!("{} argument lists from kernel {first} of {}", args.len(), self.funcs.len()))
        })?;
        let _g = CtxGuard::push(self.device.ctx)?;
        for ((f, k), a) in funcs.iter().zip(args) {
            let mut vals: Vec<u64> = a.clone();
            let mut params: Vec<*mut c_void> = vals.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
            let dependent = self.dependent && k.dep_wait;
            if dependent || k.cluster != [1; 3] {
                // SAFETY: as below; a dependent kernel waits for its predecessor before
                // touching memory.
                unsafe { launch_ex(*f, k, stream, &mut params, dependent) }?;
                continue;
            }
            // SAFETY: the caller guarantees the pointers; `params` point at `vals`, alive for the call.
            unsafe {
                cu::launch_kernel(
                    *f,
                    (k.grid[0], k.grid[1], k.grid[2]),
                    (k.block[0], k.block[1], k.block[2]),
                    k.smem_bytes as u32,
                    stream as sys::CUstream,
                    &mut params,
                )
            }
            .map_err(|e| drv_err("cuLaunchKernel", e))?;
        }
        Ok(())
    }
}

/// Lets function `f` (of a loaded module) take `bytes` of dynamic shared memory.
fn set_max_dynamic_smem(f: sys::CUfunction, bytes: usize) -> Result<()> {
    // SAFETY: `f` is a valid function of a loaded module.
    unsafe {
        cu::function::set_function_attribute(
            f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .map_err(|e| drv_err("cuFuncSetAttribute", e))
}

/// Dynamic shared memory for the launches of `k` (a large-tile kernel launched as a
/// programmatic dependent): its own, or more where its grid fills at most `need` =
/// ceil(blocks / SMs) >= 2 blocks an SM but more would fit. The spare slots would take the next
/// call's blocks early (they wait in `mi::dep_enter`), and the rest of that grid then lands
/// unevenly: MQA b=16's 256 blocks went 3 to some SMs and 1 to others once a block fitted
/// three to an SM (46.6 us in an nvcc harness without dependent launches, 62 in the bench).
/// The padding holds each SM to `need`.
fn one_wave_smem(f: sys::CUfunction, k: &KernelSpec, device: &Device) -> Result<usize> {
    let blocks = k.grid.iter().map(|&g| g as usize).product::<usize>();
    let threads = k.block.iter().map(|&b| b as usize).product::<usize>();
    let need = blocks.div_ceil(device.sm_count.max(1) as usize).max(1);
    let fits = |bytes: usize| -> Result<usize> {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `f` is valid and its dynamic shared-memory limit covers `bytes`.
        unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, threads as std::ffi::c_int, bytes) }
            .result()
            .map_err(|e| drv_err("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        Ok(n.max(0) as usize)
    };
    // With one block an SM the early blocks land one an SM and the grid stays even (and the
    // GEMV kernels' early start pays: RMSNorm+Linear b=8 14.1 -> 14.6 us held to one wave).
    if need < 2 || fits(k.smem_bytes)? <= need || device.smem_per_sm == 0 {
        return Ok(k.smem_bytes);
    }
    // Each block also reserves some of the SM's shared memory (1 KiB); steps of that size.
    let step = device.target.smem_reserved_per_block.max(1);
    let mut bytes = (device.smem_per_sm / (need + 1)).saturating_sub(step).max(k.smem_bytes);
    while bytes <= device.smem_optin {
        set_max_dynamic_smem(f, bytes)?;
        if fits(bytes)? <= need {
            return Ok(bytes);
        }
        bytes += step;
    }
    Ok(k.smem_bytes)
}

/// `cuLaunchKernelEx` with the kernel's thread-block clusters, if any, and, when `dependent`,
/// programmatic stream serialization: the kernel may be scheduled before the previous kernel
/// of `stream` has finished (it then waits in `mi::dep_enter`).
///
/// # Safety
/// As [`Module::launch`]; `params` must point at the kernel's arguments.
unsafe fn launch_ex(
    f: sys::CUfunction,
    k: &KernelSpec,
    stream: u64,
    params: &mut [*mut c_void],
    dependent: bool,
) -> Result<()> {
    let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::with_capacity(2);
    if dependent {
        // SAFETY: a zeroed attribute is a valid plain-data value; the fields used are set.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        a.value.programmaticStreamSerializationAllowed = 1;
        attrs.push(a);
    }
    if k.cluster != [1; 3] {
        // SAFETY: as above.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a.value.clusterDim.x = k.cluster[0];
        a.value.clusterDim.y = k.cluster[1];
        a.value.clusterDim.z = k.cluster[2];
        attrs.push(a);
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: k.grid[0],
        gridDimY: k.grid[1],
        gridDimZ: k.grid[2],
        blockDimX: k.block[0],
        blockDimY: k.block[1],
        blockDimZ: k.block[2],
        sharedMemBytes: k.smem_bytes as u32,
        hStream: stream as sys::CUstream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: `cfg` and `attrs` live through the call; the caller guarantees the arguments.
    unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| drv_err("cuLaunchKernelEx", e))
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_g) = CtxGuard::push(self.device.ctx) {
            // SAFETY: the module was loaded by `load` and is unloaded once.
            unsafe {
                let _ = cu::module::unload(self.module);
            }
        }
    }
}

/// The driver's CUDA version as `(major, minor)`, if a driver is present.
pub fn driver_version() -> Result<(i32, i32)> {
    init()?;
    let mut v = 0;
    // SAFETY: valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(|e| drv_err("cuDriverGetVersion", e))?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// Name of a CUDA error code (for messages).
pub fn error_name(code: sys::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: valid out-pointer; the returned string is static.
    unsafe {
        if sys::cuGetErrorName(code, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            return CStr::from_ptr(p).to_string_lossy().into_owned();
        }
    }
    format!("{code:?}")
}
