//! SASS (the GPU's machine code) of compiled kernels, read without a GPU: NVIDIA's `nvdisasm`
//! run on a CUBIN, its listing split by kernel into instructions. Answers what the source
//! cannot: whether the matrix products are `HGMMA` (wgmma) or `HMMA`, whether a loop reads
//! local memory (`LDL`/`STL`), how many instructions a step issues.
//!
//! `nvdisasm` is found at `MIRAGE_NVDISASM` (the program or its folder), in the `bin` folder
//! beside the NVRTC library folders (the `nvidia-cuda-nvdisasm` pip package puts it in
//! `nvidia/cu13/bin`), in `CUDA_HOME`/`CUDA_PATH`/`/usr/local/cuda`'s `bin`, then on `PATH`.
//!
//! ```
//! use mirage_codegen::sass::KernelSass;
//! let listing = ".text.k0:\n        /*0000*/                   LDC R1, c[0x0][0x28] ;\n\
//!                        /*0010*/               @P0 BRA `(.L_x_1) ;\n";
//! let k = &KernelSass::parse(listing)[0];
//! assert_eq!(k.name, "k0");
//! assert_eq!(k.opcodes().collect::<Vec<_>>(), ["LDC", "BRA"]);
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::nvrtc;

/// One kernel's instructions, in address order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSass {
    /// The kernel's (`extern "C"`) name.
    pub name: String,
    /// Each instruction as `nvdisasm` prints it, its predicate included (`@P0 BRA ...`),
    /// without the address and the closing `;`.
    pub instructions: Vec<String>,
}

impl KernelSass {
    /// Splits an `nvdisasm` listing into its kernels (every `.text.<name>:` section).
    pub fn parse(listing: &str) -> Vec<KernelSass> {
        let mut out: Vec<KernelSass> = Vec::new();
        for line in listing.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix(".text.").and_then(|r| r.strip_suffix(':')) {
                out.push(KernelSass { name: name.to_string(), instructions: Vec::new() });
            } else if let (Some(k), Some(rest)) = (out.last_mut(), t.strip_prefix("/*")) {
                // `/*0a30*/  INSTR ;  /* encoding */` (the encoding only with -hex).
                if let Some((_, ins)) = rest.split_once("*/") {
                    let ins = ins.split(';').next().unwrap_or("").trim();
                    if !ins.is_empty() {
                        k.instructions.push(ins.to_string());
                    }
                }
            }
        }
        out
    }

    /// Each instruction's opcode without its modifiers or predicate (`HGMMA.64x64x16.F32` and
    /// `@P0 HGMMA...` are both `HGMMA`).
    pub fn opcodes(&self) -> impl Iterator<Item = &str> {
        self.instructions.iter().map(|i| {
            let mut words = i.split_whitespace();
            let first = words.next().unwrap_or("");
            let op = if first.starts_with('@') { words.next().unwrap_or("") } else { first };
            op.split('.').next().unwrap_or(op)
        })
    }

    /// How many instructions have each opcode ([`KernelSass::opcodes`]).
    pub fn opcode_counts(&self) -> BTreeMap<&str, usize> {
        let mut m = BTreeMap::new();
        for op in self.opcodes() {
            *m.entry(op).or_insert(0) += 1;
        }
        m
    }

    /// How many instructions have opcode `op`.
    pub fn count(&self, op: &str) -> usize {
        self.opcodes().filter(|&o| o == op).count()
    }
}

/// The `nvdisasm` program to run (see the module's header), or why there is none.
pub fn nvdisasm() -> Result<PathBuf> {
    const EXE: &str = "nvdisasm";
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("MIRAGE_NVDISASM").map(PathBuf::from) {
        tried.push(if p.is_dir() { p.join(EXE) } else { p });
    }
    tried.extend(nvrtc::tool_dirs().into_iter().map(|d| d.join(EXE)));
    if let Some(path) = std::env::var_os("PATH") {
        tried.extend(std::env::split_paths(&path).map(|d| d.join(EXE)));
    }
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        Error::Disassembler(format!(
            "nvdisasm was not found (tried {} places, first {:?}); install the nvidia-cuda-nvdisasm pip package or \
             a CUDA toolkit, or set MIRAGE_NVDISASM",
            tried.len(),
            tried.first()
        ))
    })
}

/// The SASS of every kernel in `cubin` (an ELF from [`nvrtc::compile`]), in the CUBIN's order.
pub fn disassemble(cubin: &[u8]) -> Result<Vec<KernelSass>> {
    let exe = nvdisasm()?;
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let file = std::env::temp_dir().join(format!(
        "mirage-sass-{}-{}.cubin",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |what: &str, e: std::io::Error| Error::Disassembler(format!("{what}: {e}"));
    std::fs::write(&file, cubin).map_err(|e| io(&format!("writing {}", file.display()), e))?;
    let out = Command::new(&exe).arg("-c").arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| io(&format!("running {}", exe.display()), e))?;
    if !out.status.success() {
        return Err(Error::Disassembler(format!(
            "{} exited with {}: {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(KernelSass::parse(&String::from_utf8_lossy(&out.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An excerpt of `nvdisasm -c` on a CUBIN of two kernels.
    const LISTING: &str = "\t.target\tsm_90a

//--------------------- .text.mi_k4_customized    --------------------------
\t.section\t.text.mi_k4_customized,\"ax\",@progbits
        .global         mi_k4_customized
mi_k4_customized:
.text.mi_k4_customized:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/               @P0 BRA `(.L_x_1) ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ, !UPT ;
        /*0030*/              @!P1 STL.64 [R1+0x8], R2 ;
        /*0040*/                   EXIT ;
//--------------------- .text.mi_k3_customized    --------------------------
.text.mi_k3_customized:
        /*0000*/                   HMMA.16816.F32 R4, R8, R12, R4 ;  /* 0x000000080c04723c */
        /*0010*/                   EXIT ;
";

    #[test]
    fn splits_kernels_and_counts_opcodes() {
        let ks = KernelSass::parse(LISTING);
        assert_eq!(ks.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["mi_k4_customized", "mi_k3_customized"]);
        assert_eq!(ks[0].instructions.len(), 5);
        assert_eq!(ks[0].instructions[1], "@P0 BRA `(.L_x_1)");
        assert_eq!(ks[0].opcodes().collect::<Vec<_>>(), ["LDC", "BRA", "HGMMA", "STL", "EXIT"]);
        assert_eq!((ks[0].count("HGMMA"), ks[0].count("STL"), ks[0].count("HMMA")), (1, 1, 0));
        assert_eq!(ks[1].instructions, ["HMMA.16816.F32 R4, R8, R12, R4", "EXIT"]);
        assert_eq!(ks[1].opcode_counts().into_iter().collect::<Vec<_>>(), [("EXIT", 1), ("HMMA", 1)]);
    }

    #[test]
    fn text_without_sections_has_no_kernels() {
        assert!(KernelSass::parse("/*0000*/ NOP ;\n").is_empty());
    }
}
