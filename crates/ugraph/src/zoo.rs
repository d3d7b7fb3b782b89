//! The paper's workloads as pairs: the plain program a user writes and the hand-written
//! µGraph the reference reports for it (docs/reference.md: µGraph semantics). Used by the example, benches,
//! the verifier's acceptance tests and the search's structure tests.

use crate::error::{invalid, Result};
use crate::kernel::{KernelGraph, TensorId};
use crate::ops::{Accum, BinaryOp, UnaryOp};
use crate::types::DType;
use crate::{BlockGraph, STensorId};

/// A plain program and an equivalent µGraph with the same inputs in the same order.
#[derive(Debug, Clone)]
pub struct Pair {
    /// Workload name.
    pub name: String,
    /// The program as a user writes it (predefined kernel ops only).
    pub reference: KernelGraph,
    /// The fused µGraph.
    pub ugraph: KernelGraph,
}

const BLOCK: [usize; 3] = [128, 1, 1];
const NONE3: [i64; 3] = [-1, -1, -1];

fn inputs(g: &mut KernelGraph, shapes: &[&[usize]], dt: DType) -> Result<Vec<TensorId>> {
    shapes.iter().map(|s| g.new_input(s, dt, None)).collect()
}

/// RMSNorm + Linear: `rms_norm(X) @ W`, X `[m, k]`, W `[k, n]`; one kernel with `grid` blocks
/// over n and a loop of `frange` over k; the rms accumulates in the matmul's loop.
pub fn rmsnorm_linear(m: usize, k: usize, n: usize, grid: usize, frange: usize, dt: DType) -> Result<Pair> {
    rmsnorm_linear_eps(m, k, n, grid, frange, dt, 0.0)
}

/// [`rmsnorm_linear`] with `rms_norm(X, eps)`: the reference's norm and the µGraph's rms
/// accumulator both add `eps` to the mean of squares.
pub fn rmsnorm_linear_eps(
    m: usize,
    k: usize,
    n: usize,
    grid: usize,
    frange: usize,
    dt: DType,
    eps: f32,
) -> Result<Pair> {
    let mut r = KernelGraph::new();
    let v = inputs(&mut r, &[&[m, k], &[k, n]], dt)?;
    let y = r.rms_norm_eps(v[0], &[k], None, eps)?;
    let z = r.matmul(y, v[1])?;
    r.mark_output(z, None)?;

    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k, n]], dt)?;
    let mut tb = BlockGraph::new([grid, 1, 1], BLOCK, frange, 64)?;
    let tx = tb.new_input(&[m, k], dt, NONE3, 1)?;
    let tw = tb.new_input(&[k, n], dt, [1, -1, -1], 0)?;
    let mm = tb.matmul(tx, tw)?;
    let acc = tb.forloop_accum(mm, Accum::None)?;
    let rms = tb.forloop_accum_eps(tx, Accum::Rms, eps)?;
    let out = tb.binary(BinaryOp::Div, acc, rms)?;
    tb.new_output(out, [1, -1, -1], -1)?;
    let o = g.customized(&v, tb)?;
    g.mark_output(o[0], None)?;
    Ok(Pair { name: "rmsnorm_linear".into(), reference: r, ugraph: g })
}

