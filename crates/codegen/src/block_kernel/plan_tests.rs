//! Tests of the block kernel plans' decisions in the schedule's cases: pipelines, layouts,
//! register accumulators, attention variants, cluster splits and merges, epilogues, asserted on
//! [`KernelPlan`] values (`crates/codegen/tests/schedule.rs` holds the golden kernel sources and
//! the checks of emission order).

use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph, STensorId, Target};

use super::layout::Layout;
use super::plan::{AttentionForm, KernelPlan, RowSums, VNorm};
use super::tests::plans;
use super::{Section, Step};
use crate::program::Storage;
use crate::{generate, Options};

const F16: DType = DType::Float16;

/// The plan of the first customized kernel of `g` under `opts`.
fn plan_with(g: &KernelGraph, opts: &Options) -> KernelPlan {
    plans(g, opts).into_iter().flatten().next().expect("a block plan")
}

/// [`plan_with`] the preset options of `arch`.
fn plan(g: &KernelGraph, arch: u32) -> KernelPlan {
    plan_with(g, &Options::for_arch(arch))
}

/// Attention with 64 heads of 64 over 1024 keys, 4 KV splits of 4 iterations.
fn attn() -> Attn {
    Attn { b: 2, h: 64, d: 64, s: 1024, splits: 4, frange: 4, qsplit: 1 }
}

/// The layout of tile `t`.
fn layout(p: &KernelPlan, t: STensorId) -> Layout {
    p.layout[t].unwrap_or_else(|| panic!("tile {t} has no layout: {:?}", p.layout))
}

/// The steps of section `sec`.
fn steps_in(p: &KernelPlan, sec: Section) -> Vec<Step> {
    p.steps.iter().filter(|(s, _)| *s == sec).map(|&(_, st)| st).collect()
}

/// The byte range of tile `t`'s shared-memory buffer.
fn buffer(p: &KernelPlan, t: STensorId) -> (usize, usize) {
    let b = &p.buffers[p.buf_of[t].unwrap_or_else(|| panic!("tile {t} has no buffer"))];
    (b.offset, b.offset + b.size)
}

/// A padded layout (no swizzle) of `rows` rows of `inner` elements at pitch `ld`.
fn padded(rows: usize, inner: usize, ld: usize, staged: bool) -> Layout {
    Layout { inner, ld, swz: None, blocks: false, rows, vector: true, staged, trans: false }
}

/// An unpadded layout whose 16-byte chunks are swizzled by the row (`mi::swz<inner, 8>`).
fn swizzled(rows: usize, inner: usize, staged: bool) -> Layout {
    Layout { inner, ld: inner, swz: Some(8), blocks: false, rows, vector: true, staged, trans: false }
}

#[test]
fn a_streaming_loop_pipelines_its_tiles_and_sums_in_registers() {
    // RMSNorm + Linear, 16 iterations: X and W tiles staged 4 deep with 16-byte copies, W's
    // (read once) with the L2 policy evict_first; the next kernel may go in iteration 12,
    // after the last copies. X W and X's sums of squares are register accumulators (no tile
    // matmul in the loop); W's rows of 64 bytes are swizzled, X's two rows padded.
    let p = plan(&zoo::rmsnorm_linear(2, 4096, 4096, 128, 16, F16).expect("zoo").ugraph, 90);
    assert_eq!((p.stages, p.evict_first, p.late_launch), (4, true, Some(12)));
    assert_eq!(layout(&p, 0), padded(2, 256, 264, true));
    assert_eq!(layout(&p, 1), swizzled(256, 32, true));
    let rs = RowSums { rows: 2, len: 256, ld: 264, storage: Storage::F16, swizzled: false, blocks: false, rms: true };
    assert_eq!(p.row_sums[4], Some(rs));
    let in_loop = steps_in(&p, Section::Loop);
    assert!(in_loop.contains(&Step::MatAcc { op: 2, acc: 3 }), "{in_loop:?}");
    assert!(!in_loop.iter().any(|s| matches!(s, Step::Matmul { .. } | Step::Reduce { .. })), "{in_loop:?}");
}

