//! The attention region's emission: the warp-specialised producer (`FlashWG::run_ws`), the
//! loop's step (`mi::Flash` / `mi::FlashWG`) and its end (`finish`).

use mirage_ugraph::STensorId;

use super::ctx::Ctx;
use super::plan::{ws_barriers_bytes, WS_PRODUCER_THREADS};
use super::trailing;
use crate::emit::wl;
use crate::error::{unsupported, Result};
use crate::runtime::Part;

impl Ctx<'_> {
    /// The warp-specialised form's set-up and producer (`FlashWG::run_ws`). Thread 0 sets up the
    /// stage mbarriers at byte `off` (full: one arrival a producer thread; empty: one a
    /// consumer warp of the stage, or a consumer thread with V's row factors); then the producer warpgroup (threads NT on) copies each
    /// iteration's staged tiles into stage `it % stages` once the consumers have emptied it,
    /// and leaves; the consumers take its registers. A producer thread's arrival is its copies
    /// landing (`cp.async.mbarrier.arrive`: it never waits, so it runs as far ahead as the
    /// empty stages let it); each consumer fences its view for the tensor cores after its
    /// wait. (A normalised V is not rewritten: `run_ws` scales P by the rows' factors.) With
    /// `plan::ws_split_v`, K and V of a stage are marked full on mbarriers of their own.
    pub(super) fn ws_producer(&self, off: usize, staged: &[(usize, usize, STensorId)]) -> Result<String> {
        let (st, range) = (self.stages, self.bg.forloop_range);
        let mut s = String::new();
        wl!(s, "  unsigned long long* const mi_full = reinterpret_cast<unsigned long long*>(mi_smem + {off});");
        wl!(s, "  unsigned long long* const mi_empty = mi_full + {st};");
        let split = self.ws_split_v();
        if split {
            wl!(s, "  unsigned long long* const mi_vfull = mi_full + {};", 2 * st);
        }
        wl!(s, "  if (tid == 0) {{");
        wl!(s, "    for (int i = 0; i < {st}; ++i) {{");
        wl!(s, "      mi::mbar_init(mi_full + i, {WS_PRODUCER_THREADS});");
        // Consumer warps releasing a stage: its warpgroup's four (interleaved), else every
        // consumer warp; every thread of them where V's row factors read the stage with
        // ordinary loads (the `mi::VRowFactors` variant: each thread's arrival releases its own reads).
        let warps = if self.ws_interleaved() { 4 } else { self.nt / 32 };
        let readers = if self.flash.as_ref().is_some_and(|(f, _)| f.v_norm) { warps * 32 } else { warps };
        wl!(s, "      mi::mbar_init(mi_empty + i, {readers});");
        if split {
            wl!(s, "      mi::mbar_init(mi_vfull + i, {WS_PRODUCER_THREADS});");
        }
        wl!(s, "    }}");
        wl!(s, "  }}");
        wl!(s, "  __syncthreads();");
        wl!(s, "  if (tid >= {}) {{ // the producer", if self.ws3() { "NC" } else { "NT" });
        self.uses(Part::WarpSpecialized);
        wl!(s, "    mi::setmaxnreg_dec<{}>();", self.budgets.ws_producer_regs);
        wl!(s, "    constexpr int NT = {WS_PRODUCER_THREADS};");
        wl!(s, "    const int tid = mi::lin_tid() - {};", self.consumers());
        wl!(s, "#pragma unroll 1");
        wl!(s, "    for (int it = 0; it < {range}; ++it) {{");
        wl!(s, "      const int st = it % {st};");
        wl!(s, "      if (it >= {st}) mi::mbar_wait(mi_empty + st, (it / {st} - 1) & 1);");
        // With V marked full apart: K, then V, each arrived for once landed (a thread's
        // arrival counts all its copies so far).
        let order: Vec<(usize, usize, STensorId)> = match &self.flash {
            Some((f, _)) if split => {
                let of = |tile| staged.iter().copied().find(|x| x.2 == tile);
                match (of(f.k), of(f.v)) {
                    (Some(k), Some(v)) if staged.len() == 2 => vec![k, v],
                    _ => return unsupported("internal error: the warp-specialised loop stages K and V only"),
                }
            }
            _ => staged.to_vec(),
        };
        for (i, &(k, op, t)) in order.iter().enumerate() {
            let dst = format!("(t{t}_st + st * {})", self.stage_elems(t));
            for l in self.load_by(k, op, t, Some("it"), &dst, true)?.lines() {
                wl!(s, "      {l}");
            }
            if split {
                wl!(s, "      mi::cp_async_mbar_arrive({} + st);", if i == 0 { "mi_full" } else { "mi_vfull" });
            }
        }
        wl!(s, "      mi::cp_async_commit();");
        if !split {
            wl!(s, "      mi::cp_async_mbar_arrive(mi_full + st);");
        }
        wl!(s, "    }}");
        wl!(s, "    mi::cp_async_wait<0>();");
        if self.cluster > 1 {
            // Its arrival on the cluster barrier the merge after the loop starts with, releasing
            // its copies.
            wl!(s, "    mi::cluster_arrive_release();");
        }
        wl!(s, "    return;");
        wl!(s, "  }}");
        let b = &self.budgets;
        wl!(s, "  mi::setmaxnreg_inc<{}>();", if self.ws3() { b.ws3_consumer_regs } else { b.ws_consumer_regs });
        Ok(s)
    }

    /// `Step::Flash`: one iteration of the attention region (the whole loop in the
    /// warp-specialised form).
    pub(super) fn step_flash(&self, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let Some((f, _)) = &self.flash else { return unsupported("internal error: no attention region") };
        let (q, k, v) = (self.tile(f.q), self.tile(f.k), self.tile(f.v));
        // With V normalised (`mi::rms_norm_rows_frag`, in place): with the lookahead
        // (its next stage landed too) each iteration normalises the next stage a part
        // after each block's P V, and the first iteration its own stage first;
        // otherwise each iteration its own stage before the step. The loop's first
        // barrier, after a proxy fence, publishes the writes to the wgmma reads.
        let mut between = String::new();
        // (The warp-specialised form scales P by V's row factors instead: `mi::VRowFactors`.)
        if f.v_norm && self.ws.is_none() {
            let Some(l) = self.layout[f.v] else { return unsupported("internal error: V has no layout") };
            let ty = self.storage[f.v].map_or("float", |st| st.cty());
            self.uses(Part::Attention);
            let norm =
                format!("mi::rms_norm_rows_frag<NT, {}, {}, {}, {}, {ty}", l.rows, l.inner, l.ld, l.swz.is_some());
            let lookahead = self.wg_lookahead();
            if lookahead {
                // One part per block of the step (`between(j)`, j < the step's NB).
                let (st, elems) = (self.stages, self.stage_elems(f.v));
                between = format!(
                    ", [&](int j) {{ if (it + 1 < {}) {norm}, decltype(fa)::NB>({v}_st + ((it + 1) % {st}) * {elems}, j); }}",
                    bg.forloop_range
                );
                wl!(s, "if (it == 0) {{");
            }
            let pad = if lookahead { "  " } else { "" };
            wl!(s, "{pad}{norm}>({v});");
            wl!(s, "{pad}mi::fence_proxy_async();");
            wl!(s, "{pad}__syncthreads();");
            if lookahead {
                wl!(s, "}}");
            }
        }
        if self.ws.is_some() {
            // The whole loop, over the stages the producer fills.
            let mut tmpl = self.stages.to_string();
            let mut args = format!(
                "{q}, {k}_st, {v}_st, {}, {}, mi_full, mi_empty, {}",
                self.stage_elems(f.k),
                self.stage_elems(f.v),
                bg.forloop_range
            );
            // What is computed (Q's and V's factors) is `fa`'s variant (`flash_decl`); the
            // template arguments here are the pipeline's.
            let mut split = "false";
            let (mut rs, mut vfull) = ("nullptr".to_string(), "nullptr");
            if f.v_norm {
                // V's row factors, after the mbarriers (`ws_barriers_bytes`).
                let ty = self.storage[f.v].map_or("float", |st| st.cty());
                let at = ws_barriers_bytes(self.stages, self.ws_split_v());
                rs = format!("reinterpret_cast<{ty}*>(reinterpret_cast<unsigned char*>(mi_full) + {at})");
            } else if self.ws_split_v() {
                (split, vfull) = ("true", "mi_vfull");
            }
            tmpl.push_str(&trailing(&[split.to_string()], &["false"]));
            args.push_str(&trailing(&[rs, vfull.to_string()], &["nullptr", "nullptr"]));
            wl!(s, "fa.run_ws<{tmpl}>({args});");
        } else if f.wg.is_some() {
            // With three stages or more, the next iteration's K stage (already waited
            // for; at the last iteration a stale stage whose S is never used); else no
            // lookahead across iterations (each step starts its own S).
            let (st, elems) = (self.stages, self.stage_elems(f.k));
            if self.wg_lookahead() {
                wl!(
                    s,
                    "fa.step<true>({q}, {k}, {v}, {k}_st + ((it + 1) % {st}) * {elems}, it == 0, it + 1 == {}{between});",
                    bg.forloop_range
                );
            } else {
                wl!(s, "fa.step<false>({q}, {k}, {v}, nullptr, true, false);");
            }
        } else {
            wl!(s, "fa.step({q}, {k}, {v}, it == 0);");
        }
        Ok(())
    }

    /// `Step::FlashEnd`: the region's accumulator tiles, written once after the loop.
    pub(super) fn step_flash_end(&self, s: &mut String) -> Result<()> {
        let Some((f, off)) = &self.flash else { return unsupported("internal error: no attention region") };
        let opt = |t: Option<STensorId>| t.map_or("nullptr".to_string(), |t| self.tile(t));
        let cs = if self.halves() {
            format!("<{}, true, true>", self.cluster)
        } else if self.ws.is_some() {
            format!("<{}, true>", self.cluster.max(1))
        } else if self.cluster > 1 {
            format!("<{}>", self.cluster)
        } else {
            String::new()
        };
        wl!(
            s,
            "fa.finish{cs}({}, {}, {}, {}{});",
            if off.is_some() { "mi_fa" } else { "nullptr" },
            self.tile(f.o),
            opt(f.l),
            opt(f.x),
            if self.flash_remote.is_some() { ", mi_fa_remote" } else { "" }
        );
        Ok(())
    }
}
