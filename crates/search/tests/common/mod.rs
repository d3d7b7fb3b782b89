//! Helpers shared by the search's integration tests: structure queries on found µGraphs.
#![allow(dead_code)]

use mirage_search::{Candidate, SearchResult};
use mirage_ugraph::{Accum, BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, Phase};

/// The customized kernels of a graph, in order.
pub fn kernels(g: &KernelGraph) -> Vec<&BlockGraph> {
    g.ops
        .iter()
        .filter_map(|o| match &o.kind {
            KernelOpKind::Customized { graph } => Some(graph),
            _ => None,
        })
        .collect()
}

/// Number of kernel launches (predefined ops and customized kernels).
pub fn launches(g: &KernelGraph) -> usize {
    g.ops.iter().filter(|o| !matches!(o.kind, KernelOpKind::Input { .. })).count()
}

/// The best verified candidate, with a readable failure otherwise.
pub fn best(r: &SearchResult) -> &Candidate {
    r.best().unwrap_or_else(|| panic!("no verified candidate: {:?}; stats {:?}", r.empty_reason, r.stats))
}

/// Accumulators of a block graph with the input they accumulate.
pub fn accumulators(bg: &BlockGraph) -> Vec<(Accum, usize)> {
    bg.ops
        .iter()
        .filter_map(|o| match o.kind {
            BlockOpKind::ForloopAccum { acc, .. } => Some((acc, o.inputs[0])),
            _ => None,
        })
        .collect()
}

/// Whether stensor `t` is produced by a block input op.
pub fn is_input(bg: &BlockGraph, t: usize) -> bool {
    bg.ops.iter().any(|o| matches!(o.kind, BlockOpKind::Input { .. }) && o.outputs.contains(&t))
}

/// The op producing stensor `t`.
pub fn producer(bg: &BlockGraph, t: usize) -> &BlockOpKind {
    &bg.ops.iter().find(|o| o.outputs.contains(&t)).expect("every stensor has a producer").kind
}

/// Whether stensor `t` is computed after the for-loop.
pub fn is_post(bg: &BlockGraph, t: usize) -> bool {
    bg.tensors[t].phase == Phase::Post
}

/// One-line description of a candidate for assertion messages.
pub fn describe(g: &KernelGraph) -> String {
    let mut s = String::new();
    for o in &g.ops {
        match &o.kind {
            KernelOpKind::Input { .. } => {}
            KernelOpKind::Customized { graph } => {
                s.push_str(&format!("[grid {:?} loop {}:", graph.grid_dim, graph.forloop_range));
                for b in &graph.ops {
                    s.push_str(&format!(" {}{:?}", b.kind.name(), b.inputs));
                }
                s.push_str("] ");
            }
            k => s.push_str(&format!("{}{:?} ", k.name(), o.inputs)),
        }
    }
    s
}