/// Gated MLP: `silu(X @ W1) * (X @ W2)`; one kernel accumulating both matmuls.
pub fn gated_mlp(m: usize, k: usize, n: usize, grid: usize, frange: usize, dt: DType) -> Result<Pair> {
    let mut r = KernelGraph::new();
    let v = inputs(&mut r, &[&[m, k], &[k, n], &[k, n]], dt)?;
    let a = r.matmul(v[0], v[1])?;
    let b = r.matmul(v[0], v[2])?;
    let s = r.unary(UnaryOp::Silu, a)?;
    let z = r.binary(BinaryOp::Mul, s, b)?;
    r.mark_output(z, None)?;

    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &[&[m, k], &[k, n], &[k, n]], dt)?;
    let mut tb = BlockGraph::new([grid, 1, 1], BLOCK, frange, 64)?;
    let tx = tb.new_input(&[m, k], dt, NONE3, 1)?;
    let t1 = tb.new_input(&[k, n], dt, [1, -1, -1], 0)?;
    let t2 = tb.new_input(&[k, n], dt, [1, -1, -1], 0)?;
    let m1 = tb.matmul(tx, t1)?;
    let m2 = tb.matmul(tx, t2)?;
    let a1 = tb.forloop_accum(m1, Accum::None)?;
    let a2 = tb.forloop_accum(m2, Accum::None)?;
    let s = tb.unary(UnaryOp::Silu, a1)?;
    let out = tb.binary(BinaryOp::Mul, s, a2)?;
    tb.new_output(out, [1, -1, -1], -1)?;
    let o = g.customized(&v, tb)?;
    g.mark_output(o[0], None)?;
    Ok(Pair { name: "gated_mlp".into(), reference: r, ugraph: g })
}

/// LoRA: `X W + (X A) B`; one kernel: the loop over k accumulates `X W` and `X A`, then
/// `[acc_W | acc_A] @ [I; B]` is formed as `acc_W + acc_A @ B` after the loop.
pub fn lora(m: usize, k: usize, n: usize, rank: usize, grid: usize, frange: usize, dt: DType) -> Result<Pair> {
    let shapes: [&[usize]; 4] = [&[m, k], &[k, n], &[k, rank], &[rank, n]];
    let mut r = KernelGraph::new();
    let v = inputs(&mut r, &shapes, dt)?;
    let xw = r.matmul(v[0], v[1])?;
    let xa = r.matmul(v[0], v[2])?;
    let xab = r.matmul(xa, v[3])?;
    let z = r.binary(BinaryOp::Add, xw, xab)?;
    r.mark_output(z, None)?;

    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &shapes, dt)?;
    let mut tb = BlockGraph::new([grid, 1, 1], BLOCK, frange, 64)?;
    let tx = tb.new_input(&[m, k], dt, NONE3, 1)?;
    let tw = tb.new_input(&[k, n], dt, [1, -1, -1], 0)?;
    let ta = tb.new_input(&[k, rank], dt, NONE3, 0)?;
    let tbm = tb.new_input(&[rank, n], dt, [1, -1, -1], -1)?;
    let xw = tb.matmul(tx, tw)?;
    let xa = tb.matmul(tx, ta)?;
    let aw = tb.forloop_accum(xw, Accum::None)?;
    let aa = tb.forloop_accum(xa, Accum::None)?;
    let ab = tb.matmul(aa, tbm)?;
    let out = tb.binary(BinaryOp::Add, aw, ab)?;
    tb.new_output(out, [1, -1, -1], -1)?;
    let o = g.customized(&v, tb)?;
    g.mark_output(o[0], None)?;
    Ok(Pair { name: "lora".into(), reference: r, ugraph: g })
}

/// Shape and schedule of an attention workload: Q `[b, h, d]`, K `[b, d, s]`, V `[b, s, d]`;
/// kernel 1 splits the keys over `splits` blocks per batch and loops `frange` times in each;
/// both kernels split the query rows over `qsplit` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attn {
    /// Batch (times KV heads).
    pub b: usize,
    /// Query rows per batch.
    pub h: usize,
    /// Head dim.
    pub d: usize,
    /// Keys.
    pub s: usize,
    /// Key splits across blocks.
    pub splits: usize,
    /// Loop iterations per block.
    pub frange: usize,
    /// Query-row splits across blocks (keeps a block's tiles in shared memory when `h` is large).
    pub qsplit: usize,
}

