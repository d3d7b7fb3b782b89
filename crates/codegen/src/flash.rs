//! Register-resident attention: recognises the online-softmax loop of a block graph and
//! describes it for `mi::Flash` (runtime header), which keeps S = Q K, the running max,
//! P = exp(S - m), the row sums and the rescaled P V in registers (FlashAttention-2's
//! schedule) instead of materialising each in shared memory every iteration.
//!
//! The region matched, all in the loop, with nothing outside it reading its inner tensors:
//!
//! ```text
//! S = matmul(Q, K)            Q loop-invariant, K and V per-iteration (16-bit tiles)
//! (M, D) = reduction_max(S)   over S's last dim: running max and its change
//! P = exp(S - M);  a = exp(D)
//! O = accum_rescale(matmul(P, V), a)   V may be rms_norm(V') of a per-iteration V'
//! L = accum_rescale(reduction(P), a)   or   accum_rescale[sum](P, a)     (optional)
//! X = accum_max(M)                                                        (optional)
//! ```
//!
//! O, L and X are then ordinary tiles of the post-loop section: `Flash::finish` writes them
//! with exactly the values the block-graph semantics give (up to rounding).

use mirage_ugraph::{Accum, BinaryOp, BlockGraph, BlockOpKind, Phase, STensorId, Target, UnaryOp};

/// A matched attention region.
#[derive(Debug, Clone)]
pub(crate) struct FlashRegion {
    /// Block ops the region replaces.
    pub ops: Vec<usize>,
    /// Operand tiles.
    pub q: STensorId,
    /// Keys tile [1, d, n].
    pub k: STensorId,
    /// Values tile [1, n, dv] (with `v_norm`, the loaded tile before its rows are normalised).
    pub v: STensorId,
    /// V is `rms_norm` of the loaded tile `v` (QK-norm attention's normalised V): each
    /// iteration normalises the tile's rows in place before the step reads it.
    pub v_norm: bool,
    /// Accumulator tiles written after the loop.
    pub o: STensorId,
    /// Row-sum accumulator, if the graph has one.
    pub l: Option<STensorId>,
    /// Running-max accumulator, if the graph has one. Without it the runtime keeps no true
    /// running max (`XMAX` false: the rescale test runs on the packed P, see `FlashRows`).
    pub x: Option<STensorId>,
    /// Independent attention problems in the tile (the product of the leading dims).
    pub batch: usize,
    /// Rows of Q.
    pub m: usize,
    /// Head dim (Q's last dim).
    pub d: usize,
    /// Keys per iteration.
    pub n: usize,
    /// Value width.
    pub dv: usize,
    /// The grid fits one wave (the target's `Budgets::one_wave_blocks`): an SM holds one
    /// block at most, so the warps may use more registers.
    pub one_wave: bool,
    /// Most fragment registers a warp may hold ([`FlashRegion::regs`]; the target's
    /// `Budgets::flash_fragment_regs`).
    pub frag_regs: usize,
    /// Row groups and key slices per warpgroup when the region runs on warpgroup tensor cores
    /// (`mi::FlashWG`, sm_90a; set by the emitter from [`FlashRegion::wgmma`]).
    pub wg: Option<(usize, usize)>,
}

impl FlashRegion {
    /// How the warps of one batch item share the tile (`RG` and `KS` of `mi::Flash`): each
    /// warp takes `rg` row groups of 16 rows, and the warps beyond the row groups slice every
    /// key chunk `ks` ways (in multiples of 16 keys). In a one-wave grid, two row groups per
    /// warp are preferred whenever they keep as many warps busy and the registers allow:
    /// every K and V fragment a warp reads from shared memory then feeds twice the tensor-core
    /// work (one `ldmatrix` per four `mma` instead of two). Measured on the H100: GQA b=16
    /// 48.7 -> 43.9 µs, MQA b=8 48.3 -> 44.0 µs. A larger grid keeps one row group, so that
    /// two blocks of at most 128 registers per thread share an SM: two row groups need about
    /// 200, and QK-norm attention's many-block candidates lost up to 40% with them; a block of
    /// more than 256 threads cannot have 200 registers per thread at all (64K per SM).
    pub fn warps(&self, nt: usize) -> (usize, usize) {
        let nw = nt / 32 / self.batch.max(1);
        let mw = self.m / 16;
        let slices = |rg: usize| {
            let mut ks = (nw / (mw / rg).max(1)).max(1);
            while ks > 1 && !self.n.is_multiple_of(ks * 16) {
                ks -= 1;
            }
            ks
        };
        let base = if mw > nw { mw / nw } else { 1 };
        let busy = |rg: usize| (mw / rg).min(nw) * slices(rg);
        let rg2 = base * 2;
        if self.one_wave
            && nt <= 256
            && mw.is_multiple_of(rg2)
            && busy(rg2) >= busy(base)
            && self.regs(rg2, slices(rg2)) <= self.frag_regs
        {
            return (rg2, slices(rg2));
        }
        (base, slices(base))
    }

