//! One step of a block kernel as CUDA statements ([`Ctx::step`]): matmuls, reductions, norms,
//! element-wise groups (in shared memory or fused into an output's store), accumulator
//! updates and output stores. The attention region's steps are in `attention.rs`, the
//! cluster merge's and finalisation's in `merge.rs`.

use mirage_ugraph::{Accum, BinaryOp, BlockOpKind, STensorId, ThreadOp};

use super::ctx::Ctx;
use super::load::rows_of;
use super::{Section, Step};
use crate::emit::{bcast, binary_expr, coord, flit, numel, row_major, unary_expr, wl};
use crate::error::{unsupported, Result};
use crate::program::Storage;
use crate::runtime::Part;

impl Ctx<'_> {
    /// The statements of `step` in section `sec`.
    pub(super) fn step(&self, step: Step, sec: Section) -> Result<String> {
        let bg = self.bg;
        let nt = "NT";
        let mut s = String::new();
        match step {
            Step::Load { .. } => return unsupported("internal error: loads are emitted by the kernel schedule"),
            Step::MatAcc { op, acc } => {
                let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
                // The warpgroup form's products stay in flight until `mm.wait()` (the loop's
                // emission places it).
                let call = if self.wg_acc[op] { "issue" } else { "step" };
                wl!(s, "mm{acc}.{call}({}, {});", self.tile(a), self.tile(b));
            }
            Step::ClusterMerge => self.step_cluster_merge(&mut s)?,
            Step::MatAccEnd { acc } => {
                let o = bg.ops[acc].outputs[0];
                let c = self.at(o, "c");
                let sc = self.scratch_arg(step, &format!("decltype(mm{acc})"), &mut s);
                wl!(s, "mm{acc}.finish({sc}, [&](int c) -> float& {{ return {c}; }});");
            }
            Step::Flash => self.step_flash(&mut s)?,
            Step::FlashEnd => self.step_flash_end(&mut s)?,
            Step::Save { j, op } => self.step_save(j, op, sec, &mut s)?,
            Step::Group { g } => {
                let out = self.groups[g].output;
                wl!(
                    s,
                    "for (int i = tid; i < {}; i += {nt}) {{ // fused element-wise -> t{out}",
                    numel(self.dims(out))
                );
                let r = self.group_body(g, &mut s, "  ");
                wl!(s, "  {} = {};", self.at(out, "i"), self.conv(out, &r));
                wl!(s, "}}");
            }
            Step::GroupSave { g, j, op, w } => self.step_group_save(g, j, op, w, &mut s)?,
            Step::Matmul { op, acc } => self.step_matmul(op, acc, &mut s)?,
            Step::Reduce { op } => self.step_reduce(op, &mut s)?,
            Step::RedMax { op } => self.step_red_max(op, sec, &mut s)?,
            Step::RmsNorm { op } => self.step_rms_norm(op, &mut s)?,
            Step::Concat { op } => self.step_concat(op, &mut s)?,
            Step::Accum { op } if self.sum_acc(op).is_some() => {
                wl!(s, "rs{op}.step({});", self.tile(bg.ops[op].inputs[0]));
            }
            Step::Accum { op } => self.step_accum(op, &mut s)?,
            Step::Finalize { op } => self.step_finalize(op, &mut s)?,
        }
        Ok(s)
    }

    /// The body of element-wise group `g` at element `i` of its output (a C++ int in scope):
    /// its inputs and ops as `const float r..` lines into `s`, each line after `indent`;
    /// returns the name of the result.
    pub(super) fn group_body(&self, g: usize, s: &mut String, indent: &str) -> String {
        let grp = &self.groups[g];
        let od = self.dims(grp.output);
        let reads: Vec<String> = grp.inputs.iter().map(|&x| self.read(x, &bcast(od, "i", self.dims(x)))).collect();
        self.group_ops(g, s, indent, &reads, &[])
    }

    /// The statements of group `g` over its input values `reads` (one expression each); returns
    /// the name of the result. A division by input `r` with `rcp[r]` multiplies by `x{r}_rcp`
    /// (its reciprocal, computed once by the caller).
    pub(super) fn group_ops(&self, g: usize, s: &mut String, indent: &str, reads: &[String], rcp: &[bool]) -> String {
        let grp = &self.groups[g];
        for (r, x) in reads.iter().enumerate() {
            let unused = if rcp.get(r) == Some(&true) { "[[maybe_unused]] " } else { "" };
            wl!(s, "{indent}{unused}const float r{r} = {x};");
        }
        let n_in = grp.thread_graph.num_inputs;
        for (k, op) in grp.thread_graph.ops.iter().enumerate() {
            let e = match *op {
                ThreadOp::Unary { op, arg } => unary_expr(&op, &format!("r{arg}")),
                ThreadOp::Binary { op: BinaryOp::Div, lhs, rhs } if rcp.get(rhs) == Some(&true) => {
                    format!("(r{lhs} * x{rhs}_rcp)")
                }
                ThreadOp::Binary { op, lhs, rhs } => binary_expr(op, &format!("r{lhs}"), &format!("r{rhs}")),
            };
            wl!(s, "{indent}const float r{} = {e};", n_in + k);
        }
        format!("r{}", n_in + grp.thread_graph.ops.len() - 1)
    }

    /// `Step::Save`: output saver `j` (op `op`) of a tile.
    pub(super) fn step_save(&self, j: usize, op: usize, sec: Section, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let BlockOpKind::Output { omap, forloop_dim } = bg.ops[op].kind else {
            return unsupported("internal error: save of a non-output op");
        };
        let t = bg.ops[op].inputs[0];
        let tile = self.dims(t);
        let dev = &self.outs[j];
        let base = self.tile_base(omap, forloop_dim, tile, &dev.strides, (sec == Section::Loop).then_some("it"));
        wl!(s, "{{ // t{t} -> output {j}");
        wl!(s, "  const long long base = {base};");
        // A dense fp32 tile into rows of 8-element multiples: eight values a store.
        let dense = self.streamed[t].is_none()
            && self.storage[t] == Some(Storage::F32)
            && self.layout[t].is_none_or(|l| l.ld == l.inner && l.swz.is_none());
        if dense && rows_of(8, tile, &dev.strides) {
            wl!(s, "  const bool vec = mi::aligned16(out{j});");
            self.uses(Part::Reductions);
            wl!(
                s,
                "  for (int i = tid * 8; i < {}; i += {nt} * 8) mi::store_n<8>(out{j} + base + {}, {} + i, vec);",
                numel(tile),
                Self::tile_elem_offset(tile, &dev.strides, "i"),
                self.tile(t)
            );
        } else {
            wl!(
                s,
                "  for (int i = tid; i < {}; i += {nt}) out{j}[base + {}] = mi::from_f32<{}>({});",
                numel(tile),
                Self::tile_elem_offset(tile, &dev.strides, "i"),
                dev.storage.cty(),
                self.read(t, "i")
            );
        }
        wl!(s, "}}");
        Ok(())
    }

    /// `Step::GroupSave`: group `g` computed in registers, `w` elements a thread, into output `j`.
    pub(super) fn step_group_save(&self, g: usize, j: usize, op: usize, w: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let BlockOpKind::Output { omap, forloop_dim } = bg.ops[op].kind else {
            return unsupported("internal error: save of a non-output op");
        };
        let out = self.groups[g].output;
        let tile = self.dims(out);
        let dev = &self.outs[j];
        let base = self.tile_base(omap, forloop_dim, tile, &dev.strides, None);
        wl!(s, "{{ // fused element-wise -> output {j}");
        wl!(s, "  const long long base = {base};");
        wl!(s, "  const bool vec = mi::aligned16(out{j});");
        if self.halves() {
            // This block's half of the rows (`Planner::finish_halves`).
            let half = numel(tile) / 2;
            wl!(s, "  const int lo = (int)mi::cluster_rank() * {half};");
            wl!(s, "  for (int i{w} = lo + tid * {w}; i{w} < lo + {half}; i{w} += {nt} * {w}) {{");
        } else if let Some(per) = self.own_rows() {
            // The rows this warp stored (`Ctx::own_rows`).
            wl!(
                s,
                "  for (int i{w} = (tid >> 5) * {per} + (tid & 31) * {w}; i{w} < ((tid >> 5) + 1) * {per}; i{w} += 32 * {w}) {{"
            );
        } else {
            wl!(s, "  for (int i{w} = tid * {w}; i{w} < {}; i{w} += {nt} * {w}) {{", numel(tile));
        }
        wl!(s, "    float v[{w}];");
        // Each thread's run of w elements lies in one output row. An input over the
        // whole tile in plain fp32 rows is read 16 bytes at a time before the run (one
        // float at a time, a warp's reads were 8-way bank conflicts: GQA b=8's output
        // pass took 1.1 us); one broadcast along the rows is read once for the run, and
        // a division by it multiplies by its reciprocal (within 1.5 ulp of the quotient
        // instead of 0.5, as the row norms' rsqrtf: the attention epilogue's O / L, an
        // IEEE division per element, cost GQA b=8 0.6 us).
        let n_in = self.groups[g].thread_graph.num_inputs;
        let divisor = |r: usize| {
            self.groups[g]
                .thread_graph
                .ops
                .iter()
                .any(|op| matches!(*op, ThreadOp::Binary { op: BinaryOp::Div, rhs, .. } if rhs == r))
        };
        let mut rcp = vec![false; n_in];
        let mut reads = Vec::new();
        for (r, &x) in self.groups[g].inputs.iter().enumerate() {
            let xd = self.dims(x);
            let plain = self.streamed[x].is_none()
                && self.storage[x] == Some(Storage::F32)
                && self.layout[x].is_none_or(|l| l.index("i") == "i");
            if plain && xd == tile {
                wl!(s, "    float x{r}[{w}];");
                self.uses(Part::Reductions);
                wl!(s, "    mi::load_f32_n<{w}>(x{r}, t{x} + i{w});");
                if self.lazy && self.merged_by_step.contains(&x) {
                    // The other blocks' sums, as `merged_read` (16 bytes at a time).
                    let (slot, at) = (self.recv.map_or(0, |(_, slot)| slot), self.slot_offset(x));
                    for rank in 1..self.cluster {
                        wl!(s, "    {{");
                        wl!(s, "      float y[{w}];");
                        self.uses(Part::Reductions);
                        wl!(s, "      mi::load_f32_n<{w}>(y, mi_recv + {} + i{w});", (rank - 1) * slot + at);
                        wl!(s, "#pragma unroll");
                        wl!(s, "      for (int e = 0; e < {w}; ++e) x{r}[e] += y[e];");
                        wl!(s, "    }}");
                    }
                    if let Some(op) = self.lazily_finalized(x) {
                        let e = self.finalized(op, &format!("x{r}[e]"));
                        wl!(s, "#pragma unroll");
                        wl!(s, "    for (int e = 0; e < {w}; ++e) x{r}[e] = {e};");
                    }
                }
                reads.push(format!("x{r}[e]"));
            } else if xd.len() == tile.len() && xd.last() == Some(&1) {
                wl!(s, "    const float x{r} = {};", self.read(x, &bcast(tile, &format!("i{w}"), xd)));
                if r < n_in && divisor(r) {
                    wl!(s, "    const float x{r}_rcp = 1.0f / x{r};");
                    rcp[r] = true;
                }
                reads.push(format!("x{r}"));
            } else {
                reads.push(self.read(x, &bcast(tile, "i", xd)));
            }
        }
        wl!(s, "#pragma unroll");
        wl!(s, "    for (int e = 0; e < {w}; ++e) {{");
        wl!(s, "      [[maybe_unused]] const int i = i{w} + e;");
        let r = self.group_ops(g, s, "      ", &reads, &rcp);
        wl!(s, "      v[e] = {r};");
        wl!(s, "    }}");
        let at = Self::tile_elem_offset(tile, &dev.strides, &format!("i{w}"));
        self.uses(Part::Reductions);
        wl!(s, "    mi::store_n<{w}>(out{j} + base + {at}, v, vec);");
        wl!(s, "  }}");
        wl!(s, "}}");
        Ok(())
    }

    /// `Step::Matmul`: tile matmul `op`, stored or summed into accumulator `acc`.
    pub(super) fn step_matmul(&self, op: usize, acc: Option<usize>, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let (a, b) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1]);
        let epi = match acc {
            None => {
                let o = bg.ops[op].outputs[0];
                format!("{} = {};", self.at(o, "c"), self.conv(o, "v"))
            }
            Some(ac) => {
                let aop = &bg.ops[ac];
                let o = aop.outputs[0];
                match aop.kind {
                    BlockOpKind::ForloopAccumRescale { .. } => {
                        let sc = aop.inputs[1];
                        format!(
                            "t{o}[c] = it == 0 ? v : t{o}[c] * {} + v;",
                            self.read(sc, &bcast(self.dims(o), "c", self.dims(sc)))
                        )
                    }
                    _ => format!("t{o}[c] = (it == 0 ? 0.0f : t{o}[c]) + v;"),
                }
            }
        };
        let sw = |t: STensorId| self.layout[t].is_some_and(|l| l.swz.is_some());
        let trb = self.layout[b].is_some_and(|l| l.trans);
        let flags = if trb {
            format!(", {}, false, true", sw(a))
        } else if sw(a) || sw(b) {
            format!(", {}, {}", sw(a), sw(b))
        } else {
            String::new()
        };
        self.uses(Part::Matmul);
        wl!(
            s,
            "mi::matmul_tile<{nt}, {}{flags}>({}, {}, mi_scratch, [&](int c, float v) {{ {epi} }});",
            self.mm_shape(op),
            self.tile(a),
            self.tile(b)
        );
        Ok(())
    }

    /// `Step::Reduce`: a sum over a dim.
    pub(super) fn step_reduce(&self, op: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let BlockOpKind::Reduction { dim } = bg.ops[op].kind else {
            return unsupported("internal error: reduce of a non-reduction op");
        };
        let (x, o) = (bg.ops[op].inputs[0], bg.ops[op].outputs[0]);
        let d = self.dims(x);
        if let (true, Some((ld, cty))) = (dim + 1 == d.len(), self.vec_rows(x)) {
            self.uses(Part::Reductions);
            wl!(
                s,
                "mi::row_sums_vec<{nt}, {}, {}, {ld}>(static_cast<const {cty}*>({}), [](float x) {{ return x; }}, [&](int o, float v) {{ {} = {}; }});",
                numel(&d[..dim]),
                d[dim],
                self.tile(x),
                self.at(o, "o"),
                self.conv(o, "v")
            );
            return Ok(());
        }
        self.uses(Part::Reductions);
        wl!(
            s,
            "mi::reduce<{nt}, {}, {}, {}, false>([&](int i) {{ return {}; }}, [&](int o, float v) {{ {} = {}; }});",
            numel(&d[..dim]),
            d[dim],
            numel(&d[dim + 1..]),
            self.read(x, "i"),
            self.at(o, "o"),
            self.conv(o, "v")
        );
        Ok(())
    }

    /// `Step::RedMax`: the running max and its change.
    pub(super) fn step_red_max(&self, op: usize, sec: Section, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let BlockOpKind::ReductionMax { dim } = bg.ops[op].kind else {
            return unsupported("internal error: reduction_max of another op");
        };
        let x = bg.ops[op].inputs[0];
        let (mo, dd) = (bg.ops[op].outputs[0], bg.ops[op].outputs[1]);
        let d = self.dims(x);
        let has_d = self.storage[dd].is_some();
        let first = if sec == Section::Loop { "it == 0" } else { "true" };
        let wd0 = if has_d { format!(" t{dd}[o] = v - v;") } else { String::new() };
        let wd1 = if has_d { format!(" t{dd}[o] = p - nm;") } else { String::new() };
        self.uses(Part::Reductions);
        wl!(
            s,
            "mi::reduce<{nt}, {}, {}, {}, true>([&](int i) {{ return {}; }}, [&](int o, float v) {{",
            numel(&d[..dim]),
            d[dim],
            numel(&d[dim + 1..]),
            self.read(x, "i")
        );
        wl!(s, "  if ({first}) {{ t{mo}[o] = v;{wd0} }}");
        wl!(s, "  else {{ const float p = t{mo}[o]; const float nm = fmaxf(p, v);{wd1} t{mo}[o] = nm; }}");
        wl!(s, "}});");
        Ok(())
    }

    /// `Step::RmsNorm`: RMS normalisation over the last dim.
    pub(super) fn step_rms_norm(&self, op: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let (x, o) = (bg.ops[op].inputs[0], bg.ops[op].outputs[0]);
        let d = self.dims(x);
        let len = d[d.len() - 1];
        // With an epsilon: the rows as `mi::rms_norm_rows` shares them, eps added to the mean of
        // squares (the specialised forms below have none).
        if let BlockOpKind::RmsNorm { eps } = bg.ops[op].kind {
            if eps != 0.0 {
                self.uses(Part::Reductions);
                wl!(
                    s,
                    "mi::share_reduce<{nt}, {}, {len}, 1>(0.0f, [&](int i) {{ const float x = {}; return x * x; }}, [](float a, float b) {{ return a + b; }}, [&](int r, float ss, int first, int step) {{ const float inv = 1.0f / sqrtf(ss / {} + {}); for (int l = first; l < {len}; l += step) {{ const int i = r * {len} + l; {} = {}; }} }});",
                    numel(d) / len,
                    self.read(x, "i"),
                    flit(len as f32),
                    flit(eps),
                    self.at(o, "i"),
                    self.conv(o, &format!("({}) * inv", self.read(x, "i")))
                );
                return Ok(());
            }
        }
        // The attention's Q, normalised by its softmax: the rows as they are.
        if self.q_norm_in_softmax() == Some(op) {
            if let Some((k, row, _)) = self.device_rows(x) {
                let n = numel(d);
                wl!(s, "{{ // Q's rows as copied: the softmax applies their norm (the `mi::QRowScales` variant)");
                wl!(s, "  const auto row = [&](int r) {{ return {row}; }};");
                wl!(s, "  if (mi::aligned16(in{k})) {{");
                wl!(s, "    for (int i = tid * 8; i < {n}; i += {nt} * 8) mi::cp_async16({} + mi::swz<64, 8>(i), row(i / 64) + i % 64);", self.tile(o));
                wl!(s, "  }} else {{");
                wl!(s, "    for (int i = tid; i < {n}; i += {nt}) {} = row(i / 64)[i % 64];", self.at(o, "i"));
                wl!(s, "  }}");
                wl!(s, "  mi::cp_async_commit();");
                wl!(s, "}}");
                return Ok(());
            }
        }
        // A staged 16-bit tile into a 16-bit tile: whole rows in registers, 16 bytes a time.
        let ldo = self.layout[o].map_or(len, |l| l.ld);
        // QK-norm's Q under the wgmma form goes swizzled (see the layouts): the loop's
        // first proxy fence makes its writes visible to the tensor cores.
        let swz = self.layout[o].is_some_and(|l| l.swz.is_some());
        if let Some((ldi, cty)) = self.vec_rows(x) {
            if !swz && self.storage[o] == self.storage[x] && ldo.is_multiple_of(8) && len / 8 <= 16 * 32 {
                self.uses(Part::Reductions);
                wl!(
                    s,
                    "mi::rms_norm_rows_vec<{nt}, {}, {len}, {ldi}, {ldo}, {cty}>({}, {});",
                    numel(d) / len,
                    self.tile(x),
                    self.tile(o)
                );
                return Ok(());
            }
        }
        self.uses(Part::Reductions);
        let scalar = format!(
            "mi::rms_norm_rows<{nt}, {}, {len}>([&](int i) {{ return {}; }}, [&](int i, float v) {{ {} = {}; }});",
            numel(d) / len,
            self.read(x, "i"),
            self.at(o, "i"),
            self.conv(o, "v")
        );
        // Rows straight from device memory: 16-byte loads, a row per few lanes.
        if let Some((k, row, cty)) = self.device_rows(x) {
            wl!(s, "if (mi::aligned16(in{k})) {{");
            self.uses(Part::Reductions);
            wl!(
                s,
                "  mi::rms_norm_rows_ld<{nt}, {}, {len}, {cty}>([&](int r) {{ return {row}; }}, [&](int i, float v) {{ {} = {}; }});",
                numel(d) / len,
                self.at(o, "i"),
                self.conv(o, "v")
            );
            wl!(s, "}} else {{");
            wl!(s, "  {scalar}");
            wl!(s, "}}");
        } else {
            wl!(s, "{scalar}");
        }
        Ok(())
    }

    /// `Step::Concat`: a concatenation.
    pub(super) fn step_concat(&self, op: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let BlockOpKind::Concat { dim } = bg.ops[op].kind else {
            return unsupported("internal error: concat of another op");
        };
        let (a, b, o) = (bg.ops[op].inputs[0], bg.ops[op].inputs[1], bg.ops[op].outputs[0]);
        let (da, db, od) = (self.dims(a), self.dims(b), self.dims(o));
        let (ra, rb) = (row_major(da), row_major(db));
        let la = da[dim];
        let cs: Vec<String> = (0..od.len()).map(|k| coord(od, k, "i")).collect();
        let ia: Vec<String> = (0..od.len()).map(|k| format!("({}) * {}", cs[k], ra[k])).collect();
        let ib: Vec<String> =
            (0..od.len())
                .map(|k| {
                    if k == dim {
                        format!("({} - {la}) * {}", cs[k], rb[k])
                    } else {
                        format!("({}) * {}", cs[k], rb[k])
                    }
                })
                .collect();
        wl!(s, "for (int i = tid; i < {}; i += {nt}) {{ // concat -> t{o}", numel(od));
        wl!(
            s,
            "  {} = {};",
            self.at(o, "i"),
            self.conv(
                o,
                &format!(
                    "({}) < {la} ? {} : {}",
                    cs[dim],
                    self.read(a, &ia.join(" + ")),
                    self.read(b, &ib.join(" + "))
                )
            )
        );
        wl!(s, "}}");
        Ok(())
    }

    /// `Step::Accum`: one accumulator update in shared memory.
    pub(super) fn step_accum(&self, op: usize, s: &mut String) -> Result<()> {
        let bg = self.bg;
        let nt = "NT";
        let aop = &bg.ops[op];
        let (x, o) = (aop.inputs[0], aop.outputs[0]);
        let dx = self.dims(x);
        let od = self.dims(o);
        let scale = |idx: &str| match aop.kind {
            BlockOpKind::ForloopAccumRescale { .. } => {
                let sc = aop.inputs[1];
                Some(self.read(sc, &bcast(od, idx, self.dims(sc))))
            }
            _ => None,
        };
        let combine = |idx: &str, v: &str| -> String {
            match (&aop.kind, scale(idx)) {
                (BlockOpKind::ForloopAccumMax, _) => {
                    format!("t{o}[{idx}] = it == 0 ? {v} : fmaxf(t{o}[{idx}], {v});")
                }
                (_, Some(sc)) => format!("t{o}[{idx}] = it == 0 ? {v} : t{o}[{idx}] * {sc} + {v};"),
                (_, None) => format!("t{o}[{idx}] = (it == 0 ? 0.0f : t{o}[{idx}]) + {v};"),
            }
        };
        let acc = match aop.kind {
            BlockOpKind::ForloopAccum { acc, .. } | BlockOpKind::ForloopAccumRescale { acc } => acc,
            _ => Accum::None,
        };
        let last = dx.len() - 1;
        let rows = numel(&dx[..last]);
        match acc {
            Accum::None => {
                wl!(s, "for (int i = tid; i < {}; i += {nt}) {{ // accumulate -> t{o}", numel(od));
                wl!(s, "  const float x = {};", self.read(x, "i"));
                wl!(s, "  {}", combine("i", "x"));
                wl!(s, "}}");
            }
            Accum::Sum | Accum::Mean | Accum::Rms | Accum::SumToDimx => {
                let (len, inner) = if acc == Accum::SumToDimx {
                    (dx[last] / bg.reduction_dimx, bg.reduction_dimx)
                } else {
                    (dx[last], 1)
                };
                if let (1, Some((ld, cty))) = (inner, self.vec_rows(x)) {
                    let map = if acc == Accum::Rms { "x * x" } else { "x" };
                    self.uses(Part::Reductions);
                    wl!(
                        s,
                        "mi::row_sums_vec<{nt}, {rows}, {len}, {ld}>(static_cast<const {cty}*>({}), [](float x) {{ return {map}; }}, [&](int o, float v) {{ {} }});",
                        self.tile(x),
                        combine("o", "v")
                    );
                    return Ok(());
                }
                let load = if acc == Accum::Rms {
                    format!("const float x = {}; return x * x;", self.read(x, "i"))
                } else {
                    format!("return {};", self.read(x, "i"))
                };
                self.uses(Part::Reductions);
                wl!(
                    s,
                    "mi::reduce<{nt}, {rows}, {len}, {inner}, false>([&](int i) {{ {load} }}, [&](int o, float v) {{ {} }});",
                    combine("o", "v")
                );
            }
        }
        Ok(())
    }
}
