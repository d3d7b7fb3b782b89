//! Compiling generated CUDA to CUBIN with NVRTC: library and header discovery, compilation
//! for an exact architecture, and an in-memory plus on-disk cache keyed by source hash, arch,
//! NVRTC version and options. A disk entry carries its CUBIN's length and SHA-256: one that
//! does not match is compiled again and overwritten, never loaded.
//!
//! Library discovery (first that loads): `MIRAGE_NVRTC_PATH` (a file or a folder), paths
//! given to [`configure`] (the Python package passes the nvidia pip packages next to torch),
//! `CUDA_HOME`/`CUDA_PATH`, `/usr/local/cuda`, then the dynamic loader's own search. A
//! library found by path is preloaded (with its `libnvrtc-builtins` companion) so that the
//! loader resolves NVRTC's soname to it. Headers: `MIRAGE_CUDA_INCLUDE` (`:`-separated),
//! configured folders, the `include` folder beside the library, `CUDA_HOME`, `/usr/local/cuda`;
//! a folder whose CUDA version matches NVRTC's is preferred.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::resources::PtxasReport;

/// Search paths handed in by the host application (the Python package).
#[derive(Debug, Default, Clone)]
struct Config {
    lib_paths: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
}

/// A loaded NVRTC: its version, the library path it was preloaded from and the include dirs.
#[derive(Debug, Clone)]
pub struct NvrtcInfo {
    /// `(major, minor)` of the loaded NVRTC.
    pub version: (i32, i32),
    /// The library file preloaded by path, if any (else the loader's own choice).
    pub library: Option<PathBuf>,
    /// Include folders passed to every compile.
    pub include_dirs: Vec<PathBuf>,
}

fn config() -> &'static Mutex<Config> {
    static C: OnceLock<Mutex<Config>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(Config::default()))
}

fn loaded() -> &'static Mutex<Option<NvrtcInfo>> {
    static L: OnceLock<Mutex<Option<NvrtcInfo>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(None))
}

/// Libraries preloaded by path; kept loaded for the life of the process.
fn keep() -> &'static Mutex<Vec<libloading::os::unix::Library>> {
    static K: OnceLock<Mutex<Vec<libloading::os::unix::Library>>> = OnceLock::new();
    K.get_or_init(|| Mutex::new(Vec::new()))
}

/// Adds search paths for the NVRTC library (files or folders) and CUDA include folders.
/// Takes effect for the next [`info`] call that has not yet found NVRTC.
pub fn configure(lib_paths: &[PathBuf], include_dirs: &[PathBuf]) {
    if let Ok(mut c) = config().lock() {
        for p in lib_paths {
            if !c.lib_paths.contains(p) {
                c.lib_paths.push(p.clone());
            }
        }
        for p in include_dirs {
            if !c.include_dirs.contains(p) {
                c.include_dirs.push(p.clone());
            }
        }
    }
}

fn env_paths(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var).map(|v| std::env::split_paths(&v).collect()).unwrap_or_default()
}

fn cuda_roots() -> Vec<PathBuf> {
    let mut r: Vec<PathBuf> =
        ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"].iter().filter_map(|v| std::env::var_os(v).map(PathBuf::from)).collect();
    r.push(PathBuf::from("/usr/local/cuda"));
    r
}

/// Folders that may hold CUDA's command-line tools (`nvdisasm`): `bin` beside each configured
/// library folder (the nvidia pip packages' `cu13/lib` -> `cu13/bin`) and beside the loaded
/// NVRTC's folder, then `CUDA_HOME`/`CUDA_PATH`/`/usr/local/cuda`'s `bin`.
pub(crate) fn tool_dirs() -> Vec<PathBuf> {
    let cfg = config().lock().map(|c| c.clone()).unwrap_or_default();
    let loaded_lib = loaded().lock().ok().and_then(|l| l.as_ref().and_then(|i| i.library.clone()));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for lib in cfg.lib_paths.iter().chain(loaded_lib.as_ref()) {
        let dir = if lib.is_file() { lib.parent() } else { Some(lib.as_path()) };
        if let Some(bin) = dir.and_then(Path::parent).map(|p| p.join("bin")) {
            if !dirs.contains(&bin) {
                dirs.push(bin);
            }
        }
    }
    dirs.extend(cuda_roots().into_iter().map(|r| r.join("bin")));
    dirs
}

