//! What ptxas reports for each compiled kernel: registers, spills, stack frame, barriers and
//! static shared memory, read from NVRTC's log of a compile with `--ptxas-options=-v`
//! ([`crate::nvrtc::resources`]). No GPU is needed: the report answers, on a build machine,
//! whether a kernel spills or where `setmaxnreg` was ignored (ptxas warns: C7508).
//!
//! ```
//! use mirage_codegen::resources::PtxasReport;
//! let log = "ptxas info    : Compiling entry function 'k0' for 'sm_90a'\n\
//!            ptxas info    : Function properties for k0\n\
//!            ptxas         .     8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
//!            ptxas info    : Used 168 registers, used 2 barriers, 8 bytes cumulative stack size\n";
//! let r = PtxasReport::parse(log);
//! assert_eq!(r.kernels[0].name, "k0");
//! assert_eq!((r.kernels[0].registers, r.kernels[0].spill_store_bytes), (168, 8));
//! ```

/// ptxas's figures for one entry function (kernel).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's (`extern "C"`) name.
    pub name: String,
    /// Registers a thread at entry (a warpgroup's `setmaxnreg` changes it at run time).
    pub registers: u32,
    /// Named barriers the kernel uses.
    pub barriers: u32,
    /// Bytes of local memory a thread for its stack frame (spills and run-time indexed arrays).
    pub stack_frame_bytes: u32,
    /// Bytes a thread stores to local memory because registers ran out.
    pub spill_store_bytes: u32,
    /// Bytes a thread loads back from those spills.
    pub spill_load_bytes: u32,
    /// Static shared memory a block (the dynamic part is the launch's).
    pub static_smem_bytes: u32,
}

impl KernelResources {
    /// Whether ptxas spilled registers of this kernel to local memory.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// The whole verbose report of one compile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// One entry per kernel, in the order ptxas compiled them.
    pub kernels: Vec<KernelResources>,
    /// ptxas's warnings (e.g. wgmma serialised, or an ignored `setmaxnreg`), one line each.
    pub warnings: Vec<String>,
    /// The log as NVRTC gave it, for a report that misses a kernel.
    pub log: String,
}

impl PtxasReport {
    /// Parses NVRTC's log of a compile with `--ptxas-options=-v`. Lines it does not know are
    /// skipped; properties of non-entry functions are not attributed to a kernel.
    pub fn parse(log: &str) -> PtxasReport {
        let mut r = PtxasReport { log: log.to_string(), ..PtxasReport::default() };
        // Whether the current "Function properties" block is the current kernel's.
        let mut own = false;
        for line in log.lines() {
            let line = line.trim();
            if line.starts_with("ptxas warning") {
                r.warnings.push(line.to_string());
            } else if let Some(name) = quoted_after(line, "Compiling entry function '") {
                r.kernels.push(KernelResources { name: name.to_string(), ..KernelResources::default() });
                own = false;
            } else if let Some(rest) = line.split("Function properties for ").nth(1) {
                own = r.kernels.last().is_some_and(|k| k.name == rest.trim());
            } else if let Some(k) = r.kernels.last_mut() {
                if own && line.contains("bytes stack frame") {
                    k.stack_frame_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                    k.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
                    k.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
                } else if own && line.contains("Used ") && line.contains(" registers") {
                    k.registers = number_before(line, "registers").unwrap_or(0);
                    k.barriers = number_before(line, "barriers").unwrap_or(0);
                    k.static_smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
                }
            }
        }
        r
    }

    /// The report of kernel `name`, if ptxas compiled one of that name.
    pub fn kernel(&self, name: &str) -> Option<&KernelResources> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// The text between `prefix` and the next `'` in `line`.
fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = line.split(prefix).nth(1)?;
    rest.split('\'').next()
}

/// The number just before the first `key` in `line` (`"... 24 bytes spill stores"`), within
/// the comma-separated part holding it.
fn number_before(line: &str, key: &str) -> Option<u32> {
    let part = line.split(',').find(|p| p.contains(key))?;
    let before = part.split(key).next()?;
    before.split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verbose log as NVRTC 13 gives it: two kernels, one spilling with static shared
    /// memory, a device function's properties between them, and a warning.
    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'mi_k0' for 'sm_90a'
ptxas info    : Function properties for mi_k0
ptxas         .     40 bytes stack frame, 36 bytes spill stores, 28 bytes spill loads
ptxas info    : Used 128 registers, used 3 barriers, 1024 bytes smem, 40 bytes cumulative stack size
ptxas info    : Compile time = 12.5 ms
ptxas info    : Function properties for __internal_helper
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas warning : (C7508) Potential Performance Loss: setmaxnreg ignored; unable to determine register count at entry
ptxas info    : Compiling entry function 'mi_k1' for 'sm_90a'
ptxas info    : Function properties for mi_k1
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 0 bytes cumulative stack size
";

    #[test]
    fn parses_each_kernel_and_the_warnings() {
        let r = PtxasReport::parse(LOG);
        assert_eq!(
            r.kernels,
            vec![
                KernelResources {
                    name: "mi_k0".into(),
                    registers: 128,
                    barriers: 3,
                    stack_frame_bytes: 40,
                    spill_store_bytes: 36,
                    spill_load_bytes: 28,
                    static_smem_bytes: 1024,
                },
                KernelResources { name: "mi_k1".into(), registers: 32, ..KernelResources::default() },
            ]
        );
        assert!(r.kernels[0].spills() && !r.kernels[1].spills());
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("C7508"));
        assert_eq!(r.kernel("mi_k1").map(|k| k.registers), Some(32));
        assert!(r.kernel("__internal_helper").is_none());
    }

    #[test]
    fn unknown_text_gives_an_empty_report() {
        let r = PtxasReport::parse("nothing here\n");
        assert!(r.kernels.is_empty() && r.warnings.is_empty());
        assert_eq!(r.log, "nothing here\n");
    }
}