    /// Keys per online-softmax update (`CW` of `mi::Flash`) with `rg` row groups and `ks` key
    /// slices: 32 / rg, at least 16 (S and P in 16 + 8 registers per row group), or the
    /// largest 16-multiple dividing the slice below that. Measured on the H100 against
    /// 64 / rg: the same or slightly faster, with fewer registers.
    pub fn chunk(&self, rg: usize, ks: usize) -> usize {
        let nc = self.n / ks;
        let mut cw = (32 / rg).max(16);
        while !nc.is_multiple_of(cw) {
            cw -= 16;
        }
        cw
    }

    /// Registers (32-bit) a warp's fragments take with `rg` row groups and `ks` key slices:
    /// O, S (over one softmax chunk) and Q per row group.
    pub fn regs(&self, rg: usize, ks: usize) -> usize {
        rg * (self.dv / 8 + self.chunk(rg, ks) / 8 + self.d / 16) * 4
    }

    /// Whether the warpgroup form (`mi::FlashWG`) fits `nt` threads, as (row groups of 64,
    /// key slices) per warpgroup: 64, 128 or 256 keys of 64- or 128-wide values per iteration
    /// (V in 128-byte swizzle rows, K and 128-wide V in column blocks of them), 16-bit tiles,
    /// whole warpgroups per batch item covering its rows once (one or two groups each) or
    /// twice (two key slices). 128-wide values take one group a warpgroup: O alone is then 64
    /// registers a thread.
    pub fn wgmma(&self, nt: usize) -> Option<(usize, usize)> {
        if !matches!(self.n, 64 | 128 | 256)
            || !matches!(self.dv, 64 | 128)
            || !nt.is_multiple_of(128)
            || !(nt / 128).is_multiple_of(self.batch.max(1))
        {
            return None;
        }
        let (nwg, groups) = (nt / 128 / self.batch, self.m / 64);
        if !self.m.is_multiple_of(64) || groups == 0 {
            return None;
        }
        match (nwg / groups, groups / nwg) {
            (1 | 2, _) if nwg.is_multiple_of(groups) => Some((1, nwg / groups)),
            (0, 2) if groups.is_multiple_of(nwg) && self.dv == 64 => Some((2, 1)),
            _ => None,
        }
    }

    /// Bytes of shared memory `finish` needs to merge a block's key slices (0 for one slice),
    /// which may overlap the loop's tiles.
    pub fn combine_bytes(&self, nt: usize) -> usize {
        match self.wg {
            // `mi::FlashWG::finish`: one slot of `FlashRows::SLOT_FLOATS` (a warpgroup's 128
            // threads, each its O fragments plus m and l per row group) per extra slice, batch
            // item and warpgroup's rows.
            Some((_, ks)) => self.combine_bytes_slices(ks),
            // `mi::Flash::finish`: one slot (a warp's 32 threads) per extra slice, batch item
            // and warp's rows (no cluster form).
            None => (self.warps(nt).1 - 1) * self.batch * (self.m / 16) * 32 * (self.dv / 8 + 1) * 4 * 4,
        }
    }

    /// [`Self::combine_bytes`] of the warpgroup form over `ks` key slices (a form that runs
    /// more slices than the block graph's warpgroups hold, such as three warpgroups of 64
    /// rows).
    pub fn combine_bytes_slices(&self, ks: usize) -> usize {
        (ks - 1) * self.slot_bytes()
    }

