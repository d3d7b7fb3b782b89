//! The pruning oracle: the target's saturated e-graph, frozen and shared read-only by every
//! search thread.
//!
//! A candidate tensor survives only if its term is in the e-graph. The search checks a new
//! tensor with one hash-consed lookup of its top node (children are the e-classes of its
//! operands, already found), which is exactly `EGraph::lookup_expr` on its whole term; the
//! e-graph's memo is the cache keyed by term hash. The lookups the generator repeats most
//! (two-operand pairs, unary and binary op terms) are answered from tables built once after
//! saturation ([`OpTables`]). [`ExprOracle::contains`] checks a whole `RecExpr` (tests, the
//! Theorem-1 check).

use egg::{Id, Language, RecExpr};
use mirage_ugraph::KernelGraph;

use crate::axioms::{saturate, SaturationLimits, SaturationReport};
use crate::error::{Result, SearchError};
use crate::expr::{binary_term, input_var, output_terms, unary_term, Expr, ExprAnalysis, ExprGraph, Lookup, Sink};
use crate::labels::{analyze, propagate, Label, LabelInfo};
use mirage_ugraph::{BINARY_OPS, UNARY_OPS};

/// The saturated e-graph of a reference program's output terms.
pub struct ExprOracle {
    egraph: ExprGraph,
    targets: Vec<Id>,
    inputs: Vec<Option<Id>>,
    report: SaturationReport,
    tables: Option<OpTables>,
}

const _: () = {
    const fn sync<T: Sync + Send>() {}
    sync::<ExprOracle>();
};

/// Answers about the frozen e-graph that the generator asks billions of times, as tables
/// indexed by e-class instead of hash-consed lookups: which pairs of classes are the two
/// children of some e-node, in either order (a node of two operands is in the e-graph only
/// if its pair is), and the term of every registry unary op on every class and, for e-graphs of at most
/// [`MAX_BINARY_CLASSES`] classes, of every binary op on every pair. Each entry is what the
/// lookup gives (`expr::unary_term`, `expr::binary_term`).
struct OpTables {
    /// Dense index of each canonical class id (`u32::MAX`: none).
    dense: Vec<u32>,
    classes: usize,
    pairs: Vec<u64>,
    /// `[u][x]`: the class of unary op `u` on class `x` (`NONE`: absent).
    unary: Vec<u32>,
    /// `[b][x][y]`, as `unary`.
    binary: Option<Vec<u32>>,
}

/// Most e-classes for which [`OpTables`] are built (the pair bits grow with their square: 8 MiB).
const MAX_TABLE_CLASSES: usize = 8192;
/// Most e-classes for which the binary ops' terms are tabled (4 bytes an op and pair).
const MAX_BINARY_CLASSES: usize = 512;
/// An absent term in [`OpTables`].
const NONE: u32 = u32::MAX;

impl OpTables {
    fn new(egraph: &ExprGraph) -> Option<OpTables> {
        let classes = egraph.number_of_classes();
        if classes > MAX_TABLE_CLASSES {
            return None;
        }
        let ids: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        let most = ids.iter().map(|&c| usize::from(c)).max().map_or(0, |m| m + 1);
        let mut dense = vec![NONE; most];
        for (i, &c) in ids.iter().enumerate() {
            dense[usize::from(c)] = i as u32;
        }
        let mut t = OpTables {
            dense,
            classes,
            pairs: vec![0; (classes * classes).div_ceil(64)],
            unary: Vec::new(),
            binary: None,
        };
        for c in egraph.classes() {
            for node in &c.nodes {
                if let [a, b] = node.children() {
                    let (a, b) = (egraph.find(*a), egraph.find(*b));
                    for i in [t.pair(a, b), t.pair(b, a)].into_iter().flatten() {
                        t.pairs[i / 64] |= 1 << (i % 64);
                    }
                }
            }
        }
        let mut look = Lookup(egraph);
        let code = |r: Option<Id>| r.map_or(NONE, |id| usize::from(id) as u32);
        t.unary = (0..UNARY_OPS.len())
            .flat_map(|u| ids.iter().map(move |&x| (u, x)))
            .map(|(u, x)| code(unary_term(&mut look, u, x)))
            .collect();
        if classes <= MAX_BINARY_CLASSES {
            let mut binary = Vec::with_capacity(BINARY_OPS.len() * classes * classes);
            for b in 0..BINARY_OPS.len() {
                for &x in &ids {
                    for &y in &ids {
                        binary.push(if t.paired(x, y) { code(binary_term(&mut look, b, x, y)) } else { NONE });
                    }
                }
            }
            t.binary = Some(binary);
        }
        Some(t)
    }

