//! A compiled, loaded program ready to launch on raw device pointers: generation for the
//! device's exact architecture and shared-memory limit, NVRTC compilation (cached), module
//! load, and per-call argument checks.

use std::sync::Arc;

use mirage_ugraph::KernelGraph;

use crate::driver::{self, Device, Module};
use crate::error::{Error, Result};
use crate::generate::{generate, Options};
use crate::nvrtc;
use crate::program::{BufferRef, Program};

/// A kernel graph compiled and loaded on one device.
pub struct Executable {
    program: Program,
    module: Module,
}

impl Executable {
    /// Generates, compiles (through the cache) and loads `g` on device `ordinal`.
    pub fn new(g: &KernelGraph, ordinal: i32) -> Result<Executable> {
        Self::with_source(g, ordinal, None)
    }

    /// [`Executable::new`], compiling `source` instead of the generated source where given (a
    /// developer's edited copy of it): the launches stay the generated program's, so the
    /// source must define the same kernels with the same parameters and shared memory.
    pub fn with_source(g: &KernelGraph, ordinal: i32, source: Option<String>) -> Result<Executable> {
        let device = driver::device(ordinal)?;
        let mut program =
            generate(g, &Options { smem_limit: Some(device.smem_optin), ..Options::for_arch_from_env(device.arch)? })?;
        if let Some(s) = source {
            program.source = s;
        }
        Self::from_program(program, device)
    }

    /// Compiles and loads an already generated program on `device` (its arch must match).
    pub fn from_program(program: Program, device: Arc<Device>) -> Result<Executable> {
        if program.arch != device.arch {
            return Err(Error::Launch(format!(
                "the program was generated for sm_{} but device {} is sm_{}",
                program.arch, device.ordinal, device.arch
            )));
        }
        let cubin = nvrtc::compile(&program.source, program.arch)?;
        let module = Module::load(device, &cubin, &program.kernels)?;
        Ok(Executable { program, module })
    }

    /// The generated program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The device it is loaded on.
    pub fn device(&self) -> &Arc<Device> {
        self.module.device()
    }

    /// Launches every kernel on `stream` with the graph's input and output pointers and a
    /// workspace of at least [`Program::workspace_bytes`] bytes (0 when none is needed).
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
        let args: Vec<Vec<u64>> = p
            .kernels
            .iter()
            .map(|k| {
                k.args
                    .iter()
                    .map(|a| match *a {
                        BufferRef::Input(i) => inputs[i],
                        BufferRef::Output(j) => outputs[j],
                        BufferRef::Workspace(off) => workspace + off as u64,
                    })
                    .collect()
            })
            .collect();
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.module.launch(&args, stream) }
    }
}
