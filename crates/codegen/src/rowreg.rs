//! Register-resident row kernels: a block graph without a loop whose ops are element-wise ops
//! and RMS norms of one common tile shape keeps every tile in registers.
//!
//! Thread `tid` owns the 8-element chunks `tid + k * NT` (`k < KC`) of every tile, loaded and
//! stored 16 bytes at a time. Element-wise ops run on those registers. An RMS norm over the last
//! dim sums squares with shuffles. Rows of a multiple of 256 (a warp's chunks of one `k` lie in
//! one row) write one partial per warp chunk to shared memory and, after one barrier, every
//! thread adds its row's partials in a fixed order (no atomics: the result is deterministic).
//! Rows of 8 to 256 that divide 256 (a row is `len / 8` neighbouring lanes) are summed by those
//! lanes' shuffles alone. There is no other barrier and no tile in shared memory: the general
//! schedule (`block_kernel`) runs such a graph as a chain of passes over shared memory instead.

use mirage_ugraph::{BlockGraph, BlockOpKind, STensorId};

use crate::block_kernel::{tile_base, Emitted};
use crate::emit::{binary_expr, dev_offset, flit, kernel_open, kernel_params, numel, unary_expr, wl};
use crate::error::Result;
use crate::program::{BufferRef, DevBuffer};
use crate::runtime::{Part, Parts};

/// Most elements of one tile a thread holds in registers.
const MAX_PER_THREAD: usize = 64;

