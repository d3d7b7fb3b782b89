//! Tests of the planner's decisions: the shared-memory layouts' bank patterns, and the plans
//! the paper's workloads (`mirage_ugraph::zoo`) get (values of [`KernelPlan`], not CUDA text).

use std::cell::RefCell;

use mirage_ugraph::zoo;

use super::layout::Layout;
use super::plan::{AttentionForm, AttentionVariant, KernelPlan, VNorm, VariantHooks};
use crate::{generate, Options, WsWarpgroups};

thread_local! {
    /// The plans `emit` made on this thread: (kernel name, the block plan; None for a register
    /// kernel).
    static PLANS: RefCell<Vec<(String, Option<KernelPlan>)>> = const { RefCell::new(Vec::new()) };
}

/// Records the plan of kernel `name` (None: a register kernel).
pub(super) fn record(name: &str, plan: Option<&KernelPlan>) {
    PLANS.with(|p| p.borrow_mut().push((name.to_string(), plan.cloned())));
}

/// The plans recorded on this thread since the last call, in order.
fn take_plans() -> Vec<(String, Option<KernelPlan>)> {
    PLANS.with(|p| std::mem::take(&mut *p.borrow_mut()))
}

/// Bank group (4 banks, 16 bytes) of 16-bit element `e` of a tile.
fn group(l: &Layout, e: usize) -> usize {
    (l.offset(e) * 2 / 16) % 8
}

/// Whether 16-bit elements `es` of a tile (8 accesses of 16 bytes) fall in 8 distinct bank
/// groups: one conflict-free shared-memory wavefront.
fn conflict_free(l: &Layout, es: impl Iterator<Item = usize>) -> bool {
    let mut g: Vec<usize> = es.map(|e| group(l, e)).collect();
    g.sort_unstable();
    g.dedup();
    g.len() == 8
}

#[test]
fn swizzled_narrow_rows_are_free_of_bank_conflicts() {
    for inner in [16, 32] {
        let l = Layout {
            inner,
            ld: inner,
            swz: Some(8),
            blocks: false,
            rows: 64,
            vector: true,
            staged: true,
            trans: false,
        };
        let chunks = inner / 8;
        for row0 in (0..64).step_by(8) {
            for c in 0..chunks {
                // ldmatrix: one chunk of 8 consecutive rows.
                let ldsm = (0..8).map(|r| (row0 + r) * inner + c * 8);
                assert!(conflict_free(&l, ldsm), "inner {inner}, rows {row0}.., chunk {c}");
            }
            // cp.async: a quarter warp's 8 consecutive 16-byte chunks (spanning rows).
            let copies = (0..8).map(|q| row0 * inner + q * 8);
            assert!(conflict_free(&l, copies), "inner {inner}, copies from row {row0}");
        }
        // A permutation of each row's elements.
        for row in 0..64 {
            let mut o: Vec<usize> = (0..inner).map(|c| l.offset(row * inner + c)).collect();
            o.sort_unstable();
            assert_eq!(o, (row * inner..(row + 1) * inner).collect::<Vec<_>>());
        }
    }
}

#[test]
fn wide_swizzled_rows_are_column_blocks_of_one_atom_each() {
    // [64, 256] as 4 blocks of [64, 64]: a permutation; each block is 8 KiB of its own,
    // and within a block every row's 8 chunks are XOR-swizzled by the row (conflict-free).
    let l =
        Layout { inner: 256, ld: 256, swz: Some(8), blocks: true, rows: 64, vector: true, staged: true, trans: false };
    let mut seen = vec![false; 64 * 256];
    for i in 0..64 * 256 {
        let o = l.offset(i);
        assert!(!seen[o], "element {i} shares offset {o}");
        seen[o] = true;
        let (row, col) = (i / 256, i % 256);
        assert_eq!(o / 4096, col / 64, "element {i} leaves its column block");
        assert_eq!((o % 4096) / 64, row, "element {i} leaves its row");
    }
    for blk in 0..4 {
        assert!(conflict_free(&l, (0..8).map(|r| r * 256 + blk * 64)), "block {blk}: one chunk of 8 rows");
    }
}

#[test]
fn wide_row_major_swizzled_rows_keep_each_line_whole_and_ldmatrix_conflict_free() {
    // [32, 256] row-major: every 128-byte segment of a row is a permutation of itself (a
    // copy of one global line fills one aligned shared line), and one chunk of any 8
    // consecutive rows (an ldmatrix phase) meets 8 distinct bank groups.
    for inner in [64, 128, 256] {
        let l = Layout {
            inner,
            ld: inner,
            swz: Some(8),
            blocks: false,
            rows: 32,
            vector: true,
            staged: true,
            trans: false,
        };
        for row in 0..32 {
            for seg in 0..inner / 64 {
                let mut o: Vec<usize> = (0..64).map(|c| l.offset(row * inner + seg * 64 + c)).collect();
                o.sort_unstable();
                let base = row * inner + seg * 64;
                assert_eq!(o, (base..base + 64).collect::<Vec<_>>(), "inner {inner} row {row} segment {seg}");
            }
        }
        for row0 in (0..32).step_by(8) {
            for c in 0..inner / 8 {
                let ldsm = (0..8).map(|r| (row0 + r) * inner + c * 8);
                assert!(conflict_free(&l, ldsm), "inner {inner}, rows {row0}.., chunk {c}");
            }
        }
    }
}

