//! Thread graphs: element-wise chains of a block graph fused into register programs, the
//! rule-based fusion that finds them ([`fuse_elementwise`]) and their per-element evaluation.

use serde::{Deserialize, Serialize};

use crate::block::{BlockGraph, BlockOpKind, STensorId};
use crate::error::{invalid, Result};
use crate::ops::{BinaryOp, UnaryOp};
use crate::scalar::Scalar;

/// One instruction of a thread graph; operands are register numbers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ThreadOp {
    /// `op(arg)`.
    Unary {
        /// The element-wise op.
        op: UnaryOp,
        /// Operand register.
        arg: usize,
    },
    /// `op(lhs, rhs)`.
    Binary {
        /// The element-wise op.
        op: BinaryOp,
        /// Left operand register.
        lhs: usize,
        /// Right operand register.
        rhs: usize,
    },
}

/// A fused element-wise program over registers: `0..num_inputs` hold the inputs, then op `k`
/// writes register `num_inputs + k`; the last op's register is the result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadGraph {
    /// Number of input registers.
    pub num_inputs: usize,
    /// Instructions in order.
    pub ops: Vec<ThreadOp>,
}

impl ThreadGraph {
    /// Checks every operand names an input or an earlier op's register.
    pub fn validate(&self) -> Result<()> {
        for (k, op) in self.ops.iter().enumerate() {
            let avail = self.num_inputs + k;
            let regs: &[usize] = match op {
                ThreadOp::Unary { arg, .. } => &[*arg],
                ThreadOp::Binary { lhs, rhs, .. } => &[*lhs, *rhs],
            };
            if let Some(r) = regs.iter().find(|&&r| r >= avail) {
                return invalid("thread graph", format!("op {k} reads register {r}, but only {avail} are defined"));
            }
        }
        if self.ops.is_empty() && self.num_inputs == 0 {
            return invalid("thread graph", "has neither inputs nor ops");
        }
        Ok(())
    }

    /// Evaluates the program on one element of each input; with no ops, returns the last input.
    ///
    /// # Panics
    /// If `inputs` has fewer than `num_inputs` values or the graph fails [`Self::validate`].
    pub fn eval<S: Scalar>(&self, inputs: &[S]) -> S {
        let mut regs: Vec<S> = inputs[..self.num_inputs].to_vec();
        for op in &self.ops {
            let v = match *op {
                ThreadOp::Unary { op, arg } => op.apply(regs[arg]),
                ThreadOp::Binary { op, lhs, rhs } => op.apply(regs[lhs], regs[rhs]),
            };
            regs.push(v);
        }
        regs[regs.len() - 1]
    }
}

/// A maximal element-wise chain of a block graph, fused into one thread graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusedGroup {
    /// Indices of the fused block ops, ascending (a topological order).
    pub ops: Vec<usize>,
    /// Block tensors feeding the group, in register order.
    pub inputs: Vec<STensorId>,
    /// The block tensor the group produces.
    pub output: STensorId,
    /// The fused program.
    pub thread_graph: ThreadGraph,
}

/// Groups the block graph's element-wise ops (unary, binary) into maximal fused chains.
///
/// An op's result stays in registers (is fused into its consumer) when it has exactly one
/// consumer op, that consumer is element-wise and of the same phase, and the result has the
/// same dims as the consumer's result (so every internal tensor has the group output's dims).
/// Every element-wise op lands in exactly one group; a group may be a single op.
pub fn fuse_elementwise(bg: &BlockGraph) -> Vec<FusedGroup> {
    let n = bg.tensors.len();
    let is_ew = |k: &BlockOpKind| matches!(k, BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. });
    let mut producer: Vec<Option<usize>> = vec![None; n];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (j, op) in bg.ops.iter().enumerate() {
        for &t in op.outputs.iter().filter(|&&t| t < n) {
            producer[t] = Some(j);
        }
        for &t in op.inputs.iter().filter(|&&t| t < n) {
            if consumers[t].last() != Some(&j) {
                consumers[t].push(j);
            }
        }
    }
    let out_of = |j: usize| bg.ops[j].outputs.first().copied().filter(|&t| t < n);
    // The consumer op an element-wise op's result is fused into, if any.
    let fused_into = |j: usize| -> Option<usize> {
        let t = out_of(j)?;
        let &[c] = consumers[t].as_slice() else { return None };
        let u = out_of(c)?;
        let (a, b) = (&bg.tensors[t], &bg.tensors[u]);
        (is_ew(&bg.ops[c].kind) && a.phase == b.phase && a.dims == b.dims).then_some(c)
    };
    let mut group_of: Vec<Option<usize>> = vec![None; bg.ops.len()];
    let mut roots = Vec::new();
    // Reverse order: a consumer's group is known before its producers are visited.
    for j in (0..bg.ops.len()).rev() {
        if !is_ew(&bg.ops[j].kind) || out_of(j).is_none() {
            continue;
        }
        group_of[j] = match fused_into(j).and_then(|c| group_of[c]) {
            Some(gi) => Some(gi),
            None => {
                roots.push(j);
                Some(roots.len() - 1)
            }
        };
    }
    let mut groups: Vec<FusedGroup> = roots
        .iter()
        .enumerate()
        .filter_map(|(gi, &root)| {
            let ops: Vec<usize> = (0..=root).filter(|&j| group_of[j] == Some(gi)).collect();
            build_group(bg, ops, out_of(root)?)
        })
        .collect();
    groups.sort_by_key(|g| g.ops.first().copied());
    groups
}

/// Assigns registers to a group's external operands and ops.
fn build_group(bg: &BlockGraph, ops: Vec<usize>, output: STensorId) -> Option<FusedGroup> {
    let mut inputs: Vec<STensorId> = Vec::new();
    let mut reg_of_op: Vec<(STensorId, usize)> = Vec::new();
    for &j in &ops {
        for &t in &bg.ops[j].inputs {
            let internal = ops.iter().any(|&o| bg.ops[o].outputs.first() == Some(&t));
            if !internal && !inputs.contains(&t) {
                inputs.push(t);
            }
        }
    }
    let mut tops = Vec::with_capacity(ops.len());
    for (k, &j) in ops.iter().enumerate() {
        let op = &bg.ops[j];
        let reg = |t: &STensorId| -> Option<usize> {
            reg_of_op.iter().find(|(x, _)| x == t).map(|&(_, r)| r).or_else(|| inputs.iter().position(|x| x == t))
        };
        tops.push(match op.kind {
            BlockOpKind::Unary { op: u } => ThreadOp::Unary { op: u, arg: reg(op.inputs.first()?)? },
            BlockOpKind::Binary { op: b } => {
                ThreadOp::Binary { op: b, lhs: reg(op.inputs.first()?)?, rhs: reg(op.inputs.get(1)?)? }
            }
            _ => return None,
        });
        reg_of_op.push((*op.outputs.first()?, inputs.len() + k));
    }
    let thread_graph = ThreadGraph { num_inputs: inputs.len(), ops: tops };
    Some(FusedGroup { ops, inputs, output, thread_graph })
}