    fn ix(&self, x: Id) -> Option<usize> {
        self.dense.get(usize::from(x)).copied().filter(|&i| i != NONE).map(|i| i as usize)
    }

    fn pair(&self, a: Id, b: Id) -> Option<usize> {
        Some(self.ix(a)? * self.classes + self.ix(b)?)
    }

    fn paired(&self, a: Id, b: Id) -> bool {
        self.pair(a, b).is_some_and(|i| self.pairs[i / 64] >> (i % 64) & 1 == 1)
    }

    fn decode(v: u32) -> Option<Id> {
        (v != NONE).then(|| Id::from(v as usize))
    }
}

impl ExprOracle {
    /// Saturates the output terms of `reference` (labelled by [`analyze`]) with sum factors
    /// `factors`.
    pub fn new(reference: &KernelGraph, factors: &[u64], limits: &SaturationLimits) -> Result<Self> {
        let info = analyze(reference)?;
        Self::with_labels(reference, &info, factors, limits)
    }

    /// As [`ExprOracle::new`] with the reference's labels already computed.
    pub fn with_labels(
        reference: &KernelGraph,
        info: &LabelInfo,
        factors: &[u64],
        limits: &SaturationLimits,
    ) -> Result<Self> {
        let unsupported = |u: crate::expr::Unsupported| SearchError::Unsupported {
            op: u.0.into(),
            why: "it has no abstract expression".into(),
        };
        let input_labels: Vec<Vec<Label>> = reference.input_ids().iter().map(|&t| info.tensors[t].clone()).collect();
        let labels = propagate(reference, &input_labels)?;
        let terms = output_terms(reference, &labels).map_err(unsupported)?;
        Ok(Self::from_terms(&terms, &input_labels, factors, limits))
    }

    /// Saturates the given target terms; graph input `k` is `xk`, with dims labelled `inputs[k]`.
    pub fn from_terms(
        terms: &[RecExpr<Expr>],
        inputs: &[Vec<Label>],
        factors: &[u64],
        limits: &SaturationLimits,
    ) -> Self {
        let input_free = inputs.iter().map(|ls| ls.iter().fold(0u64, |m, l| m | l.bit())).collect();
        let (egraph, targets, report) = saturate(terms, ExprAnalysis { input_free }, factors, limits);
        let mut look = Lookup(&egraph);
        let inputs = (0..inputs.len()).map(|i| input_var(&mut look, i)).collect();
        let tables = OpTables::new(&egraph);
        ExprOracle { egraph, targets, inputs, report, tables }
    }

    /// Whether some e-node has the canonical classes `a` and `b` as its two children, in either
    /// order (always true where the e-graph is too large for the table). False means no node
    /// of two operands `(a, b)` or `(b, a)` is present.
    #[inline]
    pub fn may_pair(&self, a: Id, b: Id) -> bool {
        self.tables.as_ref().is_none_or(|t| t.paired(a, b))
    }

    /// The term of [`UNARY_OPS`] entry `u` on class `x`, as a lookup gives it, from the
    /// tables (`None`: not tabled; look it up).
    #[inline]
    pub fn unary_term(&self, u: usize, x: Id) -> Option<Option<Id>> {
        let t = self.tables.as_ref()?;
        let i = u.checked_mul(t.classes)?.checked_add(t.ix(x)?)?;
        t.unary.get(i).map(|&v| OpTables::decode(v))
    }

