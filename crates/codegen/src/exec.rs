//! A compiled, loaded program ready to launch on raw device pointers: generation for the
//! device's exact architecture and shared-memory limit, NVRTC compilation (cached), module
//! load, and per-call argument checks. Predefined matmuls run on cuBLAS where it loads
//! (`crate::cublas`), else on their default kernels, with the reason kept
//! ([`Executable::cublas_note`]).

use std::sync::Arc;

use mirage_ugraph::KernelGraph;

use crate::cublas::{self, Blas};
use crate::driver::{self, Device, Module};
use crate::error::{Error, Result};
use crate::generate::{generate, Options};
use crate::nvrtc;
use crate::program::{BufferRef, KernelSpec, Program, Step};

/// A kernel graph compiled and loaded on one device.
pub struct Executable {
    program: Program,
    module: Module,
    blas: Option<Arc<Blas>>,
    cublas_note: Option<String>,
}

impl Executable {
    /// Generates, compiles (through the cache) and loads `g` on device `ordinal`.
    pub fn new(g: &KernelGraph, ordinal: i32) -> Result<Executable> {
        Self::with_source(g, ordinal, None)
    }

    /// [`Executable::new`], compiling `source` instead of the generated source where given (a
    /// developer's edited copy of it): the launches stay the generated program's, so the
    /// source must define the same kernels with the same parameters, except where a line
    /// `// mirage-launch: NAME block=X,Y,Z smem=BYTES` (either key optional) changes kernel
    /// NAME's block or dynamic shared memory (a hand variant with another warpgroup).
    pub fn with_source(g: &KernelGraph, ordinal: i32, source: Option<String>) -> Result<Executable> {
        let device = driver::device(ordinal)?;
        let opts = Options { smem_limit: Some(device.smem_optin), ..Options::for_target_from_env(device.target)? };
        let mut program = generate(g, &opts)?;
        let mut note = None;
        if !opts.cublas {
            note = Some("MIRAGE_CUBLAS=0: predefined matmuls run on the default kernel".to_string());
        } else if program.gemms().next().is_some() {
            if let Err(why) = cublas::for_device(&device) {
                // The library is optional: the default kernels take the matmuls.
                note = Some(format!("cuBLAS is not available ({why}): predefined matmuls run on the default kernel"));
                program = generate(g, &Options { cublas: false, ..opts })?;
            }
        }
        if let Some(s) = source {
            override_launches(&mut program.kernels, &s)?;
            program.source = s;
        }
        let mut exe = Self::from_program(program, device)?;
        exe.cublas_note = note;
        Ok(exe)
    }

    /// Compiles and loads an already generated program on `device` (its arch must match).
    pub fn from_program(program: Program, device: Arc<Device>) -> Result<Executable> {
        if program.arch != device.arch {
            return Err(Error::Launch(format!(
                "the program was generated for sm_{} but device {} is sm_{}",
                program.arch, device.ordinal, device.arch
            )));
        }
        let blas = match program.gemms().next() {
            Some(_) => Some(cublas::for_device(&device).map_err(|msg| Error::Cublas { call: "load", msg })?),
            None => None,
        };
        let cubin = nvrtc::compile(&program.source, program.arch)?;
        let module = Module::load(device, &cubin, &program.kernels)?;
        Ok(Executable { program, module, blas, cublas_note: None })
    }

    /// Why predefined matmuls do not run on cuBLAS here (cuBLAS not loadable, or turned off
    /// with `MIRAGE_CUBLAS=0`); `None` when cuBLAS takes every matmul whose layout it can.
    pub fn cublas_note(&self) -> Option<&str> {
        self.cublas_note.as_deref()
    }

    /// The generated program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The device it is loaded on.
    pub fn device(&self) -> &Arc<Device> {
        self.module.device()
    }