/// The library files and folders searched before the loader's own path, in priority order:
/// `MIRAGE_NVRTC_PATH`, the configured paths ([`configure`]), `lib64` and `lib` of each CUDA
/// root (also where cuBLAS is looked for).
pub(crate) fn library_search_paths() -> Vec<PathBuf> {
    let cfg = config().lock().map(|c| c.clone()).unwrap_or_default();
    search_paths(&cfg)
}

fn search_paths(cfg: &Config) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = env_paths("MIRAGE_NVRTC_PATH");
    out.extend(cfg.lib_paths.iter().cloned());
    for root in cuda_roots() {
        out.push(root.join("lib64"));
        out.push(root.join("lib"));
    }
    out
}

/// The files of folder `dir` whose names start with `prefix` and pass `keep`, the longest name
/// first (a versioned soname such as `libnvrtc.so.13` before its dev symlink).
pub(crate) fn libraries_in(dir: &Path, prefix: &str, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && keep(n)))
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|f| std::cmp::Reverse(f.to_string_lossy().len()));
    found
}

/// Candidate NVRTC library files, in priority order.
fn library_candidates(cfg: &Config) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in search_paths(cfg) {
        if p.is_file() {
            out.push(p);
        } else if p.is_dir() {
            out.extend(libraries_in(&p, "libnvrtc.so", |n| !n.contains("builtins")));
        }
    }
    out
}

/// Preloads `lib` (and the builtins library beside it) globally; returns whether it loaded.
fn preload(lib: &Path) -> bool {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let mut keep = match keep().lock() {
        Ok(k) => k,
        Err(_) => return false,
    };
    if let Some(dir) = lib.parent() {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                let is_builtins =
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so"));
                if is_builtins {
                    // SAFETY: loading NVRTC's builtins library runs only its own initialisers.
                    if let Ok(l) = unsafe { Library::open(Some(&p), RTLD_NOW | RTLD_GLOBAL) } {
                        keep.push(l);
                    }
                }
            }
        }
    }
    // SAFETY: loading NVRTC runs only its own initialisers.
    match unsafe { Library::open(Some(lib), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(l) => {
            keep.push(l);
            true
        }
        Err(_) => false,
    }
}

