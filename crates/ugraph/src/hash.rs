//! Structural hashing of kernel graphs: a Merkle-style SHA-256 over the dataflow, independent
//! of tensor ids and of the order in which independent ops were built.
//!
//! A graph input's digest covers its position, dims, dtype and strides; an op output's digest
//! covers the op kind with its parameters, the digests of its operands in order and the output
//! index; a customized op hashes its block graph the same way (block inputs by position) with
//! the launch parameters, the shared-memory cap (where set) and output maps. The graph digest
//! covers the inputs in order and the outputs ([`KernelGraph::output_ids`]) in order with
//! their strides.

use sha2::{Digest as _, Sha256};

use crate::block::{BlockGraph, BlockOpKind};
use crate::kernel::{KernelGraph, KernelOpKind};
use crate::ops::UnaryOp;
use crate::types::{row_major_strides, DType};

type Digest = [u8; 32];

/// A SHA-256 state fed with length-prefixed, little-endian fields.
struct H(Sha256);

impl H {
    fn new(tag: &str) -> Self {
        let mut h = H(Sha256::new());
        h.str(tag);
        h
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.0.update(x.to_le_bytes());
        self
    }
    fn i64(&mut self, x: i64) -> &mut Self {
        self.0.update(x.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.update(s.as_bytes());
        self
    }
    fn usizes(&mut self, xs: &[usize]) -> &mut Self {
        self.u64(xs.len() as u64);
        xs.iter().for_each(|&x| {
            self.u64(x as u64);
        });
        self
    }
    fn i64s(&mut self, xs: &[i64]) -> &mut Self {
        xs.iter().for_each(|&x| {
            self.i64(x);
        });
        self
    }
    fn dtype(&mut self, d: DType) -> &mut Self {
        self.str(d.name())
    }
    fn digest(&mut self, d: &Digest) -> &mut Self {
        self.0.update(d);
        self
    }
    fn unary(&mut self, u: &UnaryOp) -> &mut Self {
        self.str(u.name());
        match *u {
            UnaryOp::Clamp { min, max } => self.u64(min.to_bits().into()).u64(max.to_bits().into()),
            UnaryOp::MulScalar { scalar } => self.u64(scalar.to_bits().into()),
            _ => self,
        }
    }
    /// Operand digests in order (an id with no digest, in a malformed graph, hashes as itself).
    fn operands(&mut self, ids: &[usize], known: &[Option<Digest>]) -> &mut Self {
        self.u64(ids.len() as u64);
        for &t in ids {
            match known.get(t).copied().flatten() {
                Some(d) => self.digest(&d),
                None => self.str("undefined").u64(t as u64),
            };
        }
        self
    }
    fn finish(&mut self) -> Digest {
        std::mem::take(&mut self.0).finalize().into()
    }
}

/// Adds an RMS epsilon: nothing when it is 0, so epsilon-free graphs keep their hashes.
fn eps_field(h: &mut H, eps: f32) -> &mut H {
    if eps != 0.0 {
        h.str("eps").u64(eps.to_bits().into());
    }
    h
}

/// Hex SHA-256 of the graph's structure (see the module docs for what it covers).
pub fn graph_hash(g: &KernelGraph) -> String {
    let mut known: Vec<Option<Digest>> = vec![None; g.tensors.len()];
    let mut inputs = Vec::new();
    for op in &g.ops {
        let kind_digest = match &op.kind {
            KernelOpKind::Input { dims, dtype, strides } => {
                let d = H::new("input").u64(inputs.len() as u64).usizes(dims).dtype(*dtype).usizes(strides).finish();
                inputs.push(d);
                set(&mut known, op.outputs.first(), d);
                continue;
            }
            KernelOpKind::Customized { graph } => block_digest(graph),
            KernelOpKind::Matmul => H::new("matmul").finish(),
            KernelOpKind::Unary { op: u } => H::new("unary").unary(u).finish(),
            KernelOpKind::Binary { op: b } => H::new("binary").str(b.name()).finish(),
            KernelOpKind::Reduction { dim } => H::new("reduction").u64(*dim as u64).finish(),
            KernelOpKind::RmsNorm { normalized_ndims, eps } => {
                let mut h = H::new("rms_norm");
                h.u64(*normalized_ndims as u64);
                eps_field(&mut h, *eps).finish()
            }
            KernelOpKind::Softmax { dim } => H::new("softmax").u64(*dim as u64).finish(),
        };
        for (i, &t) in op.outputs.iter().enumerate() {
            let d = H::new("op").digest(&kind_digest).operands(&op.inputs, &known).u64(i as u64).finish();
            set(&mut known, Some(&t), d);
        }
    }
    let mut h = H::new("graph");
    h.u64(inputs.len() as u64);
    inputs.iter().for_each(|d| {
        h.digest(d);
    });
    let outs = g.output_ids();
    h.operands(&outs, &known);
    for &t in &outs {
        let strides = match g.outputs.iter().find(|o| o.tensor == t) {
            Some(o) => o.strides.clone(),
            None => g.tensors.get(t).map(|x| row_major_strides(&x.dims)).unwrap_or_default(),
        };
        h.usizes(&strides);
    }
    hex(&h.finish())
}

fn set(known: &mut [Option<Digest>], t: Option<&usize>, d: Digest) {
    if let Some(slot) = t.and_then(|&t| known.get_mut(t)) {
        *slot = Some(d);
    }
}

/// Digest of a block graph: launch parameters, inputs by position, outputs in order.
fn block_digest(b: &BlockGraph) -> Digest {
    let mut known: Vec<Option<Digest>> = vec![None; b.tensors.len()];
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    for op in &b.ops {
        let kind_digest = match &op.kind {
            BlockOpKind::Input { dims, dtype, imap, forloop_dim } => {
                let d = H::new("tb.input")
                    .u64(inputs.len() as u64)
                    .usizes(dims)
                    .dtype(*dtype)
                    .i64s(imap)
                    .i64(*forloop_dim)
                    .finish();
                inputs.push(d);
                set(&mut known, op.outputs.first(), d);
                continue;
            }
            BlockOpKind::Output { omap, forloop_dim } => {
                outputs.push(H::new("tb.output").i64s(omap).i64(*forloop_dim).operands(&op.inputs, &known).finish());
                continue;
            }
            BlockOpKind::Matmul => H::new("tb.matmul").finish(),
            BlockOpKind::Unary { op: u } => H::new("tb.unary").unary(u).finish(),
            BlockOpKind::Binary { op: o } => H::new("tb.binary").str(o.name()).finish(),
            BlockOpKind::Reduction { dim } => H::new("tb.reduction").u64(*dim as u64).finish(),
            BlockOpKind::ReductionMax { dim } => H::new("tb.reduction_max").u64(*dim as u64).finish(),
            BlockOpKind::RmsNorm { eps } => {
                let mut h = H::new("tb.rms_norm");
                eps_field(&mut h, *eps).finish()
            }
            BlockOpKind::Concat { dim } => H::new("tb.concat").u64(*dim as u64).finish(),
            BlockOpKind::ForloopAccum { acc, eps } => {
                let mut h = H::new("tb.forloop_accum");
                h.str(&format!("{acc:?}"));
                eps_field(&mut h, *eps).finish()
            }
            BlockOpKind::ForloopAccumRescale { acc } => {
                H::new("tb.forloop_accum_rescale").str(&format!("{acc:?}")).finish()
            }
            BlockOpKind::ForloopAccumMax => H::new("tb.forloop_accum_max").finish(),
        };
        for (i, &t) in op.outputs.iter().enumerate() {
            let d = H::new("tb.op").digest(&kind_digest).operands(&op.inputs, &known).u64(i as u64).finish();
            set(&mut known, Some(&t), d);
        }
    }
    let mut h = H::new("block");
    h.usizes(&b.grid_dim).usizes(&b.block_dim).u64(b.forloop_range as u64).u64(b.reduction_dimx as u64);
    if let Some(cap) = b.smem_cap {
        h.str("smem_cap").u64(cap as u64);
    }
    if b.warpgroup_acc {
        h.str("warpgroup_acc");
    }
    for list in [&inputs, &outputs] {
        h.u64(list.len() as u64);
        list.iter().for_each(|d| {
            h.digest(d);
        });
    }
    h.finish()
}

fn hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl KernelGraph {
    /// Hex structural hash of this graph (see [`graph_hash`]).
    pub fn hash(&self) -> String {
        graph_hash(self)
    }
}
