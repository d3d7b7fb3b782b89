//! Kernel graphs: tensors in device memory, predefined ops and customized (block-graph) ops.

use serde::{Deserialize, Serialize};

use crate::block::{BlockGraph, BlockOpKind};
use crate::error::{invalid, shape_err, Error, Result};
use crate::limits::check_size;
use crate::ops::{broadcast_dims, matmul_dims, reduce_dims, BinaryOp, UnaryOp};
use crate::structural::{self as st, StructuralDef};
use crate::types::{check_dims, check_strides, resolve_dim, row_major_strides, same_dtype, DType};

/// Index of a tensor in its kernel graph.
pub type TensorId = usize;

/// A tensor in device memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DTensor {
    /// Dims.
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

/// The op of one kernel-graph node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelOpKind {
    /// A graph input.
    Input {
        /// Dims.
        dims: Vec<usize>,
        /// Element type.
        dtype: DType,
        /// Layout in elements (row-major unless given).
        strides: Vec<usize>,
    },
    /// Batched matmul `[.., m, k] x [.., k, n]`.
    Matmul,
    /// Element-wise unary op.
    Unary {
        /// The element-wise op.
        op: UnaryOp,
    },
    /// Element-wise binary op with broadcasting.
    Binary {
        /// The element-wise op.
        op: BinaryOp,
    },
    /// Sum over `dim`, kept with size 1.
    Reduction {
        /// Reduced dim.
        dim: usize,
    },
    /// `x / sqrt(mean(x^2) + eps)` over the trailing `normalized_ndims` dims, times an optional
    /// weight (second input, dims = the normalized dims).
    RmsNorm {
        /// How many trailing dims are normalized.
        normalized_ndims: usize,
        /// Added to the mean of squares before the root (finite, `>= 0`).
        #[serde(default, skip_serializing_if = "crate::ops::eps_is_zero", with = "crate::json::float")]
        eps: f32,
    },
    /// `exp(x - max) / sum(exp(x - max))` over `dim`.
    Softmax {
        /// Softmax dim.
        dim: usize,
    },
    /// A graph-defined op: a block graph run by a grid of thread blocks.
    Customized {
        /// What each block computes.
        graph: BlockGraph,
    },
}

impl KernelOpKind {
    /// The op's structural registry entry (`None` for the element-wise ops, whose entries are
    /// in [`crate::registry`]).
    pub fn def(&self) -> Option<&'static StructuralDef> {
        match self {
            KernelOpKind::Input { .. } => Some(&st::INPUT),
            KernelOpKind::Matmul => Some(&st::MATMUL),
            KernelOpKind::Unary { .. } | KernelOpKind::Binary { .. } => None,
            KernelOpKind::Reduction { .. } => Some(&st::REDUCTION),
            KernelOpKind::RmsNorm { .. } => Some(&st::RMS_NORM),
            KernelOpKind::Softmax { .. } => Some(&st::SOFTMAX),
            KernelOpKind::Customized { .. } => Some(&st::CUSTOMIZED),
        }
    }

    /// The op's name in the Python API.
    pub fn name(&self) -> &'static str {
        match (self, self.def()) {
            (_, Some(d)) => d.name,
            (KernelOpKind::Unary { op }, None) => op.name(),
            (KernelOpKind::Binary { op }, None) => op.name(),
            (_, None) => unreachable!("every kernel op but the element-wise ones has a structural entry"),
        }
    }

    /// Checks the number of operands against the op's registry entry.
    pub fn check_operands(&self, n: usize) -> Result<()> {
        let (name, want) = match (self, self.def()) {
            (_, Some(d)) => return d.check_operands(n),
            (KernelOpKind::Unary { op }, None) => (op.name(), 1),
            (KernelOpKind::Binary { op }, None) => (op.name(), op.def().arity),
            (_, None) => unreachable!("every kernel op but the element-wise ones has a structural entry"),
        };
        if n != want {
            return invalid(name, format!("expects {want} operands, got {n}"));
        }
        Ok(())
    }
}

/// One node of a kernel graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelOp {
    /// What the node computes.
    pub kind: KernelOpKind,
    /// Operand tensors.
    pub inputs: Vec<TensorId>,
    /// Result tensors.
    pub outputs: Vec<TensorId>,
}

/// A marked graph output and its layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The tensor.
    pub tensor: TensorId,
    /// Layout in elements.
    pub strides: Vec<usize>,
}

