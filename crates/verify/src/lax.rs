//! The LAX check: which fragment a kernel graph (with its block graphs) belongs to, and the
//! numbers the false-accept bound needs.
//!
//! - **Exps on a path.** `softmax` and the unary ops whose registry rule is [`Lax::Exp`] (`exp`,
//!   `silu`, `tanh`, see docs/ops.md) contain one exponential; nothing else does
//!   (accumulators and reductions only add). For every tensor we keep the largest count of
//!   exponentials on any input-to-tensor path, and the exp ops on one such path. An exp-bearing
//!   op whose operand already has one is a second exp on a path: the graph is **not LAX**, and
//!   the reason names both ops.
//! - **Uninterpreted ops.** `relu`, `clamp`, `gelu`, `pow`, `reduction_max` and
//!   `forloop_accum_max` have no algebraic meaning in the field; they are deterministic
//!   uninterpreted functions ([`crate::field`]) and a graph using them is **probabilistic,
//!   outside LAX**: the verifier still tests it the same way, but the theorem's bound does not
//!   formally apply. (`softmax`'s internal max cancels exactly in the field, so softmax is LAX.)
//! - **Degree.** Each tensor gets a bound `(num, den)` on the degree of the numerator and
//!   denominator of its elements as rational functions of the inputs, with every exponential
//!   counted as a fresh variable of degree 1 (so `exp` yields `(1, 0)`): `a*b` adds, `a/b`
//!   cross-adds, `a+b` gives `(max(na+db, nb+da), da+db)` (denominator-free sums stay
//!   `(max, 0)`), a sum of `K` terms with a denominator multiplies it by `K`, `sqrt` halves
//!   (rounding up). Uninterpreted ops yield fresh variables `(1, 0)`. The graph's degree is the
//!   largest `num + den` over its outputs.
//! - **Common denominators.** For kernel-level ops we also keep the dims along which an
//!   element's denominator is one and the same polynomial (`Info::fixed`): an `rms_norm`'s
//!   output over its normalised dims (the row's root mean square, when its operand has no
//!   denominator) and a `softmax`'s over its dim (the row's sum of exponentials). A sum along
//!   such a dim (a matmul's inner dim, a reduction) adds numerators over that one denominator,
//!   `(num, den)` unchanged, instead of multiplying the denominator by `K`: `rms_norm(X) @ W`
//!   at K = 8192 has degree 3, not 16,385. The bound is the same theorem's with a tighter
//!   degree; elsewhere (block graphs, or a denominator that varies along the summed dim) the
//!   rule above stands.
//! - **Exp count `k`.** The number of exp-bearing ops (each block-graph op counts once).

use mirage_ugraph::{Accum, BinaryLax, BinaryOp, BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, Lax, UnaryOp};

/// Which fragment a graph (or a pair of graphs) belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    /// Multi-linear ops, division, `sqrt`, at most one exponential on any path: the theorem's
    /// bound applies (with `sqrt` read as a fresh variable of half degree).
    Lax,
    /// Uses ops without an algebraic meaning, evaluated as deterministic uninterpreted
    /// functions; the bound is reported as an estimate.
    Probabilistic {
        /// Which ops, where.
        reason: String,
    },
    /// Some path holds two exponentials.
    NotLax {
        /// The two exp-bearing ops on one path.
        reason: String,
    },
}

impl Fragment {
    fn rank(&self) -> u8 {
        match self {
            Fragment::Lax => 0,
            Fragment::Probabilistic { .. } => 1,
            Fragment::NotLax { .. } => 2,
        }
    }
}