#[test]
fn tensor_core_operands_are_swizzled_or_padded_against_bank_conflicts() {
    // W tile [256, 64] fp16: rows of 128 bytes, swizzled; X [16, 256] too, and the rms
    // accumulator reads X through the swizzle.
    let p = plan(&zoo::rmsnorm_linear(16, 4096, 4096, 64, 16, F16).expect("zoo").ugraph, 90);
    assert_eq!((layout(&p, 0), layout(&p, 1)), (swizzled(16, 256, true), swizzled(256, 64, true)));
    assert!(p.row_sums[4].is_some_and(|r| r.swizzled && r.rms), "{:?}", p.row_sums);
    // The matmul's finish adds its 4 K slices through 16 KiB of scratch ([16, 64] sums: 4
    // slices x 8 fragments x 32 lanes x 16 bytes).
    assert_eq!(p.acc_scratch[3].map(|(_, bytes)| bytes), Some(16384));
    // W tile [256, 48]: rows of 96 bytes, not whole lines, get 16 bytes of padding (pitch 56).
    let p = plan(&zoo::rmsnorm_linear(16, 4096, 6144, 128, 16, F16).expect("zoo").ugraph, 90);
    assert_eq!((layout(&p, 0), layout(&p, 1)), (swizzled(16, 256, true), padded(256, 48, 56, true)));
}

#[test]
fn exp_tiles_stay_fp32_unless_the_running_max_bounds_them() {
    // Plain attention (exp without the max subtracted) keeps P in fp32: fp16 would overflow
    // for logits above ~11.
    let p = plan(&zoo::attention(attn(), false, F16).expect("zoo").ugraph, 90);
    let at = p.steps.iter().position(|&(_, s)| matches!(s, Step::Group { .. })).expect("the exp group");
    for &t in &p.step_rw[at].0 {
        assert_eq!(p.storage[t], Some(Storage::F32), "tile {t}");
    }
}

#[test]
fn online_attention_keeps_scores_in_registers_and_picks_its_warps() {
    // The online-softmax loop is one register-resident step: no tile matmul, reduction or
    // group in the loop; the accumulators are written once, after it.
    let p = plan(&zoo::attention_online(attn(), F16).expect("zoo").ugraph, 80);
    let in_loop = steps_in(&p, Section::Loop);
    assert_eq!(in_loop.iter().filter(|s| **s == Step::Flash).count(), 1, "{in_loop:?}");
    assert!(in_loop.iter().all(|s| matches!(s, Step::Flash | Step::Load { .. })), "{in_loop:?}");
    assert!(steps_in(&p, Section::Post).contains(&Step::FlashEnd));
    // 8 blocks (one wave): each warp takes 2 row groups and the warps split every key chunk
    // 2 ways. Q's rows are padded by 16 bytes, the staged K and V rows by 32.
    let a = p.attention.expect("a region");
    assert_eq!((a.form, a.row_groups, a.key_slices), (AttentionForm::Mma, 2, 2));
    assert_eq!(
        (layout(&p, 0), layout(&p, 1), layout(&p, 2)),
        (padded(64, 64, 72, false), padded(64, 64, 80, true), padded(64, 64, 80, true))
    );
    // 256 blocks: one row group per warp, so that registers allow several blocks an SM.
    let many = plan(&zoo::attention_online(Attn { b: 64, ..attn() }, F16).expect("zoo").ugraph, 80);
    let a = many.attention.expect("a region");
    assert_eq!((a.row_groups, a.key_slices), (1, 1));
}

#[test]
fn attention_runs_on_warpgroup_tensor_cores_on_sm_90() {
    // The same region as `mi::FlashWG`: Q, K and V swizzled in 128-byte rows from 1024-byte
    // aligned buffers, K read a step ahead with four stages.
    let p = plan(&zoo::attention_online(attn(), F16).expect("zoo").ugraph, 90);
    let a = p.attention.expect("a region");
    assert_eq!((a.form, a.lookahead, p.stages), (AttentionForm::Wgmma, true, 4));
    assert_eq!(layout(&p, 0), swizzled(64, 64, false));
    for t in [1, 2] {
        assert_eq!(layout(&p, t), swizzled(64, 64, true), "tile {t}");
    }
    for t in 0..3 {
        assert_eq!(buffer(&p, t).0 % 1024, 0, "tile {t}: {:?}", p.buffers);
    }
}

