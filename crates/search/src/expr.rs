//! Abstract expressions: what each tensor of a µGraph computes, up to tiling and layout.
//!
//! Every tensor — kernel-level or a block-level tile — gets a term over the language [`Expr`]:
//! `+ - * / pow clamp`, the registry's unary terms (`exp sqrt square silu gelu relu tanh`,
//! docs/ops.md), `(sum i n x)` (a sum of `n` terms over index `i`), `(rms i n x)` (a root mean
//! square over `n` elements of index `i`) and `(max i n x)`. Sizes `n` are [`Expr::Num`] literals; indices `i` are [`Expr::Idx`] literals
//! naming the index label ([`crate::labels`]) the sum runs over. Graph input `k` is the variable
//! `xk`. A tile has the term of the whole tensor it is cut from: imaps and fmaps change only the
//! sizes of the sums a block performs, never the term. The paper's terms carry sizes only; the
//! index lets the sum-of-product axiom require a factor independent of the summed index (see
//! [`crate::axioms`]), which removes a large class of wrong candidates (e.g. `(Σx)(Σw)` for
//! `Σ(x w)`) without losing any right one.
//!
//! The whole abstraction is the single match in [`op_term`] (`l`: the index of a dim's label):
//!
//! | op (kernel or block level)          | term                                              |
//! |-------------------------------------|---------------------------------------------------|
//! | `matmul(a, b)`, inner dim `k`       | `(sum l(k) k (* a b))`                            |
//! | unary registry op (docs/ops.md)     | `(term a)`: `(exp a)`, `(silu a)` ...             |
//! | `clamp(a, lo, hi)`, `mul_scalar(a, c)` | `(clamp lo hi a)`, `(* c a)` (constants)       |
//! | binary `add sub mul div pow`        | `(+ a b)` ...                                     |
//! | `reduction(a, d)`, dim size `n`     | `(sum l(d) n a)`                                  |
//! | `rms_norm(a)` over the last dim, `n` elements | `(/ a (rms l(last) n a))` (kernel: `(* that w)` with a weight) |
//! | `softmax(a, d)`, dim size `n`       | `(/ (exp a) (sum l(d) n (exp a)))`                |
//! | accum `None`, loop range `f` over label `L` | `(sum L f a)`                              |
//! | accum `sum`, last tile dim `m`      | `(sum L f (sum l(last) m a))`, one `(sum L f*m a)` when `L` is the last label |
//! | accum `mean` / `rms`                | `(/ that f*m)` / `(rms l(last) f*m a)`            |
//! | `rms_norm` / accum `rms` with `eps > 0` | `(rmse i n #eps a)` in place of `(rms i n a)`  |
//! | accum `sum_todimx` (last dim: `p` partials over `P`) | `(sum L f (sum P p a))`          |
//! | `reduction_max(a, d)`               | `(max l(d) n a)`; its diff output and the rescaling / max accumulators are unsupported |
//! | `concat`                            | unsupported (no algebraic abstraction yet)         |
//!
//! A sum of one term is its operand: `(sum i 1 x)` is never built. Terms are built bottom-up
//! through a [`Sink`]: [`TermBuilder`] makes `RecExpr`s (no parsing), an e-graph sink adds or
//! looks up nodes. Looking a term up node by node is exactly `EGraph::lookup_expr` on the whole
//! term.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use egg::{define_language, Analysis, DidMerge, EGraph, FromOp, Id, Language, RecExpr, Symbol};
use mirage_ugraph::{
    Accum, BinaryOp, BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, UnaryOp, BINARY_OPS, UNARY_OPS,
};

use crate::labels::{BlockLabels, GraphLabels, Label, NO_INDEX};