    /// The term of [`BINARY_OPS`] entry `b` on classes `(x, y)`, as [`Self::unary_term`].
    #[inline]
    pub fn binary_term(&self, b: usize, x: Id, y: Id) -> Option<Option<Id>> {
        let t = self.tables.as_ref()?;
        let i = b.checked_mul(t.classes)?.checked_add(t.ix(x)?)?.checked_mul(t.classes)?.checked_add(t.ix(y)?)?;
        t.binary.as_ref()?.get(i).map(|&v| OpTables::decode(v))
    }

    /// The e-class of `node` (children are e-classes of this oracle), if present.
    #[inline]
    pub fn lookup(&self, node: Expr) -> Option<Id> {
        self.egraph.lookup(node)
    }

    /// A read-only sink over the e-graph (for [`crate::expr`]'s term functions).
    pub fn sink(&self) -> impl Sink + '_ {
        Lookup(&self.egraph)
    }

    /// Whether the whole term `e` is in the e-graph.
    pub fn contains(&self, e: &RecExpr<Expr>) -> bool {
        self.egraph.lookup_expr(e).is_some()
    }

    /// The e-class of term `e`, if present.
    pub fn class_of(&self, e: &RecExpr<Expr>) -> Option<Id> {
        self.egraph.lookup_expr(e)
    }

    /// The e-class of each target output, in output order.
    pub fn targets(&self) -> &[Id] {
        &self.targets
    }

    /// The e-class of each graph input variable (`None` if the targets do not use it).
    pub fn inputs(&self) -> &[Option<Id>] {
        &self.inputs
    }

    /// What the saturation did.
    pub fn report(&self) -> &SaturationReport {
        &self.report
    }

    /// The frozen e-graph.
    pub fn egraph(&self) -> &ExprGraph {
        &self.egraph
    }
}

#[cfg(test)]
mod tests {
    use mirage_ugraph::zoo::{self, Attn};
    use mirage_ugraph::DType;

    use super::*;

    #[test]
    fn the_tables_answer_as_the_lookups_do() {
        // QK-norm attention's reference, saturated: every tabled unary and binary term is the
        // hash-consed lookup's, and every pair a binary term exists for is paired.
        let a = Attn { b: 2, h: 4, d: 64, s: 256, splits: 1, frange: 4, qsplit: 1 };
        let g = zoo::attention(a, true, DType::Float16).expect("zoo").reference;
        let o = ExprOracle::new(&g, &[4], &SaturationLimits::default()).expect("oracle");
        let t = o.tables.as_ref().expect("tables of a small e-graph");
        assert!(t.binary.is_some());
        let ids: Vec<Id> = o.egraph.classes().map(|c| c.id).collect();
        let mut look = Lookup(&o.egraph);
        let (mut found, mut pairs) = (0, 0);
        for &x in &ids {
            for u in 0..UNARY_OPS.len() {
                let direct = unary_term(&mut look, u, x);
                assert_eq!(o.unary_term(u, x), Some(direct), "unary {u} of {x}");
                found += usize::from(direct.is_some());
            }
            for &y in &ids {
                pairs += usize::from(o.may_pair(x, y));
                for b in 0..BINARY_OPS.len() {
                    let direct = binary_term(&mut look, b, x, y);
                    assert_eq!(o.binary_term(b, x, y), Some(direct), "binary {b} of ({x}, {y})");
                    if direct.is_some() {
                        found += 1;
                        assert!(o.may_pair(x, y), "({x}, {y})");
                    }
                }
            }
        }
        // The tables hold terms, and the pairs are few of all.
        assert!(found > 0);
        assert!(pairs > 0 && pairs < ids.len() * ids.len() / 4, "{pairs} of {}", ids.len() * ids.len());
    }
}
