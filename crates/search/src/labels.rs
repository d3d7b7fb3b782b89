//! Index labels: which data dims of a program are "the same index".
//!
//! Abstract expressions ignore layout, so on their own they cannot tell a correct imap from one
//! that pairs the wrong parts of two tensors. Labels add the missing layout facts. Every dim of
//! size > 1 of the reference program gets a label, unified across ops with a union-find
//! (matmul unifies batch dims and the contracted dims `A[-1] ~ B[-2]`; element-wise ops unify
//! aligned dims; reductions end a label). A label that appears in an output is *parallel*;
//! the others (`k` of a matmul, the keys of attention) are *reduction* labels.
//!
//! The generator uses them three ways: a grid axis splits one label (every input that has it
//! is split on that axis, the others are replicated); the for-loop iterates one reduction label;
//! and tile ops must pair equal labels (a matmul contracts equal labels, element-wise operands
//! align equal labels). A kernel output whose grid axis split a reduction label holds partial
//! sums placed side by side along its last dim: that dim gets a [`Label::Partial`] label, which
//! a later kernel folds with `sum_todimx` (or `sum`).

use mirage_ugraph::{KernelGraph, KernelOpKind};

use crate::error::{Result, SearchError};

/// The label of one data dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Label {
    /// A dim of size 1 (broadcasts).
    Unit,
    /// An index of the reference program (numbered by first appearance in the inputs).
    Index(u16),
    /// `parts` partial sums over index `over`, each a tile of index `of` (`None`: of a size-1
    /// dim), laid side by side.
    Partial {
        /// The label whose tiles are repeated (`None` for a size-1 dim).
        of: Option<u16>,
        /// How many partial results.
        parts: u32,
        /// The reduction index the partial sums still have to be summed over.
        over: u16,
    },
}

/// The index of a sum over a dim without a label of its own.
pub const NO_INDEX: u16 = u16::MAX;

impl Label {
    /// The index a sum over a dim with this label runs over: its own index, or for partial
    /// results the index still to be summed; [`NO_INDEX`] for a size-1 dim.
    pub fn index(self) -> u16 {
        match self {
            Label::Unit => NO_INDEX,
            Label::Index(i) => i,
            Label::Partial { over, .. } => over,
        }
    }

    /// The label bit of an index label, for sets of labels.
    pub fn bit(self) -> u64 {
        match self {
            Label::Index(i) if i < 64 => 1u64 << i,
            _ => 0,
        }
    }
}

/// Labels of a reference program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelInfo {
    /// Labels of each tensor's dims (indexed by tensor id).
    pub tensors: Vec<Vec<Label>>,
    /// Size of each index label.
    pub sizes: Vec<usize>,
    /// Set of parallel labels (bit `i` for `Label::Index(i)`): those in an output.
    pub parallel: u64,
}

impl LabelInfo {
    /// Whether index label `l` appears in an output.
    pub fn is_parallel(&self, l: Label) -> bool {
        self.parallel & l.bit() != 0
    }
}

struct UnionFind(Vec<usize>);

impl UnionFind {
    fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            let (lo, hi) = (ra.min(rb), ra.max(rb));
            self.0[hi] = lo;
        }
    }
}