define_language! {
    /// The abstract-expression language (see the module docs for what each op stands for).
    /// `Num`: a size (terms of a `sum`, elements of an `rms`, a mean's divisor); `Idx`: the index
    /// label a `sum`/`rms`/`max` runs over; `Const`: a float constant of the graph
    /// (`mul_scalar`, `clamp` bounds); `Var`: graph input `k` is `xk`; `Other`: a registry unary
    /// op (docs/ops.md) whose term operator has no variant of its own, so no axiom rewrites it.
    #[allow(missing_docs)]
    pub enum Expr {
        Num(u64),
        Idx(Index),
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "pow" = Pow([Id; 2]),
        "exp" = Exp(Id),
        "sqrt" = Sqrt(Id),
        "square" = Square(Id),
        "silu" = Silu(Id),
        "gelu" = Gelu(Id),
        "relu" = Relu(Id),
        "clamp" = Clamp([Id; 3]),
        "sum" = Sum([Id; 3]),
        "rms" = Rms([Id; 3]),
        "rmse" = RmsEps([Id; 4]),
        "max" = Max([Id; 3]),
        Const(Constant),
        Var(Symbol),
        Other(Symbol, Vec<Id>),
    }
}

/// An index label as a term leaf; written `@3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Index(pub u16);

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}", self.0)
    }
}

impl FromStr for Index {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let body = s.strip_prefix('@').ok_or_else(|| format!("{s} is not an index (@<n>)"))?;
        body.parse::<u16>().map(Index).map_err(|e| e.to_string())
    }
}

/// A float constant, compared and hashed by its bits; written `#1.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Constant(pub u32);

impl Constant {
    /// The constant of `x`.
    pub fn of(x: f32) -> Self {
        Constant(x.to_bits())
    }
}

impl fmt::Display for Constant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", f32::from_bits(self.0))
    }
}

impl FromStr for Constant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let body = s.strip_prefix('#').ok_or_else(|| format!("{s} is not a constant (#<float>)"))?;
        body.parse::<f32>().map(Constant::of).map_err(|e| e.to_string())
    }
}

/// The set bit of index `i` (none for indices beyond 63 or [`NO_INDEX`]).
pub fn index_bit(i: u16) -> u64 {
    if i < 64 {
        1u64 << i
    } else {
        0
    }
}

/// E-class data: the value of a size or index literal, and the indices the class's value
/// depends on (free indices: those of its inputs' dims minus the ones summed over).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExprData {
    /// The value of a [`Expr::Num`] class.
    pub size: Option<u64>,
    /// The value of a [`Expr::Idx`] class.
    pub index: Option<u16>,
    /// Free indices (bit per index label).
    pub free: u64,
}

/// The e-graph analysis: literal values and free indices. Equal classes merge their free sets
/// by intersection (a value depends on an index only if every form of it does), which only
/// lets more conditional rewrites fire.
#[derive(Debug, Clone, Default)]
pub struct ExprAnalysis {
    /// Free indices of each graph input variable `xk` (its dims' labels).
    pub input_free: Vec<u64>,
}

impl Analysis<Expr> for ExprAnalysis {
    type Data = ExprData;

    fn make(egraph: &mut EGraph<Expr, Self>, enode: &Expr, _id: Id) -> Self::Data {
        let d = |id: Id| egraph[id].data;
        match enode {
            Expr::Num(n) => ExprData { size: Some(*n), ..Default::default() },
            Expr::Idx(i) => ExprData { index: Some(i.0), ..Default::default() },
            Expr::Var(sym) => {
                let k = sym.as_str().strip_prefix('x').and_then(|k| k.parse::<usize>().ok());
                let free = k.and_then(|k| egraph.analysis.input_free.get(k)).copied().unwrap_or(0);
                ExprData { free, ..Default::default() }
            }
            Expr::Sum([i, _, x]) | Expr::Rms([i, _, x]) | Expr::Max([i, _, x]) | Expr::RmsEps([i, _, _, x]) => {
                let bound = d(*i).index.map_or(0, index_bit);
                ExprData { free: d(*x).free & !bound, ..Default::default() }
            }
            other => ExprData { free: other.children().iter().fold(0, |m, &c| m | d(c).free), ..Default::default() },
        }
    }

    fn merge(&mut self, a: &mut Self::Data, b: Self::Data) -> DidMerge {
        let free = a.free & b.free;
        let did = DidMerge(free != a.free, free != b.free);
        a.free = free;
        if a.size.is_none() {
            a.size = b.size;
        }
        if a.index.is_none() {
            a.index = b.index;
        }
        did
    }
}

/// The e-graph type of the search.
pub type ExprGraph = EGraph<Expr, ExprAnalysis>;