#[test]
fn padding_alone_cannot_serve_narrow_rows() {
    // The reason for the swizzle: with 64-byte rows at any 16-byte-multiple pitch, either an
    // ldmatrix phase or a quarter warp's copies hit a bank group twice.
    for pad in 0..8 {
        let l = Layout {
            inner: 32,
            ld: 32 + pad * 8,
            swz: None,
            blocks: false,
            rows: 64,
            vector: true,
            staged: true,
            trans: false,
        };
        let ldsm = conflict_free(&l, (0..8).map(|r| r * 32));
        let copies = conflict_free(&l, (0..8).map(|q| q * 8));
        assert!(!(ldsm && copies), "pitch {}", l.ld);
    }
}

/// The block plans of `g`'s customized kernels under `opts` (None: a register kernel).
pub(super) fn plans(g: &mirage_ugraph::KernelGraph, opts: &Options) -> Vec<Option<KernelPlan>> {
    let _ = take_plans();
    generate(g, opts).expect("generates");
    take_plans().into_iter().map(|(_, p)| p).collect()
}

/// The saved winner whose file name starts with `prefix` (the H200 suite's graphs in
/// `benches/gpu/results/h200-2026-11-29-s50/all-graphs`).
fn winner(prefix: &str) -> mirage_ugraph::KernelGraph {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/gpu/results/h200-2026-11-29-s50/all-graphs");
    let mut found = std::fs::read_dir(dir)
        .expect("the saved winners")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)));
    let path = found.next().expect("a saved winner of that name");
    assert!(found.next().is_none(), "one winner starts with {prefix}");
    mirage_ugraph::from_json(&std::fs::read_to_string(path).expect("readable")).expect("a graph")
}

/// The plan of the first customized kernel of saved winner `prefix` under `opts`.
fn winner_plan(prefix: &str, opts: &Options) -> KernelPlan {
    plans(&winner(prefix), opts).into_iter().next().flatten().expect("a block plan")
}

/// The attention variant of a plan that has one.
fn variant(p: &KernelPlan) -> AttentionVariant {
    p.attention.expect("an attention region")
}

#[test]
fn attention_winners_take_their_forms_on_sm_90() {
    let opts = Options::for_arch(90);
    // (winner, form, consumer warpgroups, interleaved, V marked full apart, halves, stages,
    // cluster, threads added)
    use AttentionForm::{Mma, WarpSpecialised as Ws, Wgmma};
    let table = [
        ("gqa_1_", Wgmma, 0, false, false, false, 4, [1, 1, 1], 0),
        ("gqa_8_", Ws, 2, true, true, true, 6, [1, 1, 2], 128),
        ("gqa_16_", Ws, 2, true, true, false, 6, [1, 1, 1], 128),
        ("mqa_1_", Wgmma, 0, false, false, false, 4, [1, 1, 1], 0),
        ("mqa_8_", Ws, 2, true, true, false, 6, [1, 1, 1], 128),
        ("mqa_16_", Ws, 2, false, false, false, 4, [1, 1, 1], 128),
        ("mha_1_", Mma, 0, false, false, false, 2, [1, 1, 1], 0),
        ("mha_16_", Mma, 0, false, false, false, 2, [1, 1, 1], 0),
        ("qknorm_gqa_1_", Ws, 3, true, false, false, 8, [1, 1, 8], 256),
        ("qknorm_gqa_8_", Ws, 3, true, false, true, 10, [1, 1, 2], 256),
        ("qknorm_gqa_16_", Ws, 3, true, false, false, 10, [1, 1, 1], 256),
    ];
    for (name, form, cwg, ilv, split_v, halves, stages, cluster, extra) in table {
        let p = winner_plan(name, &opts);
        let a = variant(&p);
        assert_eq!(
            (a.form, a.consumer_warpgroups, a.interleaved, a.split_v, a.halves),
            (form, cwg, ilv, split_v, halves),
            "{name}: {a:?}"
        );
        assert_eq!((p.stages, p.cluster_dims, p.extra_threads), (stages, cluster, extra), "{name}");
        // The wgmma step reads K a step ahead exactly where three stages or more allow it.
        assert_eq!(a.lookahead, form == Wgmma && stages >= 3, "{name}");
        // The warp-specialised loop and its mbarriers go together, one block an SM.
        assert_eq!(p.ws.is_some(), form == Ws, "{name}");
        if form == Ws {
            assert_eq!(p.min_blocks, Some(1), "{name}");
        }
        // An attention kernel lets the next kernel go at once.
        assert_eq!(p.late_launch, None, "{name}");
        // Three warpgroups without a cluster: the first warpgroup's warps read back the rows
        // each stored (64 columns, 16 rows a warp); every other form reads after a barrier.
        let own = (cwg == 3 && cluster == [1, 1, 1]).then_some(16 * 64);
        assert_eq!(p.own_rows, own, "{name}");
        assert!(p.smem_bytes <= mirage_ugraph::Target::for_arch(90).smem_per_block_optin, "{name}");
        // QK-norm: the consumers scale P by V's factors and the softmax applies Q's norm, both
        // as the hooks of one variant struct; the others take the plain variant.
        let qk = name.starts_with("qknorm");
        let (v_norm, hooks) =
            if qk { (VNorm::RowFactors, VariantHooks::QkNorm) } else { (VNorm::None, VariantHooks::Plain) };
        assert_eq!((a.v_norm, a.hooks), (v_norm, hooks), "{name}");
    }
}

