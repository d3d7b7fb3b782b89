//! The online-softmax rewrite (max subtraction), like the reference's optional transformation:
//! it turns a µGraph that accumulates a plain `exp(A)` (which overflows in fp16 once the logits
//! pass about 11) into one that keeps a running row maximum, as [`mirage_ugraph::zoo::attention_online`].
//!
//! # What is recognised
//!
//! **Kernel 1** (any customized op): an `E = exp(A)` computed before the loop closes, where every
//! use of `E` is *row-linear*: `matmul(·, X)` with `X` independent of `E`, `reduction` over the last
//! dim, `mul` / `div` by tensors independent of `E`, ending in `forloop_accum` (`None` or `"sum"`);
//! after the loop the accumulated values may be divided by each other (the ratio is free of the
//! scale; without a loop, also by a row-linear value not accumulated), multiplied by an
//! `E`-free tensor divided by another accumulated value (`O * (w / l)`: the scales cancel),
//! multiplied / divided by `E`-free tensors, or saved. Every such tensor keeps the row
//! dims of `A` (all but its last dim), so one factor `exp(-max)` per row scales all of them.
//! The kernel is rebuilt with `(M, D) = reduction_max(A, last dim)`, `E' = exp(A - M)`,
//! `s = exp(D)` and each accumulator replaced by `forloop_accum_rescale(·, s, same kind)`. When
//! scaled values are saved (partial results per split), `forloop_accum_max(M)` is saved as an
//! extra last output with the same output map. A loop of one iteration that saves scaled
//! values without an accumulator gets a rescaling accumulator (the identity for one iteration).
//!
//! **Kernel 2** (the single customized consumer of those partials): a loop of one iteration that
//! computes `sum_todimx(P_o) / sum(P_l)` (or `sum_todimx(P_o / sum(P_l))`) over the splits laid
//! side by side in the last dim, then possibly multiplies or divides the merged value by other
//! inputs of its own (QK-norm's V weight). It is replaced by the max-weighted merge of
//! [`mirage_ugraph::zoo::attention_online`]: a loop over the splits, `(m, d) = reduction_max(P_m)`,
//! weights `exp(P_m - m)`, rescaling accumulators with `exp(d)`, then the division and the
//! products that followed it (those inputs loaded once, outside the loop).
//!
//! Anything else makes the rewrite decline (`None`): it never guesses. The new graph is built
//! through the checked builders, and the search verifies it against the reference anyway.

use mirage_ugraph::{
    Accum, BinaryOp, BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, Phase, STensorId, TensorId, UnaryOp,
};

/// How a block tensor of kernel 1 relates to the rewritten `E' = exp(A - M)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cls {
    /// Independent of `E`: copied unchanged.
    Free,
    /// Row-linear in `E` inside the loop (scaled by `exp(-M)` per row after the rewrite).
    Scaled,
    /// Accumulated row-linear values after the loop (scaled by `exp(-final max)` per row).
    AccScaled,
    /// A free tensor divided by accumulated row-linear values (scaled by `exp(+final max)` per
    /// row): its product with an [`Cls::AccScaled`] value is free of the scale.
    AccInverse,
}

/// Output positions of kernel 1 that save scaled partial results, with their tile's last dim.
type Partials = Vec<(usize, usize)>;

/// Kernel 1 rewritten.
struct Kernel1 {
    /// The new block graph: the old outputs in order, then the running max if `partials` is set.
    graph: BlockGraph,
    /// Output positions that hold scaled partial results, with the last dim of their tile.
    partials: Partials,
    /// Number of old outputs.
    old_outputs: usize,
}