/// Attention `softmax(Q K) V` with Q `[b, h, d]`, K `[b, d, s]`, V `[b, s, d]` (GQA, MHA, MQA
/// differ only in shapes), optionally with `rms_norm` over d of Q and V (QKNorm).
/// Two kernels (flash decoding): kernel 1 splits the keys over `splits` blocks per batch and
/// loops over them, accumulating `exp(QK) V` and `sum exp(QK)`; kernel 2 sums the partials
/// (`sum_todimx` / `sum`) and divides.
pub fn attention(cfg: Attn, qknorm: bool, dt: DType) -> Result<Pair> {
    let Attn { b, h, d, splits, qsplit, .. } = cfg;
    let r = attention_reference(cfg, qknorm, qknorm, dt)?;

    let (mut g, v, mut k1, [tq, tk, tv]) = flash_kernel1(cfg, dt)?;
    let (tq, tv) = if qknorm { (k1.rms_norm(tq)?, k1.rms_norm(tv)?) } else { (tq, tv) };
    let a = k1.matmul(tq, tk)?;
    let e = k1.unary(UnaryOp::Exp, a)?;
    let ev = k1.matmul(e, tv)?;
    let acc_o = k1.forloop_accum(ev, Accum::None)?;
    let acc_l = k1.forloop_accum(e, Accum::Sum)?;
    k1.new_output(acc_o, [0, 2, 1], -1)?;
    k1.new_output(acc_l, [0, 2, 1], -1)?;
    let part = g.customized(&v, k1)?;

    let mut k2 = BlockGraph::new([b, qsplit, 1], BLOCK, 1, d)?;
    let po = k2.new_input(&[b, h, d * splits], dt, [0, 1, -1], -1)?;
    let pl = k2.new_input(&[b, h, splits], dt, [0, 1, -1], -1)?;
    let so = k2.forloop_accum(po, Accum::SumToDimx)?;
    let sl = k2.forloop_accum(pl, Accum::Sum)?;
    let out = k2.binary(BinaryOp::Div, so, sl)?;
    k2.new_output(out, [0, 1, -1], -1)?;
    let o = g.customized(&part, k2)?;
    g.mark_output(o[0], None)?;
    let name = if qknorm { "qknorm_attention" } else { "attention" };
    Ok(Pair { name: name.into(), reference: r, ugraph: g })
}

/// The reference `softmax(Q K) V` of an attention workload, with `rms_norm` over d of Q
/// (`norm_q`) and of V (`norm_v`) first.
fn attention_reference(cfg: Attn, norm_q: bool, norm_v: bool, dt: DType) -> Result<KernelGraph> {
    let Attn { b, h, d, s, .. } = cfg;
    let shapes: [&[usize]; 3] = [&[b, h, d], &[b, d, s], &[b, s, d]];
    let mut r = KernelGraph::new();
    let v = inputs(&mut r, &shapes, dt)?;
    let q = if norm_q { r.rms_norm(v[0], &[d], None)? } else { v[0] };
    let vv = if norm_v { r.rms_norm(v[2], &[d], None)? } else { v[2] };
    let a = r.matmul(q, v[1])?;
    let p = r.softmax(a, -1)?;
    let o = r.matmul(p, vv)?;
    r.mark_output(o, None)?;
    Ok(r)
}

/// The µGraph's inputs Q, K, V and kernel 1's input iterators: keys split over grid y and the
/// loop, query rows over grid z.
fn flash_kernel1(a: Attn, dt: DType) -> Result<(KernelGraph, Vec<TensorId>, BlockGraph, [usize; 3])> {
    let Attn { b, h, d, s, splits, frange, qsplit } = a;
    let shapes: [&[usize]; 3] = [&[b, h, d], &[b, d, s], &[b, s, d]];
    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &shapes, dt)?;
    let mut k1 = BlockGraph::new([b, splits, qsplit], BLOCK, frange, d)?;
    let tq = k1.new_input(shapes[0], dt, [0, -1, 1], -1)?;
    let tk = k1.new_input(shapes[1], dt, [0, 2, -1], 2)?;
    let tv = k1.new_input(shapes[2], dt, [0, 1, -1], 1)?;
    Ok((g, v, k1, [tq, tk, tv]))
}