#[test]
fn attention_winners_take_mma_sync_without_clusters_on_sm_80() {
    let opts = Options::for_arch(80);
    for name in ["gqa_1_", "gqa_8_", "mqa_16_", "mha_8_", "qknorm_gqa_1_", "qknorm_gqa_8_"] {
        let p = winner_plan(name, &opts);
        let a = variant(&p);
        assert_eq!((a.form, a.consumer_warpgroups, p.ws, p.extra_threads), (AttentionForm::Mma, 0, None, 0), "{name}");
        assert_eq!(p.cluster_dims, [1, 1, 1], "{name}");
        // A normalised V is normalised in place in its stage.
        let v_norm = if name.starts_with("qknorm") { VNorm::InPlace } else { VNorm::None };
        // ... by a pass of its own: the loop's variant stays the plain one.
        assert_eq!((a.v_norm, a.hooks), (v_norm, VariantHooks::Plain), "{name}");
    }
}

#[test]
fn the_warpgroup_count_follows_the_option() {
    // Auto: three where V is normalised; Two: never; Three: wherever the form applies (GQA's
    // 128-key loop then made twice as fine: 64-key stages).
    let with = |wgs: WsWarpgroups| Options { ws_warpgroups: wgs, ..Options::for_arch(90) };
    // QK-norm b=8 on two warpgroups: its 128-key loop with V normalised takes the wgmma step,
    // not the warp-specialised loop.
    let p = winner_plan("qknorm_gqa_8_", &with(WsWarpgroups::Two));
    let a = variant(&p);
    assert_eq!((a.form, a.consumer_warpgroups, p.extra_threads), (AttentionForm::Wgmma, 0, 0));
    assert_eq!((a.v_norm, a.hooks), (VNorm::InPlace, VariantHooks::Plain));
    let p = winner_plan("gqa_16_", &with(WsWarpgroups::Three));
    let a = variant(&p);
    assert_eq!((a.consumer_warpgroups, p.extra_threads), (3, 256));
    let auto = winner_plan("gqa_16_", &with(WsWarpgroups::Auto));
    assert_eq!(variant(&auto).consumer_warpgroups, 2);
}

#[test]
fn mlp_winners_split_their_loop_across_a_cluster_only_on_sm_90() {
    // (winner, cluster on sm_90, stages on sm_90)
    let table = [
        ("rmsnorm_linear_1_", [1, 2, 1], 3),
        ("rmsnorm_linear_8_", [1, 2, 1], 4),
        ("rmsnorm_linear_6144_8_", [1, 1, 1], 4),
        ("gated_mlp_1_", [1, 2, 1], 3),
        ("gated_mlp_16_", [1, 2, 1], 4),
        ("lora_8_", [1, 1, 1], 1),
    ];
    for (name, cluster, stages) in table {
        let p = winner_plan(name, &Options::for_arch(90));
        assert_eq!((p.cluster_dims, p.stages, p.attention, p.extra_threads), (cluster, stages, None, 0), "{name}");
        // A summing split merges its accumulators in one step after the loop.
        let merges = p.steps.iter().filter(|(_, st)| matches!(st, super::Step::ClusterMerge)).count();
        assert_eq!(merges, usize::from(cluster != [1, 1, 1]), "{name}");
        // A pipelined loop lets the next kernel go after its last copies.
        assert_eq!(p.late_launch.is_some(), stages >= 2, "{name}");
        // RMSNorm+Linear sums X's squares in registers on the tensor cores (`mi::RowSumAcc`).
        let rms_in_registers = p.row_sums.iter().flatten().any(|r| r.rms);
        assert_eq!(rms_in_registers, name.starts_with("rmsnorm_linear"), "{name}: {:?}", p.row_sums);
        let p80 = winner_plan(name, &Options::for_arch(80));
        assert_eq!(p80.cluster_dims, [1, 1, 1], "{name}");
    }
}