/// What the LAX check found in one graph or a pair (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LaxReport {
    /// The fragment.
    pub fragment: Fragment,
    /// Degree bound `d` (largest numerator + denominator degree of an output; summed over a pair).
    pub degree: u64,
    /// Exp-bearing ops `k` (summed over a pair).
    pub exp_ops: usize,
    /// Largest number of exponentials on one input-to-output path.
    pub max_exps_on_path: u32,
    /// Uninterpreted ops, by location.
    pub uninterpreted: Vec<String>,
    /// Square roots (`sqrt`, `rms_norm`, the `rms` accumulator), which the theorem as stated
    /// does not cover; they are evaluated as the power map `x^((P+1)/4)`.
    pub sqrt_ops: usize,
}

impl LaxReport {
    /// The report of a reference/candidate pair: the worse fragment, summed `d` and `k`.
    pub fn pair(a: &LaxReport, b: &LaxReport) -> LaxReport {
        let fragment = if b.fragment.rank() > a.fragment.rank() { b.fragment.clone() } else { a.fragment.clone() };
        let fragment = match (&fragment, &a.fragment, &b.fragment) {
            (
                Fragment::Probabilistic { .. },
                Fragment::Probabilistic { reason: ra },
                Fragment::Probabilistic { reason: rb },
            ) => Fragment::Probabilistic { reason: format!("reference: {ra}; candidate: {rb}") },
            (Fragment::Probabilistic { reason }, _, _) if a.fragment.rank() == 1 => {
                Fragment::Probabilistic { reason: format!("reference: {reason}") }
            }
            (Fragment::Probabilistic { reason }, _, _) => {
                Fragment::Probabilistic { reason: format!("candidate: {reason}") }
            }
            _ => fragment,
        };
        LaxReport {
            fragment,
            degree: a.degree.saturating_add(b.degree),
            exp_ops: a.exp_ops + b.exp_ops,
            max_exps_on_path: a.max_exps_on_path.max(b.max_exps_on_path),
            uninterpreted: a.uninterpreted.iter().chain(&b.uninterpreted).cloned().collect(),
            sqrt_ops: a.sqrt_ops + b.sqrt_ops,
        }
    }
}

/// Degree bound of a rational function: numerator and denominator degrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Deg {
    num: u64,
    den: u64,
}

impl Deg {
    const VAR: Deg = Deg { num: 1, den: 0 };

    fn add(self, o: Deg) -> Deg {
        if self.den == 0 && o.den == 0 {
            return Deg { num: self.num.max(o.num), den: 0 };
        }
        Deg {
            num: self.num.saturating_add(o.den).max(o.num.saturating_add(self.den)),
            den: self.den.saturating_add(o.den),
        }
    }

    fn mul(self, o: Deg) -> Deg {
        Deg { num: self.num.saturating_add(o.num), den: self.den.saturating_add(o.den) }
    }

    fn div(self, o: Deg) -> Deg {
        Deg { num: self.num.saturating_add(o.den), den: self.den.saturating_add(o.num) }
    }

    /// A sum of `k` terms of this degree.
    fn sum(self, k: usize) -> Deg {
        if self.den == 0 || k <= 1 {
            return self;
        }
        let k = k as u64;
        Deg { num: self.num.saturating_add((k - 1).saturating_mul(self.den)), den: self.den.saturating_mul(k) }
    }

    fn sqrt(self) -> Deg {
        Deg { num: self.num.div_ceil(2), den: self.den.div_ceil(2) }
    }

    fn join(self, o: Deg) -> Deg {
        Deg { num: self.num.max(o.num), den: self.den.max(o.den) }
    }
}

/// The degree of `d + eps` (a constant of degree 0; the interpreter adds `eps` mapped into the
/// field exactly, as every `f32` constant); `d` itself when `eps` is 0.
fn plus_eps(d: Deg, eps: f32) -> Deg {
    if eps == 0.0 {
        d
    } else {
        d.add(Deg::default())
    }
}

impl Deg {
    fn total(self) -> u64 {
        self.num.saturating_add(self.den)
    }
}