/// The kernel `name` for `bg` in registers, or `None` when the graph is not of that form.
pub(crate) fn emit(name: &str, bg: &BlockGraph, ins: &[DevBuffer], outs: &[DevBuffer]) -> Result<Option<Emitted>> {
    let nt: usize = bg.block_dim.iter().product();
    if bg.forloop_range != 1 || nt == 0 || !nt.is_multiple_of(32) {
        return Ok(None);
    }
    let Some(first) = bg.tensors.first() else { return Ok(None) };
    let dims = first.dims.clone();
    let n = numel(&dims);
    let len = dims.last().copied().unwrap_or(1);
    if !n.is_multiple_of(8 * nt) || n / nt > MAX_PER_THREAD || !len.is_multiple_of(8) {
        return Ok(None);
    }
    let kc = n / (8 * nt);
    // Every tile has the common shape; only element-wise ops and RMS norms (rows of 256k).
    if bg.tensors.iter().any(|t| t.dims != dims) {
        return Ok(None);
    }
    let mut norms = 0;
    for op in &bg.ops {
        match op.kind {
            BlockOpKind::Input { .. }
            | BlockOpKind::Output { .. }
            | BlockOpKind::Unary { .. }
            | BlockOpKind::Binary { .. } => {}
            BlockOpKind::RmsNorm { .. } if len.is_multiple_of(256) => norms += 1,
            BlockOpKind::RmsNorm { .. } if 256 % len == 0 => {}
            _ => return Ok(None),
        }
    }

    let params = kernel_params(ins, outs);
    let mut s = String::new();
    wl!(
        s,
        "// block graph: grid {:?}, block {:?}: tiles in registers ({kc} chunk(s) of 8 per thread)",
        bg.grid_dim,
        bg.block_dim
    );
    // Chunk k of this thread starts at element e(k) = (tid + k * NT) * 8 of the tile.
    let chunk = |k: &str| format!("((unsigned)(tid + {k} * NT) * 8u)");
    // Element offset in device tensor `dev` of tile element `var`, and whether the 8 elements
    // from a chunk start are contiguous and 16-byte aligned whenever the pointer is.
    let elem = |dev: &DevBuffer, var: &str| -> (String, bool) {
        let off = dev_offset(&dims, var, &dims, &dev.strides);
        let es = dev.storage.size_bytes();
        let r = dims.len();
        let vec =
            dev.strides[r - 1] == 1 && (0..r - 1).all(|d| dims[d] == 1 || (dev.strides[d] * es).is_multiple_of(16));
        (off, vec)
    };
    // L2 prefetches of the graph inputs' tiles, before the dependent-launch wait (see
    // `block_kernel`'s prefetches; nTrans b=8 2.86 -> 2.07 us, b=16 3.35 -> 2.29): one per
    // chunk of 8.
    let mut pre = String::new();
    let maps = bg.ops.iter().filter_map(|op| match op.kind {
        BlockOpKind::Input { imap, forloop_dim, .. } => Some((imap, forloop_dim)),
        _ => None,
    });
    for (k, ((imap, fdim), dev)) in maps.zip(ins).enumerate() {
        if matches!(dev.location, BufferRef::Input(_)) {
            let base = tile_base(bg, imap, fdim, &dims, &dev.strides, Some("0"));
            let off = elem(dev, &chunk("c")).0;
            wl!(pre, "#pragma unroll");
            wl!(pre, "    for (int c = 0; c < {kc}; ++c) mi::prefetch_l2(in{k} + ({base}) + {off});");
        }
    }
    s.push_str(&kernel_open(&nt.to_string(), name, &params, nt, &pre));
    wl!(s, "  constexpr int NT = {nt};");
    wl!(s, "  const int tid = mi::lin_tid();");
    // A kernel whose output a later kernel reads (a workspace tensor: QK-norm's normalised V,
    // read by the attention kernel right after) stores its 16-bit output with the L2 policy
    // evict_last and reads its graph inputs, used once, with evict_first, so that the
    // intermediate stays in L2 for its reader (and the next call's writes) instead of being
    // written back to memory in this kernel. Saved winners, side by side in one run: QK-norm
    // b=8 23.25-23.29 -> 22.83-23.05 us, b=16 40.87-41.09 -> 40.14-40.46. Graph outputs are left
    // alone (nTrans with the hints on its outputs was mixed).
    let l2_keep = |d: &DevBuffer| matches!(d.location, BufferRef::Workspace(_)) && d.storage.size_bytes() == 2;
    let staging = outs.iter().any(l2_keep);
    let l2_once = |d: &DevBuffer| staging && matches!(d.location, BufferRef::Input(_)) && d.storage.size_bytes() == 2;
    if staging {
        wl!(s, "  const unsigned long long mi_once = mi::l2_policy<false>(), mi_keep = mi::l2_policy<true>();");
        wl!(s, "  (void)mi_once;");
    }
    if norms > 0 {
        // One partial sum per warp chunk (256 elements) per norm.
        wl!(s, "  __shared__ float mi_part[{}][{}];", norms, n / 256);
        wl!(s, "  const int lane = tid & 31, warp = tid >> 5;");
    }
    // The block that copies this thread's chunks between device tensor `dev` (pointer `ptr`)
    // and registers: `vec_copy(offset)` copies a chunk (16-byte accesses when `vec`),
    // `elem_copy(offset)` element `q` of it (layouts whose chunks are not contiguous).
    type Copy<'a> = &'a dyn Fn(&str) -> String;
    let copy = |dev: &DevBuffer, map: [i64; 3], fdim: i64, ptr: &str, vec_copy: Copy, elem_copy: Copy| {
        let base = tile_base(bg, map, fdim, &dims, &dev.strides, Some("0"));
        let (off, vec) = elem(dev, "e");
        let mut c = String::new();
        wl!(c, "  {{");
        wl!(c, "    const long long base = {base};");
        wl!(c, "    const bool vec = {vec} && mi::aligned16({ptr} + base);");
        wl!(c, "#pragma unroll");
        wl!(c, "    for (int k = 0; k < {kc}; ++k) {{");
        wl!(c, "      const unsigned e = {};", chunk("k"));
        if vec {
            wl!(c, "      {}", vec_copy(&off));
        } else {
            wl!(c, "#pragma unroll");
            wl!(c, "      for (unsigned q = 0; q < 8u; ++q) {}", elem_copy(&elem(dev, "(e + q)").0));
        }
        wl!(c, "    }}");
        wl!(c, "  }}");
        c
    };
    let mut norm = 0;
    let mut out_j = 0;
    let mut in_k = 0;
    let v = |t: STensorId| format!("v{t}");
    for op in &bg.ops {
        match &op.kind {
            BlockOpKind::Input { imap, forloop_dim, .. } => {
                let (k, t) = (in_k, op.outputs[0]);
                in_k += 1;
                wl!(s, "  float {}[{}]; // input {k}", v(t), kc * 8);
                s.push_str(&copy(
                    &ins[k],
                    *imap,
                    *forloop_dim,
                    &format!("in{k}"),
                    &|off| {
                        if l2_once(&ins[k]) {
                            format!("mi::load8_pol(in{k} + base + {off}, {} + k * 8, vec, mi_once);", v(t))
                        } else {
                            format!("mi::load8(in{k} + base + {off}, {} + k * 8, vec);", v(t))
                        }
                    },
                    &|off| format!("{}[k * 8 + q] = mi::to_f32(in{k}[base + {off}]);", v(t)),
                ));
            }
            BlockOpKind::Output { omap, forloop_dim } => {
                let (j, t) = (out_j, op.inputs[0]);
                out_j += 1;
                let ty = outs[j].storage.cty();
                wl!(s, "  // {} -> output {j}", v(t));
                s.push_str(&copy(
                    &outs[j],
                    *omap,
                    *forloop_dim,
                    &format!("out{j}"),
                    &|off| {
                        if l2_keep(&outs[j]) {
                            format!("mi::store8_pol(out{j} + base + {off}, {} + k * 8, vec, mi_keep);", v(t))
                        } else {
                            format!("mi::store_n<8>(out{j} + base + {off}, {} + k * 8, vec);", v(t))
                        }
                    },
                    &|off| format!("out{j}[base + {off}] = mi::from_f32<{ty}>({}[k * 8 + q]);", v(t)),
                ));
            }
            BlockOpKind::Unary { op: u } => {
                let (x, o) = (op.inputs[0], op.outputs[0]);
                wl!(s, "  float {}[{}];", v(o), kc * 8);
                wl!(s, "#pragma unroll");
                wl!(
                    s,
                    "  for (int i = 0; i < {}; ++i) {}[i] = {};",
                    kc * 8,
                    v(o),
                    unary_expr(u, &format!("{}[i]", v(x)))
                );
            }
            BlockOpKind::Binary { op: b } => {
                let (x, y, o) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let e = binary_expr(*b, &format!("{}[i]", v(x)), &format!("{}[i]", v(y)));
                wl!(s, "  float {}[{}];", v(o), kc * 8);
                wl!(s, "#pragma unroll");
                wl!(s, "  for (int i = 0; i < {}; ++i) {}[i] = {e};", kc * 8, v(o));
            }
            BlockOpKind::RmsNorm { .. } => {
                let (x, o) = (v(op.inputs[0]), v(op.outputs[0]));
                let eps = match op.kind {
                    BlockOpKind::RmsNorm { eps } => eps,
                    _ => 0.0,
                };
                rms_norm(&mut s, (&x, &o), (kc, len, nt), eps, &mut norm);
            }
            _ => return Ok(None),
        }
    }
    wl!(s, "}}");
    // Loads, stores and warp sums of `reductions.cuh`.
    let parts = Parts::of(&[Part::Reductions]);
    Ok(Some(Emitted { source: s, smem_bytes: 0, cluster: [1; 3], extra_threads: 0, parts }))
}

