//! Copies of input tiles into shared memory (`cp.async`, 16 bytes where the layout and the
//! pointer allow), their L2 policy, and the L2 prefetches and dependent-launch point of a
//! kernel.

use mirage_ugraph::{BlockGraph, BlockOpKind, STensorId};

use super::ctx::Ctx;
use super::layout::Layout;
use super::plan::WS_PRODUCER_THREADS;
use super::{Section, Step};
use crate::emit::{numel, wl};
use crate::error::{unsupported, Result};
use crate::program::{BufferRef, Storage};

/// Byte-offset-free base expression (in elements) of a block's tile in a device tensor: the
/// block's offset along the grid-mapped dims (`map`), plus iteration `iter` along `fdim`.
pub(crate) fn tile_base(
    bg: &BlockGraph,
    map: [i64; 3],
    fdim: i64,
    tile: &[usize],
    strides: &[usize],
    iter: Option<&str>,
) -> String {
    let mut terms = Vec::new();
    let axes = ["blockIdx.x", "blockIdx.y", "blockIdx.z"];
    for a in 0..3 {
        if bg.grid_dim[a] > 1 && map[a] >= 0 {
            let d = map[a] as usize;
            let part = if d as i64 == fdim { tile[d] * bg.forloop_range } else { tile[d] };
            terms.push(format!("(long long){} * {}LL", axes[a], part * strides[d]));
        }
    }
    if let (true, Some(it)) = (fdim >= 0, iter) {
        let f = fdim as usize;
        terms.push(format!("(long long)({it}) * {}LL", tile[f] * strides[f]));
    }
    if terms.is_empty() {
        "0LL".into()
    } else {
        terms.join(" + ")
    }
}

/// The unrolled 16-byte copies of a tile (`vec` elements each, `nt` threads, a whole number of
/// copies per thread) as constant (source, destination) element steps from each thread's first
/// copy, when every thread's steps are the same: copy `u` of thread `t` moves element
/// `i = (t + u nt) vec`, from device offset `src(i)` (tile dims over device strides) to shared
/// index `layout.offset(i)` (padded or swizzled rows). The kernel then computes one address pair
/// per tile and thread instead of one per copy (about seven integer instructions each).
fn copy_steps(tile: &[usize], strides: &[usize], layout: &Layout, nt: usize, vec: usize) -> Option<Vec<(i64, i64)>> {
    let n = numel(tile);
    let reps = n / vec / nt;
    let src = |i: usize| -> i64 {
        let (mut rest, mut off) = (i, 0i64);
        for (&d, &st) in tile.iter().zip(strides).rev() {
            off += (rest % d) as i64 * st as i64;
            rest /= d;
        }
        off
    };
    let dst = |i: usize| layout.offset(i) as i64;
    let steps: Vec<(i64, i64)> = (0..reps).map(|u| (src(u * nt * vec) - src(0), dst(u * nt * vec) - dst(0))).collect();
    let same = (0..nt).all(|t| {
        let i0 = t * vec;
        steps.iter().enumerate().all(|(u, &(sc, dc))| {
            let i = i0 + u * nt * vec;
            src(i) - src(i0) == sc && dst(i) - dst(i0) == dc
        })
    });
    (same && reps <= 64).then_some(steps)
}

/// Whether a tile's rows are whole runs of `w` elements, contiguous and `w`-aligned in device
/// memory (the last stride 1, every other stride a multiple of `w`): from an aligned base,
/// with `w` = 8 each row starts 16-byte aligned for 16-bit values.
pub(super) fn rows_of(w: usize, tile: &[usize], strides: &[usize]) -> bool {
    tile.last().is_some_and(|l| l % w == 0)
        && strides.last() == Some(&1)
        && strides.iter().rev().skip(1).all(|s| s % w == 0)
}

