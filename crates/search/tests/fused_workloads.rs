//! The other workloads of the paper (docs/reference.md: workloads) at the paper's shapes, batch 1:
//! LoRA and nTrans in one kernel; GQA, MHA and MQA in at most two kernels with no attention
//! matrix in device memory; QKNorm with the norms inside the attention kernels. Each found
//! µGraph also runs on the CPU interpreter against the reference.

mod common;

use common::{best, describe, kernels, launches};
use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{random_inputs, run, zoo, BlockOpKind, KernelGraph};

fn workload(name: &str) -> zoo::Pair {
    zoo::paper_workloads(1).expect("zoo builds").into_iter().find(|p| p.name == name).expect("known workload")
}

/// Searches, then checks on the CPU interpreter that the best µGraph computes the reference's
/// values on random inputs at the paper's shapes.
fn search(p: &zoo::Pair) -> KernelGraph {
    let r = superoptimize(&p.reference, &SearchConfig::default()).expect("search runs");
    eprintln!("{}: {:?}", p.name, r.stats);
    let c = best(&r);
    eprintln!("{}: best {:.2} us, {} launch(es), {:?}", p.name, c.cost.est_us, c.cost.launches, c.verification);
    assert_same_values(p, &c.graph);
    c.graph.clone()
}

fn assert_same_values(p: &zoo::Pair, g: &KernelGraph) {
    let inputs = random_inputs(&p.reference, 0x2545_f491);
    let want = run(&p.reference, &inputs).expect("reference runs");
    let got = run(g, &inputs).expect("found µGraph runs");
    for (w, o) in want.iter().zip(&got) {
        let num: f64 = w.data.iter().zip(&o.data).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = w.data.iter().map(|a| (*a as f64).powi(2)).sum();
        assert!((num / den).sqrt() < 1e-4, "{}: relative error {} on the CPU", p.name, (num / den).sqrt());
    }
}

/// No device tensor of the attention matrix's size (queries x keys per batch).
fn assert_no_score_matrix(p: &zoo::Pair, g: &KernelGraph) {
    let q = &p.reference.tensors[p.reference.input_ids()[0]].dims;
    let k = &p.reference.tensors[p.reference.input_ids()[1]].dims;
    let scores: usize = q[0] * q[1] * k[2];
    let inputs = g.input_ids();
    for (i, t) in g.tensors.iter().enumerate().filter(|(i, _)| !inputs.contains(i)) {
        let n: usize = t.dims.iter().product();
        assert!(n < scores, "tensor {i} of dims {:?} is as large as the scores: {}", t.dims, describe(g));
    }
}

#[test]
fn lora_one_kernel() {
    let g = search(&workload("lora"));
    assert_eq!(launches(&g), 1, "{}", describe(&g));
}

#[test]
fn ntrans_one_kernel() {
    let g = search(&workload("ntrans"));
    assert_eq!(launches(&g), 1, "{}", describe(&g));
}

#[test]
#[cfg_attr(debug_assertions, ignore = "paper-sized attention search: run with --release")]
fn gqa_at_most_two_kernels_without_scores_in_memory() {
    let p = workload("gqa");
    let g = search(&p);
    assert!(launches(&g) <= 2 && kernels(&g).len() == launches(&g), "{}", describe(&g));
    assert_no_score_matrix(&p, &g);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "paper-sized attention search: run with --release")]
fn mha_at_most_two_kernels_without_scores_in_memory() {
    let p = workload("mha");
    let g = search(&p);
    assert!(launches(&g) <= 2 && kernels(&g).len() == launches(&g), "{}", describe(&g));
    assert_no_score_matrix(&p, &g);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "paper-sized attention search: run with --release")]
fn mqa_at_most_two_kernels_without_scores_in_memory() {
    let p = workload("mqa");
    let g = search(&p);
    assert!(launches(&g) <= 2 && kernels(&g).len() == launches(&g), "{}", describe(&g));
    assert_no_score_matrix(&p, &g);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "paper-sized attention search: run with --release")]
fn qknorm_norms_inside_the_attention_kernels() {
    let p = workload("qknorm_gqa");
    let g = search(&p);
    assert!(launches(&g) <= 2 && kernels(&g).len() == launches(&g), "{}", describe(&g));
    assert_no_score_matrix(&p, &g);
    let is_norm = |k: &BlockOpKind| {
        matches!(k, BlockOpKind::RmsNorm { .. } | BlockOpKind::ForloopAccum { acc: mirage_ugraph::Accum::Rms, .. })
    };
    let norms: usize = kernels(&g).iter().map(|k| k.ops.iter().filter(|o| is_norm(&o.kind)).count()).sum();
    assert_eq!(norms, 2, "both norms run inside the kernels: {}", describe(&g));
}