/// Labels every dim of `g`, a program of predefined ops.
pub fn analyze(g: &KernelGraph) -> Result<LabelInfo> {
    let mut offset = Vec::with_capacity(g.tensors.len());
    let mut n = 0;
    for t in &g.tensors {
        offset.push(n);
        n += t.dims.len();
    }
    let dims = |t: usize| g.tensors[t].dims.as_slice();
    let mut uf = UnionFind((0..n).collect());
    let join = |uf: &mut UnionFind, (ta, da): (usize, usize), (tb, db): (usize, usize)| {
        if dims(ta)[da] > 1 && dims(tb)[db] > 1 {
            uf.union(offset[ta] + da, offset[tb] + db);
        }
    };
    for op in &g.ops {
        let ins = &op.inputs;
        let Some(&out) = op.outputs.first() else { continue };
        let r = dims(out).len();
        match &op.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Matmul => {
                let (a, b) = (ins[0], ins[1]);
                for i in 0..r - 2 {
                    join(&mut uf, (a, i), (b, i));
                    join(&mut uf, (out, i), (a, i));
                }
                join(&mut uf, (a, r - 1), (b, r - 2));
                join(&mut uf, (out, r - 2), (a, r - 2));
                join(&mut uf, (out, r - 1), (b, r - 1));
            }
            KernelOpKind::Unary { .. } | KernelOpKind::Softmax { .. } => {
                for i in 0..r {
                    join(&mut uf, (out, i), (ins[0], i));
                }
            }
            KernelOpKind::RmsNorm { normalized_ndims, .. } => {
                for i in 0..r {
                    join(&mut uf, (out, i), (ins[0], i));
                }
                if let Some(&w) = ins.get(1) {
                    for j in 0..*normalized_ndims {
                        join(&mut uf, (w, j), (ins[0], r - normalized_ndims + j));
                    }
                }
            }
            KernelOpKind::Binary { .. } => {
                for i in 0..r {
                    join(&mut uf, (ins[0], i), (ins[1], i));
                    join(&mut uf, (out, i), (ins[0], i));
                    join(&mut uf, (out, i), (ins[1], i));
                }
            }
            KernelOpKind::Reduction { dim } => {
                for i in (0..r).filter(|i| i != dim) {
                    join(&mut uf, (out, i), (ins[0], i));
                }
            }
            KernelOpKind::Customized { .. } => {
                return Err(SearchError::Unsupported {
                    op: "customized".into(),
                    why: "the reference must be a program of predefined ops".into(),
                })
            }
        }
    }
    let mut id_of_root = vec![usize::MAX; n];
    let mut sizes = Vec::new();
    let mut tensors = Vec::with_capacity(g.tensors.len());
    for (t, dt) in g.tensors.iter().enumerate() {
        let mut ls = Vec::with_capacity(dt.dims.len());
        for (d, &size) in dt.dims.iter().enumerate() {
            if size == 1 {
                ls.push(Label::Unit);
                continue;
            }
            let root = uf.find(offset[t] + d);
            if id_of_root[root] == usize::MAX {
                if sizes.len() >= 64 {
                    return Err(SearchError::Unsupported {
                        op: "reference".into(),
                        why: "more than 64 distinct index labels".into(),
                    });
                }
                id_of_root[root] = sizes.len();
                sizes.push(size);
            }
            ls.push(Label::Index(id_of_root[root] as u16));
        }
        tensors.push(ls);
    }
    let parallel = g.output_ids().iter().flat_map(|&t| tensors[t].iter()).fold(0u64, |m, l| m | l.bit());
    Ok(LabelInfo { tensors, sizes, parallel })
}

/// Labels of every tensor of one customized kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLabels {
    /// Labels of each tile tensor's dims (indexed by stensor id).
    pub tensors: Vec<Vec<Label>>,
    /// The label each grid axis of size > 1 splits.
    pub axis: [Option<Label>; 3],
    /// The label the for-loop iterates.
    pub loop_label: Option<Label>,
}

/// Labels of every tensor of a µGraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphLabels {
    /// Labels of each device tensor's dims (indexed by tensor id).
    pub tensors: Vec<Vec<Label>>,
    /// Labels inside each customized kernel (indexed by kernel op).
    pub blocks: Vec<Option<BlockLabels>>,
}

fn broadcast_labels(a: &[Label], ad: &[usize], b: &[Label], bd: &[usize]) -> Vec<Label> {
    (0..a.len()).map(|i| if ad[i] == 1 && bd.get(i).is_some_and(|&x| x > 1) { b[i] } else { a[i] }).collect()
}

fn matmul_labels(a: &[Label], b: &[Label]) -> Vec<Label> {
    let mut out = a.to_vec();
    if let (Some(o), Some(&l)) = (out.last_mut(), b.last()) {
        *o = l;
    }
    out
}