/// Rewrites every customized kernel that accumulates a plain `exp` into the online-softmax form
/// (and its merging consumer kernel); `None` when no kernel matches the pattern exactly.
///
/// ```
/// use mirage_search::online_softmax::rewrite_online_softmax;
/// use mirage_ugraph::{zoo, DType};
/// let a = zoo::Attn { b: 2, h: 4, d: 8, s: 64, splits: 2, frange: 2, qsplit: 1 };
/// let plain = zoo::attention(a, false, DType::Float16).unwrap();
/// let online = rewrite_online_softmax(&plain.ugraph).expect("flash decoding matches");
/// assert_eq!(online.ops.len(), plain.ugraph.ops.len());
/// let rms = zoo::rmsnorm_linear(4, 64, 64, 2, 2, DType::Float16).unwrap();
/// assert!(rewrite_online_softmax(&rms.ugraph).is_none());
/// ```
pub fn rewrite_online_softmax(g: &KernelGraph) -> Option<KernelGraph> {
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); g.tensors.len()];
    for (i, op) in g.ops.iter().enumerate() {
        for &t in &op.inputs {
            let c = consumers.get_mut(t)?;
            if c.last() != Some(&i) {
                c.push(i);
            }
        }
    }
    let graph_outputs = g.output_ids();
    // Kernel index -> its rewrite; merge kernel index -> (its rewrite, the kernel-1 index).
    let mut k1s: Vec<(usize, Kernel1)> = Vec::new();
    let mut k2s: Vec<(usize, BlockGraph, usize)> = Vec::new();
    for (i, op) in g.ops.iter().enumerate() {
        let KernelOpKind::Customized { graph } = &op.kind else { continue };
        if k2s.iter().any(|(j, _, _)| *j == i) {
            continue;
        }
        let Some(k1) = rewrite_kernel1(graph) else { continue };
        if k1.partials.is_empty() {
            k1s.push((i, k1));
            continue;
        }
        // Every partial goes to one customized consumer and nowhere else.
        let partial_ids: Vec<TensorId> = k1.partials.iter().filter_map(|&(p, _)| op.outputs.get(p).copied()).collect();
        if partial_ids.len() != k1.partials.len() || partial_ids.iter().any(|t| graph_outputs.contains(t)) {
            continue;
        }
        let mut users: Vec<usize> = partial_ids.iter().flat_map(|&t| consumers[t].iter().copied()).collect();
        users.sort_unstable();
        users.dedup();
        let &[j] = users.as_slice() else { continue };
        let KernelOpKind::Customized { graph: g2 } = &g.ops[j].kind else { continue };
        let groups: Vec<Option<usize>> =
            g.ops[j].inputs.iter().map(|t| partial_ids.iter().position(|p| p == t).map(|k| k1.partials[k].1)).collect();
        let Some(merge) = rewrite_merge(g2, &groups, &k1) else { continue };
        k2s.push((j, merge, i));
        k1s.push((i, k1));
    }
    if k1s.is_empty() {
        return None;
    }
    rebuild(g, &k1s, &k2s)
}

/// The graph with kernel 1s and merge kernels replaced, through the checked builders.
fn rebuild(g: &KernelGraph, k1s: &[(usize, Kernel1)], k2s: &[(usize, BlockGraph, usize)]) -> Option<KernelGraph> {
    let mut ng = KernelGraph::new();
    let mut map: Vec<Option<TensorId>> = vec![None; g.tensors.len()];
    // Kernel-1 index -> the new tensor of its running max.
    let mut maxima: Vec<(usize, TensorId)> = Vec::new();
    for (i, op) in g.ops.iter().enumerate() {
        let mut ins: Vec<TensorId> = op.inputs.iter().map(|&t| map.get(t).copied().flatten()).collect::<Option<_>>()?;
        let outs = if let Some((_, k1)) = k1s.iter().find(|(k, _)| *k == i) {
            let outs = ng.customized(&ins, k1.graph.clone()).ok()?;
            if !k1.partials.is_empty() {
                maxima.push((i, *outs.get(k1.old_outputs)?));
            }
            outs.get(..k1.old_outputs)?.to_vec()
        } else if let Some((_, merge, k)) = k2s.iter().find(|(j, _, _)| *j == i) {
            ins.push(maxima.iter().find(|(m, _)| m == k)?.1);
            ng.customized(&ins, merge.clone()).ok()?
        } else {
            replay_kernel_op(&mut ng, &op.kind, &ins)?
        };
        if outs.len() != op.outputs.len() {
            return None;
        }
        for (&old, new) in op.outputs.iter().zip(outs) {
            *map.get_mut(old)? = Some(new);
        }
    }
    for o in &g.outputs {
        ng.mark_output(map.get(o.tensor).copied().flatten()?, Some(&o.strides)).ok()?;
    }
    Some(ng)
}