/// Where terms are built: each call adds (or finds) one node whose children are ids of this
/// sink. `None` means the node is absent (a lookup sink); building sinks always return `Some`.
pub trait Sink {
    /// Adds or looks up `node`.
    fn node(&mut self, node: Expr) -> Option<Id>;
}

/// Builds terms as one hash-consed `RecExpr`; [`TermBuilder::term`] extracts a tensor's term.
#[derive(Debug, Default, Clone)]
pub struct TermBuilder {
    expr: RecExpr<Expr>,
    memo: HashMap<Expr, Id>,
}

impl TermBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The term rooted at `id` as a self-contained `RecExpr`.
    pub fn term(&self, id: Id) -> RecExpr<Expr> {
        self.expr[id].build_recexpr(|c| self.expr[c].clone())
    }
}

impl Sink for TermBuilder {
    fn node(&mut self, node: Expr) -> Option<Id> {
        if let Some(&id) = self.memo.get(&node) {
            return Some(id);
        }
        let id = self.expr.add(node.clone());
        self.memo.insert(node, id);
        Some(id)
    }
}

/// Adds nodes to an e-graph (how target terms enter it).
pub struct Adder<'a>(pub &'a mut ExprGraph);

impl Sink for Adder<'_> {
    fn node(&mut self, node: Expr) -> Option<Id> {
        Some(self.0.add(node))
    }
}

/// Looks nodes up in a finished e-graph, read-only (how candidate terms are checked).
pub struct Lookup<'a>(pub &'a ExprGraph);

impl Sink for Lookup<'_> {
    fn node(&mut self, node: Expr) -> Option<Id> {
        self.0.lookup(node)
    }
}

/// The variable of graph input `k`.
pub fn input_var<S: Sink>(s: &mut S, k: usize) -> Option<Id> {
    s.node(Expr::Var(Symbol::from(format!("x{k}"))))
}

/// `(sum i n x)`, or `x` itself when `n == 1`.
pub fn sum<S: Sink>(s: &mut S, i: u16, n: usize, x: Id) -> Option<Id> {
    if n == 1 {
        return Some(x);
    }
    let i = s.node(Expr::Idx(Index(i)))?;
    let n = s.node(Expr::Num(n as u64))?;
    s.node(Expr::Sum([i, n, x]))
}

/// A sum over `f` terms of index `i` of a sum over `m` terms of index `j`.
fn sum2<S: Sink>(s: &mut S, (i, f): (u16, usize), (j, m): (u16, usize), x: Id) -> Option<Id> {
    if f == 1 || i == j {
        return sum(s, j, f * m, x);
    }
    let inner = sum(s, j, m, x)?;
    sum(s, i, f, inner)
}

/// `(rms i n x)`.
pub fn rms<S: Sink>(s: &mut S, i: u16, n: usize, x: Id) -> Option<Id> {
    let i = s.node(Expr::Idx(Index(i)))?;
    let n = s.node(Expr::Num(n as u64))?;
    s.node(Expr::Rms([i, n, x]))
}

/// `(rmse i n #eps x)`: `sqrt(mean(x^2) + eps)`; the plain [`rms`] term when `eps` is 0.
pub fn rms_eps<S: Sink>(s: &mut S, i: u16, n: usize, eps: f32, x: Id) -> Option<Id> {
    if eps == 0.0 {
        return rms(s, i, n, x);
    }
    let i = s.node(Expr::Idx(Index(i)))?;
    let n = s.node(Expr::Num(n as u64))?;
    let e = s.node(Expr::Const(Constant::of(eps)))?;
    s.node(Expr::RmsEps([i, n, e, x]))
}

/// An op whose term [`op_term`] gives: kernel-level or block-level.
#[derive(Debug, Clone, Copy)]
pub enum OpRef<'a> {
    /// A predefined kernel op (not an input, not customized).
    Kernel(&'a KernelOpKind),
    /// A block op (not an input or output saver) with its block's loop parameters.
    Block(&'a BlockOpKind, LoopCtx),
}

/// What a block op's term depends on beyond its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopCtx {
    /// The block graph's `forloop_range`.
    pub forloop_range: usize,
    /// The block graph's `reduction_dimx`.
    pub reduction_dimx: usize,
    /// The label the loop iterates (`None` without a loop).
    pub loop_label: Option<Label>,
}

/// An op with no abstract expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub &'static str);

