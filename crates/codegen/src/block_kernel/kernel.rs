//! The frame of a block kernel ([`Ctx::kernel`]): its signature and declarations, the
//! warp-specialised producer, the cp.async pipeline's prologue and loop, and the barriers and
//! copy waits between steps, placed by the bytes each step reads and writes.

use mirage_ugraph::STensorId;

use super::ctx::Ctx;
use super::plan::{combine_bytes, VariantHooks, WS_PRODUCER_THREADS};
use super::{trailing, Section, Step, WG_ALIGN};
use crate::emit::{kernel_open_with, kernel_params, wl};
use crate::error::Result;
use crate::program::Storage;
use crate::runtime::Part;

/// Whether two sets of byte ranges share a byte.
fn overlaps(a: &[(usize, usize)], b: &[(usize, usize)]) -> bool {
    a.iter().any(|&(lo, hi)| b.iter().any(|&(l2, h2)| lo < h2 && l2 < hi))
}

/// `mm.wait()` of every warpgroup accumulator with products in flight, after `ind`.
fn waits(inflight: &mut Vec<(usize, Vec<(usize, usize)>)>, ind: &str) -> String {
    inflight.drain(..).map(|(acc, _)| format!("{ind}mm{acc}.wait();\n")).collect()
}

/// Byte range of each tile in shared memory (None: not there).
type TileRanges = Vec<Option<(usize, usize)>>;

/// What the kernel's step loop tracks between steps.
struct Frame {
    /// Byte range of each materialised tile (staged tiles: all stages).
    range: TileRanges,
    /// Barriers only where a step reads bytes written, or writes bytes touched, since the
    /// last barrier (buffers share memory across lifetimes, so this is by byte range).
    dirty_w: Vec<(usize, usize)>,
    dirty_r: Vec<(usize, usize)>,
    /// Tiles whose copies were issued (outside the pipeline) but not yet waited for.
    pending: Vec<STensorId>,
    /// Warpgroup accumulators with products in flight, and the bytes those read.
    inflight: Vec<(usize, Vec<(usize, usize)>)>,
    /// The pipeline's prologue, until issued.
    prologue: String,
    /// Whether barriers span the third attention warpgroup too (the loop to `finish`).
    wide: bool,
    /// Whether each warp reads back only rows it wrote (after the finish, `Ctx::own_rows`):
    /// a warp barrier orders them.
    own: bool,
}

impl Frame {
    /// The byte ranges of tiles `ts`.
    fn ranges_of(&self, ts: &[STensorId]) -> Vec<(usize, usize)> {
        ts.iter().filter_map(|&t| self.range[t]).collect()
    }
}

