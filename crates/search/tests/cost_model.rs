//! The static cost model ranks fused µGraphs above the unfused program and candidates best first.

use mirage_search::cost::{kernel_graph_cost, CostModel};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{zoo, DType};

#[test]
fn fused_rmsnorm_linear_is_cheaper_than_the_program() {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo");
    let m = CostModel::default();
    let plain = kernel_graph_cost(&pair.reference, &m);
    let r = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    let best = r.best().expect("a candidate");
    assert_eq!(best.cost, kernel_graph_cost(&best.graph, &m));
    let fused = best.cost;
    // The zoo's 64-block grid fills under half of 132 SMs: the model prefers more blocks.
    let zoo_cost = kernel_graph_cost(&pair.ugraph, &m);
    assert!(fused.est_us <= zoo_cost.est_us);
    assert_eq!(plain.launches, 2);
    assert_eq!(fused.launches, 1);
    assert!(fused.est_us < plain.est_us, "fused {fused:?} vs plain {plain:?}");
    assert!(fused.shared_memory > 0 && fused.shared_memory <= 96 * 1024);
    assert!(fused.dram_bytes < plain.dram_bytes, "Y never goes to device memory");
    // W dominates: 32 MiB read once.
    assert!(fused.dram_bytes >= 4096 * 4096 * 2);
}

#[test]
fn candidates_are_sorted_cheapest_first() {
    let pair = zoo::gated_mlp(8, 1024, 1024, 16, 16, DType::Float16).expect("zoo");
    let r = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    assert!(r.candidates.len() > 1);
    for w in r.candidates.windows(2) {
        assert!(w[0].cost.est_us <= w[1].cost.est_us);
    }
}