fn nvrtc_err(call: &'static str, r: sys::nvrtcResult) -> Error {
    // SAFETY: nvrtcGetErrorString returns a static string for any result code.
    let msg = unsafe {
        let p = sys::nvrtcGetErrorString(r);
        if p.is_null() {
            format!("{r:?}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Error::Nvrtc { call, msg }
}

/// Parses `#define CUDART_VERSION 13000` (or `CUDA_VERSION`) from a header folder.
fn header_version(dir: &Path) -> Option<(i32, i32)> {
    for (file, key) in [("cuda_runtime_api.h", "CUDART_VERSION"), ("cuda.h", "CUDA_VERSION")] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else { continue };
        for l in text.lines() {
            let mut it = l.split_whitespace();
            if it.next() == Some("#define") && it.next() == Some(key) {
                if let Some(v) = it.next().and_then(|v| v.parse::<i32>().ok()) {
                    return Some((v / 1000, (v % 1000) / 10));
                }
            }
        }
    }
    None
}

fn find_headers(cfg: &Config, lib: Option<&Path>, version: (i32, i32)) -> Result<Vec<PathBuf>> {
    let mut cands: Vec<PathBuf> = env_paths("MIRAGE_CUDA_INCLUDE");
    cands.extend(cfg.include_dirs.iter().cloned());
    if let Some(dir) = lib.and_then(Path::parent).and_then(Path::parent) {
        cands.push(dir.join("include"));
    }
    for root in cuda_roots() {
        cands.push(root.join("include"));
    }
    let with_fp16: Vec<PathBuf> = cands.into_iter().filter(|d| d.join("cuda_fp16.h").is_file()).collect();
    let chosen = with_fp16
        .iter()
        .find(|d| header_version(d) == Some(version))
        .or_else(|| with_fp16.first())
        .cloned()
        .ok_or_else(|| {
        Error::HeadersNotFound(format!(
            "no folder with cuda_fp16.h for NVRTC {}.{}; set MIRAGE_CUDA_INCLUDE to CUDA's include folder \
                 (pip: site-packages/nvidia/cu13/include)",
            version.0, version.1
        ))
    })?;
    let mut dirs = vec![chosen.clone()];
    let cccl = chosen.join("cccl");
    if cccl.is_dir() {
        dirs.push(cccl);
    }
    Ok(dirs)
}

/// Finds and loads NVRTC (once it succeeds, the result is kept); a clear error if it is absent.
pub fn info() -> Result<NvrtcInfo> {
    let mut slot = loaded().lock().map_err(|_| Error::NvrtcUnavailable("internal lock poisoned".into()))?;
    if let Some(i) = slot.as_ref() {
        return Ok(i.clone());
    }
    let cfg = config().lock().map(|c| c.clone()).unwrap_or_default();
    let cands = library_candidates(&cfg);
    let library = cands.iter().find(|c| preload(c)).cloned();
    // SAFETY: probing only dlopens candidate names; a panic (none expected) is caught.
    let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err(Error::NvrtcUnavailable(format!(
            "libnvrtc was not found (tried {cands:?} and the loader's search path); install the nvidia-cuda-nvrtc \
             pip package or a CUDA toolkit, or set MIRAGE_NVRTC_PATH"
        )));
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present; the out-pointers are valid.
    let r = std::panic::catch_unwind(move || {
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        (r, major, minor)
    });
    let (r, major, minor) = r.map_err(|_| Error::NvrtcUnavailable("libnvrtc lacks nvrtcVersion".into()))?;
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcVersion", r));
    }
    let include_dirs = find_headers(&cfg, library.as_deref(), (major, minor))?;
    let i = NvrtcInfo { version: (major, minor), library, include_dirs };
    *slot = Some(i.clone());
    Ok(i)
}

/// Whether NVRTC can be loaded (see [`info`] for the reason when not).
pub fn is_available() -> bool {
    info().is_ok()
}

/// NVRTC's options for `arch`. sm_90 compiles as sm_90a (the same devices, plus wgmma, which
/// the attention's warpgroup form uses; the runtime header checks the feature macro).
fn options(arch: u32, info: &NvrtcInfo) -> Vec<String> {
    let target = if arch == 90 { "sm_90a".to_string() } else { format!("sm_{arch}") };
    let mut o = vec![format!("--gpu-architecture={target}"), "-std=c++17".into(), "-lineinfo".into()];
    for d in &info.include_dirs {
        o.push(format!("--include-path={}", d.display()));
    }
    o
}

fn mem_cache() -> &'static Mutex<HashMap<String, Arc<Vec<u8>>>> {
    static M: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The on-disk cache folder: `MIRAGE_CACHE_DIR` (`off` disables), else
/// `$XDG_CACHE_HOME/mirage/cubin`, else `~/.cache/mirage/cubin`.
pub fn disk_cache_dir() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("MIRAGE_CACHE_DIR") {
        if v.is_empty() || v == "off" || v == "0" {
            return None;
        }
        return Some(PathBuf::from(v).join("cubin"));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("mirage").join("cubin"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("mirage").join("cubin"))
}

/// Forgets the CUBINs held in memory (the on-disk cache stays): the next compile of each
/// source reads its disk entry, or compiles it again.
pub fn clear_memory_cache() {
    if let Ok(mut m) = mem_cache().lock() {
        m.clear();
    }
}

/// The first bytes of an on-disk cache entry; the digit is the entry layout's version.
const ENTRY_MAGIC: &[u8; 16] = b"mirage-cubin\0v1\0";
/// Bytes before an entry's CUBIN: the magic, the CUBIN's length (u64, little-endian) and its
/// SHA-256.
const ENTRY_HEADER: usize = ENTRY_MAGIC.len() + 8 + 32;

/// The on-disk cache entry of `cubin`: a header (magic, length, SHA-256 of the CUBIN), then
/// the CUBIN.
pub fn encode_cache_entry(cubin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER + cubin.len());
    out.extend_from_slice(ENTRY_MAGIC);
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(cubin));
    out.extend_from_slice(cubin);
    out
}