/// Attention as [`attention`] but numerically safe (online softmax): kernel 1 keeps a running
/// max with `reduction_max` and rescales its accumulators; kernel 2 merges the splits by their
/// maxima the same way.
pub fn attention_online(a: Attn, dt: DType) -> Result<Pair> {
    online(a, false, false, dt)
}

/// [`attention_online`] of `rms_norm(Q)` over d, normalised in kernel 1 before its loop
/// (QK-norm's attention once V is normalised by a kernel of its own).
pub fn qnorm_attention_online(a: Attn, dt: DType) -> Result<Pair> {
    online(a, true, false, dt)
}

/// QK-norm attention in one µGraph (`rms_norm` over d of Q and of V) as
/// [`qnorm_attention_online`], with each iteration's V tile normalised in kernel 1's loop
/// before `P V`.
pub fn qknorm_attention_online(a: Attn, dt: DType) -> Result<Pair> {
    online(a, true, true, dt)
}

/// Attention in one kernel, the form the search finds for MQA: online softmax over the keys
/// in the loop (`splits` must be 1), O / l after it; no running max is saved.
pub fn attention_one_kernel(a: Attn, dt: DType) -> Result<Pair> {
    one_kernel(a, false, dt)
}

/// QK-norm attention in one kernel as [`attention_one_kernel`] (`rms_norm` over d of Q before
/// the loop, of each iteration's V tile in it): the search's QK-norm form at b=16.
pub fn qknorm_attention_one_kernel(a: Attn, dt: DType) -> Result<Pair> {
    one_kernel(a, true, dt)
}

fn one_kernel(a: Attn, qknorm: bool, dt: DType) -> Result<Pair> {
    let name = if qknorm { "qknorm_attention_one_kernel" } else { "attention_one_kernel" };
    if a.splits != 1 {
        return invalid(name, format!("splits {} must be 1 (keys are split only by the loop)", a.splits));
    }
    let reference = attention_reference(a, qknorm, qknorm, dt)?;
    let (mut g, v, mut k1, [tq, tk, tv]) = flash_kernel1(a, dt)?;
    let (tq, tv) = if qknorm { (k1.rms_norm(tq)?, k1.rms_norm(tv)?) } else { (tq, tv) };
    let (o, l, _) = online_loop(&mut k1, tq, tk, tv)?;
    let out = k1.binary(BinaryOp::Div, o, l)?;
    k1.new_output(out, [0, -1, 1], -1)?;
    let outs = g.customized(&v, k1)?;
    g.mark_output(outs[0], None)?;
    Ok(Pair { name: name.into(), reference, ugraph: g })
}

/// The online-softmax loop body of attention over per-iteration tiles K and V: the
/// accumulators of P V and of the row sums, each rescaled by exp(change of the max), and the
/// iteration's row max.
pub fn online_loop(
    k1: &mut BlockGraph,
    q: STensorId,
    k: STensorId,
    v: STensorId,
) -> Result<(STensorId, STensorId, STensorId)> {
    let s = k1.matmul(q, k)?;
    let (mx, diff) = k1.reduction_max(s, 2)?;
    let shifted = k1.binary(BinaryOp::Sub, s, mx)?;
    let e = k1.unary(UnaryOp::Exp, shifted)?;
    let scale = k1.unary(UnaryOp::Exp, diff)?;
    let ev = k1.matmul(e, v)?;
    let o = k1.forloop_accum_rescale(ev, scale, Accum::None)?;
    let l = k1.forloop_accum_rescale(e, scale, Accum::Sum)?;
    Ok((o, l, mx))
}