/// Whether some candidate of a search over `heads` heads (default settings but the loop
/// range, and `max_full_split` if given) has a kernel with one block per head: grid x of
/// `heads` blocks over the head dim of its inputs.
fn offers_one_head_per_block(heads: usize, max_full_split: Option<usize>) -> bool {
    let a = zoo::Attn { b: heads, h: 16, d: 16, s: 256, splits: 1, frange: 4, qsplit: 1 };
    let p = zoo::attention(a, false, mirage_ugraph::DType::Float16).expect("zoo");
    let mut cfg = SearchConfig { franges: Some(vec![4]), ..SearchConfig::default() };
    if let Some(m) = max_full_split {
        cfg.max_full_split = m;
    }
    let r = superoptimize(&p.reference, &cfg).expect("search runs");
    any_block_graph(&r, |bg| {
        bg.grid_dim[0] == heads
            && bg
                .ops
                .iter()
                .any(|o| matches!(&o.kind, BlockOpKind::Input { dims, imap, .. } if dims[0] == heads && imap[0] == 0))
    })
}

#[test]
fn an_index_of_a_grid_size_is_split_fully() {
    // 128 heads, above `max_full_split` but one of `grid_sizes`: one block per head is offered.
    let cfg = SearchConfig::default();
    assert!(cfg.grid_sizes.contains(&128) && !cfg.grid_sizes.contains(&512));
    assert!(offers_one_head_per_block(128, Some(64)), "128 heads, max_full_split 64");
}

#[test]
fn an_index_up_to_max_full_split_is_split_fully() {
    // 512 heads (MHA at b = 16), not a grid size: one block per head only within
    // `max_full_split`, which by default reaches it.
    assert!(SearchConfig::default().max_full_split >= 512);
    assert!(offers_one_head_per_block(512, None), "512 heads, default max_full_split");
    assert!(!offers_one_head_per_block(512, Some(256)), "512 heads, max_full_split 256");
}

/// Whether any customized kernel of any candidate satisfies `pred`.
fn any_block_graph(r: &mirage_search::SearchResult, pred: impl Fn(&mirage_ugraph::BlockGraph) -> bool) -> bool {
    r.candidates.iter().any(|c| kernels(&c.graph).into_iter().any(&pred))
}

#[test]
fn a_small_loop_free_grid_also_gets_wide_blocks() {
    // nTrans at one row: one block, no loop. It is latency-bound, and 512 threads ran it in
    // 1.9 µs on an H100 against 2.7 µs with 256, so the default block shapes gain 512 there.
    let p = zoo::ntrans(1, 4096, mirage_ugraph::DType::Float16).expect("zoo");
    let wide = |bg: &mirage_ugraph::BlockGraph| bg.block_dim[0] == 512 && bg.forloop_range == 1;
    let r = superoptimize(&p.reference, &SearchConfig::default()).expect("search runs");
    assert!(any_block_graph(&r, wide), "no 512-thread block among {} candidates", r.candidates.len());
    // Block shapes the user names are kept as given.
    let cfg = SearchConfig { blockdims: Some(vec![[128, 1, 1]]), ..SearchConfig::default() };
    let r = superoptimize(&p.reference, &cfg).expect("search runs");
    assert!(!r.candidates.is_empty());
    assert!(!any_block_graph(&r, |bg| bg.block_dim[0] != 128), "a block shape the user did not name");
}

#[test]
fn an_index_of_three_times_a_power_of_two_gets_a_one_wave_grid() {
    // 6144 columns: 96 blocks of 64 columns (one wave on 132 SMs) besides the powers of two.
    let p = zoo::rmsnorm_linear(2, 256, 6144, 128, 4, mirage_ugraph::DType::Float16).expect("zoo");
    let cfg = SearchConfig { franges: Some(vec![4]), ..SearchConfig::default() };
    let r = superoptimize(&p.reference, &cfg).expect("search runs");
    assert!(
        any_block_graph(&r, |bg| bg.grid_dim[0] == 96 || bg.grid_dim[1] == 96),
        "no 96-block grid among {} candidates",
        r.candidates.len()
    );
}

#[test]
#[cfg_attr(debug_assertions, ignore = "attention search: run with --release")]
fn an_attention_block_is_bounded_by_its_live_tiles_not_their_sum() {
    // QK-norm attention, 128 query rows of 64 per head. Two blocks of 64 rows per head (grid
    // size 2 on the rows) with 128 keys an iteration: its tiles sum past 96 KiB, but the
    // scores, exponentials and normalised tiles are not all live at once (the H100 ran the
    // paper-sized form of two warpgroups, 128 rows a block, at 34.4 µs against 38.7 for
    // the best of blocks of one).
    let a = zoo::Attn { b: 4, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 1 };
    let p = zoo::qknorm_attention_online(a, mirage_ugraph::DType::Float16).expect("zoo");
    let cfg = SearchConfig { franges: Some(vec![8]), max_block_ops: 13, ..SearchConfig::default() };
    assert!(cfg.grid_sizes.contains(&2));
    let r = superoptimize(&p.reference, &cfg).expect("search runs");
    let kept = |bg: &mirage_ugraph::BlockGraph| {
        bg.grid_dim[1] == 2
            && bg.forloop_range == 8
            && bg.shared_memory_upper_bound() > cfg.shared_memory_limit
            && bg.shared_memory_peak() <= cfg.shared_memory_limit
    };
    assert!(any_block_graph(&r, kept), "no two-row-block kernel over the sum among {} candidates", r.candidates.len());
    for c in &r.candidates {
        for bg in kernels(&c.graph) {
            assert!(bg.shared_memory_peak() <= cfg.shared_memory_limit, "{}", describe(&c.graph));
        }
    }
}