/// The CUBIN of an on-disk cache entry, or why the entry is unusable (another layout, a
/// truncated or extended file, a digest mismatch, a payload that is not an ELF image).
pub fn decode_cache_entry(bytes: &[u8]) -> std::result::Result<&[u8], &'static str> {
    if bytes.len() < ENTRY_HEADER {
        return Err("shorter than the entry header");
    }
    let (magic, rest) = bytes.split_at(ENTRY_MAGIC.len());
    if magic != ENTRY_MAGIC {
        return Err("not a mirage CUBIN cache entry of this layout");
    }
    let (len, rest) = rest.split_at(8);
    let (digest, cubin) = rest.split_at(32);
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(len);
    if u64::from_le_bytes(len_bytes) != cubin.len() as u64 {
        return Err("length does not match the header (truncated or extended)");
    }
    if Sha256::digest(cubin).as_slice() != digest {
        return Err("SHA-256 does not match the header (corrupted)");
    }
    if !cubin.starts_with(b"\x7fELF") {
        return Err("payload is not an ELF image");
    }
    Ok(cubin)
}

/// The cache key of a compile: the source (which holds the runtime header), the arch, the
/// NVRTC version, the options, the entry layout and this crate's version.
fn cache_key(source: &str, arch: u32, info: &NvrtcInfo, opts: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(ENTRY_MAGIC);
    h.update(concat!("mirage-codegen ", env!("CARGO_PKG_VERSION"), "\0").as_bytes());
    h.update(source.as_bytes());
    h.update(format!("\0sm_{arch}\0nvrtc {}.{}\0", info.version.0, info.version.1).as_bytes());
    // Include folders only matter through their contents' version; options without them.
    for o in opts.iter().filter(|o| !o.starts_with("--include-path")) {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles `source` to a CUBIN for `sm_{arch}`, through the in-memory and on-disk caches.
/// A compile error returns NVRTC's log.
pub fn compile(source: &str, arch: u32) -> Result<Arc<Vec<u8>>> {
    let info = info()?;
    let opts = options(arch, &info);
    let key = cache_key(source, arch, &info, &opts);
    if let Some(c) = mem_cache().lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(c);
    }
    let disk = disk_cache_dir().map(|d| d.join(format!("{key}.cubin")));
    // An entry that fails its checks (truncated, corrupted, another layout) is compiled again
    // and overwritten; it is never loaded.
    let entry = disk.as_ref().and_then(|p| std::fs::read(p).ok());
    if let Some(cubin) = entry.as_deref().and_then(|b| decode_cache_entry(b).ok()) {
        let c = Arc::new(cubin.to_vec());
        if let Ok(mut m) = mem_cache().lock() {
            m.insert(key, c.clone());
        }
        return Ok(c);
    }
    let cubin = Arc::new(compile_uncached(source, arch, &opts, false)?.0);
    if let Some(p) = disk {
        // Best effort: a cache that cannot be written is not an error.
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                // A file of this write alone (threads of one process may write the same key),
                // renamed into place: a reader sees the old entry or the whole new one.
                static WRITES: AtomicU64 = AtomicU64::new(0);
                let n = WRITES.fetch_add(1, Ordering::Relaxed);
                let tmp = p.with_extension(format!("tmp{}-{n}", std::process::id()));
                if std::fs::write(&tmp, encode_cache_entry(&cubin)).is_err() || std::fs::rename(&tmp, &p).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }
    if let Ok(mut m) = mem_cache().lock() {
        m.insert(key, cubin.clone());
    }
    Ok(cubin)
}

/// Compiles `source` for `sm_{arch}` with ptxas's verbose report (`--ptxas-options=-v`) and
/// returns that report: each kernel's registers, spills, stack frame and barriers, and
/// ptxas's warnings. Never cached (a diagnostic, as slow as a first compile); needs NVRTC, not
/// a GPU. A compile error returns NVRTC's log.
///
/// NVRTC 13.0 keeps each PTX's machine code for the process: compiling the same PTX again skips
/// ptxas, and with it the report (on the H200's image, a second report of one graph named no
/// kernel). So the source compiled here gets a device variable of its own per call, which
/// changes the PTX but no kernel.
pub fn resources(source: &str, arch: u32) -> Result<PtxasReport> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let info = info()?;
    let mut opts = options(arch, &info);
    opts.push("--ptxas-options=-v".into());
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let unique = format!("{source}\n__device__ unsigned mirage_report_{}_{nanos}_{n};\n", std::process::id());
    Ok(PtxasReport::parse(&compile_uncached(&unique, arch, &opts, true)?.1))
}

/// Owns an NVRTC program handle.
struct Prog(sys::nvrtcProgram);