#[test]
fn attention_without_a_saved_max_keeps_no_running_max() {
    // softmax(Q K) V in one kernel (blocks of 64 or 32 query rows): no running max leaves the
    // loop, so the region has none (XMAX false); split-KV partials save theirs.
    let one = |qsplit: usize| {
        let a = Attn { b: 2, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit };
        zoo::attention_one_kernel(a, F16).expect("zoo").ugraph
    };
    let region = |p: &KernelPlan| p.flash.as_ref().map(|(f, _)| (f.x.is_some(), f.m)).expect("a region");
    let wg = plan(&one(2), 90);
    assert_eq!((wg.attention.map(|a| a.form), region(&wg)), (Some(AttentionForm::Wgmma), (false, 64)));
    let mma = plan(&one(4), 90);
    assert_eq!((mma.attention.map(|a| a.form), region(&mma)), (Some(AttentionForm::Mma), (false, 32)));
    let saved = plan(&zoo::attention_online(attn(), F16).expect("zoo").ugraph, 90);
    assert!(region(&saved).0);
}

#[test]
fn a_q_normalised_before_the_loop_is_written_swizzled_for_the_descriptors() {
    // QK-norm's Q, normalised from device memory before the loop (no load of its own), is
    // written through the 128-byte swizzle into a 1024-byte aligned buffer.
    let p = plan(&zoo::qnorm_attention_online(attn(), F16).expect("zoo").ugraph, 90);
    let pre = steps_in(&p, Section::Pre);
    assert_eq!(pre, vec![Step::RmsNorm { op: 3 }]);
    let q = p.flash.as_ref().map(|(f, _)| f.q).expect("a region");
    assert_eq!(q, 3);
    let l = layout(&p, q);
    assert_eq!((l.swz, l.inner, l.ld, l.staged), (Some(8), 64, 64, false));
    assert_eq!(buffer(&p, q).0 % 1024, 0, "{:?}", p.buffers);
    assert_eq!(p.attention.map(|a| a.form), Some(AttentionForm::Wgmma));
}

#[test]
fn a_v_normalised_in_the_loop_is_normalised_in_place_in_its_stage() {
    // QK-norm attention in one kernel: V's rms norm is part of the region, done in place in
    // each stage (no tile of its own: as many buffers as without it), the wgmma form kept.
    let qn = plan(&zoo::qnorm_attention_online(attn(), F16).expect("zoo").ugraph, 90);
    let qkn = plan(&zoo::qknorm_attention_online(attn(), F16).expect("zoo").ugraph, 90);
    let a = qkn.attention.expect("a region");
    assert_eq!((a.form, a.v_norm, a.lookahead), (AttentionForm::Wgmma, VNorm::InPlace, true));
    assert_eq!(qkn.buffers.len(), qn.buffers.len());
    assert_eq!(qkn.stages, qn.stages);
    // 128 keys an iteration: K in two column blocks of 64, the stages four deep.
    let wide = plan(&zoo::qknorm_attention_online(Attn { s: 2048, ..attn() }, F16).expect("zoo").ugraph, 90);
    let a = wide.attention.expect("a region");
    assert_eq!((a.v_norm, a.lookahead, wide.stages), (VNorm::InPlace, true, 4));
    assert_eq!((layout(&wide, 1).inner, layout(&wide, 1).blocks), (128, true));
}

#[test]
fn wide_key_tiles_go_in_swizzled_column_blocks() {
    // 256 keys an iteration: K [64, 256] in column blocks of [64, 64], V [256, 64] keeps its
    // 128-byte rows.
    let p = plan(&zoo::attention_online(Attn { s: 4096, ..attn() }, F16).expect("zoo").ugraph, 90);
    assert_eq!(layout(&p, 1), Layout { blocks: true, ..swizzled(64, 256, true) });
    assert_eq!(layout(&p, 2), swizzled(256, 64, true));
    assert_eq!(p.flash.as_ref().map(|(f, _)| f.n), Some(256));
}