/// A kernel graph: the top level of a µGraph.
///
/// ```
/// use mirage_ugraph::{DType, KernelGraph, Tensor, run};
/// let mut g = KernelGraph::new();
/// let x = g.new_input(&[2, 3], DType::Float32, None).unwrap();
/// let w = g.new_input(&[3, 2], DType::Float32, None).unwrap();
/// let y = g.matmul(x, w).unwrap();
/// g.mark_output(y, None).unwrap();
/// let xs = Tensor::new(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
/// let ws = Tensor::new(vec![3, 2], vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
/// let out = run(&g, &[xs, ws]).unwrap();
/// assert_eq!(out[0].data, vec![4.0, 5.0, 10.0, 11.0]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelGraph {
    /// Nodes in creation (topological) order.
    pub ops: Vec<KernelOp>,
    /// Tensors, indexed by [`TensorId`].
    pub tensors: Vec<DTensor>,
    /// Marked outputs in order.
    pub outputs: Vec<Output>,
}

impl KernelGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: TensorId) -> Result<&DTensor> {
        self.tensors.get(id).ok_or_else(|| Error::Invalid {
            op: "kernel graph".into(),
            msg: format!("tensor #{id} does not belong to this graph"),
        })
    }

    /// Appends an op; every result must fit the size limits ([`crate::limits`]).
    fn push(&mut self, kind: KernelOpKind, inputs: Vec<TensorId>, outs: Vec<DTensor>) -> Result<Vec<TensorId>> {
        for (i, t) in outs.iter().enumerate() {
            let what = if outs.len() == 1 { "the result".to_string() } else { format!("result {i}") };
            check_size(kind.name(), &what, &t.dims)?;
        }
        let ids: Vec<TensorId> = (self.tensors.len()..self.tensors.len() + outs.len()).collect();
        self.tensors.extend(outs);
        self.ops.push(KernelOp { kind, inputs, outputs: ids.clone() });
        Ok(ids)
    }

    /// Adds an input; `strides` default to row-major.
    pub fn new_input(&mut self, dims: &[usize], dtype: DType, strides: Option<&[usize]>) -> Result<TensorId> {
        check_dims("new_input", "the input", dims)?;
        let strides = match strides {
            Some(s) => {
                check_strides("new_input", dims, s)?;
                s.to_vec()
            }
            None => row_major_strides(dims),
        };
        let t = DTensor { dims: dims.to_vec(), dtype };
        Ok(self.push(KernelOpKind::Input { dims: dims.to_vec(), dtype, strides }, vec![], vec![t])?[0])
    }

    /// Ids of the graph inputs in order.
    pub fn input_ids(&self) -> Vec<TensorId> {
        self.ops.iter().filter(|o| matches!(o.kind, KernelOpKind::Input { .. })).map(|o| o.outputs[0]).collect()
    }

    /// Batched matmul.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = matmul_dims("matmul", &ta.dims, &tb.dims)?;
        let dtype = same_dtype("matmul", ta.dtype, tb.dtype)?;
        Ok(self.push(KernelOpKind::Matmul, vec![a, b], vec![DTensor { dims, dtype }])?[0])
    }

    /// Element-wise unary op.
    pub fn unary(&mut self, op: UnaryOp, a: TensorId) -> Result<TensorId> {
        op.validate()?;
        let t = self.tensor(a)?.clone();
        Ok(self.push(KernelOpKind::Unary { op }, vec![a], vec![t])?[0])
    }

    /// Element-wise binary op with broadcasting.
    pub fn binary(&mut self, op: BinaryOp, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (self.tensor(a)?.clone(), self.tensor(b)?.clone());
        let dims = broadcast_dims(op.name(), &ta.dims, &tb.dims)?;
        let dtype = same_dtype(op.name(), ta.dtype, tb.dtype)?;
        Ok(self.push(KernelOpKind::Binary { op }, vec![a, b], vec![DTensor { dims, dtype }])?[0])
    }

    /// Sum over `dim` (negative counts from the end), kept with size 1.
    pub fn reduction(&mut self, a: TensorId, dim: i64) -> Result<TensorId> {
        let t = self.tensor(a)?.clone();
        let d = resolve_dim("reduction", "the input", dim, t.dims.len())?;
        let out = DTensor { dims: reduce_dims(&t.dims, d), dtype: t.dtype };
        Ok(self.push(KernelOpKind::Reduction { dim: d }, vec![a], vec![out])?[0])
    }

    /// RMS normalisation over the trailing dims `normalized_shape`, with an optional weight.
    pub fn rms_norm(&mut self, a: TensorId, normalized_shape: &[usize], weight: Option<TensorId>) -> Result<TensorId> {
        self.rms_norm_eps(a, normalized_shape, weight, 0.0)
    }

    /// [`KernelGraph::rms_norm`] with `eps` added to the mean of squares (finite, `>= 0`).
    pub fn rms_norm_eps(
        &mut self,
        a: TensorId,
        normalized_shape: &[usize],
        weight: Option<TensorId>,
        eps: f32,
    ) -> Result<TensorId> {
        let op = "rms_norm";
        let eps = crate::ops::check_eps(op, eps)?;
        let t = self.tensor(a)?.clone();
        let n = normalized_shape.len();
        if n == 0 || n > t.dims.len() || t.dims[t.dims.len() - n..] != *normalized_shape {
            return shape_err(
                op,
                format!(
                    "normalized_shape {normalized_shape:?} is not a non-empty suffix of the input dims {:?}",
                    t.dims
                ),
            );
        }
        let mut inputs = vec![a];
        if let Some(w) = weight {
            let tw = self.tensor(w)?.clone();
            if tw.dims != normalized_shape {
                return shape_err(
                    op,
                    format!("weight has dims {:?} but normalized_shape is {normalized_shape:?}", tw.dims),
                );
            }
            same_dtype(op, t.dtype, tw.dtype)?;
            inputs.push(w);
        }
        Ok(self.push(KernelOpKind::RmsNorm { normalized_ndims: n, eps }, inputs, vec![t])?[0])
    }

    /// Softmax over `dim` (negative counts from the end).
    pub fn softmax(&mut self, a: TensorId, dim: i64) -> Result<TensorId> {
        let t = self.tensor(a)?.clone();
        let d = resolve_dim("softmax", "the input", dim, t.dims.len())?;
        Ok(self.push(KernelOpKind::Softmax { dim: d }, vec![a], vec![t])?[0])
    }

    /// Adds a customized op running `graph` on `inputs`; returns its outputs in order.
    pub fn customized(&mut self, inputs: &[TensorId], graph: BlockGraph) -> Result<Vec<TensorId>> {
        let op = "customized";
        graph.check_complete()?;
        let declared: Vec<(Vec<usize>, DType)> = graph
            .input_ops()
            .map(|o| match &o.kind {
                BlockOpKind::Input { dims, dtype, .. } => (dims.clone(), *dtype),
                _ => unreachable!("input_ops yields inputs only"),
            })
            .collect();
        if declared.len() != inputs.len() {
            return invalid(
                op,
                format!("the threadblock graph has {} inputs but {} tensors were given", declared.len(), inputs.len()),
            );
        }
        for (i, (&t, (dims, dtype))) in inputs.iter().zip(&declared).enumerate() {
            let dt = self.tensor(t)?;
            if lifted_rank(dims, &dt.dims).is_none() || dt.dtype != *dtype {
                return shape_err(
                    op,
                    format!(
                        "input {i} has dims {:?} and dtype {} but the threadblock graph's input {i} was declared with dims {dims:?} (the same dims, or them with leading 1s) and dtype {}",
                        dt.dims,
                        dt.dtype.name(),
                        dtype.name()
                    ),
                );
            }
        }
        let outs: Vec<DTensor> = graph
            .output_ops()
            .zip(graph.output_dims())
            .map(|(o, dims)| DTensor { dims, dtype: graph.tensors[o.inputs[0]].dtype })
            .collect();
        self.push(KernelOpKind::Customized { graph }, inputs.to_vec(), outs)
    }

    /// Marks `t` as an output; `strides` default to row-major.
    pub fn mark_output(&mut self, t: TensorId, strides: Option<&[usize]>) -> Result<()> {
        let dims = self.tensor(t)?.dims.clone();
        if self.outputs.iter().any(|o| o.tensor == t) {
            return invalid("mark_output", format!("tensor #{t} is already marked as an output"));
        }
        let strides = match strides {
            Some(s) => {
                check_strides("mark_output", &dims, s)?;
                s.to_vec()
            }
            None => row_major_strides(&dims),
        };
        self.outputs.push(Output { tensor: t, strides });
        Ok(())
    }

    /// The graph's outputs: the marked ones, or every tensor no op consumes (not inputs).
    pub fn output_ids(&self) -> Vec<TensorId> {
        if !self.outputs.is_empty() {
            return self.outputs.iter().map(|o| o.tensor).collect();
        }
        let mut used = vec![false; self.tensors.len()];
        for op in &self.ops {
            for &i in &op.inputs {
                used[i] = true;
            }
        }
        self.ops
            .iter()
            .filter(|o| !matches!(o.kind, KernelOpKind::Input { .. }))
            .flat_map(|o| o.outputs.iter().copied())
            .filter(|&t| !used[t])
            .collect()
    }

    /// Rebuilds this graph through the checked builder: the structural validation of a graph
    /// that did not come from the builder (e.g. deserialized).
    pub fn revalidate(&self) -> Result<KernelGraph> {
        let mut g = KernelGraph::new();
        for op in &self.ops {
            for &i in &op.inputs {
                if i >= g.tensors.len() {
                    return invalid(op.kind.name(), format!("operand tensor #{i} is used before it is defined"));
                }
            }
            let ins = &op.inputs;
            op.kind.check_operands(ins.len())?;
            match &op.kind {
                KernelOpKind::Input { dims, dtype, strides } => {
                    g.new_input(dims, *dtype, Some(strides))?;
                }
                KernelOpKind::Matmul => {
                    g.matmul(ins[0], ins[1])?;
                }
                KernelOpKind::Unary { op: u } => {
                    g.unary(*u, ins[0])?;
                }
                KernelOpKind::Binary { op: b } => {
                    g.binary(*b, ins[0], ins[1])?;
                }
                KernelOpKind::Reduction { dim } => {
                    g.reduction(ins[0], *dim as i64)?;
                }
                KernelOpKind::RmsNorm { normalized_ndims, eps } => {
                    let d = &g.tensor(ins[0])?.dims;
                    let n = (*normalized_ndims).min(d.len());
                    let shape = d[d.len() - n..].to_vec();
                    if n != *normalized_ndims {
                        return shape_err(
                            "rms_norm",
                            format!("normalized_ndims {normalized_ndims} exceeds the input rank {}", d.len()),
                        );
                    }
                    g.rms_norm_eps(ins[0], &shape, ins.get(1).copied(), *eps)?;
                }
                KernelOpKind::Softmax { dim } => {
                    g.softmax(ins[0], *dim as i64)?;
                }
                KernelOpKind::Customized { graph } => {
                    g.customized(ins, graph.revalidate()?)?;
                }
            }
        }
        for o in &self.outputs {
            g.mark_output(o.tensor, Some(&o.strides))?;
        }
        Ok(g)
    }
}

