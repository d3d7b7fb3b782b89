//! Cluster merges (a summing split's push into its first block, eager or lazy) and the
//! finalisation of mean and rms accumulators.

use mirage_ugraph::{Accum, BlockOpKind, STensorId};

use super::ctx::Ctx;
use super::schedule::finalized;
use super::Step;
use crate::emit::{flit, numel, wl};
use crate::error::{unsupported, Result};

impl Ctx<'_> {
    /// The division of mean or rms accumulator `op`'s summed tile, in place (and the root).
    pub(super) fn finalize_divide(&self, op: usize) -> String {
        let o = self.bg.ops[op].outputs[0];
        let e = self.finalized(op, &format!("t{o}[i]"));
        format!("for (int i = tid; i < {}; i += NT) t{o}[i] = {e};\n", numel(self.dims(o)))
    }

    /// Mean or rms accumulator `op`'s value from its summed element `sum` (a C++ float).
    pub(super) fn finalized(&self, op: usize, sum: &str) -> String {
        let aop = &self.bg.ops[op];
        let dx = self.dims(aop.inputs[0]);
        let n = dx[dx.len() - 1] * self.bg.forloop_range * self.cluster;
        match aop.kind {
            BlockOpKind::ForloopAccum { acc: Accum::Rms, eps } => {
                format!("sqrtf({sum} / {}{})", flit(n as f32), crate::default_kernels::plus_eps(eps))
            }
            _ => format!("{sum} / {}", flit(n as f32)),
        }
    }

    /// In a lazy cluster merge, the mean or rms accumulator op whose merged tile is `t`.
    pub(super) fn lazily_finalized(&self, t: STensorId) -> Option<usize> {
        (0..self.bg.ops.len()).find(|&j| finalized(&self.bg.ops[j].kind) && self.bg.ops[j].outputs[0] == t)
    }

    /// Where merged tile `t` lies in a block's slot of the cluster merge's receive area (floats).
    pub(super) fn slot_offset(&self, t: STensorId) -> usize {
        let before = self.merged_by_step.iter().take_while(|&&m| m != t);
        before.map(|&m| numel(self.dims(m)).next_multiple_of(4)).sum()
    }

    /// In a lazy cluster merge, merged tile `t`'s element `idx` as the eager merge leaves it:
    /// this block's sum plus every other block's slot, in rank order, then a mean's division
    /// or an rms's root.
    pub(super) fn merged_read(&self, t: STensorId, idx: &str) -> String {
        let slot = self.recv.map_or(0, |(_, slot)| slot);
        let at = self.slot_offset(t);
        let mut sum = format!("t{t}[{idx}]");
        for r in 1..self.cluster {
            sum = format!("{sum} + mi_recv[{} + ({idx})]", (r - 1) * slot + at);
        }
        match self.lazily_finalized(t) {
            Some(op) => self.finalized(op, &format!("({sum})")),
            None => format!("({sum})"),
        }
    }

    /// A summing cluster's merge of its fp32 tiles `ts` (`mi::cluster_push`): every block but
    /// the first stores its tiles into the first block's receive area and leaves; the first
    /// block waits for them on the cluster barrier and adds them to its own.
    pub(super) fn cluster_push(&self, ts: &[STensorId]) -> Result<String> {
        let Some((off, slot)) = self.recv else {
            return unsupported("internal error: a cluster merge without its receive area");
        };
        let mut s = if self.lazy {
            // (`mi_recv` is declared at the kernel's start: the readers after the merge use it.)
            String::from("{ // the cluster's sums into its first block's receive area, added where read\n")
        } else {
            format!("{{ // the cluster's sums into its first block\nfloat* const mi_recv = reinterpret_cast<float*>(mi_smem + {off});\n")
        };
        s.push_str("mi::cluster_wait(); // every block of the cluster has started\nif (mi::cluster_rank() != 0) {\n");
        let mut gather = String::new();
        let mut bytes = 0;
        for &t in ts {
            let (n, at) = (numel(self.dims(t)), self.slot_offset(t));
            if self.async_push {
                wl!(s, "  mi::cluster_push_async<NT>(t{t}, mi_recv + {at}, {slot}, {n}, mi_merge_bar);");
            } else {
                wl!(s, "  mi::cluster_push<NT>(t{t}, mi_recv + {at}, {slot}, {n});");
            }
            wl!(gather, "mi::cluster_gather<NT, {}>(t{t}, mi_recv + {at}, {slot}, {n});", self.cluster);
            bytes += n * 4;
        }
        if self.async_push {
            wl!(
                s,
                "  return;\n}}\nif (tid == 0) mi::cluster_merge_arm(mi_merge_bar, {}u);",
                (self.cluster - 1) * bytes
            );
            s.push_str("mi::mbar_wait(mi_merge_bar, 0);\n");
        } else {
            s.push_str(
                "  mi::cluster_arrive_release();\n  return;\n}\nmi::cluster_arrive_relaxed();\nmi::cluster_wait();\n",
            );
        }
        if !self.lazy {
            s.push_str(&gather);
            s.push_str("__syncthreads();\n");
        }
        s.push_str("}\n");
        Ok(s)
    }

    /// Adds fp32 tiles `ts` of every block of the cluster into the first block's, between two
    /// cluster barriers (the first makes every block's tiles visible, the second keeps them
    /// alive until read).
    pub(super) fn cluster_sum(&self, ts: &[STensorId]) -> String {
        let mut s = String::from("mi::cluster_sync();\n");
        for &t in ts {
            wl!(s, "mi::cluster_sum<NT, {}>(t{t}, {});", self.cluster, numel(self.dims(t)));
        }
        s.push_str("mi::cluster_sync();\n");
        s
    }

    /// `Step::ClusterMerge`: a summing cluster's merge of its accumulators.
    pub(super) fn step_cluster_merge(&self, s: &mut String) -> Result<()> {
        let bg = self.bg;
        s.push_str(&self.cluster_push(&self.merged_by_step)?);
        let divided = |j: &usize| finalized(&bg.ops[*j].kind) && self.merged_by_step.contains(&bg.ops[*j].outputs[0]);
        for op in (0..bg.ops.len()).filter(|j| !self.lazy && divided(j)) {
            s.push_str(&self.finalize_divide(op));
        }
        Ok(())
    }

    /// `Step::Finalize`: a mean or rms accumulator's finalisation after the loop.
    pub(super) fn step_finalize(&self, op: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let step = Step::Finalize { op };
        let o = bg.ops[op].outputs[0];
        if self.sum_acc(op).is_some() {
            let sc = self.scratch_arg(step, &format!("decltype(rs{op})"), s);
            wl!(s, "rs{op}.finish({sc}, [&](int r) -> float& {{ return t{o}[r]; }});");
            if sc == "nullptr" && self.cluster == 1 {
                // One slice: rows are stored by their fragments' lanes, read below by others.
                wl!(s, "__syncthreads();");
            }
        }
        // A summing cluster divides in its merge, once every block's sums are added.
        if !self.merged_by_step.contains(&o) {
            if self.cluster > 1 {
                wl!(s, "{}", self.cluster_sum(&[o]));
            }
            s.push_str(&self.finalize_divide(op));
        }
        Ok(())
    }
}
