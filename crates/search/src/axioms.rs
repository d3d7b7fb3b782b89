//! The axioms of abstract expressions, in one place, and the saturation of a target's terms.
//!
//! All rules are equalities of the abstraction (docs/reference.md: search); none cancels terms.
//! `free(b)` is the set of indices `b` depends on ([`crate::expr::ExprAnalysis`]):
//!
//! | name | rule |
//! |------|------|
//! | `comm-add`, `comm-mul` | `a + b = b + a`, `a * b = b * a` |
//! | `assoc-add`, `assoc-mul` | `a + (b + c) = (a + b) + c`, same for `*` |
//! | `distribute` | `a * (b + c) = a * b + a * c` |
//! | `div-add` | `(a + b) / c = a / c + b / c` |
//! | `mul-div` | `a * (b / c) = (a * b) / c` |
//! | `div-div` | `(a / b) / c = a / (b * c)` |
//! | `sum-add` | `(sum i n (a + b)) = (sum i n a) + (sum i n b)` (sum-over-add) |
//! | `sum-mul` | `(sum i n (a * b)) = (sum i n a) * b` if `i` is not free in `b` (sum-of-product) |
//! | `sum-div` | `(sum i n (a / b)) = (sum i n a) / b` if `i` is not free in `b` (sum-of-quotient) |
//! | `sum-comm` | `(sum i n (sum j m x)) = (sum j m (sum i n x))` for `i != j` |
//! | `sum-merge` | `(sum i n (sum i m x)) = (sum i n*m x)` (sum-over-sum) |
//! | `sum-split` | `(sum i n x) = (sum i j (sum i n/j x))` for every factor `j` of the search (its franges and grid sizes) with `1 < j < n`, `j` dividing `n` (sum factorisation) |
//!
//! Saturation may stop at a node, iteration or time limit; a candidate whose term the
//! stopped e-graph lacks is then pruned although it might be equivalent (a false negative):
//! [`SaturationReport::limit_hit`] says whether that can have happened.

use std::time::{Duration, Instant};

use egg::{
    rewrite, Applier, Id, PatternAst, RecExpr, Rewrite, Runner, SimpleScheduler, StopReason, Subst, Symbol, Var,
};

use crate::expr::{index_bit, Expr, ExprAnalysis, ExprGraph};

/// Limits of one saturation.
#[derive(Debug, Clone, PartialEq)]
pub struct SaturationLimits {
    /// Most e-nodes.
    pub nodes: usize,
    /// Most rewrite iterations.
    pub iterations: usize,
    /// Most wall time.
    pub time: Duration,
}

impl Default for SaturationLimits {
    fn default() -> Self {
        SaturationLimits { nodes: 200_000, iterations: 30, time: Duration::from_secs(10) }
    }
}

