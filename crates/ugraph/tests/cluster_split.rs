//! The thread-block-cluster form of loops whose grid leaves SMs idle (`BlockGraph::cluster_split`).

use mirage_ugraph::target::Budgets;
use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{BlockGraph, BlockOpKind, DType, KernelGraph, KernelOpKind, Target};

const H100: Target = Target::sm90();

/// The first customized kernel's block graph.
fn first_block_graph(g: &KernelGraph) -> BlockGraph {
    g.ops
        .iter()
        .find_map(|op| match &op.kind {
            KernelOpKind::Customized { graph } => Some(graph.clone()),
            _ => None,
        })
        .expect("a customized op")
}

#[test]
fn a_small_matmul_grid_splits_its_loop_across_clusters_of_eight() {
    // 15 blocks of 16 iterations: 8 blocks per cluster along the free axis y, 2 iterations
    // each; X's and W's tiles follow the loop's dim along y, the output is one per cluster.
    let p = zoo::rmsnorm_linear(2, 4096, 3840, 15, 16, DType::Float16).expect("zoo");
    let bg = first_block_graph(&p.ugraph);
    let (axis, cs, g) = bg.cluster_split(&H100).expect("a cluster form");
    assert_eq!((axis, cs, g.grid_dim, g.forloop_range), (1, 8, [15, 8, 1], 2));
    for op in &g.ops {
        match op.kind {
            BlockOpKind::Input { imap, forloop_dim, .. } => assert_eq!(imap[1], forloop_dim),
            BlockOpKind::Output { omap, .. } => assert_eq!(omap[1], -1),
            _ => {}
        }
    }
    // The tiles are the original ones.
    let dims = |g: &BlockGraph| g.tensors.iter().map(|t| t.dims.clone()).collect::<Vec<_>>();
    assert_eq!(dims(&g), dims(&bg));
}

#[test]
fn grids_that_fill_the_gpu_or_short_loops_keep_their_form() {
    let full = zoo::rmsnorm_linear(2, 4096, 4096, 128, 16, DType::Float16).expect("zoo");
    assert!(first_block_graph(&full.ugraph).cluster_split(&H100).is_none());
    // 64 blocks of 2 iterations: a split would leave one iteration per block.
    let short = zoo::rmsnorm_linear(2, 4096, 4096, 64, 2, DType::Float16).expect("zoo");
    assert!(first_block_graph(&short.ugraph).cluster_split(&H100).is_none());
    // 64 blocks of 16 iterations: clusters of two.
    let half = zoo::rmsnorm_linear(2, 4096, 4096, 64, 16, DType::Float16).expect("zoo");
    assert_eq!(first_block_graph(&half.ugraph).cluster_split(&H100).map(|(_, cs, _)| cs), Some(2));
    // 16 blocks: 128 in clusters of 8 would not all be resident at once; 64 in clusters of 4.
    let sixteen = zoo::rmsnorm_linear(2, 4096, 4096, 16, 16, DType::Float16).expect("zoo");
    let split = first_block_graph(&sixteen.ugraph).cluster_split(&H100);
    assert_eq!(split.map(|(_, cs, g)| (cs, g.num_blocks())), Some((4, 64)));
}

#[test]
fn attention_splits_only_without_key_splits_across_the_grid() {
    // Keys split over grid y (4 blocks per head): no cluster form.
    let a = Attn { b: 2, h: 64, d: 64, s: 2048, splits: 4, frange: 8, qsplit: 1 };
    assert!(first_block_graph(&zoo::attention_online(a, DType::Float16).expect("zoo").ugraph)
        .cluster_split(&H100)
        .is_none());
    // One block per head: its loop over 4 blocks (8 iterations, 2 each).
    let one = Attn { splits: 1, ..a };
    let bg = first_block_graph(&zoo::attention_online(one, DType::Float16).expect("zoo").ugraph);
    let (axis, cs, g) = bg.cluster_split(&H100).expect("a cluster form");
    assert_eq!((axis, cs, g.grid_dim, g.forloop_range), (1, 4, [2, 4, 1], 2));
    // A loop-free or element-wise kernel (the split-KV combine) never splits.
    let g = zoo::combine(8, 128, DType::Float16, false).expect("zoo");
    assert!(first_block_graph(&g).cluster_split(&H100).is_none());
}

#[test]
fn cluster_splits_can_be_capped() {
    // The code generator retries with smaller clusters: `cluster_split_within(n)` picks the
    // largest split of at most n blocks under the same rule, and none below two.
    let one = Attn { b: 1, h: 128, d: 64, s: 4096, splits: 1, frange: 16, qsplit: 1 };
    let bg = first_block_graph(&zoo::attention_online(one, DType::Float16).expect("zoo").ugraph);
    assert_eq!(bg.cluster_split(&H100).map(|(_, cs, _)| cs), Some(8));
    let (axis, cs, g) = bg.cluster_split_within(7, &H100).expect("a cluster form");
    assert_eq!((cs, g.grid_dim[axis], g.forloop_range), (4, 4, 4));
    assert!(bg.cluster_split_within(1, &H100).is_none());
}

#[test]
fn the_target_bounds_clusters_and_their_grid() {
    let one = Attn { b: 2, h: 64, d: 64, s: 2048, splits: 1, frange: 8, qsplit: 1 };
    let bg = first_block_graph(&zoo::attention_online(one, DType::Float16).expect("zoo").ugraph);
    assert!(bg.cluster_split(&H100).is_some());
    // No clusters on sm_80.
    assert!(bg.cluster_split(&Target::sm80()).is_none());
    // 64 blocks of 16 iterations split in two only where a wave holds 128 blocks.
    let half = first_block_graph(&zoo::rmsnorm_linear(2, 4096, 4096, 64, 16, DType::Float16).expect("zoo").ugraph);
    let small = Target { budgets: Budgets { one_wave_blocks: 100, ..H100.budgets }, ..H100 };
    assert!(half.cluster_split(&small).is_none());
}