/// Term of the (first) output of `op` applied to operand terms `ins` of dims `dims` with
/// labels `labels`.
///
/// `Ok(None)`: a node is absent from a lookup sink (the candidate is pruned).
/// This match is the whole abstraction (see the module docs).
pub fn op_term<S: Sink>(
    s: &mut S,
    op: OpRef<'_>,
    ins: &[Id],
    dims: &[&[usize]],
    labels: &[&[Label]],
) -> Result<Option<Id>, Unsupported> {
    use BlockOpKind as B;
    use KernelOpKind as K;
    let last = |i: usize| dims[i].last().copied().unwrap_or(1);
    let ix = |i: usize, d: usize| labels[i].get(d).map_or(NO_INDEX, |l| l.index());
    let last_ix = |i: usize| ix(i, dims[i].len().saturating_sub(1));
    let t = match op {
        OpRef::Kernel(K::Matmul) | OpRef::Block(B::Matmul, _) => {
            s.node(Expr::Mul([ins[0], ins[1]])).and_then(|m| sum(s, last_ix(0), last(0), m))
        }
        OpRef::Kernel(K::Unary { op: u }) | OpRef::Block(B::Unary { op: u }, _) => unary(s, u, ins[0]),
        OpRef::Kernel(K::Binary { op: b }) | OpRef::Block(B::Binary { op: b }, _) => binary(s, *b, ins[0], ins[1]),
        OpRef::Kernel(K::Reduction { dim }) | OpRef::Block(B::Reduction { dim }, _) => {
            sum(s, ix(0, *dim), dims[0][*dim], ins[0])
        }
        OpRef::Block(B::ReductionMax { dim }, _) => {
            let i = s.node(Expr::Idx(Index(ix(0, *dim))));
            let n = s.node(Expr::Num(dims[0][*dim] as u64));
            match (i, n) {
                (Some(i), Some(n)) => s.node(Expr::Max([i, n, ins[0]])),
                _ => None,
            }
        }
        OpRef::Kernel(K::RmsNorm { normalized_ndims, eps }) => {
            let d = dims[0];
            let len: usize = d[d.len().saturating_sub(*normalized_ndims)..].iter().product();
            let normed = rms_eps(s, last_ix(0), len, *eps, ins[0]).and_then(|r| s.node(Expr::Div([ins[0], r])));
            match (normed, ins.get(1)) {
                (Some(n), Some(&w)) => s.node(Expr::Mul([n, w])),
                (n, _) => n,
            }
        }
        OpRef::Block(B::RmsNorm { eps }, _) => {
            rms_eps(s, last_ix(0), last(0), *eps, ins[0]).and_then(|r| s.node(Expr::Div([ins[0], r])))
        }
        OpRef::Kernel(K::Softmax { dim }) => {
            let e = s.node(Expr::Exp(ins[0]));
            let den = e.and_then(|e| sum(s, ix(0, *dim), dims[0][*dim], e));
            match (e, den) {
                (Some(e), Some(d)) => s.node(Expr::Div([e, d])),
                _ => None,
            }
        }
        OpRef::Block(B::ForloopAccum { acc, eps }, ctx) => {
            let f = ctx.forloop_range;
            let li = ctx.loop_label.map_or(NO_INDEX, Label::index);
            let (m, mi) = (last(0), last_ix(0));
            match acc {
                Accum::None => sum(s, li, f, ins[0]),
                Accum::Sum => sum2(s, (li, f), (mi, m), ins[0]),
                Accum::Mean => {
                    let total = sum2(s, (li, f), (mi, m), ins[0]);
                    let n = s.node(Expr::Num((f * m) as u64));
                    match (total, n) {
                        (Some(t), Some(n)) => s.node(Expr::Div([t, n])),
                        _ => None,
                    }
                }
                Accum::Rms => rms_eps(s, mi, f * m, *eps, ins[0]),
                Accum::SumToDimx => sum2(s, (li, f), (mi, m / ctx.reduction_dimx.max(1)), ins[0]),
            }
        }
        OpRef::Block(B::Concat { .. }, _) => return Err(Unsupported("concat")),
        OpRef::Block(B::ForloopAccumRescale { .. }, _) => return Err(Unsupported("forloop_accum_rescale")),
        OpRef::Block(B::ForloopAccumMax, _) => return Err(Unsupported("forloop_accum_max")),
        OpRef::Kernel(K::Input { .. } | K::Customized { .. }) => return Err(Unsupported("input/customized")),
        OpRef::Block(B::Input { .. } | B::Output { .. }, _) => return Err(Unsupported("input/output")),
    };
    Ok(t)
}

