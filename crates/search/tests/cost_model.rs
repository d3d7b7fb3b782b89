//! The static cost model ranks fused µGraphs above the unfused program and candidates best first.

use mirage_search::cost::{block_graph_cost, kernel_graph_cost, CostModel};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{zoo, DType, Target};

const H100: Target = Target::sm90();

#[test]
fn fused_rmsnorm_linear_is_cheaper_than_the_program() {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo");
    let m = CostModel::default();
    let plain = kernel_graph_cost(&pair.reference, &m, &H100);
    let r = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    let best = r.best().expect("a candidate");
    assert_eq!(best.cost, kernel_graph_cost(&best.graph, &m, &H100));
    let fused = best.cost;
    // The zoo's 64-block grid fills under half of an H100's SMs: the model prefers more blocks.
    let zoo_cost = kernel_graph_cost(&pair.ugraph, &m, &H100);
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

#[test]
fn small_grids_are_priced_as_their_cluster_split() {
    // 15 blocks of 16 iterations run as 120 blocks in clusters of 8 (the code generator's
    // form): priced as that grid plus the merge, with the output written once.
    let m = CostModel::default();
    let p = zoo::rmsnorm_linear(2, 4096, 3840, 15, 16, DType::Float16).expect("zoo");
    let bg = p
        .ugraph
        .ops
        .iter()
        .find_map(|op| match &op.kind {
            mirage_ugraph::KernelOpKind::Customized { graph } => Some(graph.clone()),
            _ => None,
        })
        .expect("a customized op");
    let (_, cs, split) = bg.cluster_split(&H100).expect("a cluster form");
    assert_eq!((cs, split.num_blocks()), (8, 120));
    let c = block_graph_cost(&bg, &m, &H100);
    let s = block_graph_cost(&split, &m, &H100);
    // Within the time of the split graph's seven extra output copies (108 KB).
    assert!((c.est_us - s.est_us - m.cluster_merge_us).abs() < 0.05, "{c:?} vs {s:?}");
    let (x, w, out) = (2 * 4096 * 2, 4096 * 3840 * 2, 2 * 3840 * 2);
    assert_eq!(c.dram_bytes, x + w + out);
    assert_eq!(s.dram_bytes, x + w + cs as u64 * out);
}