#[test]
fn wide_value_tiles_go_in_swizzled_column_blocks() {
    // Head dim 128 in one kernel (128 rows, 128-key tiles): Q [128, 128] and V [128, 128] in
    // column blocks of [128, 64] like K, one group of 64 rows a warpgroup; the same at head
    // dim 256 (values wider than the warpgroup form's 128) does not take it.
    let one = |d: usize| {
        let a = Attn { b: 300, h: 128, d, s: 1024, splits: 1, frange: 8, qsplit: 1 };
        let mut g = zoo::attention_one_kernel(a, F16).expect("zoo").ugraph;
        for op in &mut g.ops {
            if let mirage_ugraph::KernelOpKind::Customized { graph } = &mut op.kind {
                graph.block_dim = [256, 1, 1];
            }
        }
        plan(&g, 90)
    };
    let p = one(128);
    let a = p.attention.expect("a region");
    assert_eq!((a.form, a.row_groups, a.key_slices), (AttentionForm::Wgmma, 1, 1));
    for t in [1, 2] {
        assert_eq!(layout(&p, t), Layout { blocks: true, ..swizzled(128, 128, true) }, "tile {t}");
    }
    // Q as well, for the descriptors (loaded once, before the loop).
    assert_eq!(layout(&p, 0), Layout { blocks: true, ..swizzled(128, 128, false) });
    assert_ne!(one(256).attention.map(|a| a.form), Some(AttentionForm::Wgmma));
}

#[test]
fn rms_norms_of_staged_16_bit_tiles_keep_their_padded_16_bit_rows() {
    // QK-norm attention op by op: V's norm in the loop reads and writes 16-bit rows of the
    // same padded pitch (whole rows in registers, 16 bytes at a time).
    let p = plan(&zoo::attention(attn(), true, F16).expect("zoo").ugraph, 90);
    assert!(steps_in(&p, Section::Loop).contains(&Step::RmsNorm { op: 4 }));
    let at = p.steps.iter().position(|&(_, s)| s == Step::RmsNorm { op: 4 }).expect("the norm");
    let (w, r) = &p.step_rw[at];
    let (o, x) = (w[0], r[0]);
    assert_eq!((p.storage[o], p.storage[x]), (Some(Storage::F16), Some(Storage::F16)));
    assert_eq!((layout(&p, x).ld, layout(&p, o).ld, layout(&p, o).swz), (72, 72, None));
}

#[test]
fn loop_free_row_kernels_keep_tiles_in_registers() {
    // nTrans with 4096-wide rows: a register kernel (no block plan); rows that are not whole
    // warp chunks (256 elements) keep the general schedule.
    let regs = plans(&zoo::ntrans(2, 4096, F16).expect("zoo").ugraph, &Options::for_arch(90));
    assert!(!regs.is_empty() && regs.iter().all(Option::is_none));
    let general = plans(&zoo::ntrans(2, 4104, F16).expect("zoo").ugraph, &Options::for_arch(90));
    assert!(general.iter().any(Option::is_some));
}

#[test]
fn small_attention_grids_split_the_loop_across_a_cluster() {
    // Two blocks of 8 iterations: on sm_90 the loop is split over clusters of four blocks
    // along the free axis y; on sm_80, and where the grid already fills the GPU, no clusters.
    let small = Attn { s: 2048, splits: 1, frange: 8, ..attn() };
    let g = zoo::attention_online(small, F16).expect("zoo").ugraph;
    let p = plan(&g, 90);
    assert_eq!((p.cluster, p.cluster_dims), (4, [1, 4, 1]));
    let k = generate(&g, &Options::for_arch(90)).expect("generates").kernels.remove(0);
    assert_eq!((k.grid, k.cluster), ([2, 4, 1], [1, 4, 1]));
    assert_eq!(plan(&g, 80).cluster_dims, [1, 1, 1]);
    let wide = zoo::attention_online(Attn { b: 80, ..small }, F16).expect("zoo").ugraph;
    assert_eq!(plan(&wide, 90).cluster_dims, [1, 1, 1]);
}

