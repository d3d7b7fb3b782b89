//! The pruning oracle: the target's saturated e-graph, frozen and shared read-only by every
//! search thread.
//!
//! A candidate tensor survives only if its term is in the e-graph. The search checks a new
//! tensor with one hash-consed lookup of its top node (children are the e-classes of its
//! operands, already found), which is exactly `EGraph::lookup_expr` on its whole term; the
//! e-graph's memo is the cache keyed by term hash. [`ExprOracle::contains`] checks a whole
//! `RecExpr` (tests, the Theorem-1 check).

use egg::{Id, RecExpr};
use mirage_ugraph::KernelGraph;

use crate::axioms::{saturate, SaturationLimits, SaturationReport};
use crate::error::{Result, SearchError};
use crate::expr::{input_var, output_terms, Expr, ExprAnalysis, ExprGraph, Lookup, Sink};
use crate::labels::{analyze, propagate, Label, LabelInfo};

/// The saturated e-graph of a reference program's output terms.
pub struct ExprOracle {
    egraph: ExprGraph,
    targets: Vec<Id>,
    inputs: Vec<Option<Id>>,
    report: SaturationReport,
}

const _: () = {
    const fn sync<T: Sync + Send>() {}
    sync::<ExprOracle>();
};

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
        ExprOracle { egraph, targets, inputs, report }
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