impl Drop for Prog {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// Compiles without the caches: the CUBIN and, with `log`, NVRTC's log of the successful
/// compile (ptxas's report with `-v`; empty without `log`).
fn compile_uncached(source: &str, arch: u32, opts: &[String], log: bool) -> Result<(Vec<u8>, String)> {
    let src = CString::new(source).map_err(|_| Error::Unsupported("source contains a NUL byte".into()))?;
    let name = c"mirage_generated.cu";
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings; no headers passed.
    let r = unsafe {
        sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcCreateProgram", r));
    }
    let prog = Prog(prog);
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::Unsupported("an NVRTC option contains a NUL byte".into()))?;
    let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: `ptrs` point into `copts`, alive for the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(&prog).unwrap_or_else(|e| e.to_string());
        return match r {
            sys::nvrtcResult::NVRTC_ERROR_COMPILATION => Err(Error::Compile { arch, log }),
            // NVRTC's log names the option (e.g. an architecture it does not know).
            sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION => Err(Error::Nvrtc {
                call: "nvrtcCompileProgram",
                msg: format!("invalid option for sm_{arch}: {}", log.trim()),
            }),
            _ => Err(nvrtc_err("nvrtcCompileProgram", r)),
        };
    }
    let mut size = 0usize;
    // SAFETY: valid program and out-pointer.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetCUBINSize", r));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the size NVRTC reported.
    let r = unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetCUBIN", r));
    }
    Ok((buf, if log { program_log(&prog)? } else { String::new() }))
}

fn program_log(prog: &Prog) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: valid program and out-pointer.
    let r = unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetProgramLogSize", r));
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` has the size NVRTC reported.
    let r = unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcGetProgramLog", r));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cubin() -> Vec<u8> {
        let mut c = b"\x7fELF".to_vec();
        c.extend((0u8..200).map(|i| i.wrapping_mul(37)));
        c
    }

    #[test]
    fn an_entry_decodes_to_its_cubin() {
        let c = cubin();
        let e = encode_cache_entry(&c);
        assert_eq!(e.len(), ENTRY_HEADER + c.len());
        assert_eq!(decode_cache_entry(&e), Ok(c.as_slice()));
    }

    #[test]
    fn a_truncated_or_extended_entry_is_refused() {
        let e = encode_cache_entry(&cubin());
        for n in [0, 1, ENTRY_HEADER - 1, ENTRY_HEADER, e.len() - 1] {
            assert!(decode_cache_entry(&e[..n]).is_err(), "{n} bytes");
        }
        let mut longer = e.clone();
        longer.push(0);
        assert!(decode_cache_entry(&longer).is_err());
    }

    #[test]
    fn a_flipped_byte_anywhere_is_refused() {
        let e = encode_cache_entry(&cubin());
        for i in 0..e.len() {
            let mut bad = e.clone();
            bad[i] ^= 0x10;
            assert!(decode_cache_entry(&bad).is_err(), "byte {i}");
        }
    }

    #[test]
    fn a_raw_cubin_or_a_non_elf_payload_is_refused() {
        let c = cubin();
        assert!(decode_cache_entry(&c).is_err());
        let e = encode_cache_entry(b"not an ELF image at all, but long enough");
        assert_eq!(decode_cache_entry(&e), Err("payload is not an ELF image"));
    }

    #[test]
    fn the_key_follows_source_arch_version_and_options() {
        let info = NvrtcInfo { version: (13, 0), library: None, include_dirs: vec![PathBuf::from("/a")] };
        let opts = options(90, &info);
        let k = cache_key("src", 90, &info, &opts);
        assert_eq!(k, cache_key("src", 90, &info, &opts));
        assert_ne!(k, cache_key("src2", 90, &info, &opts));
        assert_ne!(k, cache_key("src", 80, &info, &options(80, &info)));
        let newer = NvrtcInfo { version: (13, 1), ..info.clone() };
        assert_ne!(k, cache_key("src", 90, &newer, &opts));
        let mut more = opts.clone();
        more.push("-G".into());
        assert_ne!(k, cache_key("src", 90, &info, &more));
        // Include folders count through NVRTC's version only.
        let elsewhere = NvrtcInfo { include_dirs: vec![PathBuf::from("/b")], ..info.clone() };
        assert_eq!(k, cache_key("src", 90, &elsewhere, &options(90, &elsewhere)));
    }
}