    /// Runs every step (kernels and cuBLAS GEMMs, in the program's order) on `stream` with the
    /// graph's input and output pointers and a workspace of at least
    /// [`Program::workspace_bytes`] bytes (0 when none is needed).
    ///
    /// # Safety
    /// Each pointer must address a live allocation on this device holding the tensor the
    /// program expects at that position (dims, dtype and strides of [`Program::inputs`] /
    /// [`Program::outputs`]); outputs must not overlap inputs or each other; `stream` must
    /// belong to the device's primary context (or be 0).
    pub unsafe fn launch(&self, inputs: &[u64], outputs: &[u64], workspace: u64, stream: u64) -> Result<()> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() || outputs.len() != p.outputs.len() {
            return Err(Error::Launch(format!(
                "expected {} input and {} output pointers, got {} and {}",
                p.inputs.len(),
                p.outputs.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        if let Some(i) = inputs.iter().chain(outputs).position(|&x| x == 0) {
            return Err(Error::Launch(format!("pointer {i} is null")));
        }
        if p.workspace_bytes > 0 && workspace == 0 {
            return Err(Error::Launch(format!("the program needs {} bytes of workspace", p.workspace_bytes)));
        }
        let ptr = |a: &BufferRef| match *a {
            BufferRef::Input(i) => inputs[i],
            BufferRef::Output(j) => outputs[j],
            BufferRef::Workspace(off) => workspace + off as u64,
        };
        let args: Vec<Vec<u64>> = p.kernels.iter().map(|k| k.args.iter().map(ptr).collect()).collect();
        // Consecutive kernels go out together; a GEMM step ends such a run.
        let mut run: Option<(usize, usize)> = None;
        let flush = |run: &mut Option<(usize, usize)>| -> Result<()> {
            if let Some((first, end)) = run.take() {
                // SAFETY: forwarded from the caller's contract.
                unsafe { self.module.launch(first, &args[first..end], stream) }?;
            }
            Ok(())
        };
        for step in &p.steps {
            match step {
                Step::Kernel(i) => match run {
                    Some((_, ref mut end)) if *end == *i => *end += 1,
                    _ => {
                        flush(&mut run)?;
                        run = Some((*i, i.checked_add(1).ok_or_else(|| Error::Launch("kernel index".into()))?));
                    }
                },
                Step::Gemm(g) => {
                    flush(&mut run)?;
                    let blas =
                        self.blas.as_ref().ok_or_else(|| Error::Launch(format!("{}: no cuBLAS handle", g.name)))?;
                    let (a, b, c, ws) =
                        (ptr(&g.first.location), ptr(&g.second.location), ptr(&g.out.location), ptr(&g.workspace));
                    // SAFETY: forwarded from the caller's contract; the workspace slice lies
                    // inside the caller's workspace of `workspace_bytes`.
                    unsafe { blas.gemm(g, a, b, c, ws, stream) }?;
                }
            }
        }
        flush(&mut run)
    }
}

/// Applies a hand-edited source's `// mirage-launch:` lines to `kernels` (see
/// [`Executable::with_source`]).
fn override_launches(kernels: &mut [KernelSpec], source: &str) -> Result<()> {
    let bad = |line: &str, why: &str| Error::Launch(format!("`{}`: {why}", line.trim()));
    for line in source.lines().filter_map(|l| l.trim().strip_prefix("// mirage-launch:")) {
        let mut words = line.split_whitespace();
        let name = words.next().ok_or_else(|| bad(line, "no kernel name"))?;
        let k = kernels.iter_mut().find(|k| k.name == name).ok_or_else(|| bad(line, "no such kernel"))?;
        for w in words {
            match w.split_once('=') {
                Some(("block", v)) => {
                    let d: Vec<u32> = v
                        .split(',')
                        .map(str::parse)
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|_| bad(line, "block=X,Y,Z"))?;
                    k.block = <[u32; 3]>::try_from(d).map_err(|_| bad(line, "block=X,Y,Z"))?;
                }
                Some(("smem", v)) => k.smem_bytes = v.parse().map_err(|_| bad(line, "smem=BYTES"))?,
                _ => return Err(bad(line, "expected block=X,Y,Z or smem=BYTES")),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> KernelSpec {
        KernelSpec {
            name: "mi_k0".into(),
            kind: "customized",
            op: 0,
            grid: [1, 1, 1],
            block: [128, 1, 1],
            cluster: [1, 1, 1],
            smem_bytes: 0,
            args: vec![],
            dep_wait: false,
        }
    }

    #[test]
    fn a_launch_line_changes_block_and_smem() {
        let mut k = [spec()];
        override_launches(&mut k, "x\n// mirage-launch: mi_k0 block=640,1,1 smem=4096\n").unwrap();
        assert_eq!((k[0].block, k[0].smem_bytes), ([640, 1, 1], 4096));
        assert!(override_launches(&mut k, "// mirage-launch: mi_k9 block=1,1,1").is_err());
        assert!(override_launches(&mut k, "// mirage-launch: mi_k0 block=1,1").is_err());
        assert!(override_launches(&mut k, "// mirage-launch: mi_k0 grid=1").is_err());
    }
}