/// What the analysis knows about one tensor.
#[derive(Debug, Clone, Default)]
struct Info {
    /// Largest exp count on a path to it.
    exps: u32,
    /// The exp-bearing ops on one such path.
    path: Vec<String>,
    deg: Deg,
    /// Bit `d`: every element along dim `d` has the same denominator polynomial (kernel-level
    /// tensors only; 0 where unknown). A value without a denominator has it along every dim.
    fixed: u64,
}

impl Info {
    /// Whether the denominator is the same along dim `d`.
    fn den_fixed(&self, d: usize) -> bool {
        self.deg.den == 0 || (d < 64 && self.fixed >> d & 1 == 1)
    }

    /// The bits of the dims along which the denominator is the same, for a tensor of dims
    /// `dims` (dims of size 1, read broadcast, count as the same).
    fn fixed_bits(&self, dims: &[usize]) -> u64 {
        let all = (0..dims.len().min(64)).fold(0u64, |m, d| m | 1 << d);
        let own = if self.deg.den == 0 { all } else { self.fixed & all };
        size_one_bits(dims) | own
    }
}

/// The bits of the dims of size 1 in `dims` (the first 64).
fn size_one_bits(dims: &[usize]) -> u64 {
    dims.iter().enumerate().take(64).filter(|&(_, &n)| n == 1).fold(0, |m, (d, _)| m | 1 << d)
}

/// What an out-of-range operand reads (only reachable on graphs that do not validate).
static EMPTY: Info = Info { exps: 0, path: Vec::new(), deg: Deg { num: 0, den: 0 }, fixed: 0 };
static NO_DIMS: Vec<usize> = Vec::new();

fn join(infos: &[&Info]) -> Info {
    let mut out = Info::default();
    for i in infos {
        if i.exps > out.exps || out.path.is_empty() && !i.path.is_empty() {
            out.exps = i.exps;
            out.path = i.path.clone();
        }
        out.deg = out.deg.join(i.deg);
    }
    out
}

/// Collects findings while walking a graph.
#[derive(Default)]
struct Walk {
    violation: Option<String>,
    uninterpreted: Vec<String>,
    exp_ops: usize,
    sqrt_ops: usize,
}

impl Walk {
    /// An exp-bearing op at `label` with operand info `x`: the result's exp count and path.
    fn exp(&mut self, label: String, x: &Info) -> (u32, Vec<String>) {
        self.exp_ops += 1;
        if x.exps >= 1 && self.violation.is_none() {
            self.violation = Some(format!(
                "two exponentials on one path: {} feeds {label}",
                x.path.last().cloned().unwrap_or_else(|| "an exp".into())
            ));
        }
        let mut path = x.path.clone();
        path.push(label);
        (x.exps + 1, path)
    }

    /// An element-wise unary op, read through its registry rule ([`UnaryOp::lax`]).
    fn unary(&mut self, op: &UnaryOp, label: String, x: &Info) -> Info {
        let mut out = x.clone();
        let scaled = |power: u32, num: u64, den: u64| (0..power).fold(Deg { num, den }, |d, _| d.mul(x.deg));
        match op.lax() {
            Lax::Exp { power, num, den } => {
                (out.exps, out.path) = self.exp(label, x);
                out.deg = scaled(power, num, den);
            }
            Lax::Uninterpreted => {
                self.uninterpreted.push(label);
                out.deg = Deg::VAR;
            }
            Lax::Sqrt => {
                self.sqrt_ops += 1;
                out.deg = x.deg.sqrt();
            }
            Lax::Rational { power, num, den } => out.deg = scaled(power, num, den),
        }
        out
    }

    /// An element-wise binary op, read through its registry rule ([`BinaryOp::lax`]).
    fn binary(&mut self, op: BinaryOp, label: String, a: &Info, b: &Info) -> Info {
        let mut out = join(&[a, b]);
        out.deg = match op.lax() {
            BinaryLax::Sum => a.deg.add(b.deg),
            BinaryLax::Product => a.deg.mul(b.deg),
            BinaryLax::Quotient => a.deg.div(b.deg),
            BinaryLax::Uninterpreted => {
                self.uninterpreted.push(label);
                Deg::VAR
            }
        };
        out
    }