/// Adds a predefined kernel op (or an unchanged customized one) through the builder.
fn replay_kernel_op(g: &mut KernelGraph, kind: &KernelOpKind, ins: &[TensorId]) -> Option<Vec<TensorId>> {
    let one = |r: mirage_ugraph::Result<TensorId>| r.ok().map(|t| vec![t]);
    match kind {
        KernelOpKind::Input { dims, dtype, strides } => one(g.new_input(dims, *dtype, Some(strides))),
        KernelOpKind::Matmul => one(g.matmul(*ins.first()?, *ins.get(1)?)),
        KernelOpKind::Unary { op } => one(g.unary(*op, *ins.first()?)),
        KernelOpKind::Binary { op } => one(g.binary(*op, *ins.first()?, *ins.get(1)?)),
        KernelOpKind::Reduction { dim } => one(g.reduction(*ins.first()?, *dim as i64)),
        KernelOpKind::RmsNorm { normalized_ndims, eps } => {
            let dims = g.tensor(*ins.first()?).ok()?.dims.clone();
            let shape = dims.get(dims.len().checked_sub(*normalized_ndims)?..)?.to_vec();
            one(g.rms_norm_eps(ins[0], &shape, ins.get(1).copied(), *eps))
        }
        KernelOpKind::Softmax { dim } => one(g.softmax(*ins.first()?, *dim as i64)),
        KernelOpKind::Customized { graph } => g.customized(ins, graph.clone()).ok(),
    }
}

/// Whether `dims` are `rows` plus one trailing dim.
fn has_rows(dims: &[usize], rows: &[usize]) -> bool {
    dims.len() == rows.len() + 1 && dims[..rows.len()] == *rows
}

/// Classifies kernel 1's tensors for the exp at op `exp_op`; `None` if a use is not row-linear.
/// Also returns the positions of outputs that save scaled values (with their tile's last dim).
fn classify(bg: &BlockGraph, exp_op: usize) -> Option<(Vec<Cls>, Partials)> {
    let a = *bg.ops.get(exp_op)?.inputs.first()?;
    let ta = bg.tensor(a).ok()?;
    if ta.phase == Phase::Post || ta.dims.len() < 2 {
        return None;
    }
    let rows = &ta.dims[..ta.dims.len() - 1];
    let mut cls = vec![Cls::Free; bg.tensors.len()];
    let mut partials = Vec::new();
    let mut omaps: Vec<[i64; 3]> = Vec::new();
    let mut accumulators = 0;
    let mut out_pos = 0;
    for (j, op) in bg.ops.iter().enumerate() {
        let ins: Vec<Cls> = op.inputs.iter().map(|&t| cls.get(t).copied()).collect::<Option<_>>()?;
        let rank0 = op.inputs.first().and_then(|&t| bg.tensors.get(t)).map_or(0, |t| t.dims.len());
        use BinaryOp::{Div, Mul};
        use Cls::{AccInverse as Inv, AccScaled as Acc, Free, Scaled};
        let out = if j == exp_op {
            Scaled
        } else if ins.iter().all(|&c| c == Free) {
            Free
        } else {
            match (&op.kind, ins.as_slice()) {
                (BlockOpKind::Matmul, [Scaled, Free]) => Scaled,
                (BlockOpKind::Reduction { dim }, [Scaled]) if dim + 1 == rank0 => Scaled,
                (BlockOpKind::Binary { op: Mul }, [Scaled, Free] | [Free, Scaled]) => Scaled,
                (BlockOpKind::Binary { op: Div }, [Scaled, Free]) => Scaled,
                (BlockOpKind::ForloopAccum { acc: Accum::None | Accum::Sum, .. }, [Scaled]) => {
                    accumulators += 1;
                    Acc
                }
                (BlockOpKind::Binary { op: Mul }, [Acc, Free] | [Free, Acc]) => Acc,
                (BlockOpKind::Binary { op: Div }, [Acc, Free]) => Acc,
                (BlockOpKind::Binary { op: Div }, [Acc, Acc]) => Free,
                // A free tensor over the row sums (a norm's weight over them, to multiply the
                // accumulated values by: QK-norm's V weight) carries the inverse factor.
                (BlockOpKind::Binary { op: Div }, [Free, Acc]) => Inv,
                (BlockOpKind::Binary { op: Mul }, [Inv, Free] | [Free, Inv]) => Inv,
                (BlockOpKind::Binary { op: Div }, [Inv, Free]) => Inv,
                (BlockOpKind::Binary { op: Mul }, [Acc, Inv] | [Inv, Acc]) => Free,
                // Without a loop, an in-loop value and an accumulated one carry the same
                // factor exp(-max): their ratio is free of it.
                (BlockOpKind::Binary { op: Div }, [Scaled, Acc] | [Acc, Scaled]) if bg.forloop_range == 1 => Free,
                // ... and so do two in-loop values (each passed through an identity accumulator).
                (BlockOpKind::Binary { op: Div }, [Scaled, Scaled]) if bg.forloop_range == 1 => {
                    accumulators += 2;
                    Free
                }
                (BlockOpKind::Output { omap, forloop_dim: -1 }, [c @ (Acc | Scaled)]) => {
                    let t = bg.tensor(op.inputs[0]).ok()?;
                    // Saving an in-loop value is only the identity accumulation for one iteration.
                    if *c == Scaled {
                        if bg.forloop_range != 1 || t.phase != Phase::Invariant {
                            return None;
                        }
                        accumulators += 1;
                    }
                    partials.push((out_pos, *t.dims.last()?));
                    omaps.push(*omap);
                    Free
                }
                _ => return None,
            }
        };
        if matches!(op.kind, BlockOpKind::Output { .. }) {
            out_pos += 1;
        }
        for &t in &op.outputs {
            if out != Free && !has_rows(&bg.tensor(t).ok()?.dims, rows) {
                return None;
            }
            *cls.get_mut(t)? = out;
        }
    }
    if accumulators == 0 || omaps.windows(2).any(|w| w[0] != w[1]) {
        return None;
    }
    Some((cls, partials))
}