#[test]
fn a_cluster_split_keeps_one_slot_of_partials_a_block() {
    // One block of 128 rows by 4096 keys splits over a cluster of eight: each block keeps its
    // own partials (one slot for its two warpgroups' rows) for the first block to read, so the
    // cluster is not capped by the first block's shared memory (seven slots, 132 KiB, beside
    // the stages would not fit).
    let one = Attn { b: 1, h: 128, s: 4096, splits: 1, frange: 16, ..attn() };
    let p = plan(&zoo::attention_online(one, F16).expect("zoo").ugraph, 90);
    assert_eq!((p.cluster, p.cluster_dims), (8, [8, 1, 1]));
    assert!(p.smem_bytes <= Target::sm90().smem_per_block_optin, "{}", p.smem_bytes);
}

#[test]
fn a_summing_cluster_split_merges_into_a_receive_area_apart_from_the_stages() {
    // RMSNorm + Linear on 8 blocks of 16 iterations, split over clusters of eight: one merge
    // step after the loop's finishes, the other blocks' slots (the [4, 64] tile and 4 sums)
    // in a receive area that no stage overlaps (a block may push while the first still loops).
    let g = zoo::rmsnorm_linear(4, 1024, 512, 8, 16, F16).expect("zoo").ugraph;
    for (lazy, async_push) in [(false, false), (true, true)] {
        let p = plan_with(&g, &Options { lazy_merge: lazy, async_push, ..Options::for_arch(90) });
        assert_eq!((p.cluster, p.lazy, p.async_push), (8, lazy, async_push));
        let post = steps_in(&p, Section::Post);
        let merge = post.iter().position(|s| *s == Step::ClusterMerge).expect("a merge");
        assert!(
            post[..merge].contains(&Step::MatAccEnd { acc: 3 }) && post[..merge].contains(&Step::Finalize { op: 4 })
        );
        let (recv, slot) = p.recv.expect("a receive area");
        assert_eq!(slot, 4 * 64 + 4);
        let end = recv + (p.cluster - 1) * slot * 4;
        for t in [0, 1] {
            let (lo, hi) = buffer(&p, t);
            assert!(hi <= recv || lo >= end, "tile {t} [{lo}, {hi}) meets [{recv}, {end})");
        }
        // With st.async pushes, their mbarrier (8 bytes) right after the slots, in bounds.
        let need = if async_push { end + 8 } else { end };
        assert!(need <= p.smem_bytes && end.is_multiple_of(8), "{need} > {}", p.smem_bytes);
    }
    // Gated MLP's merge is lazy by default too.
    let mlp = plan(&zoo::gated_mlp(4, 1024, 512, 8, 16, F16).expect("zoo").ugraph, 90);
    assert!(mlp.lazy && mlp.async_push && mlp.recv.is_some());
}

#[test]
fn epilogues_run_in_registers_where_a_thread_has_four_elements_or_more() {
    // [32, 32] output tiles (8 elements for each of 128 threads) and [16, 32] (4): computed in
    // registers and stored together, no tile of their own; [8, 32] (2): a tile pass.
    for (m, w) in [(32, Some(8)), (16, Some(4)), (8, None)] {
        let p = plan(&zoo::rmsnorm_linear(m, 4096, 4096, 128, 16, F16).expect("zoo").ugraph, 90);
        let post = steps_in(&p, Section::Post);
        let fused = post.iter().find_map(|s| match s {
            Step::GroupSave { w, .. } => Some(*w),
            _ => None,
        });
        assert_eq!(fused, w, "m={m}: {post:?}");
        assert_eq!(post.iter().any(|s| matches!(s, Step::Group { .. })), w.is_none(), "m={m}: {post:?}");
    }
}