/// What a saturation did.
#[derive(Debug, Clone, PartialEq)]
pub struct SaturationReport {
    /// Rewrite iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Why it stopped (`saturated`, or the limit hit).
    pub stop_reason: String,
    /// Whether a limit stopped it before saturation (pruning may then have false negatives).
    pub limit_hit: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// Every axiom; `factors` are the sizes `j` that `sum-split` may pull out of a sum.
pub fn rules(factors: &[u64]) -> Vec<Rewrite<Expr, ExprAnalysis>> {
    let mut factors: Vec<u64> = factors.iter().copied().filter(|&j| j > 1).collect();
    factors.sort_unstable();
    factors.dedup();
    let mut rs: Vec<Rewrite<Expr, ExprAnalysis>> =
        vec![rewrite!("comm-add"; "(+ ?a ?b)" => "(+ ?b ?a)"), rewrite!("comm-mul"; "(* ?a ?b)" => "(* ?b ?a)")];
    rs.extend(rewrite!("assoc-add"; "(+ ?a (+ ?b ?c))" <=> "(+ (+ ?a ?b) ?c)"));
    rs.extend(rewrite!("assoc-mul"; "(* ?a (* ?b ?c))" <=> "(* (* ?a ?b) ?c)"));
    rs.extend(rewrite!("distribute"; "(* ?a (+ ?b ?c))" <=> "(+ (* ?a ?b) (* ?a ?c))"));
    rs.extend(rewrite!("div-add"; "(/ (+ ?a ?b) ?c)" <=> "(+ (/ ?a ?c) (/ ?b ?c))"));
    rs.extend(rewrite!("mul-div"; "(* ?a (/ ?b ?c))" <=> "(/ (* ?a ?b) ?c)"));
    rs.extend(rewrite!("div-div"; "(/ (/ ?a ?b) ?c)" <=> "(/ ?a (* ?b ?c))"));
    rs.extend(rewrite!("sum-add"; "(sum ?i ?n (+ ?a ?b))" <=> "(+ (sum ?i ?n ?a) (sum ?i ?n ?b))"));
    rs.push(rewrite!("sum-mul"; "(sum ?i ?n (* ?a ?b))" => "(* (sum ?i ?n ?a) ?b)" if not_free("?i", "?b")));
    rs.push(rewrite!("sum-mul-rev"; "(* (sum ?i ?n ?a) ?b)" => "(sum ?i ?n (* ?a ?b))" if not_free("?i", "?b")));
    rs.push(rewrite!("sum-div"; "(sum ?i ?n (/ ?a ?b))" => "(/ (sum ?i ?n ?a) ?b)" if not_free("?i", "?b")));
    rs.push(rewrite!("sum-div-rev"; "(/ (sum ?i ?n ?a) ?b)" => "(sum ?i ?n (/ ?a ?b))" if not_free("?i", "?b")));
    rs.push(rewrite!("sum-comm"; "(sum ?i ?n (sum ?j ?m ?x))" => "(sum ?j ?m (sum ?i ?n ?x))" if distinct("?i", "?j")));
    rs.push(rewrite!("sum-merge"; "(sum ?i ?n (sum ?i ?m ?x))" => { SumMerge }));
    if !factors.is_empty() {
        rs.push(rewrite!("sum-split"; "(sum ?i ?n ?x)" => { SumSplit { factors } }));
    }
    rs
}

fn var(name: &str) -> Var {
    name.parse().expect("pattern variables are valid")
}

/// Condition: index `i` is not free in `b`.
fn not_free(i: &str, b: &str) -> impl Fn(&mut ExprGraph, Id, &Subst) -> bool {
    let (i, b) = (var(i), var(b));
    move |eg: &mut ExprGraph, _, s: &Subst| match eg[s[i]].data.index {
        Some(ix) => eg[s[b]].data.free & index_bit(ix) == 0,
        None => false,
    }
}

/// Condition: two index classes differ.
fn distinct(i: &str, j: &str) -> impl Fn(&mut ExprGraph, Id, &Subst) -> bool {
    let (i, j) = (var(i), var(j));
    move |eg: &mut ExprGraph, _, s: &Subst| eg.find(s[i]) != eg.find(s[j])
}

fn size_of(egraph: &ExprGraph, id: Id) -> Option<u64> {
    egraph[id].data.size
}

/// `(sum i n (sum i m x)) => (sum i n*m x)`.
#[derive(Debug, Clone)]
struct SumMerge;

impl Applier<Expr, ExprAnalysis> for SumMerge {
    fn apply_one(
        &self,
        egraph: &mut ExprGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Expr>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let (Some(n), Some(m)) = (size_of(egraph, subst[var("?n")]), size_of(egraph, subst[var("?m")])) else {
            return vec![];
        };
        let size = egraph.add(Expr::Num(n * m));
        let s = egraph.add(Expr::Sum([subst[var("?i")], size, subst[var("?x")]]));
        if egraph.union(eclass, s) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}

/// `(sum i n x) => (sum i j (sum i n/j x))` for each factor `j`.
#[derive(Debug, Clone)]
struct SumSplit {
    factors: Vec<u64>,
}

impl Applier<Expr, ExprAnalysis> for SumSplit {
    fn apply_one(
        &self,
        egraph: &mut ExprGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Expr>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let Some(n) = size_of(egraph, subst[var("?n")]) else { return vec![] };
        let (i, x) = (subst[var("?i")], subst[var("?x")]);
        let mut changed = vec![];
        for &j in &self.factors {
            if j >= n || n % j != 0 {
                continue;
            }
            let inner_n = egraph.add(Expr::Num(n / j));
            let inner = egraph.add(Expr::Sum([i, inner_n, x]));
            let outer_n = egraph.add(Expr::Num(j));
            let outer = egraph.add(Expr::Sum([i, outer_n, inner]));
            if egraph.union(eclass, outer) {
                changed.push(eclass);
            }
        }
        changed
    }
}

/// Saturates `terms` under [`rules`] (`analysis` knows the inputs' free indices); returns the e-graph, the root class of each term, and a report.
pub fn saturate(
    terms: &[RecExpr<Expr>],
    analysis: ExprAnalysis,
    factors: &[u64],
    limits: &SaturationLimits,
) -> (ExprGraph, Vec<Id>, SaturationReport) {
    let start = Instant::now();
    let mut runner: Runner<Expr, ExprAnalysis> = Runner::new(analysis)
        .with_explanations_disabled()
        .with_scheduler(SimpleScheduler)
        .with_node_limit(limits.nodes)
        .with_iter_limit(limits.iterations)
        .with_time_limit(limits.time);
    for t in terms {
        runner = runner.with_expr(t);
    }
    let runner = runner.run(&rules(factors));
    let stop = runner.stop_reason.clone().unwrap_or(StopReason::Saturated);
    let mut egraph = runner.egraph;
    egraph.rebuild();
    let roots = runner.roots.iter().map(|&r| egraph.find(r)).collect();
    let report = SaturationReport {
        iterations: runner.iterations.len(),
        nodes: egraph.total_number_of_nodes(),
        classes: egraph.number_of_classes(),
        stop_reason: match &stop {
            StopReason::Saturated => "saturated".to_string(),
            StopReason::IterationLimit(n) => format!("iteration limit ({n})"),
            StopReason::NodeLimit(n) => format!("node limit ({n})"),
            StopReason::TimeLimit(t) => format!("time limit ({t:.1} s)"),
            StopReason::Other(s) => s.clone(),
        },
        limit_hit: !matches!(stop, StopReason::Saturated),
        elapsed: start.elapsed(),
    };
    (egraph, roots, report)
}