/// Rewrites kernel 1 for the first `exp` whose uses are all row-linear.
fn rewrite_kernel1(bg: &BlockGraph) -> Option<Kernel1> {
    let exps = bg.ops.iter().enumerate().filter(|(_, o)| matches!(o.kind, BlockOpKind::Unary { op: UnaryOp::Exp }));
    exps.filter_map(|(j, _)| rewrite_kernel1_at(bg, j)).next()
}

fn rewrite_kernel1_at(bg: &BlockGraph, exp_op: usize) -> Option<Kernel1> {
    let (cls, partials) = classify(bg, exp_op)?;
    let mut nb = BlockGraph::new(bg.grid_dim, bg.block_dim, bg.forloop_range, bg.reduction_dimx).ok()?;
    let mut map: Vec<Option<STensorId>> = vec![None; bg.tensors.len()];
    // (running max, rescale factor) once the exp is rewritten; the saved max accumulator.
    let mut online: Option<(STensorId, STensorId)> = None;
    let mut acc_max: Option<STensorId> = None;
    for (j, op) in bg.ops.iter().enumerate() {
        let ins: Vec<STensorId> = op.inputs.iter().map(|&t| map.get(t).copied().flatten()).collect::<Option<_>>()?;
        let scaled_in = op.inputs.first().is_some_and(|&t| cls[t] == Cls::Scaled);
        let outs = if j == exp_op {
            let a = *ins.first()?;
            let (mx, diff) = nb.reduction_max(a, -1).ok()?;
            let shifted = nb.binary(BinaryOp::Sub, a, mx).ok()?;
            let e = nb.unary(UnaryOp::Exp, shifted).ok()?;
            let scale = nb.unary(UnaryOp::Exp, diff).ok()?;
            online = Some((mx, scale));
            vec![e]
        } else {
            match &op.kind {
                BlockOpKind::ForloopAccum { acc, .. } if scaled_in => {
                    vec![nb.forloop_accum_rescale(*ins.first()?, online?.1, *acc).ok()?]
                }
                BlockOpKind::Output { omap: om, forloop_dim } => {
                    if let (false, None, Some((mx, _))) = (partials.is_empty(), acc_max, online) {
                        acc_max = Some(nb.forloop_accum_max(mx).ok()?);
                    }
                    let mut x = *ins.first()?;
                    if scaled_in {
                        x = nb.forloop_accum_rescale(x, online?.1, Accum::None).ok()?;
                    }
                    nb.new_output(x, *om, *forloop_dim).ok()?;
                    vec![]
                }
                kind => {
                    // A row-linear value divided by (or dividing) an accumulated one, or another
                    // row-linear value, in a loop of one iteration: accumulated first (the
                    // identity), so both leave the loop.
                    let mut ins = ins;
                    let meets_acc = op.inputs.iter().any(|&t| cls[t] == Cls::AccScaled);
                    let ratio = matches!(kind, BlockOpKind::Binary { op: BinaryOp::Div })
                        && op.inputs.iter().all(|&t| cls[t] == Cls::Scaled);
                    if (meets_acc || ratio) && bg.forloop_range == 1 {
                        for (x, &t) in ins.iter_mut().zip(&op.inputs) {
                            if cls[t] == Cls::Scaled {
                                *x = nb.forloop_accum_rescale(*x, online?.1, Accum::None).ok()?;
                            }
                        }
                    }
                    nb.replay(kind, &ins).ok()?
                }
            }
        };
        if outs.len() != op.outputs.len() {
            return None;
        }
        for (&old, new) in op.outputs.iter().zip(outs) {
            *map.get_mut(old)? = Some(new);
        }
    }
    let old_outputs = bg.output_ops().count();
    if let Some(&(pos, _)) = partials.first() {
        let omap = match bg.output_ops().nth(pos)?.kind {
            BlockOpKind::Output { omap, .. } => omap,
            _ => return None,
        };
        let m = match acc_max {
            Some(m) => m,
            None => nb.forloop_accum_max(online?.0).ok()?,
        };
        nb.new_output(m, omap, -1).ok()?;
    }
    Some(Kernel1 { graph: nb, partials, old_outputs })
}