    fn rms_norm(&mut self, x: &Info, len: usize, eps: f32) -> Info {
        self.sqrt_ops += 1;
        let r = plus_eps(x.deg.mul(x.deg).sum(len), eps).sqrt();
        Info { deg: x.deg.div(r), ..x.clone() }
    }

    fn matmul(a: &Info, b: &Info, k: usize) -> Info {
        let mut out = join(&[a, b]);
        out.deg = a.deg.mul(b.deg).sum(k);
        out
    }

    fn block(&mut self, bg: &BlockGraph, at: &str, inputs: &[Info]) -> Vec<Info> {
        let mut vals: Vec<Info> = vec![Info::default(); bg.tensors.len()];
        let (mut n_in, mut outs) = (0, Vec::new());
        for (j, op) in bg.ops.iter().enumerate() {
            let label = format!("{at} / block op #{j} ({})", op.kind.name());
            let arg = |k: usize| op.inputs.get(k).and_then(|&t| vals.get(t)).unwrap_or(&EMPTY);
            let dims = |k: usize| op.inputs.get(k).and_then(|&t| bg.tensors.get(t)).map_or(&NO_DIMS, |t| &t.dims);
            let last = |k: usize| *dims(k).last().unwrap_or(&1);
            let range = bg.forloop_range;
            let res: Vec<Info> = match &op.kind {
                BlockOpKind::Input { .. } => {
                    n_in += 1;
                    vec![inputs.get(n_in - 1).cloned().unwrap_or_default()]
                }
                BlockOpKind::Output { .. } => {
                    outs.push(arg(0).clone());
                    continue;
                }
                BlockOpKind::Matmul => vec![Walk::matmul(arg(0), arg(1), last(0))],
                BlockOpKind::Unary { op: u } => vec![self.unary(u, label, arg(0))],
                BlockOpKind::Binary { op: b } => vec![self.binary(*b, label, arg(0), arg(1))],
                BlockOpKind::Reduction { dim } => {
                    let l = dims(0).get(*dim).copied().unwrap_or(1);
                    vec![Info { deg: arg(0).deg.sum(l), ..arg(0).clone() }]
                }
                BlockOpKind::ReductionMax { .. } => {
                    self.uninterpreted.push(label);
                    vec![arg(0).clone(), arg(0).clone()]
                }
                BlockOpKind::RmsNorm { eps } => vec![self.rms_norm(arg(0), last(0), *eps)],
                BlockOpKind::Concat { .. } => vec![join(&[arg(0), arg(1)])],
                BlockOpKind::ForloopAccum { acc, eps } => {
                    let x = arg(0);
                    let deg = match acc {
                        Accum::None => x.deg.sum(range),
                        Accum::Sum | Accum::Mean => x.deg.sum(range * last(0)),
                        Accum::Rms => {
                            self.sqrt_ops += 1;
                            plus_eps(x.deg.mul(x.deg).sum(range * last(0)), *eps).sqrt()
                        }
                        Accum::SumToDimx => x.deg.sum(range * (last(0) / bg.reduction_dimx.max(1)).max(1)),
                    };
                    vec![Info { deg, ..x.clone() }]
                }
                BlockOpKind::ForloopAccumRescale { acc } => {
                    let (x, s) = (arg(0), arg(1));
                    let contrib = if *acc == Accum::None { x.deg } else { x.deg.sum(last(0)) };
                    let mut deg = contrib;
                    for _ in 1..range {
                        deg = deg.mul(s.deg).add(contrib);
                    }
                    vec![Info { deg, ..join(&[x, s]) }]
                }
                BlockOpKind::ForloopAccumMax => {
                    self.uninterpreted.push(label);
                    vec![arg(0).clone()]
                }
            };
            for (&t, i) in op.outputs.iter().zip(res) {
                if let Some(slot) = vals.get_mut(t) {
                    *slot = i;
                }
            }
        }
        outs
    }
}