impl Ctx<'_> {
    /// The kernel `name`: its frame around every step of the plan.
    pub(super) fn kernel(&self, name: &str) -> Result<String> {
        let (bg, steps, step_rw) = (self.bg, &self.steps, &self.step_rw);
        let staged = self.staged(steps);
        let late = self.late_launch;
        let (mut s, range) = self.head(name, &staged, late)?;
        let prologue = self.prologue(&staged, late)?;
        let mut fm = Frame {
            range,
            dirty_w: Vec::new(),
            dirty_r: Vec::new(),
            pending: Vec::new(),
            inflight: Vec::new(),
            prologue,
            wide: false,
            own: false,
        };
        let mut in_loop = false;
        let mut exited = false;
        let loop_start = steps.iter().position(|(sec, _)| *sec == Section::Loop);
        // Issued before the pre-loop computation (QK-norm's Q, normalised from device memory)
        // where none of its tiles shares bytes with the stages, so that the first stage's
        // copies are in flight meanwhile. (Waits on older copies then wait for these too.)
        let stage_bytes: Vec<(usize, usize)> = staged.iter().filter_map(|&(_, _, t)| fm.range[t]).collect();
        let mut early = !staged.is_empty()
            && steps.iter().zip(step_rw).all(|(&(sec, _), (w, r))| {
                sec != Section::Pre
                    || !(overlaps(&fm.ranges_of(w), &stage_bytes) || overlaps(&fm.ranges_of(r), &stage_bytes))
            });
        // Warpgroup products whose tiles are the loop's loaded inputs are issued first in the
        // iteration (right after its loads) and waited for before the first step that writes
        // bytes they read, or at the iteration's end, so that the steps between run beside
        // them (RMSNorm+Linear's row sums of squares).
        let order = self.wg_first_order(steps);
        for pos in order {
            let (sec, step) = &steps[pos];
            if early && *sec == Section::Pre && !matches!(step, Step::Load { .. }) {
                s.push_str(&fm.prologue);
                fm.prologue.clear();
                early = false;
            }
            if *sec == Section::Loop && !in_loop {
                self.enter_loop(&mut fm, &mut s, &staged, &stage_bytes, late)?;
                in_loop = true;
            }
            if *sec == Section::Post && in_loop {
                // (The warp-specialised form has no loop statement: `run_ws` is the loop.)
                if self.ws.is_none() {
                    s.push_str(&waits(&mut fm.inflight, "    "));
                    wl!(s, "  }}");
                    if !staged.is_empty() {
                        wl!(s, "  mi::cp_async_wait<0>();");
                    }
                }
                in_loop = false;
            }
            if let Step::Load { op, .. } = step {
                if self.layout[bg.ops[*op].outputs[0]].is_some_and(|l| l.staged) {
                    continue; // issued by the pipeline above
                }
            }
            // In a cluster split, the blocks but the first leave once the merges are done.
            if self.cluster > 1
                && !self.halves()
                && *sec == Section::Post
                && !matches!(step, Step::MatAccEnd { .. } | Step::ClusterMerge | Step::Finalize { .. } | Step::FlashEnd)
                && !exited
            {
                wl!(s, "  if (mi::cluster_rank() != 0) return; // merged into the cluster's first block");
                exited = true;
            }
            let ind = if in_loop && self.ws.is_none() { "    " } else { "  " };
            self.emit_step(&mut fm, &mut s, pos, ind, &staged, loop_start)?;
        }
        if in_loop && self.ws.is_none() {
            s.push_str(&waits(&mut fm.inflight, "    "));
            wl!(s, "  }}");
        }
        if !fm.pending.is_empty() {
            wl!(s, "  mi::cp_async_wait<0>();");
        }
        wl!(s, "}}");
        Ok(s)
    }

    /// Step `pos` after the waits and the barrier it needs (`ind`: its indent).
    fn emit_step(
        &self,
        fm: &mut Frame,
        s: &mut String,
        pos: usize,
        ind: &str,
        staged: &[(usize, usize, STensorId)],
        loop_start: Option<usize>,
    ) -> Result<()> {
        let (bg, steps, step_rw) = (self.bg, &self.steps, &self.step_rw);
        let (sec, step) = &steps[pos];
        let (mut w, mut r) = (fm.ranges_of(&step_rw[pos].0), fm.ranges_of(&step_rw[pos].1));
        if let Some((off, bytes)) = self.finish_scratch(*step) {
            w.push((off, off + bytes));
            r.push((off, off + bytes));
        }
        // The copies of tiles loaded outside the pipeline are waited for just before the
        // first step that touches one, so that every load before it is in flight at once
        // (LoRA issued its four inputs one round trip after another).
        // Before any loop, only up to the newest copy group the step touches (one group
        // per load, committed in order).
        if !matches!(step, Step::Load { .. }) {
            let newest = fm.pending.iter().rposition(|&t| {
                let tr = fm.ranges_of(&[t]);
                overlaps(&tr, &r) || overlaps(&tr, &w)
            });
            if let Some(i) = newest {
                let before_loop = loop_start.is_none_or(|l| pos < l);
                let keep = if before_loop { fm.pending.len() - 1 - i } else { 0 };
                wl!(s, "{ind}mi::cp_async_wait<{keep}>();");
                fm.pending.drain(..fm.pending.len() - keep);
            }
        }
        // (One warpgroup chain at a time: two in flight, as two accumulators of one chain,
        // ran slower on the H200.)
        let wg_step = matches!(*step, Step::MatAcc { op, .. } if self.wg_acc[op]);
        if wg_step || fm.inflight.iter().any(|(_, read)| overlaps(&w, read)) {
            s.push_str(&waits(&mut fm.inflight, ind));
        }
        if overlaps(&r, &fm.dirty_w) || overlaps(&w, &fm.dirty_w) || overlaps(&w, &fm.dirty_r) {
            wl!(s, "{ind}{}", if fm.own { "__syncwarp();" } else { self.sync_wide(fm.wide) });
            fm.dirty_w.clear();
            fm.dirty_w.extend(fm.ranges_of(&fm.pending));
            fm.dirty_r.clear();
        }
        let body = match *step {
            Step::Load { k, op } => {
                let t = bg.ops[op].outputs[0];
                let mut b = self.load(k, op, t, None, &format!("t{t}"))?;
                b.push_str("mi::cp_async_commit();\n");
                // A tile first read in the loop is waited for there: the loop's first wait
                // covers every older copy group, so its copies overlap the prologue's.
                let read_before_loop = steps[pos + 1..]
                    .iter()
                    .zip(&step_rw[pos + 1..])
                    .any(|((sec, _), (_, r))| *sec == Section::Pre && r.contains(&t));
                if staged.is_empty() || read_before_loop {
                    fm.pending.push(t);
                }
                b
            }
            _ => self.step(*step, *sec)?,
        };
        for l in body.lines() {
            wl!(s, "{ind}{l}");
        }
        if let (true, Step::MatAcc { acc, .. }) = (wg_step, *step) {
            fm.inflight.push((acc, r.clone()));
        }
        if fm.wide && matches!(step, Step::FlashEnd) {
            if self.own_rows().is_some() {
                wl!(s, "  if (tid >= 128) return; // warpgroup 0 stored every row: its warps read back their own");
                fm.own = true;
            } else {
                wl!(s, "  if (tid >= NT) return; // the third attention warpgroup: merged");
            }
            fm.wide = false;
        }
        fm.dirty_w.extend(w);
        fm.dirty_r.extend(r);
        Ok(())
    }

    /// The kernel's signature, shared-memory pointers and tile declarations, and the
    /// warp-specialised producer; with the byte range of each tile.
    fn head(
        &self,
        name: &str,
        staged: &[(usize, usize, STensorId)],
        late: Option<i64>,
    ) -> Result<(String, TileRanges)> {
        let (bg, steps, buffers, buf_of, smem) = (self.bg, &self.steps, &self.buffers, &self.buf_of, self.smem_bytes);
        let mut s = String::new();
        let params = kernel_params(self.ins, self.outs);
        let n_stages = self.stages;
        wl!(
            s,
            "// block graph: grid {:?}, block {:?}, forloop_range {}, {smem} bytes of shared memory, {} pipeline stage(s)",
            bg.grid_dim,
            bg.block_dim,
            bg.forloop_range,
            n_stages
        );
        let threads = if self.ws.is_some() { self.consumers() + WS_PRODUCER_THREADS } else { self.nt };
        let bounds = match self.min_blocks {
            Some(b) => format!("{threads}, {b}"),
            None => threads.to_string(),
        };
        let wait = if late.is_some() {
            "mi::dep_wait(); // the next kernel goes after this loop's last copies"
        } else {
            "mi::dep_enter();"
        };
        s.push_str(&kernel_open_with(&bounds, name, &params, self.nt, &self.prefetches(steps), wait));
        let wgmma = self.flash.as_ref().is_some_and(|(f, _)| f.wg.is_some()) || self.wg_acc.contains(&true);
        wl!(s, "  extern __shared__ __align__({}) unsigned char mi_smem[];", if wgmma { WG_ALIGN } else { 16 });
        wl!(s, "  constexpr int NT = {};", self.nt);
        if self.ws3() {
            wl!(s, "  constexpr int NC = {}; // consumers: NT and a third attention warpgroup", self.consumers());
        }
        wl!(s, "  const int tid = mi::lin_tid();");
        wl!(s, "  (void)tid;");
        if let Some((off, slot)) = self.recv {
            if self.async_push {
                let bar = off + (self.cluster - 1) * slot * 4;
                wl!(s, "  unsigned long long* const mi_merge_bar = reinterpret_cast<unsigned long long*>(mi_smem + {bar}); // the merge's pushes land");
                wl!(s, "  if (mi::cluster_rank() == 0 && tid == 0) mi::cluster_merge_init(mi_merge_bar);");
            }
            wl!(s, "  mi::cluster_arrive_relaxed(); // its merge waits for every block of the cluster to start");
            if self.lazy {
                wl!(s, "  float* const mi_recv = reinterpret_cast<float*>(mi_smem + {off}); // the cluster merge's receive area");
            }
        }
        if let Some(off) = self.scratch {
            wl!(s, "  float* const mi_scratch = reinterpret_cast<float*>(mi_smem + {off}); // matmul split-K");
        }
        if let Some((_, Some(off))) = &self.flash {
            wl!(s, "  float* const mi_fa = reinterpret_cast<float*>(mi_smem + {off}); // attention slice combine");
        }
        if let Some(off) = self.flash_remote {
            wl!(
                s,
                "  float* const mi_fa_remote = reinterpret_cast<float*>(mi_smem + {off}); // the cluster's partials"
            );
        }
        // Byte range of each materialised tile (staged tiles: all stages).
        let mut range: Vec<Option<(usize, usize)>> = vec![None; bg.tensors.len()];
        for (t, b) in buf_of.iter().enumerate() {
            if let (Some(b), Some(st)) = (b, self.storage[t]) {
                let ty = st.cty();
                let off = buffers[*b].offset;
                range[t] = Some((off, off + buffers[*b].size));
                let is_staged = self.layout[t].is_some_and(|l| l.staged);
                let var = if is_staged { format!("t{t}_st") } else { format!("t{t}") };
                wl!(
                    s,
                    "  {ty}* const {var} = reinterpret_cast<{ty}*>(mi_smem + {off}); // {:?} {}",
                    bg.tensors[t].dims,
                    st.name()
                );
            }
        }
        if let Some(off) = self.ws {
            s.push_str(&self.ws_producer(off, staged)?);
        }
        // With a third attention warpgroup (`ws_three`): the block graph's threads alone run
        // the steps before the loop (closed where the loop starts).
        if self.ws3() {
            wl!(s, "  if (tid < NT) {{ // the third attention warpgroup joins at the loop");
        }
        Ok((s, range))
    }

    /// The pipeline's prologue: the first stages of every staged tile (one cp.async group per
    /// stage, empty past the loop's end, so that waiting for all but the newest `stages - 2`
    /// groups means "this stage"). (None in the warp-specialised form: its producer issues
    /// every stage.)
    fn prologue(&self, staged: &[(usize, usize, STensorId)], late: Option<i64>) -> Result<String> {
        let bg = self.bg;
        let n_stages = self.stages;
        let mut prologue = String::new();
        let prologue_stages = if self.ws.is_some() { 0 } else { n_stages.saturating_sub(1) };
        for st in 0..prologue_stages {
            if !staged.is_empty() && st < bg.forloop_range {
                for &(k, op, t) in staged {
                    let dst = format!("(t{t}_st + {})", st * self.stage_elems(t));
                    for l in self.load(k, op, t, Some(&st.to_string()), &dst)?.lines() {
                        wl!(prologue, "  {l}");
                    }
                }
            }
            wl!(prologue, "  mi::cp_async_commit();");
        }
        if late.is_some_and(|at| at < 0) {
            wl!(prologue, "  mi::dep_launch(); // every copy is issued");
        }
        Ok(prologue)
    }

    /// Where the loop starts: the register accumulators and the attention region declared, the
    /// prologue (unless issued earlier), then the loop statement with its stage's wait and
    /// barrier and the next stages' copies.
    fn enter_loop(
        &self,
        fm: &mut Frame,
        s: &mut String,
        staged: &[(usize, usize, STensorId)],
        stage_bytes: &[(usize, usize)],
        late: Option<i64>,
    ) -> Result<()> {
        let (bg, steps, n_stages) = (self.bg, &self.steps, self.stages);
        let wg = self.flash.as_ref().and_then(|(f, _)| f.wg);
        let wgmma = wg.is_some() || self.wg_acc.contains(&true);
        if self.ws3() {
            wl!(s, "  }}");
            fm.wide = true;
        }
        for (_, st) in steps {
            if let Step::MatAcc { op, acc } = *st {
                wl!(s, "  {} mm{acc};", self.mma_acc_type(op));
            }
            if let Step::Accum { op } = *st {
                if let Some(ty) = self.sum_acc(op) {
                    wl!(s, "  {ty} rs{op};");
                }
            }
        }
        self.flash_decl(s);
        // The prologue (unless issued earlier), then the loop.
        if !fm.prologue.is_empty() {
            if overlaps(stage_bytes, &fm.dirty_w) || overlaps(stage_bytes, &fm.dirty_r) {
                wl!(s, "  __syncthreads();");
            }
            s.push_str(&fm.prologue);
            fm.prologue.clear();
        }
        if self.ws.is_some() {
            // The whole loop is the region's `run_ws` (`Step::Flash`), fed by the
            // producer: the consumers' own copies (Q) land and are published to the
            // tensor cores first.
            wl!(s, "  mi::cp_async_wait<0>();");
            wl!(s, "  mi::fence_proxy_async();");
            wl!(s, "  {}", self.sync_wide(fm.wide));
            fm.pending.clear();
        } else {
            if wg.is_some() {
                // Two iterations per pass let the compiler rename the S registers the
                // wgmma form carries a step ahead instead of copying them.
                wl!(s, "#pragma unroll 2");
            }
            wl!(s, "  for (int it = 0; it < {}; ++it) {{", bg.forloop_range);
            if staged.is_empty() {
                // Copies issued before the loop and not yet waited for land before this
                // barrier, which then publishes them (not a wait and a barrier in every
                // iteration at their first reader).
                if !fm.pending.is_empty() {
                    wl!(s, "    mi::cp_async_wait<0>();");
                    fm.pending.clear();
                }
                wl!(s, "    __syncthreads();");
            } else if n_stages >= 2 {
                // The wgmma form with three stages or more also reads the next iteration's
                // K (a step ahead); its tiles are then made visible to the tensor cores'
                // (async-proxy) reads.
                wl!(s, "    mi::cp_async_wait<{}>();", n_stages - if self.wg_lookahead() { 3 } else { 2 });
                if wgmma {
                    wl!(s, "    mi::fence_proxy_async();");
                }
                wl!(s, "    __syncthreads();");
                for &(_, _, t) in staged {
                    let ty = self.storage[t].map_or("float", Storage::cty);
                    wl!(s, "    {ty}* const t{t} = t{t}_st + (it % {n_stages}) * {};", self.stage_elems(t));
                }
                let ahead = n_stages - 1;
                wl!(s, "    if (it + {ahead} < {}) {{", bg.forloop_range);
                for &(k, op, t) in staged {
                    let dst = format!("(t{t}_st + ((it + {ahead}) % {n_stages}) * {})", self.stage_elems(t));
                    for l in self.load(k, op, t, Some(&format!("(it + {ahead})")), &dst)?.lines() {
                        wl!(s, "      {l}");
                    }
                }
                wl!(s, "    }}");
                wl!(s, "    mi::cp_async_commit();");
                if let Some(at) = late.filter(|&at| at >= 0) {
                    wl!(s, "    if (it == {at}) mi::dep_launch(); // the last copies are issued");
                }
            } else {
                wl!(s, "    __syncthreads();");
                for &(k, op, t) in staged {
                    let ty = self.storage[t].map_or("float", Storage::cty);
                    wl!(s, "    {ty}* const t{t} = t{t}_st;");
                    for l in self.load(k, op, t, Some("it"), &format!("t{t}"))?.lines() {
                        wl!(s, "    {l}");
                    }
                }
                wl!(s, "    mi::cp_async_commit();");
                wl!(s, "    mi::cp_async_wait<0>();");
                if wgmma {
                    wl!(s, "    mi::fence_proxy_async();");
                }
                wl!(s, "    __syncthreads();");
            }
        }
        // A barrier publishes only the copies already waited for: tiles still in
        // flight stay dirty, so their first reader gets its wait and a barrier after it.
        fm.dirty_w.clear();
        fm.dirty_w.extend(fm.ranges_of(&fm.pending));
        fm.dirty_r.clear();
        Ok(())
    }

    /// The attention region's declaration (`mi::Flash` / `mi::FlashWG`) and the checks of its
    /// scratch sizes.
    fn flash_decl(&self, s: &mut String) {
        if let Some((f, off)) = &self.flash {
            let ld = |t: STensorId| self.layout[t].map_or(self.dims(t)[self.dims(t).len() - 1], |l| l.ld);
            let ty = self.storage[f.k].map_or("float", Storage::cty);
            let tq = self.storage[f.q].map_or("float", Storage::cty);
            if let Some((rg, ks)) = f.wg {
                // The trailing template arguments (interleaved stages, the variant struct) up
                // to the last one that is not its default.
                let ilv = self.ws.is_some() && self.ws_interleaved();
                let hooks = self.variant_hooks();
                let ilv = trailing(
                    &[ilv.to_string(), hooks.cpp().to_string(), f.dv.to_string()],
                    &["false", VariantHooks::Plain.cpp(), "64"],
                );
                let (threads, ks) = if self.ws3() { ("NC", 3) } else { ("NT", ks) };
                self.uses(Part::WarpSpecialized);
                wl!(
                    s,
                    "  mi::FlashWG<{threads}, {}, {}, {}, {}, {}, {rg}, {ks}, {ty}, {tq}, {}, {}{ilv}> fa;",
                    f.batch,
                    f.m,
                    f.d,
                    f.n,
                    ld(f.q),
                    self.layout[f.q].is_some_and(|l| l.swz.is_some()),
                    f.x.is_some()
                );
            } else {
                let (rg, ks) = f.warps(self.nt);
                let cw = f.chunk(rg, ks);
                self.uses(Part::Attention);
                wl!(
                    s,
                    "  mi::Flash<NT, {}, {}, {}, {}, {}, {}, {}, {}, {rg}, {ks}, {cw}, {ty}, {tq}, {}> fa;",
                    f.batch,
                    f.m,
                    f.d,
                    f.n,
                    f.dv,
                    ld(f.q),
                    ld(f.k),
                    ld(f.v),
                    f.x.is_some()
                );
            }
            if off.is_some() {
                // The planner's combine scratch must hold what the runtime's `finish`
                // writes there.
                wl!(
                    s,
                    "  static_assert(decltype(fa)::scratch_floats<{}>() * 4 <= {}, \"attention combine scratch\");",
                    self.cluster.max(1),
                    combine_bytes(f, self.nt, self.ws3())
                );
            }
            if self.flash_remote.is_some() {
                wl!(
                    s,
                    "  static_assert(decltype(fa)::remote_floats<{}>() * 4 <= {}, \"attention cluster partials\");",
                    self.cluster,
                    f.remote_bytes(self.cluster)
                );
            }
            wl!(s, "  fa.init();");
        }
    }

    /// The order the kernel emits `steps` in: theirs, but for the loop's warpgroup
    /// accumulations ([`Ctx::wg_acc`]) whose two tiles are inputs loaded before the loop's
    /// first other step: those move right before that step.
    fn wg_first_order(&self, steps: &[(Section, Step)]) -> Vec<usize> {
        let bg = self.bg;
        let in_loop = |p: usize| steps[p].0 == Section::Loop;
        let Some(first) = (0..steps.len()).find(|&p| {
            in_loop(p)
                && !matches!(steps[p].1, Step::Load { .. })
                && !matches!(steps[p].1, Step::MatAcc { op, .. } if self.wg_acc[op])
        }) else {
            return (0..steps.len()).collect();
        };
        let loaded_before = |t: STensorId| {
            steps[..first].iter().any(|&(_, st)| matches!(st, Step::Load { op, .. } if bg.ops[op].outputs[0] == t))
        };
        let hoisted: Vec<usize> = (first..steps.len())
            .filter(|&p| in_loop(p))
            .filter(|&p| matches!(steps[p].1, Step::MatAcc { op, .. } if self.wg_acc[op] && bg.ops[op].inputs.iter().all(|&t| loaded_before(t))))
            .collect();
        let mut order: Vec<usize> = Vec::with_capacity(steps.len());
        for p in (0..steps.len()).filter(|p| !hoisted.contains(p)) {
            if p == first {
                order.extend(&hoisted);
            }
            order.push(p);
        }
        order
    }
}