fn online(a: Attn, qnorm: bool, vnorm: bool, dt: DType) -> Result<Pair> {
    let Attn { b, h, d, splits, qsplit, .. } = a;
    let reference = attention_reference(a, qnorm, vnorm, dt)?;
    let (mut g, v, mut k1, [tq, tk, tv]) = flash_kernel1(a, dt)?;
    let tq = if qnorm { k1.rms_norm(tq)? } else { tq };
    let tv = if vnorm { k1.rms_norm(tv)? } else { tv };
    let (acc_o, acc_l, mx) = online_loop(&mut k1, tq, tk, tv)?;
    let acc_m = k1.forloop_accum_max(mx)?;
    k1.new_output(acc_o, [0, 2, 1], -1)?;
    k1.new_output(acc_l, [0, 2, 1], -1)?;
    k1.new_output(acc_m, [0, 2, 1], -1)?;
    let part = g.customized(&v, k1)?;

    // Kernel 2 loops over the splits, merging (o, l) weighted by exp(m_split - running max).
    let mut k2 = BlockGraph::new([b, qsplit, 1], BLOCK, splits, d)?;
    let po = k2.new_input(&[b, h, d * splits], dt, [0, 1, -1], 2)?;
    let pl = k2.new_input(&[b, h, splits], dt, [0, 1, -1], 2)?;
    let pm = k2.new_input(&[b, h, splits], dt, [0, 1, -1], 2)?;
    let (mx, diff) = k2.reduction_max(pm, 2)?;
    let dm = k2.binary(BinaryOp::Sub, pm, mx)?;
    let w = k2.unary(UnaryOp::Exp, dm)?;
    let scale = k2.unary(UnaryOp::Exp, diff)?;
    let ow = k2.binary(BinaryOp::Mul, po, w)?;
    let lw = k2.binary(BinaryOp::Mul, pl, w)?;
    let so = k2.forloop_accum_rescale(ow, scale, Accum::None)?;
    let sl = k2.forloop_accum_rescale(lw, scale, Accum::None)?;
    let out = k2.binary(BinaryOp::Div, so, sl)?;
    k2.new_output(out, [0, 1, -1], -1)?;
    let o = g.customized(&part, k2)?;
    g.mark_output(o[0], None)?;
    let name = match (qnorm, vnorm) {
        (true, true) => "qknorm_attention_online",
        (true, false) => "qnorm_attention_online",
        _ => "attention_online",
    };
    Ok(Pair { name: name.into(), reference, ugraph: g })
}

/// nTrans: `rms_norm(X + alpha * (rms_norm(H) + X))` over rows of `n`; one kernel, a block per row.
pub fn ntrans(b: usize, n: usize, dt: DType) -> Result<Pair> {
    let shapes: [&[usize]; 3] = [&[b, n], &[b, n], &[b, n]];
    let mut r = KernelGraph::new();
    let v = inputs(&mut r, &shapes, dt)?;
    let hn = r.rms_norm(v[0], &[n], None)?;
    let t = r.binary(BinaryOp::Add, hn, v[1])?;
    let t = r.binary(BinaryOp::Mul, v[2], t)?;
    let t = r.binary(BinaryOp::Add, v[1], t)?;
    let o = r.rms_norm(t, &[n], None)?;
    r.mark_output(o, None)?;

    let mut g = KernelGraph::new();
    let v = inputs(&mut g, &shapes, dt)?;
    let mut tb = BlockGraph::new([b, 1, 1], BLOCK, 1, 64)?;
    let th = tb.new_input(&[b, n], dt, [0, -1, -1], -1)?;
    let tx = tb.new_input(&[b, n], dt, [0, -1, -1], -1)?;
    let ta = tb.new_input(&[b, n], dt, [0, -1, -1], -1)?;
    let hn = tb.rms_norm(th)?;
    let t = tb.binary(BinaryOp::Add, hn, tx)?;
    let t = tb.binary(BinaryOp::Mul, ta, t)?;
    let t = tb.binary(BinaryOp::Add, tx, t)?;
    let o = tb.rms_norm(t)?;
    tb.new_output(o, [0, -1, -1], -1)?;
    let out = g.customized(&v, tb)?;
    g.mark_output(out[0], None)?;
    Ok(Pair { name: "ntrans".into(), reference: r, ugraph: g })
}