/// A tile whose contiguous device dim is not its last (a transposed weight, `x @ W.T` with
/// `W` as `nn.Linear` stores it): `(R, C, S)` for a tile of `R` rows along the device dim of
/// stride 1 and `C` columns along its last dim (device stride `S`), when every other tile dim
/// is 1, `R` is a whole number of `vec`-element runs and every other stride a multiple of
/// `vec` (each run then starts 16-byte aligned from an aligned base). Tile element `(r, c)`
/// is then row-major index `r C + c` and device offset `r + c S`.
pub(super) fn column_walk(tile: &[usize], strides: &[usize], vec: usize) -> Option<(usize, usize, usize)> {
    let last = tile.len().checked_sub(1)?;
    let g = (0..last).find(|&j| strides[j] == 1 && tile[j] > 1)?;
    let others_one = (0..last).all(|j| j == g || tile[j] == 1);
    let aligned = (0..=last).all(|j| j == g || strides[j].is_multiple_of(vec));
    (others_one && aligned && tile[last] > 1 && tile[g].is_multiple_of(vec)).then_some((
        tile[g],
        tile[last],
        strides[last],
    ))
}

impl Ctx<'_> {
    /// Code copying block input `k` (op `op`, tile `t`) for loop iteration `iter` (None outside
    /// the loop) into shared memory at `dst`: 16-byte `cp.async` copies when the layout allows
    /// and the pointer is aligned, element copies otherwise. The caller commits the group.
    pub(super) fn load(&self, k: usize, op: usize, t: STensorId, iter: Option<&str>, dst: &str) -> Result<String> {
        self.load_by(k, op, t, iter, dst, false)
    }

    /// [`Ctx::load`] by the block's threads, or with `producer` by the warp-specialised
    /// producer's (`tid` < `nt` and `NT` = `nt` in scope either way). In the interleaved
    /// form's producer (24 registers) the unaligned fallback is never unrolled: unrolled, it
    /// made ptxas spill in the vector path too (on the H100 GQA b=8 16.1-16.6 -> 15.4-15.6 us
    /// and QK-norm b=8 20.4-20.7 -> 19.8-20.0 with two warpgroups, GQA b=8 17.5-17.7 ->
    /// 16.2-16.4 with three: 40 bytes of spills -> none); in the 128-row form's it did not pay
    /// (MQA b=16 40.3-41.1 -> 42.1-43.8, with fewer spills).
    pub(super) fn load_by(
        &self,
        k: usize,
        op: usize,
        t: STensorId,
        iter: Option<&str>,
        dst: &str,
        producer: bool,
    ) -> Result<String> {
        let nt = if producer { WS_PRODUCER_THREADS } else { self.nt };
        let rolled = producer && self.ws_interleaved();
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else {
            return unsupported("internal error: load of a non-input op");
        };
        let Some(l) = self.layout[t] else {
            return unsupported("internal error: load of a tile with no shared-memory layout");
        };
        let tile = self.dims(t);
        let dev = &self.ins[k];
        let base = self.tile_base(imap, forloop_dim, tile, &dev.strides, iter);
        let n = numel(tile);
        let mut s = String::new();
        wl!(s, "{{ // input {k} -> t{t}");
        wl!(s, "  const long long base = {base};");
        let once = self.evict_first && self.read_once(k, op);
        // Element by element: fp32 values through 4-byte cp.async (a staged tile's copies then
        // stay in flight like the vector ones; a plain load would stall its iteration).
        let (to, from) = (
            format!("{dst}[{}]", l.index("i")),
            format!("in{k}[base + {}]", Self::tile_elem_offset(tile, &dev.strides, "i")),
        );
        let copy = if dev.storage == Storage::F32 {
            format!("mi::cp_async4(&{to}, &{from})")
        } else {
            format!("{to} = {from}")
        };
        let scalar = format!("for (int i = tid; i < {n}; i += NT) {copy};");
        if l.trans {
            let vec = 16 / dev.storage.size_bytes();
            let Some((rows, cols, stride)) = column_walk(tile, &dev.strides, vec) else {
                return unsupported("internal error: a transposed tile that is not a column walk");
            };
            s.push_str(&Self::column_async_copy(k, dst, &l, (rows, cols, stride), vec, once));
            wl!(s, "  }} else {{");
            if rolled {
                wl!(s, "#pragma unroll 1");
            }
            wl!(s, "    {scalar}");
            wl!(s, "  }}");
        } else if l.vector {
            let vec = 16 / dev.storage.size_bytes();
            let chunks = n / vec;
            wl!(s, "  if (mi::aligned16(in{k})) {{");
            if once {
                wl!(s, "    const unsigned long long mi_once = mi::l2_policy<false>();");
            }
            // Unsigned indices (shifts and masks for power-of-two rows); a whole number of chunks
            // per thread unrolls with the addresses hoisted out of the loop.
            let whole = chunks.is_multiple_of(nt);
            if let Some(steps) = whole.then(|| copy_steps(tile, &dev.strides, &l, nt, vec)).flatten() {
                // Every copy of this thread is its first plus a constant: one address per tile.
                wl!(s, "    const unsigned i = (unsigned)tid * {vec}u;");
                wl!(
                    s,
                    "    const auto* const src = in{k} + base + {};",
                    Self::tile_elem_offset(tile, &dev.strides, "i")
                );
                wl!(s, "    auto* const dst = {dst} + {};", l.index("i"));
                if once {
                    // One shuffled shared address a tile (`mi::smem_lane`); copies add bytes.
                    wl!(s, "    const unsigned sdst = mi::smem_lane(dst);");
                }
                let bytes = dev.storage.size_bytes() as i64;
                for (sc, dc) in steps {
                    if once {
                        let (op, off) = if dc < 0 { ('-', -dc * bytes) } else { ('+', dc * bytes) };
                        wl!(s, "    mi::cp_async16_pol(sdst {op} {off}u, src + {sc}LL, mi_once);");
                    } else {
                        wl!(s, "    mi::cp_async16(dst + {dc}, src + {sc}LL);");
                    }
                }
            } else {
                if whole {
                    wl!(s, "#pragma unroll");
                    wl!(s, "    for (int u = 0; u < {}; ++u) {{", chunks / nt);
                    wl!(s, "      const unsigned i = (unsigned)(tid + u * NT) * {vec}u;");
                } else {
                    wl!(s, "    for (int c = tid; c < {chunks}; c += NT) {{");
                    wl!(s, "      const unsigned i = (unsigned)c * {vec}u;");
                }
                let (to, from) = (format!("{dst} + {}", l.index("i")), Self::tile_elem_offset(tile, &dev.strides, "i"));
                if once {
                    wl!(s, "      mi::cp_async16_pol(mi::smem_lane({to}), in{k} + base + {from}, mi_once);");
                } else {
                    wl!(s, "      mi::cp_async16({to}, in{k} + base + {from});");
                }
                wl!(s, "    }}");
            }
            wl!(s, "  }} else {{");
            if rolled {
                wl!(s, "#pragma unroll 1");
            }
            wl!(s, "    {scalar}");
            wl!(s, "  }}");
        } else if let Some(walk) = (!producer && dev.storage != Storage::F32)
            .then(|| column_walk(tile, &dev.strides, 16 / dev.storage.size_bytes()))
            .flatten()
        {
            // (Not in a warp-specialised producer: it runs on 24 registers, and its stage's
            // full barrier tracks its `cp.async` copies.)
            s.push_str(&Self::column_copy(k, dst, &l, walk, dev.storage, nt));
            wl!(s, "  }} else {{");
            wl!(s, "    {scalar}");
            wl!(s, "  }}");
        } else {
            wl!(s, "  {scalar}");
        }
        wl!(s, "}}");
        Ok(s)
    }

    /// The aligned branch of a transposed tile's copy ([`Layout::trans`]; opening `if`, no
    /// closing brace): 16-byte `cp.async` copies of `vec`-element runs down each of the
    /// [`column_walk`]'s columns into that column's row, consecutive threads taking a column's
    /// consecutive runs (whole device sectors).
    fn column_async_copy(
        k: usize,
        dst: &str,
        l: &Layout,
        (rows, cols, stride): (usize, usize, usize),
        vec: usize,
        once: bool,
    ) -> String {
        let runs = rows / vec;
        let chunks = runs * cols;
        let ld = l.ld;
        let mut s = String::new();
        wl!(s, "  if (mi::aligned16(in{k})) {{");
        if once {
            wl!(s, "    const unsigned long long mi_once = mi::l2_policy<false>();");
        }
        wl!(s, "    for (unsigned q = (unsigned)tid; q < {chunks}u; q += (unsigned)NT) {{");
        wl!(s, "      const unsigned mi_c = q / {runs}u, mi_j = q % {runs}u * {vec}u;");
        let (to, from) =
            (format!("{dst} + mi_c * {ld}u + mi_j"), format!("in{k} + base + mi_j + (long long)mi_c * {stride}LL"));
        if once {
            wl!(s, "      mi::cp_async16_pol(mi::smem_lane({to}), {from}, mi_once);");
        } else {
            wl!(s, "      mi::cp_async16({to}, {from});");
        }
        wl!(s, "    }}");
        s
    }

    /// The aligned branch of a [`column_walk`] tile's copy (opening `if`, no closing brace):
    /// each thread reads a run of `vec` elements down one column in one 16-byte load and
    /// stores them into the column's rows. Consecutive threads take adjacent columns, so that
    /// each store instruction writes consecutive elements of a row (no bank conflicts) and
    /// each of a column's 16-byte runs is read once (the element copies read a column
    /// with a device stride between neighbouring threads: each 2-byte load its own sector).
    /// Plain loads, not `cp.async` (whose 16 bytes land contiguous in shared memory): up to
    /// eight a thread are issued before their stores.
    fn column_copy(
        k: usize,
        dst: &str,
        l: &Layout,
        (r, c, stride): (usize, usize, usize),
        st: Storage,
        nt: usize,
    ) -> String {
        let vec = 16 / st.size_bytes();
        let chunks = r / vec * c;
        let ty = st.cty();
        let mut s = String::new();
        wl!(s, "  if (mi::aligned16(in{k})) {{");
        let store = |s: &mut String, ind: &str, v: &str, q: &str| {
            wl!(s, "{ind}{{");
            wl!(s, "{ind}  const unsigned mi_c = {q} % {c}u, mi_r = {q} / {c}u * {vec}u;");
            wl!(s, "{ind}  const {ty}* const mi_e = reinterpret_cast<const {ty}*>(&{v});");
            wl!(s, "#pragma unroll");
            wl!(
                s,
                "{ind}  for (unsigned j = 0; j < {vec}u; ++j) {dst}[{}] = mi_e[j];",
                l.index(&format!("(mi_r + j) * {c}u + mi_c"))
            );
            wl!(s, "{ind}}}");
        };
        let src = |q: &str| format!("in{k} + base + {q} / {c}u * {vec}u + (long long)({q} % {c}u) * {stride}LL");
        let per = chunks / nt;
        if chunks.is_multiple_of(nt) && per <= 8 {
            wl!(s, "    uint4 mi_v[{per}];");
            wl!(s, "#pragma unroll");
            wl!(s, "    for (unsigned u = 0; u < {per}u; ++u) {{");
            wl!(s, "      const unsigned q = (unsigned)tid + u * (unsigned)NT;");
            wl!(s, "      mi_v[u] = *reinterpret_cast<const uint4*>({});", src("q"));
            wl!(s, "    }}");
            wl!(s, "#pragma unroll");
            wl!(s, "    for (unsigned u = 0; u < {per}u; ++u) {{");
            wl!(s, "      const unsigned q = (unsigned)tid + u * (unsigned)NT;");
            store(&mut s, "      ", "mi_v[u]", "q");
            wl!(s, "    }}");
        } else {
            wl!(s, "    for (unsigned q = (unsigned)tid; q < {chunks}u; q += (unsigned)NT) {{");
            wl!(s, "      const uint4 mi_v = *reinterpret_cast<const uint4*>({});", src("q"));
            store(&mut s, "      ", "mi_v", "q");
            wl!(s, "    }}");
        }
        s
    }

    /// Whether block input `k` (op `op`) is a graph input of which each block reads a tile of
    /// its own, once: every grid axis of more than one block picks a part of it, and so does
    /// the loop if there is one. Its 16-byte copies then carry the L2 policy evict_first, so
    /// that these lines leave the L2 before those read again (a tile other blocks share, a
    /// later kernel's workspace) and before the next call's prefetched first stages
    /// (`prefetches`). H200, saved MLP-side winners, one call, medians of three
    /// rounds, µs (without -> with): RMSNorm+Linear 4096 b=1/8/16 10.3/10.4/11.0 ->
    /// 9.5/9.7/11.0, 4096x6144 14.9/15.2/16.7 -> 13.5/14.7/16.4, gated MLP 17.5/18.4/18.1 ->
    /// 16.5/17.1/17.3; LoRA +0.02-0.06, nTrans within 0.01.
    pub(super) fn read_once(&self, k: usize, op: usize) -> bool {
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else { return false };
        matches!(self.ins[k].location, BufferRef::Input(_))
            && (0..3).all(|a| self.bg.grid_dim[a] == 1 || imap[a] >= 0)
            && (self.bg.forloop_range == 1 || forloop_dim >= 0)
    }

    /// The loop's staged input tiles: (block input position, input op, tile).
    pub(super) fn staged(&self, steps: &[(Section, Step)]) -> Vec<(usize, usize, STensorId)> {
        let bg = self.bg;
        steps
            .iter()
            .filter_map(|&(_, st)| match st {
                Step::Load { k, op } if self.layout[bg.ops[op].outputs[0]].is_some_and(|l| l.staged) => {
                    Some((k, op, bg.ops[op].outputs[0]))
                }
                _ => None,
            })
            .collect()
    }

    /// L2 prefetches of the graph-input tiles the kernel reads first, issued before the
    /// dependent-launch wait: a loop-free kernel's input tiles, or the first stages of a loop's
    /// staged tiles where the kernel lets the next one go late (`KernelPlan::late_launch`). They
    /// bring no data into the block, so the previous kernel may still be writing (the L2 is
    /// coherent); their DRAM latency overlaps that kernel's drain. Measured per call, saved
    /// winners: LoRA b=8 5.05 -> 4.4 us, b=16 5.7 -> 4.9 (H100). A loop whose blocks arrive at
    /// the previous call's start (early trigger) prefetches nothing: the lines would wait in
    /// L2 for a whole kernel, and on the H200 RMSNorm+Linear b=8 took 11.2 -> 12.2 us with
    /// three stages prefetched so. Inputs an earlier kernel of the program computes are left
    /// out too.
    pub(super) fn prefetches(&self, steps: &[(Section, Step)]) -> String {
        let mut s = String::new();
        if self.late_launch.is_some() {
            let (first, staged) = ((self.stages - 1).min(self.bg.forloop_range), self.staged(steps));
            for it in 0..first {
                for &(k, op, _) in &staged {
                    s.push_str(&self.prefetch_tile(k, op, Some(&it.to_string())));
                }
            }
            return s;
        }
        if self.bg.forloop_range != 1 {
            return s;
        }
        for &(_, st) in steps {
            let Step::Load { k, op } = st else { continue };
            s.push_str(&self.prefetch_tile(k, op, Some("0")));
        }
        s
    }

    /// L2 prefetches of input `k`'s tile (op `op`) at loop iteration `iter`, if it is a graph
    /// input: one per 128-byte line where the tile's rows are whole lines, else one per 16
    /// bytes (the copies' granularity).
    pub(super) fn prefetch_tile(&self, k: usize, op: usize, iter: Option<&str>) -> String {
        let mut s = String::new();
        let BlockOpKind::Input { imap, forloop_dim, .. } = self.bg.ops[op].kind else { return s };
        let (t, dev) = (self.bg.ops[op].outputs[0], &self.ins[k]);
        if !matches!(dev.location, BufferRef::Input(_)) {
            return s;
        }
        let tile = self.dims(t);
        let es = dev.storage.size_bytes();
        let row_bytes = tile.last().map_or(0, |&n| n * es);
        let step = if row_bytes > 0 && row_bytes.is_multiple_of(128) { 128 / es } else { 16 / es };
        wl!(s, "    {{ // input {k}");
        wl!(s, "      const long long base = {};", self.tile_base(imap, forloop_dim, tile, &dev.strides, iter));
        wl!(s, "      for (int c = tid; c < {}; c += NT) {{", numel(tile).div_ceil(step));
        wl!(s, "        const unsigned i = (unsigned)c * {step}u;");
        wl!(s, "        mi::prefetch_l2(in{k} + base + {});", Self::tile_elem_offset(tile, &dev.strides, "i"));
        wl!(s, "      }}");
        wl!(s, "    }}");
        s
    }
}