/// The statements of register output `o`, the RMS norm of `x` over rows of `len`, for `kc`
/// chunks of 8 a thread of `nt`; rows of 256 or more sum through `mi_part[norm]` (then the next).
fn rms_norm(s: &mut String, (x, o): (&str, &str), (kc, len, nt): (usize, usize, usize), eps: f32, norm: &mut usize) {
    wl!(s, "  float {o}[{}]; // rms norm of {x} over rows of {len}", kc * 8);
    wl!(s, "#pragma unroll");
    wl!(s, "  for (int k = 0; k < {kc}; ++k) {{");
    wl!(s, "    float ss = 0.0f;");
    wl!(s, "#pragma unroll");
    wl!(s, "    for (int j = 0; j < 8; ++j) ss += {x}[k * 8 + j] * {x}[k * 8 + j];");
    let n = *norm;
    if len < 256 {
        // A row is `len / 8` neighbouring lanes' chunks (NT * 8 is a multiple of 256).
        wl!(s, "    ss = mi::lanes_reduce<{}>(ss, [](float a, float b) {{ return a + b; }});", len / 8);
    } else {
        let per_row = len / 256; // warp chunks per row
        let nw = nt / 32;
        wl!(s, "    ss = mi::warp_sum(ss);");
        wl!(s, "    if (lane == 0) mi_part[{n}][k * {nw} + warp] = ss;");
        wl!(s, "  }}");
        wl!(s, "  __syncthreads();");
        wl!(s, "#pragma unroll");
        wl!(s, "  for (int k = 0; k < {kc}; ++k) {{");
        wl!(s, "    const int row0 = ((k * {nw} + warp) / {per_row}) * {per_row};");
        wl!(s, "    float ss = 0.0f;");
        wl!(s, "#pragma unroll");
        wl!(s, "    for (int p = 0; p < {per_row}; ++p) ss += mi_part[{n}][row0 + p];");
        *norm += 1;
    }
    // x * (1 / rms): one division per row chunk instead of per element (within an
    // ulp of x / rms).
    wl!(s, "    const float inv = 1.0f / sqrtf(ss / {}{});", flit(len as f32), crate::default_kernels::plus_eps(eps));
    wl!(s, "#pragma unroll");
    wl!(s, "    for (int j = 0; j < 8; ++j) {o}[k * 8 + j] = {x}[k * 8 + j] * inv;");
    wl!(s, "  }}");
}