/// Split-KV attention's combine step alone: O `[2, 256, 64 splits]` and per-slice sums L and
/// maxima M `[2, 256, splits]` (the slices an attention kernel wrote side by side) give per
/// row the running max of the slices' maxima, the rescaled sums of O and L over a loop of
/// `splits` and one division; the sum L is saved too (a tile of one value per row). With
/// `matmul`, the rescaled O passes through a loop matmul with W `[2, 64, 64]` first (W is
/// the fourth input), which takes the block graph off the element-wise form
/// ([`BlockGraph::is_elementwise`]). Grid `[2, 64, 1]`: four rows per block.
pub fn combine(splits: usize, threads: usize, dt: DType, matmul: bool) -> Result<KernelGraph> {
    let mut g = KernelGraph::new();
    let o = g.new_input(&[2, 256, 64 * splits], dt, None)?;
    let l = g.new_input(&[2, 256, splits], dt, None)?;
    let m = g.new_input(&[2, 256, splits], dt, None)?;
    let mut tb = BlockGraph::new([2, 64, 1], [threads, 1, 1], splits, 4)?;
    let to = tb.new_input(&[2, 256, 64 * splits], dt, [0, 1, -1], 2)?;
    let tl = tb.new_input(&[2, 256, splits], dt, [0, 1, -1], 2)?;
    let tm = tb.new_input(&[2, 256, splits], dt, [0, 1, -1], 2)?;
    let (mx, diff) = tb.reduction_max(tm, 2)?;
    let d = tb.binary(BinaryOp::Sub, tm, mx)?;
    let e1 = tb.unary(UnaryOp::Exp, d)?;
    let e2 = tb.unary(UnaryOp::Exp, diff)?;
    let mut po = tb.binary(BinaryOp::Mul, to, e1)?;
    let mut ins = vec![o, l, m];
    if matmul {
        ins.push(g.new_input(&[2, 64, 64], dt, None)?);
        let tw = tb.new_input(&[2, 64, 64], dt, [0, -1, -1], -1)?;
        po = tb.matmul(po, tw)?;
    }
    let pl = tb.binary(BinaryOp::Mul, tl, e1)?;
    let ao = tb.forloop_accum_rescale(po, e2, Accum::None)?;
    let al = tb.forloop_accum_rescale(pl, e2, Accum::None)?;
    let out = tb.binary(BinaryOp::Div, ao, al)?;
    tb.new_output(out, [0, 1, -1], -1)?;
    tb.new_output(al, [0, 1, -1], -1)?;
    for t in g.customized(&ins, tb)? {
        g.mark_output(t, None)?;
    }
    Ok(g)
}

/// Every workload at the paper's shapes for batch `b` (docs/reference.md: workloads), in fp16.
pub fn paper_workloads(b: usize) -> Result<Vec<Pair>> {
    let dt = DType::Float16;
    let named = |mut p: Pair, name: &str| {
        p.name = name.into();
        p
    };
    Ok(vec![
        named(
            attention(Attn { b: 2 * b, h: 256, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 2 }, false, dt)?,
            "gqa",
        ),
        named(
            attention(Attn { b: 2 * b, h: 256, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 2 }, true, dt)?,
            "qknorm_gqa",
        ),
        named(
            attention(Attn { b: 32 * b, h: 16, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 1 }, false, dt)?,
            "mha",
        ),
        named(attention(Attn { b, h: 1024, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 8 }, false, dt)?, "mqa"),
        rmsnorm_linear(2 * b, 4096, 4096, 64, 64, dt)?,
        lora(b, 256, 4096, 16, 64, 4, dt)?,
        gated_mlp(b, 4096, 4096, 64, 32, dt)?,
        ntrans(b, 4096, dt)?,
    ])
}