/// The term node of each registry op ([`UNARY_OPS`] order), its operand a placeholder.
fn unary_templates() -> &'static [Expr] {
    static T: OnceLock<Vec<Expr>> = OnceLock::new();
    T.get_or_init(|| {
        UNARY_OPS
            .iter()
            .map(|d| match Expr::from_op(d.term, vec![Id::from(0)]) {
                Ok(e) => e,
                Err(_) => Expr::Other(Symbol::from(d.term), vec![Id::from(0)]),
            })
            .collect()
    })
}

fn unary<S: Sink>(s: &mut S, u: &UnaryOp, x: Id) -> Option<Id> {
    match *u {
        UnaryOp::Clamp { min, max } => {
            let lo = s.node(Expr::Const(Constant::of(min)))?;
            let hi = s.node(Expr::Const(Constant::of(max)))?;
            s.node(Expr::Clamp([lo, hi, x]))
        }
        UnaryOp::MulScalar { scalar } => {
            let c = s.node(Expr::Const(Constant::of(scalar)))?;
            s.node(Expr::Mul([c, x]))
        }
        op => {
            let i = UNARY_OPS.iter().position(|d| d.op == op)?;
            s.node(unary_templates()[i].clone().map_children(|_| x))
        }
    }
}

/// The term node of each binary registry op ([`BINARY_OPS`] order), its operands the
/// placeholders 0 and 1.
fn binary_templates() -> &'static [Expr] {
    static T: OnceLock<Vec<Expr>> = OnceLock::new();
    T.get_or_init(|| {
        BINARY_OPS
            .iter()
            .map(|d| match Expr::from_op(d.term, vec![Id::from(0), Id::from(1)]) {
                Ok(e) => e,
                Err(_) => Expr::Other(Symbol::from(d.term), vec![Id::from(0), Id::from(1)]),
            })
            .collect()
    })
}

/// The term of [`UNARY_OPS`] entry `u` applied to `x` (what [`op_term`] gives that op).
pub(crate) fn unary_term<S: Sink>(s: &mut S, u: usize, x: Id) -> Option<Id> {
    unary(s, &UNARY_OPS.get(u)?.op, x)
}

/// The term of [`BINARY_OPS`] entry `b` applied to `(x, y)` (what [`op_term`] gives that op).
pub(crate) fn binary_term<S: Sink>(s: &mut S, b: usize, x: Id, y: Id) -> Option<Id> {
    binary(s, BINARY_OPS.get(b)?.op, x, y)
}

fn binary<S: Sink>(s: &mut S, op: BinaryOp, a: Id, b: Id) -> Option<Id> {
    let t = binary_templates()[op as usize].clone();
    s.node(t.map_children(|c| if c == Id::from(0) { a } else { b }))
}

/// Terms of every tensor of a block graph (indexed by stensor id), given its inputs' terms in
/// input order and its labels. `None` where a node is absent from a lookup sink.
pub fn block_terms<S: Sink>(
    s: &mut S,
    bg: &BlockGraph,
    labels: &BlockLabels,
    inputs: &[Option<Id>],
) -> Result<Vec<Option<Id>>, Unsupported> {
    let ctx =
        LoopCtx { forloop_range: bg.forloop_range, reduction_dimx: bg.reduction_dimx, loop_label: labels.loop_label };
    let mut terms: Vec<Option<Id>> = vec![None; bg.tensors.len()];
    let mut next_input = 0;
    for op in &bg.ops {
        match &op.kind {
            BlockOpKind::Input { .. } => {
                terms[op.outputs[0]] = inputs.get(next_input).copied().flatten();
                next_input += 1;
            }
            BlockOpKind::Output { .. } => {}
            kind => {
                let ins: Option<Vec<Id>> = op.inputs.iter().map(|&t| terms[t]).collect();
                let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| bg.tensors[t].dims.as_slice()).collect();
                let ls: Vec<&[Label]> = op.inputs.iter().map(|&t| labels.tensors[t].as_slice()).collect();
                let t = match ins {
                    Some(ins) => op_term(s, OpRef::Block(kind, ctx), &ins, &dims, &ls)?,
                    None => None,
                };
                if let Some(&out) = op.outputs.first() {
                    terms[out] = t;
                }
            }
        }
    }
    Ok(terms)
}