#[test]
fn loop_matmuls_take_the_warpgroup_tensor_cores_where_asked() {
    // RMSNorm + Linear, 32 rows, 64 columns a block: with `wgmma_acc` its loop matmul is a
    // warpgroup accumulator (`mi::MmaAccWG`); without, the warp accumulator.
    let mut g = KernelGraph::new();
    let x = g.new_input(&[32, 4096], F16, None).expect("x");
    let w = g.new_input(&[4096, 4096], F16, None).expect("w");
    let mut tb = BlockGraph::new([64, 1, 1], [128, 1, 1], 16, 64).expect("block graph");
    let tx = tb.new_input(&[32, 4096], F16, [-1, -1, -1], 1).expect("x tile");
    let tw = tb.new_input(&[4096, 4096], F16, [1, -1, -1], 0).expect("w tile");
    let rms = tb.forloop_accum(tx, Accum::Rms).expect("rms");
    let xw = tb.matmul(tx, tw).expect("matmul");
    let sum = tb.forloop_accum(xw, Accum::None).expect("sum");
    let out = tb.binary(BinaryOp::Div, sum, rms).expect("div");
    tb.new_output(out, [1, -1, -1], -1).expect("output");
    let o = g.customized(&[x, w], tb).expect("customized");
    g.mark_output(o[0], None).expect("output");
    let wg = plan_with(&g, &Options { wgmma_acc: true, ..Options::for_arch(90) });
    let matacc = |p: &KernelPlan| {
        steps_in(p, Section::Loop).into_iter().find_map(|s| match s {
            Step::MatAcc { op, .. } => Some(op),
            _ => None,
        })
    };
    let op = matacc(&wg).expect("a register accumulator");
    assert!(wg.wg_acc[op]);
    let warp = plan(&g, 90);
    assert!(!warp.wg_acc[matacc(&warp).expect("a register accumulator")]);
    assert!(!plan(&g, 80).wg_acc.iter().any(|&b| b));
}

/// `x @ W.T` at decode: one row of 4096 against a weight kept as `nn.Linear` does (W [6144,
/// 4096] row-major, the graph's [4096, 6144] input of strides [1, 4096], or `w_strides`), 128
/// blocks of 48 columns, 64 iterations of 64-deep tiles.
fn gemv(w_strides: Option<&[usize]>) -> (KernelGraph, STensorId) {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[1, 4096], F16, None).expect("x");
    let w = g.new_input(&[4096, 6144], F16, w_strides).expect("w");
    let mut tb = BlockGraph::new([128, 1, 1], [128, 1, 1], 64, 64).expect("block graph");
    let tx = tb.new_input(&[1, 4096], F16, [-1, -1, -1], 1).expect("x tile");
    let tw = tb.new_input(&[4096, 6144], F16, [1, -1, -1], 0).expect("w tile");
    let xw = tb.matmul(tx, tw).expect("matmul");
    let sum = tb.forloop_accum(xw, Accum::None).expect("sum");
    tb.new_output(sum, [1, -1, -1], -1).expect("output");
    let o = g.customized(&[x, w], tb).expect("customized");
    g.mark_output(o[0], None).expect("output");
    (g, tw)
}

#[test]
fn a_transposed_weight_tile_is_stored_transposed_for_the_loop_matmul() {
    // W.T's [64, 48] tile runs down its columns in device memory: stored as 48 rows of 64 (+ 8
    // elements of padding), copied with cp.async, read by the loop matmul as is (sm_80 and 90).
    let (g, tw) = gemv(Some(&[1, 4096]));
    for arch in [80, 90] {
        let p = plan(&g, arch);
        let l = layout(&p, tw);
        assert_eq!((l.trans, l.inner, l.ld, l.staged, l.swz), (true, 48, 72, true, None), "sm_{arch}");
        assert!(p.steps.iter().any(|&(_, st)| matches!(st, Step::MatAcc { .. })), "sm_{arch}");
        // Each stage holds the 48 padded rows.
        let (lo, hi) = buffer(&p, tw);
        assert_eq!(hi - lo, p.stages * 48 * 72 * 2, "sm_{arch}");
    }
    // The same weight row-major keeps its rows.
    let (g, tw) = gemv(None);
    assert!(!layout(&plan(&g, 90), tw).trans);
}