/// What a tensor of the merge kernel holds, in terms of its inputs (by position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sym {
    /// Input `k` as loaded (all splits side by side in the last dim).
    In(usize),
    /// The sum over the splits of input `k` (a partial with one value per split).
    Tot(usize),
    /// The split groups of input `k` folded (summed) together.
    Fold(usize),
    /// `In(k) / Tot(l)`.
    InOverTot(usize, usize),
    /// `Fold(k) / Tot(l)`: the merged result.
    FoldOverTot(usize, usize),
    /// Computed from the merge kernel's other inputs only (none of the partials).
    Other,
    /// [`Sym::Other`] values over `Tot(l)`.
    OtherOverTot(usize),
    /// The merged result (partials `k` over `l`) times or over [`Sym::Other`] values.
    Weighted(usize, usize),
}

/// Tensors that multiply or divide (the op) a merged value, in order.
type Factors = Vec<(STensorId, BinaryOp)>;

/// Rebuilds the merge kernel `g2` as the max-weighted merge; `groups[k]` is the kernel-1 tile's
/// last dim of input `k` when that input is a scaled partial of `k1` (two of them: the values
/// and the row sums), None for another input.
fn rewrite_merge(g2: &BlockGraph, groups: &[Option<usize>], k1: &Kernel1) -> Option<BlockGraph> {
    if g2.forloop_range != 1 || groups.iter().filter(|g| g.is_some()).count() != 2 {
        return None;
    }
    // Splits: kernel 1's blocks placed along the last dim of its outputs.
    let k1_dims = k1.graph.output_dims();
    let m_dims = k1_dims.get(k1.old_outputs)?.clone();
    let last = m_dims.len().checked_sub(1)?;
    let (mx_omap, m_dtype) = match k1.graph.output_ops().nth(k1.old_outputs) {
        Some(o) => match o.kind {
            BlockOpKind::Output { omap, .. } => (omap, k1.graph.tensors.get(*o.inputs.first()?)?.dtype),
            _ => return None,
        },
        None => return None,
    };
    let splits =
        (0..3).find(|&a| k1.graph.grid_dim[a] > 1 && mx_omap[a] == last as i64).map_or(1, |a| k1.graph.grid_dim[a]);
    if m_dims[last] != splits {
        return None;
    }
    let inputs: Vec<(&Vec<usize>, [i64; 3])> = g2
        .input_ops()
        .map(|o| match &o.kind {
            BlockOpKind::Input { dims, imap, forloop_dim: -1, .. } => Some((dims, *imap)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    for ((dims, imap), group) in inputs.iter().zip(groups) {
        let split_last = (0..3).any(|a| g2.grid_dim[a] > 1 && imap[a] == last as i64);
        if group.is_some() && (dims.len() != m_dims.len() || split_last) {
            return None;
        }
    }
    // Symbolic evaluation of the old merge. A merged value (`FoldOverTot`, `Weighted`) or an
    // other input over the row sums (`OtherOverTot`) carries its factors: other tensors, each
    // multiplying or dividing it.
    let mut sym: Vec<Option<Sym>> = vec![None; g2.tensors.len()];
    let mut factors: Vec<Factors> = vec![Vec::new(); g2.tensors.len()];
    let mut result: Option<(usize, usize, [i64; 3], Factors)> = None;
    // Ops computing from other inputs only, replayed as they are.
    let mut replayed: Vec<usize> = Vec::new();
    let mut pos = 0;
    let dimx = g2.reduction_dimx;
    let group = |k: usize| groups.get(k).copied().flatten();
    for (j, op) in g2.ops.iter().enumerate() {
        let arg = |i: usize| op.inputs.get(i).and_then(|&t| sym.get(t).copied().flatten());
        let tile_rank = op.inputs.first().and_then(|&t| g2.tensors.get(t)).map_or(0, |t| t.dims.len());
        let others = !op.inputs.is_empty() && (0..op.inputs.len()).all(|i| arg(i) == Some(Sym::Other));
        let mut carried: Factors = Vec::new();
        let out = match &op.kind {
            BlockOpKind::Input { .. } => {
                pos += 1;
                Some(if group(pos - 1).is_some() { Sym::In(pos - 1) } else { Sym::Other })
            }
            BlockOpKind::Unary { .. } | BlockOpKind::Binary { .. } if others => {
                replayed.push(j);
                Some(Sym::Other)
            }
            BlockOpKind::Binary { op: bop @ (BinaryOp::Mul | BinaryOp::Div) } => {
                let (x, y) = (*op.inputs.first()?, *op.inputs.get(1)?);
                let had = |t: STensorId| factors.get(t).cloned().unwrap_or_default();
                match (arg(0)?, arg(1)?, bop) {
                    (Sym::In(k), Sym::Tot(l), BinaryOp::Div) => Some(Sym::InOverTot(k, l)),
                    (Sym::Fold(k), Sym::Tot(l), BinaryOp::Div) => Some(Sym::FoldOverTot(k, l)),
                    (Sym::Other, Sym::Tot(l), BinaryOp::Div) => {
                        carried = vec![(x, BinaryOp::Mul)];
                        Some(Sym::OtherOverTot(l))
                    }
                    (Sym::FoldOverTot(k, l) | Sym::Weighted(k, l), Sym::Other, _) => {
                        carried = [had(x), vec![(y, *bop)]].concat();
                        Some(Sym::Weighted(k, l))
                    }
                    (Sym::Other, Sym::FoldOverTot(k, l) | Sym::Weighted(k, l), BinaryOp::Mul) => {
                        carried = [had(y), vec![(x, BinaryOp::Mul)]].concat();
                        Some(Sym::Weighted(k, l))
                    }
                    (Sym::OtherOverTot(l), Sym::Other, _) => {
                        carried = [had(x), vec![(y, *bop)]].concat();
                        Some(Sym::OtherOverTot(l))
                    }
                    (Sym::Other, Sym::OtherOverTot(l), BinaryOp::Mul) => {
                        carried = [had(y), vec![(x, BinaryOp::Mul)]].concat();
                        Some(Sym::OtherOverTot(l))
                    }
                    (Sym::Fold(k), Sym::OtherOverTot(l), BinaryOp::Mul) => {
                        carried = had(y);
                        Some(Sym::Weighted(k, l))
                    }
                    (Sym::OtherOverTot(l), Sym::Fold(k), BinaryOp::Mul) => {
                        carried = had(x);
                        Some(Sym::Weighted(k, l))
                    }
                    _ => return None,
                }
            }
            BlockOpKind::ForloopAccum { acc: Accum::None, .. } => Some(arg(0)?),
            BlockOpKind::ForloopAccum { acc: Accum::Sum, .. } => match arg(0)? {
                Sym::In(l) if group(l) == Some(1) => Some(Sym::Tot(l)),
                _ => return None,
            },
            BlockOpKind::Reduction { dim } if dim + 1 == tile_rank => match arg(0)? {
                Sym::In(l) if group(l) == Some(1) => Some(Sym::Tot(l)),
                _ => return None,
            },
            BlockOpKind::ForloopAccum { acc: Accum::SumToDimx, .. } => match arg(0)? {
                Sym::In(k) if group(k) == Some(dimx) => Some(Sym::Fold(k)),
                Sym::InOverTot(k, l) if group(k) == Some(dimx) => Some(Sym::FoldOverTot(k, l)),
                _ => return None,
            },
            BlockOpKind::Output { omap, forloop_dim: -1 } => match (arg(0)?, &result) {
                (Sym::FoldOverTot(k, l) | Sym::Weighted(k, l), None) if k != l => {
                    result = Some((k, l, *omap, factors.get(*op.inputs.first()?)?.clone()));
                    None
                }
                _ => return None,
            },
            _ => return None,
        };
        if let Some(s) = out {
            let t = *op.outputs.first()?;
            *sym.get_mut(t)? = Some(s);
            *factors.get_mut(t)? = carried;
        }
    }
    let (k, l, omap, weights) = result?;
    let (po, pl) = (inputs.get(k)?, inputs.get(l)?);
    let live =
        |imap: &[i64; 3]| -> Vec<i64> { (0..3).map(|a| if g2.grid_dim[a] > 1 { imap[a] } else { -1 }).collect() };
    if live(&po.1) != live(&pl.1) || *pl.0 != m_dims || po.0.last() != Some(&(dimx * splits)) {
        return None;
    }
    // The max-weighted merge (zoo::attention_online's kernel 2), inputs in the old order + max.
    let mut nb = BlockGraph::new(g2.grid_dim, g2.block_dim, splits, dimx).ok()?;
    let fd = last as i64;
    // Old tensor -> new: the partials loop over the splits, other inputs are loaded once.
    let mut map: Vec<Option<STensorId>> = vec![None; g2.tensors.len()];
    for (i, o) in g2.input_ops().enumerate() {
        let BlockOpKind::Input { dims, dtype, imap, .. } = &o.kind else { return None };
        let loop_dim = if group(i).is_some() { fd } else { -1 };
        *map.get_mut(*o.outputs.first()?)? = Some(nb.new_input(dims, *dtype, *imap, loop_dim).ok()?);
    }
    let pm = nb.new_input(&m_dims, m_dtype, pl.1, fd).ok()?;
    let tile =
        |k: usize| g2.input_ops().nth(k).and_then(|o| o.outputs.first()).and_then(|&t| map.get(t).copied().flatten());
    let (to, tl) = (tile(k)?, tile(l)?);
    let (mx, diff) = nb.reduction_max(pm, fd).ok()?;
    let dm = nb.binary(BinaryOp::Sub, pm, mx).ok()?;
    let w = nb.unary(UnaryOp::Exp, dm).ok()?;
    let scale = nb.unary(UnaryOp::Exp, diff).ok()?;
    let ow = nb.binary(BinaryOp::Mul, to, w).ok()?;
    let lw = nb.binary(BinaryOp::Mul, tl, w).ok()?;
    let so = nb.forloop_accum_rescale(ow, scale, Accum::None).ok()?;
    let sl = nb.forloop_accum_rescale(lw, scale, Accum::None).ok()?;
    let out = nb.binary(BinaryOp::Div, so, sl).ok()?;
    for &j in &replayed {
        let op = g2.ops.get(j)?;
        let ins: Vec<STensorId> = op.inputs.iter().map(|&t| map.get(t).copied().flatten()).collect::<Option<_>>()?;
        let outs = nb.replay(&op.kind, &ins).ok()?;
        for (&old, new) in op.outputs.iter().zip(outs) {
            *map.get_mut(old)? = Some(new);
        }
    }
    let mut out = out;
    for (t, bop) in weights {
        out = nb.binary(bop, out, map.get(t).copied().flatten()?).ok()?;
    }
    nb.new_output(out, omap, -1).ok()?;
    Some(nb)
}