/// Terms of every tensor of a kernel graph (indexed by tensor id) with its labels
/// ([`crate::labels::propagate`]); customized ops contribute the terms of their block outputs.
pub fn kernel_terms<S: Sink>(s: &mut S, g: &KernelGraph, labels: &GraphLabels) -> Result<Vec<Option<Id>>, Unsupported> {
    let mut terms: Vec<Option<Id>> = vec![None; g.tensors.len()];
    let mut next_input = 0;
    for (oi, op) in g.ops.iter().enumerate() {
        match &op.kind {
            KernelOpKind::Input { .. } => {
                terms[op.outputs[0]] = input_var(s, next_input);
                next_input += 1;
            }
            KernelOpKind::Customized { graph } => {
                let Some(bl) = labels.blocks.get(oi).and_then(Option::as_ref) else {
                    return Err(Unsupported("customized op without labels"));
                };
                let ins: Vec<Option<Id>> = op.inputs.iter().map(|&t| terms[t]).collect();
                let bt = block_terms(s, graph, bl, &ins)?;
                for (o, &out) in graph.output_ops().zip(&op.outputs) {
                    terms[out] = bt[o.inputs[0]];
                }
            }
            kind => {
                let ins: Option<Vec<Id>> = op.inputs.iter().map(|&t| terms[t]).collect();
                let dims: Vec<&[usize]> = op.inputs.iter().map(|&t| g.tensors[t].dims.as_slice()).collect();
                let ls: Vec<&[Label]> = op.inputs.iter().map(|&t| labels.tensors[t].as_slice()).collect();
                terms[op.outputs[0]] = match ins {
                    Some(ins) => op_term(s, OpRef::Kernel(kind), &ins, &dims, &ls)?,
                    None => None,
                };
            }
        }
    }
    Ok(terms)
}

/// The terms of a kernel graph's outputs ([`KernelGraph::output_ids`] order) as `RecExpr`s.
pub fn output_terms(g: &KernelGraph, labels: &GraphLabels) -> Result<Vec<RecExpr<Expr>>, Unsupported> {
    let mut b = TermBuilder::new();
    let terms = kernel_terms(&mut b, g, labels)?;
    Ok(g.output_ids().iter().filter_map(|&t| terms[t]).map(|id| b.term(id)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registry_op_has_its_term_and_it_parses_back() {
        for d in UNARY_OPS {
            let mut b = TermBuilder::new();
            let x = input_var(&mut b, 0).expect("builds");
            let t = unary(&mut b, &d.op, x).expect("builds");
            let want = format!("({} x0)", d.term);
            assert_eq!(b.term(t).to_string(), want, "{}", d.name);
            let parsed: RecExpr<Expr> = want.parse().expect("parses");
            assert_eq!(parsed, b.term(t), "{}", d.name);
        }
        for d in BINARY_OPS {
            let mut b = TermBuilder::new();
            let x = input_var(&mut b, 0).expect("builds");
            let y = input_var(&mut b, 1).expect("builds");
            let t = binary(&mut b, d.op, x, y).expect("builds");
            let want = format!("({} x0 x1)", d.term);
            assert_eq!(b.term(t).to_string(), want, "{}", d.name);
            // Every binary op has a variant of its own (the axioms' patterns name them).
            assert!(!matches!(b.term(t).as_ref().last(), Some(Expr::Other(..))), "{}", d.name);
            let swapped = binary(&mut b, d.op, y, x).expect("builds");
            assert_ne!(t, swapped, "{}: operand order kept", d.name);
        }
        // Existing ops keep their own variants (the axioms' patterns name them).
        let mut b = TermBuilder::new();
        let x = input_var(&mut b, 0).expect("builds");
        let t = unary(&mut b, &UnaryOp::Silu, x).expect("builds");
        assert!(matches!(b.term(t).as_ref().last(), Some(Expr::Silu(_))));
    }
}