    /// Bytes of the area where a block of a thread-block cluster of `cluster` that split the
    /// loop leaves its merged partials for the first block to read (`mi::FlashWG::finish`'s
    /// `remote`: one slot per batch item and warpgroup's rows; 0 outside a cluster). In the
    /// two-block halves form the other block writes it, so it must not overlap anything
    /// asynchronous copies write there.
    pub fn remote_bytes(&self, cluster: usize) -> usize {
        match self.wg {
            Some(_) if cluster > 1 => self.slot_bytes(),
            _ => 0,
        }
    }

    /// Bytes of the slots of one slice or block: `FlashRows::SLOT_FLOATS<128>` per batch item
    /// and warpgroup's rows.
    fn slot_bytes(&self) -> usize {
        self.batch * (self.m / 64) * 128 * (self.dv / 2 + 4) * 4
    }
}

/// The attention region of `bg`, if it has exactly the form above and the block shape suits
/// the runtime (batch items spread evenly over warps, whole 16-row groups per warp, 16-multiples elsewhere, bounded registers).
/// `need[j]`: op j contributes to an output; `uses[t]`: the ops reading tile t.
pub(crate) fn find(bg: &BlockGraph, need: &[bool], uses: &[Vec<usize>], target: &Target) -> Option<FlashRegion> {
    let nt: usize = bg.block_dim.iter().product();
    if !nt.is_multiple_of(32) || bg.forloop_range < 1 {
        return None;
    }
    let ops = &bg.ops;
    let only = |t: STensorId, users: &[usize]| uses[t].iter().all(|u| users.contains(u));
    let last_dim = |t: STensorId| bg.tensors[t].dims.len() - 1;
    let lead = |t: STensorId| {
        let d = &bg.tensors[t].dims;
        d[..d.len().saturating_sub(2)].to_vec()
    };
    for (jr, rop) in ops.iter().enumerate() {
        let BlockOpKind::ReductionMax { dim } = rop.kind else { continue };
        if !need[jr] {
            continue;
        }
        let s = rop.inputs[0];
        let (mx, dm) = (rop.outputs[0], rop.outputs[1]);
        if dim != last_dim(s) || bg.tensors[s].phase != Phase::Loop {
            continue;
        }
        // S = matmul(Q, K)
        let Some(js) = ops.iter().position(|o| matches!(o.kind, BlockOpKind::Matmul) && o.outputs[0] == s) else {
            continue;
        };
        let (q, k) = (ops[js].inputs[0], ops[js].inputs[1]);
        // P = exp(S - M)
        let Some(jsub) = uses[mx]
            .iter()
            .copied()
            .find(|&u| matches!(ops[u].kind, BlockOpKind::Binary { op: BinaryOp::Sub }) && ops[u].inputs == [s, mx])
        else {
            continue;
        };
        let sub = ops[jsub].outputs[0];
        let [jexp] = uses[sub][..] else { continue };
        if !matches!(ops[jexp].kind, BlockOpKind::Unary { op: UnaryOp::Exp }) {
            continue;
        }
        let p = ops[jexp].outputs[0];
        // a = exp(D)
        let [jalpha] = uses[dm][..] else { continue };
        if !matches!(ops[jalpha].kind, BlockOpKind::Unary { op: UnaryOp::Exp }) {
            continue;
        }
        let alpha = ops[jalpha].outputs[0];
        // O = accum_rescale(matmul(P, V), a)
        let Some(jpv) =
            uses[p].iter().copied().find(|&u| matches!(ops[u].kind, BlockOpKind::Matmul) && ops[u].inputs[0] == p)
        else {
            continue;
        };
        let (mut v, pv) = (ops[jpv].inputs[1], ops[jpv].outputs[0]);
        // V = rms_norm(V') of a tile read by nothing else: normalised in place.
        let v_norm = ops
            .iter()
            .position(|o| o.kind == BlockOpKind::RmsNorm { eps: 0.0 } && o.outputs[0] == v)
            .filter(|&jn| uses[v][..] == [jpv] && uses[ops[jn].inputs[0]][..] == [jn]);
        if let Some(jn) = v_norm {
            v = ops[jn].inputs[0];
        }
        let [jo] = uses[pv][..] else { continue };
        if !matches!(ops[jo].kind, BlockOpKind::ForloopAccumRescale { acc: Accum::None })
            || ops[jo].inputs != [pv, alpha]
        {
            continue;
        }
        let o = ops[jo].outputs[0];
        // L: reduction(P) then a plain rescale, or a summing rescale of P.
        let mut region = vec![js, jr, jsub, jexp, jalpha, jpv, jo];
        region.extend(v_norm);
        let mut l = None;
        let mut p_users = vec![jpv];
        let mut ok = true;
        for &u in &uses[p] {
            if u == jpv {
                continue;
            }
            match ops[u].kind {
                BlockOpKind::Reduction { dim } if dim == last_dim(p) && l.is_none() => {
                    let ls = ops[u].outputs[0];
                    match uses[ls][..] {
                        [ja] if matches!(ops[ja].kind, BlockOpKind::ForloopAccumRescale { acc: Accum::None })
                            && ops[ja].inputs == [ls, alpha] =>
                        {
                            l = Some(ops[ja].outputs[0]);
                            region.extend([u, ja]);
                            p_users.push(u);
                        }
                        _ => ok = false,
                    }
                }
                BlockOpKind::ForloopAccumRescale { acc: Accum::Sum } if ops[u].inputs == [p, alpha] && l.is_none() => {
                    l = Some(ops[u].outputs[0]);
                    region.push(u);
                    p_users.push(u);
                }
                _ => ok = false,
            }
        }
        // X = accum_max(M)
        let mut x = None;
        for &u in &uses[mx] {
            if u == jsub {
                continue;
            }
            if matches!(ops[u].kind, BlockOpKind::ForloopAccumMax) && x.is_none() {
                x = Some(ops[u].outputs[0]);
                region.push(u);
            } else {
                ok = false;
            }
        }
        let alpha_users: Vec<usize> = region.iter().copied().filter(|&j| ops[j].inputs.contains(&alpha)).collect();
        if !ok
            || !only(s, &[jr, jsub])
            || !only(alpha, &alpha_users)
            || !only(p, &p_users)
            || bg.tensors[q].phase != Phase::Invariant
            || [k, v].iter().any(|&t| bg.tensors[t].phase != Phase::Loop)
            || bg.tensors[q].dims.len() < 2
            || ![k, v, s, o].iter().all(|&t| lead(t) == lead(q))
        {
            continue;
        }
        let (dq, dk, dvv) = (&bg.tensors[q].dims, &bg.tensors[k].dims, &bg.tensors[v].dims);
        let r = dq.len();
        let (m, d, n, dv) = (dq[r - 2], dq[r - 1], dk[r - 1], dvv[r - 1]);
        if dk[r - 2] != d || dvv[r - 2] != n {
            continue;
        }
        let batch: usize = lead(q).iter().product();
        let one_wave = bg.num_blocks() <= target.budgets.one_wave_blocks;
        let f = FlashRegion {
            ops: region,
            q,
            k,
            v,
            v_norm: v_norm.is_some(),
            o,
            l,
            x,
            batch,
            m,
            d,
            n,
            dv,
            one_wave,
            frag_regs: target.budgets.flash_fragment_regs,
            wg: None,
        };
        if !(m.is_multiple_of(16) && d.is_multiple_of(16) && n.is_multiple_of(16) && dv.is_multiple_of(16)) {
            continue;
        }
        // Batch items and row groups must share evenly among warps, and the per-warp registers
        // stay bounded.
        if batch == 0 || !(nt / 32).is_multiple_of(batch) {
            continue;
        }
        let (nw, mw) = (nt / 32 / batch, m / 16);
        if mw > nw && !mw.is_multiple_of(nw) {
            continue;
        }
        let (rg, ks) = f.warps(nt);
        if f.regs(rg, ks) > f.frag_regs {
            continue;
        }
        return Some(f);
    }
    None
}