/// Labels of every tensor of `g` given its inputs' labels, following the same rules as the
/// generator (tiles keep the labels of the dims they are cut from; an output dim that holds
/// partial sums over a split reduction label becomes [`Label::Partial`]).
pub fn propagate(g: &KernelGraph, inputs: &[Vec<Label>]) -> Result<GraphLabels> {
    use mirage_ugraph::{Accum, BlockOpKind};
    let bad = |why: String| SearchError::Unsupported { op: "labels".into(), why };
    let mut tensors: Vec<Vec<Label>> = vec![Vec::new(); g.tensors.len()];
    let mut blocks = vec![None; g.ops.len()];
    let mut next_input = 0;
    for (oi, op) in g.ops.iter().enumerate() {
        let l = |i: usize| tensors[op.inputs[i]].clone();
        let d = |i: usize| g.tensors[op.inputs[i]].dims.as_slice();
        let out = match &op.kind {
            KernelOpKind::Input { dims, .. } => {
                let ls =
                    inputs.get(next_input).cloned().ok_or_else(|| bad(format!("no labels for input {next_input}")))?;
                next_input += 1;
                if ls.len() != dims.len() {
                    return Err(bad(format!("input labels {ls:?} do not fit dims {dims:?}")));
                }
                ls
            }
            KernelOpKind::Matmul => matmul_labels(&l(0), &l(1)),
            KernelOpKind::Unary { .. } | KernelOpKind::Softmax { .. } | KernelOpKind::RmsNorm { .. } => l(0),
            KernelOpKind::Binary { .. } => broadcast_labels(&l(0), d(0), &l(1), d(1)),
            KernelOpKind::Reduction { dim } => {
                let mut x = l(0);
                x[*dim] = Label::Unit;
                x
            }
            KernelOpKind::Customized { graph } => {
                // A block input declared with leading 1s (a lifted rank) gets unit labels there.
                let ins: Vec<Vec<Label>> = (0..op.inputs.len())
                    .zip(graph.input_ops())
                    .map(|(i, bop)| {
                        let rank = bop.outputs.first().map_or(0, |&o| graph.tensors[o].dims.len());
                        let x = l(i);
                        [vec![Label::Unit; rank.saturating_sub(x.len())], x].concat()
                    })
                    .collect();
                let mut bt: Vec<Vec<Label>> = vec![Vec::new(); graph.tensors.len()];
                let (mut axis, mut loop_label) = ([None; 3], None);
                let mut k = 0;
                for bop in &graph.ops {
                    if let BlockOpKind::Input { imap, forloop_dim, .. } = &bop.kind {
                        let ls = ins.get(k).cloned().unwrap_or_default();
                        k += 1;
                        for a in 0..3 {
                            if graph.grid_dim[a] > 1 && imap[a] >= 0 && axis[a].is_none() {
                                axis[a] = ls.get(imap[a] as usize).copied();
                            }
                        }
                        if *forloop_dim >= 0 && loop_label.is_none() {
                            loop_label = ls.get(*forloop_dim as usize).copied();
                        }
                    }
                }
                let mut k = 0;
                let mut outs = Vec::new();
                for bop in &graph.ops {
                    let bl = |i: usize| bt[bop.inputs[i]].clone();
                    let bd = |i: usize| graph.tensors[bop.inputs[i]].dims.as_slice();
                    let res: Vec<Label> = match &bop.kind {
                        BlockOpKind::Input { .. } => {
                            k += 1;
                            ins.get(k - 1).cloned().unwrap_or_default()
                        }
                        BlockOpKind::Output { omap, .. } => {
                            let mut x = bl(0);
                            for a in 0..3 {
                                let (gsz, dd) = (graph.grid_dim[a], omap[a]);
                                if gsz == 1 || dd < 0 || dd as usize >= x.len() {
                                    continue;
                                }
                                let dd = dd as usize;
                                if Some(x[dd]) != axis[a] {
                                    let of = match x[dd] {
                                        Label::Index(i) => Some(i),
                                        _ => None,
                                    };
                                    let over = axis[a].map_or(NO_INDEX, Label::index);
                                    x[dd] = Label::Partial { of, parts: gsz as u32, over };
                                }
                            }
                            outs.push(x);
                            continue;
                        }
                        BlockOpKind::Matmul => matmul_labels(&bl(0), &bl(1)),
                        BlockOpKind::Binary { .. } | BlockOpKind::Concat { .. } => {
                            broadcast_labels(&bl(0), bd(0), &bl(1), bd(1))
                        }
                        BlockOpKind::Reduction { dim } | BlockOpKind::ReductionMax { dim } => {
                            let mut x = bl(0);
                            x[*dim] = Label::Unit;
                            x
                        }
                        BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => {
                            let mut x = bl(0);
                            if let Some(last) = x.last_mut() {
                                match acc {
                                    Accum::None => {}
                                    Accum::Sum | Accum::Mean | Accum::Rms => *last = Label::Unit,
                                    Accum::SumToDimx => {
                                        if let Label::Partial { of, .. } = *last {
                                            *last = of.map_or(Label::Unit, Label::Index);
                                        }
                                    }
                                }
                            }
                            x
                        }
                        BlockOpKind::Unary { .. } | BlockOpKind::RmsNorm { .. } | BlockOpKind::ForloopAccumMax => bl(0),
                    };
                    for &t in &bop.outputs {
                        bt[t] = res.clone();
                    }
                }
                blocks[oi] = Some(BlockLabels { tensors: bt, axis, loop_label });
                for (&t, x) in op.outputs.iter().zip(outs) {
                    tensors[t] = x;
                }
                continue;
            }
        };
        tensors[op.outputs[0]] = out;
    }
    Ok(GraphLabels { tensors, blocks })
}