impl BlockGraph {
    /// Rebuilds this block graph through the checked builder.
    pub fn revalidate(&self) -> Result<BlockGraph> {
        let mut b = BlockGraph::new(self.grid_dim, self.block_dim, self.forloop_range, self.reduction_dimx)?;
        b.set_smem_cap(self.smem_cap)?;
        b.warpgroup_acc = self.warpgroup_acc;
        for op in &self.ops {
            let ins = &op.inputs;
            for &i in ins {
                if i >= b.tensors.len() {
                    return invalid(op.kind.name(), format!("operand stensor #{i} is used before it is defined"));
                }
            }
            let want = op.kind.arity();
            if ins.len() != want {
                return invalid(op.kind.name(), format!("expects {want} operands, got {}", ins.len()));
            }
            match &op.kind {
                BlockOpKind::Input { dims, dtype, imap, forloop_dim } => {
                    b.new_input(dims, *dtype, *imap, *forloop_dim)?;
                }
                BlockOpKind::Output { omap, forloop_dim } => {
                    b.new_output(ins[0], *omap, *forloop_dim)?;
                }
                BlockOpKind::Matmul => {
                    b.matmul(ins[0], ins[1])?;
                }
                BlockOpKind::Unary { op: u } => {
                    b.unary(*u, ins[0])?;
                }
                BlockOpKind::Binary { op: o } => {
                    b.binary(*o, ins[0], ins[1])?;
                }
                BlockOpKind::Reduction { dim } => {
                    b.reduction(ins[0], *dim as i64)?;
                }
                BlockOpKind::ReductionMax { dim } => {
                    b.reduction_max(ins[0], *dim as i64)?;
                }
                BlockOpKind::RmsNorm { eps } => {
                    b.rms_norm_eps(ins[0], *eps)?;
                }
                BlockOpKind::Concat { dim } => {
                    b.concat(ins[0], ins[1], *dim as i64)?;
                }
                BlockOpKind::ForloopAccum { acc, eps } => {
                    b.forloop_accum_eps(ins[0], *acc, *eps)?;
                }
                BlockOpKind::ForloopAccumRescale { acc } => {
                    b.forloop_accum_rescale(ins[0], ins[1], *acc)?;
                }
                BlockOpKind::ForloopAccumMax => {
                    b.forloop_accum_max(ins[0])?;
                }
            }
        }
        Ok(b)
    }
}

/// How many leading 1s a customized op's block input of `block_dims` adds to the device tensor
/// of `dims` it reads (a view of the same memory, e.g. a `[k]` weight read as a `[1, k]` tile
/// source); None when `block_dims` is not `dims` with leading 1s.
pub fn lifted_rank(block_dims: &[usize], dims: &[usize]) -> Option<usize> {
    let p = block_dims.len().checked_sub(dims.len())?;
    (block_dims[..p].iter().all(|&d| d == 1) && block_dims[p..] == *dims).then_some(p)
}