#[test]
fn the_paper_programs_get_their_kernel_forms() {
    // The zoo's hand-written µGraphs at batch 1 (their attention has no running max, so no
    // attention region; nTrans is a register kernel).
    for p in zoo::paper_workloads(1).expect("zoo") {
        for arch in [80, 90] {
            let ps = plans(&p.ugraph, &Options::for_arch(arch));
            assert!(!ps.is_empty(), "{}", p.name);
            match p.name.as_str() {
                "ntrans" => assert!(ps.iter().all(Option::is_none), "{}", p.name),
                _ => {
                    let first = ps[0].as_ref().expect("a block plan");
                    assert_eq!(first.attention, None, "{}", p.name);
                    // The loop kernels are pipelined; the summing ones split on sm_90.
                    let split = matches!(p.name.as_str(), "rmsnorm_linear" | "lora" | "gated_mlp") && arch == 90;
                    assert_eq!(first.cluster_dims, if split { [1, 2, 1] } else { [1, 1, 1] }, "{} sm{arch}", p.name);
                    assert!(first.stages >= 2, "{} sm{arch}", p.name);
                }
            }
        }
    }
}

#[test]
fn online_attention_of_the_zoo_takes_the_wgmma_form_across_a_cluster_on_sm_90() {
    // One group of 64 rows, 16 iterations of 128 keys (as a decode step): few blocks, so the
    // loop splits over a cluster of 8 with the wgmma form; sm_80 keeps the grid with mma.sync.
    let a = zoo::Attn { b: 8, h: 64, d: 64, s: 4096, splits: 1, frange: 16, qsplit: 1 };
    for (pair, v_norm) in [
        (zoo::attention_online(a, mirage_ugraph::DType::Float16), VNorm::None),
        (zoo::qknorm_attention_online(a, mirage_ugraph::DType::Float16), VNorm::InPlace),
    ] {
        let g = pair.expect("zoo").ugraph;
        let p90 = plans(&g, &Options::for_arch(90)).into_iter().next().flatten().expect("a block plan");
        let v = variant(&p90);
        assert_eq!((v.form, v.v_norm, p90.cluster_dims, p90.stages), (AttentionForm::Wgmma, v_norm, [1, 8, 1], 2));
        let p80 = plans(&g, &Options::for_arch(80)).into_iter().next().flatten().expect("a block plan");
        let v = variant(&p80);
        assert_eq!((v.form, v.v_norm, p80.cluster_dims), (AttentionForm::Mma, v_norm, [1, 1, 1]));
    }
}

#[test]
fn transposed_tiles_are_copied_down_their_columns() {
    use super::load::column_walk;
    // A [256, 32] tile of `W.T` (W [4096, 4096] row-major): rows along the device dim of
    // stride 1, so each 16-byte run goes down one column.
    assert_eq!(column_walk(&[256, 32], &[1, 4096], 8), Some((256, 32, 4096)));
    // With a leading dim of one (a batch of weights): the same walk, its stride aligned.
    assert_eq!(column_walk(&[1, 128, 64], &[4096 * 4096, 1, 4096], 8), Some((128, 64, 4096)));
    // Row-major tiles take the row copies; a column stride or row count off the 16-byte
    // runs, a second dim of more than one, or a single column take the element copies.
    assert_eq!(column_walk(&[256, 32], &[4096, 1], 8), None);
    assert_eq!(column_walk(&[256, 32], &[1, 4100], 8), None);
    assert_eq!(column_walk(&[4, 32], &[1, 4096], 8), None);
    assert_eq!(column_walk(&[2, 128, 64], &[64, 1, 4096], 8), None);
    assert_eq!(column_walk(&[256, 1], &[1, 4096], 8), None);
}

#[test]
fn a_transposed_layout_puts_each_column_in_a_padded_row() {
    // Tile element (r, c) of a [64, 48] tile at c * 72 + r: a one-to-one map into the 48 rows,
    // none in a row's 8 padding elements.
    let l = Layout { inner: 48, ld: 72, swz: None, blocks: false, rows: 64, vector: false, staged: true, trans: true };
    assert_eq!(l.elems(), 48 * 72);
    let mut seen = vec![false; l.elems()];
    for i in 0..64 * 48 {
        let (r, c) = (i / 48, i % 48);
        let o = l.offset(i);
        assert_eq!(o, c * 72 + r);
        assert!(o % 72 < 64 && !seen[o]);
        seen[o] = true;
    }
    assert_eq!(l.index("i"), "mi::tidx<48, 72>(i)");
}