/// Runs the LAX check on one kernel graph (meant for validated graphs; operands that do not
/// exist are read as inputs of degree 0 rather than panicking).
pub fn analyze(g: &KernelGraph) -> LaxReport {
    let mut walk = Walk::default();
    let mut vals: Vec<Info> = vec![Info::default(); g.tensors.len()];
    for (i, op) in g.ops.iter().enumerate() {
        let label = format!("kernel op #{i} ({})", op.kind.name());
        let arg = |k: usize| op.inputs.get(k).and_then(|&t| vals.get(t)).unwrap_or(&EMPTY);
        let dims = |k: usize| op.inputs.get(k).and_then(|&t| g.tensors.get(t)).map_or(&NO_DIMS, |t| &t.dims);
        let res: Vec<Info> = match &op.kind {
            KernelOpKind::Input { .. } => vec![Info { deg: Deg::VAR, ..Info::default() }],
            KernelOpKind::Matmul => {
                let (a, b, da, db) = (arg(0), arg(1), dims(0), dims(1));
                // One denominator along the inner dim on both sides: the products share it.
                let common = !da.is_empty() && db.len() >= 2 && a.den_fixed(da.len() - 1) && b.den_fixed(db.len() - 2);
                let k = if common { 1 } else { *da.last().unwrap_or(&1) };
                vec![Walk::matmul(a, b, k)]
            }
            KernelOpKind::Unary { op: u } => {
                let x = arg(0);
                let mut out = walk.unary(u, label, x);
                // x^power times a factor without a denominator: x's denominators, powered.
                out.fixed = match u.lax() {
                    Lax::Rational { den: 0, .. } | Lax::Exp { den: 0, .. } => x.fixed,
                    _ => 0,
                };
                vec![out]
            }
            KernelOpKind::Binary { op: b } => {
                let (x, y) = (arg(0), arg(1));
                let mut out = walk.binary(*b, label, x, y);
                let (fx, fy) = (x.fixed_bits(dims(0)), y.fixed_bits(dims(1)));
                out.fixed = match b.lax() {
                    // Denominator D_x D_y.
                    BinaryLax::Sum | BinaryLax::Product => fx & fy,
                    // Denominator D_x N_y: y's numerator is the same only where y is broadcast.
                    BinaryLax::Quotient => fx & size_one_bits(dims(1)),
                    BinaryLax::Uninterpreted => 0,
                };
                vec![out]
            }
            KernelOpKind::Reduction { dim } => {
                let (x, l) = (arg(0), dims(0).get(*dim).copied().unwrap_or(1));
                let deg = if x.den_fixed(*dim) { x.deg } else { x.deg.sum(l) };
                vec![Info { deg, ..x.clone() }]
            }
            KernelOpKind::RmsNorm { normalized_ndims, eps } => {
                let (x, d) = (arg(0), dims(0));
                let first = d.len().saturating_sub(*normalized_ndims);
                let len: usize = d[first..].iter().product();
                let mut out = walk.rms_norm(x, len, *eps);
                // x / r with x free of denominators: r, the row's root mean square, is the
                // denominator of every element of the row.
                out.fixed = if x.deg.den == 0 { (first..d.len().min(64)).fold(0, |m, k| m | 1 << k) } else { 0 };
                if op.inputs.len() > 1 {
                    let w = arg(1);
                    let fixed = if w.deg.den == 0 { out.fixed } else { 0 };
                    out = Info { deg: out.deg.mul(w.deg), fixed, ..join(&[&out, w]) };
                }
                vec![out]
            }
            KernelOpKind::Softmax { dim } => {
                let l = dims(0).get(*dim).copied().unwrap_or(1);
                let (exps, path) = walk.exp(label, arg(0));
                // exp(x_i) / sum_j exp(x_j): the row's sum is every element's denominator.
                let fixed = if *dim < 64 { 1u64 << dim } else { 0 };
                vec![Info { exps, path, deg: Deg::VAR.div(Deg::VAR.sum(l)), fixed }]
            }
            KernelOpKind::Customized { graph } => {
                let ins: Vec<Info> = op.inputs.iter().map(|&t| vals.get(t).cloned().unwrap_or_default()).collect();
                // Block graphs keep the plain rule: nothing is known of their denominators.
                walk.block(graph, &label, &ins).into_iter().map(|i| Info { fixed: 0, ..i }).collect()
            }
        };
        for (&t, info) in op.outputs.iter().zip(res) {
            if let Some(slot) = vals.get_mut(t) {
                *slot = info;
            }
        }
    }
    let outs: Vec<&Info> = g.output_ids().iter().filter_map(|&t| vals.get(t)).collect();
    let degree = outs.iter().map(|i| i.deg.total()).max().unwrap_or(0);
    let max_exps_on_path = outs.iter().map(|i| i.exps).max().unwrap_or(0);
    let fragment = if let Some(reason) = walk.violation {
        Fragment::NotLax { reason }
    } else if !walk.uninterpreted.is_empty() {
        Fragment::Probabilistic {
            reason: format!(
                "uses ops without an algebraic meaning (deterministic uninterpreted functions in the field): {}",
                walk.uninterpreted.join(", ")
            ),
        }
    } else {
        Fragment::Lax
    };
    LaxReport {
        fragment,
        degree,
        exp_ops: walk.exp_ops,
        max_exps_on_path,
        uninterpreted: walk.uninterpreted,
        sqrt_ops: walk.sqrt_ops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirage_ugraph::{zoo, DType};

    #[test]
    fn zoo_fragments() {
        let dt = DType::Float32;
        let p = zoo::rmsnorm_linear(4, 16, 32, 2, 4, dt).unwrap();
        let (r, c) = (analyze(&p.reference), analyze(&p.ugraph));
        assert_eq!((r.fragment.clone(), c.fragment.clone()), (Fragment::Lax, Fragment::Lax));
        assert_eq!((r.exp_ops, c.exp_ops), (0, 0));
        // rms_norm(X) @ W: (x / r) * w summed over k = 16 terms over the one denominator r.
        assert_eq!(r.degree, 3);
        assert_eq!(c.degree, 3);
        let a =
            zoo::attention(zoo::Attn { b: 2, h: 4, d: 8, s: 32, splits: 2, frange: 2, qsplit: 1 }, false, dt).unwrap();
        let (r, c) = (analyze(&a.reference), analyze(&a.ugraph));
        assert_eq!((r.fragment.clone(), c.fragment.clone()), (Fragment::Lax, Fragment::Lax));
        assert_eq!((r.exp_ops, c.exp_ops, r.max_exps_on_path), (1, 1, 1));
        let o =
            zoo::attention_online(zoo::Attn { b: 2, h: 4, d: 8, s: 32, splits: 2, frange: 2, qsplit: 1 }, dt).unwrap();
        let c = analyze(&o.ugraph);
        assert!(matches!(c.fragment, Fragment::Probabilistic { .. }), "{:?}", c.fragment);
        assert_eq!(c.max_exps_on_path, 1);
    }

    /// The degree of graph `f`'s one output, built on inputs of `dims`.
    fn degree(dims: &[&[usize]], f: impl Fn(&mut KernelGraph, &[usize]) -> usize) -> u64 {
        let mut g = KernelGraph::new();
        let ins: Vec<usize> = dims.iter().map(|d| g.new_input(d, DType::Float32, None).unwrap()).collect();
        let out = f(&mut g, &ins);
        g.mark_output(out, None).unwrap();
        analyze(&g).degree
    }

    #[test]
    fn sums_over_one_common_denominator_keep_its_degree() {
        let (m, k, n) = (8usize, 64usize, 16usize);
        // The row's root mean square is every element's denominator along the normalised dim:
        // (x / r) w summed over k stays (2, 1).
        let norm_mm = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.rms_norm(i[0], &[k], None).unwrap();
            g.matmul(y, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n]], norm_mm), 3);
        // ... with its weight too, and reduced along that dim.
        let weighted = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.rms_norm(i[0], &[k], Some(i[2])).unwrap();
            g.matmul(y, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n], &[k]], weighted), 4);
        let reduced = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.rms_norm(i[0], &[k], None).unwrap();
            g.reduction(y, 1).unwrap()
        };
        assert_eq!(degree(&[&[m, k]], reduced), 2);
        // The softmax's row sum along its dim: P V summed over the keys stays (2, 1).
        let attn = |g: &mut KernelGraph, i: &[usize]| {
            let p = g.softmax(i[0], -1).unwrap();
            g.matmul(p, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n]], attn), 3);
        // A quotient by a tensor broadcast along the summed dim: one denominator per row.
        let scaled = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.binary(BinaryOp::Div, i[0], i[2]).unwrap();
            g.matmul(y, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n], &[m, 1]], scaled), 3);
    }

    #[test]
    fn sums_over_denominators_that_vary_multiply_them() {
        let (m, k, n) = (8usize, 64usize, 16usize);
        let k64 = k as u64;
        // X / Y element by element: a denominator per element, (2 + (k - 1), k) over k terms.
        let quotient = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.binary(BinaryOp::Div, i[0], i[2]).unwrap();
            g.matmul(y, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n], &[m, k]], quotient), 2 + (k64 - 1) + k64);
        // The norm's rows summed across (over the dim it does not normalise): r varies.
        let across = |g: &mut KernelGraph, i: &[usize]| {
            let y = g.rms_norm(i[0], &[k], None).unwrap();
            g.matmul(i[1], y).unwrap()
        };
        let m64 = m as u64;
        assert_eq!(degree(&[&[m, k], &[n, m]], across), 2 + (m64 - 1) + m64);
        // A softmax over the other dim than the one summed.
        let other = |g: &mut KernelGraph, i: &[usize]| {
            let p = g.softmax(i[0], 0).unwrap();
            g.matmul(p, i[1]).unwrap()
        };
        assert_eq!(degree(&[&[m, k], &[k, n]], other), 2 + (k64 - 1) + k64);
        // A norm of a quotient: its own denominators vary along the row.
        let norm_of_quotient = |g: &mut KernelGraph, i: &[usize]| {
            let q = g.binary(BinaryOp::Div, i[0], i[2]).unwrap();
            let y = g.rms_norm(q, &[k], None).unwrap();
            g.matmul(y, i[1]).unwrap()
        };
        assert!(degree(&[&[m, k], &[k, n], &[m, k]], norm_of_quotient) > k64);
        // Block graphs keep the plain rule (the zoo's fused norm + projection is small anyway:
        // its sums have no denominator).
    }

    #[test]
    fn two_exps_on_a_path_are_rejected_with_the_ops_named() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[4, 4], DType::Float32, None).unwrap();
        let e = g.unary(UnaryOp::Exp, x).unwrap();
        let s = g.softmax(x, -1).unwrap();
        let t = g.binary(BinaryOp::Add, e, s).unwrap();
        let y = g.unary(UnaryOp::Silu, t).unwrap();
        g.mark_output(y, None).unwrap();
        let r = analyze(&g);
        let Fragment::NotLax { reason } = r.fragment else { panic!("{:?}", r.fragment) };
        assert!(reason.contains("kernel op #1 (exp)") && reason.contains("kernel op #4 (silu)"), "{reason}");
        assert_eq!(r.max_exps_on_path, 2);
    }
}
