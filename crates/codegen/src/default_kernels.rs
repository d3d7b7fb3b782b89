//! Default kernels for the predefined kernel-graph ops: element-wise with broadcasting (and
//! copies), sum reductions, rms_norm with an optional weight, softmax and batched matmul.
//!
//! They read and write device memory through each tensor's strides, so they take any shape
//! and any dense layout; intermediate math is fp32 (softmax subtracts the max first).

use mirage_ugraph::{BinaryOp, UnaryOp};

use crate::emit::{binary_expr, kernel_open, offset_wide, row_major, unary_expr, wl};
use crate::error::{unsupported, Result};
use crate::program::{DevBuffer, Storage};
use crate::runtime::{Part, Parts};

/// The parts of the reduction, rms_norm and softmax kernels (warp and block reductions).
const REDUCTIONS: Parts = Parts::NONE.with(Part::Reductions);

/// Threads per block of the element-wise, reduction, rms_norm and softmax kernels.
const NT: usize = 256;
/// Matmul kernel: threads per block and the block tile (m, n, k).
const MM_NT: usize = 128;
const MM_TM: usize = 64;
const MM_TN: usize = 64;
const MM_TK: usize = 32;
/// Upper bound on grid-stride grids.
const MAX_GRID: usize = 1 << 20;

/// A generated default kernel: source, launch shape and dynamic shared memory.
pub(crate) struct Emitted {
    /// CUDA source.
    pub source: String,
    /// Grid dims.
    pub grid: [u32; 3],
    /// Block dims.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub smem_bytes: usize,
    /// The runtime header parts the kernel's code uses.
    pub parts: Parts,
}

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

fn grid1(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block).clamp(1, MAX_GRID) as u32
}

fn read(b: &DevBuffer, param: &str, idx: &str) -> String {
    match b.storage {
        Storage::F32 => format!("{param}[{idx}]"),
        _ => format!("mi::to_f32({param}[{idx}])"),
    }
}

fn signature(name: &str, nt: usize, ins: &[&DevBuffer], out: &DevBuffer) -> String {
    let mut p: Vec<String> =
        ins.iter().enumerate().map(|(k, b)| format!("const {}* __restrict__ in{k}", b.storage.cty())).collect();
    p.push(format!("{}* __restrict__ out0", out.storage.cty()));
    kernel_open(&nt.to_string(), name, &p.join(", "), nt, "")
}

/// The element-wise op of an element-wise kernel.
pub(crate) enum Ew {
    /// A copy (a graph output that is a graph input).
    Copy,
    /// A unary op.
    Unary(UnaryOp),
    /// A binary op with broadcasting.
    Binary(BinaryOp),
}

/// `out = op(in0[, in1])`, broadcasting size-1 dims.
pub(crate) fn elementwise(name: &str, op: &Ew, ins: &[&DevBuffer], out: &DevBuffer) -> Result<Emitted> {
    let n = numel(&out.dims);
    let od = &out.dims;
    let mut s = String::new();
    s.push_str(&signature(name, NT, ins, out));
    wl!(s, "  for (long long i = (long long)blockIdx.x * {NT} + threadIdx.x; i < {n}LL; i += (long long)gridDim.x * {NT}) {{");
    for (k, b) in ins.iter().enumerate() {
        wl!(s, "    const float r{k} = {};", read(b, &format!("in{k}"), &offset_wide(od, "i", &b.dims, &b.strides)));
    }
    let e = match op {
        Ew::Copy => "r0".to_string(),
        Ew::Unary(u) => unary_expr(u, "r0"),
        Ew::Binary(b) => binary_expr(*b, "r0", "r1"),
    };
    wl!(s, "    out0[{}] = mi::from_f32<{}>({e});", offset_wide(od, "i", od, &out.strides), out.storage.cty());
    wl!(s, "  }}");
    wl!(s, "}}");
    Ok(Emitted { source: s, grid: [grid1(n, NT), 1, 1], block: [NT as u32, 1, 1], smem_bytes: 0, parts: Parts::NONE })
}

/// Sum over `dim`, kept with size 1: a warp per output element.
pub(crate) fn reduction(name: &str, dim: usize, x: &DevBuffer, out: &DevBuffer) -> Result<Emitted> {
    let od = &out.dims;
    let nout = numel(od);
    let warps = NT / 32;
    let mut s = String::new();
    s.push_str(&signature(name, NT, &[x], out));
    wl!(s, "  const int lane = threadIdx.x & 31;");
    wl!(s, "  for (long long o = (long long)blockIdx.x * {warps} + (threadIdx.x >> 5); o < {nout}LL; o += (long long)gridDim.x * {warps}) {{");
    wl!(s, "    const long long base = {};", offset_wide(od, "o", od, &x.strides));
    wl!(s, "    float acc = 0.0f;");
    wl!(
        s,
        "    for (long long l = lane; l < {}LL; l += 32) acc += {};",
        x.dims[dim],
        read(x, "in0", &format!("base + l * {}LL", x.strides[dim]))
    );
    wl!(s, "    acc = mi::warp_sum(acc);");
    wl!(
        s,
        "    if (lane == 0) out0[{}] = mi::from_f32<{}>(acc);",
        offset_wide(od, "o", od, &out.strides),
        out.storage.cty()
    );
    wl!(s, "  }}");
    wl!(s, "}}");
    Ok(Emitted {
        source: s,
        grid: [grid1(nout, warps), 1, 1],
        block: [NT as u32, 1, 1],
        smem_bytes: 0,
        parts: REDUCTIONS,
    })
}

/// Whether the trailing `nd` dims of a tensor are dense among themselves (row-major, unit
/// innermost stride; dims of size 1 take any stride): element `j` of a row is `j` apart from
/// the row's first.
fn trailing_dense(dims: &[usize], strides: &[usize], nd: usize) -> bool {
    let mut want = 1usize;
    for k in (dims.len() - nd..dims.len()).rev() {
        if dims[k] != 1 && strides[k] != want {
            return false;
        }
        want = want.saturating_mul(dims[k]);
    }
    true
}

/// Elements a thread keeps in registers between the two passes of a dense row.
const NORM_CACHE: usize = 16;

/// How the default rms_norm kernel walks a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormForm {
    /// Dense rows, `per` elements a thread loaded once into registers.
    Cached { per: usize },
    /// Dense rows streamed twice (a thread's share exceeds `NORM_CACHE`).
    Streamed,
    /// Rows read and written through the strides.
    Strided,
}

/// The form for rows of the trailing `nd` dims of `x` written to `out`.
pub(crate) fn norm_form(x: &DevBuffer, out: &DevBuffer, nd: usize) -> NormForm {
    let d = &x.dims;
    if !(trailing_dense(d, &x.strides, nd) && trailing_dense(d, &out.strides, nd)) {
        return NormForm::Strided;
    }
    let per = numel(&d[d.len() - nd..]).div_ceil(NT);
    if per <= NORM_CACHE {
        NormForm::Cached { per }
    } else {
        NormForm::Streamed
    }
}

/// `x / sqrt(mean(x^2) + eps)` over the trailing `nd` dims, times `w` if given: a block per row.
/// Where the rows are dense in `x` and the output and a thread's share fits `NORM_CACHE`, a
/// thread loads its elements once, all at once (one memory round trip for the sum of
/// squares), and scales them from registers; otherwise it streams the row twice. Indices of a
/// dense row are its base plus the element's place; other layouts go through the strides.
pub(crate) fn rms_norm(
    name: &str,
    nd: usize,
    eps: f32,
    x: &DevBuffer,
    w: Option<&DevBuffer>,
    out: &DevBuffer,
) -> Result<Emitted> {
    let d = &x.dims;
    let r = d.len();
    let len = numel(&d[r - nd..]);
    let rows = numel(&d[..r - nd]);
    let mut ins = vec![x];
    ins.extend(w);
    let form = norm_form(x, out, nd);
    let dense = form != NormForm::Strided;
    let lead = &d[..r - nd];
    // Element j of row `row` in x and in the output.
    let (xi, oi) = if dense {
        ("bx + j".to_string(), "bo + j".to_string())
    } else {
        let i = format!("(row * {len}LL + j)");
        (offset_wide(d, &i, d, &x.strides), offset_wide(d, &i, d, &out.strides))
    };
    let scale = |v: &str| match w {
        Some(w) if trailing_dense(&w.dims, &w.strides, w.dims.len()) => {
            format!("{v} * {}", read(w, "in1", "j"))
        }
        Some(w) => format!("{v} * {}", read(w, "in1", &offset_wide(&w.dims, "j", &w.dims, &w.strides))),
        None => v.to_string(),
    };
    let mut s = String::new();
    s.push_str(&signature(name, NT, &ins, out));
    wl!(s, "  __shared__ float scratch[32];");
    wl!(s, "  for (long long row = blockIdx.x; row < {rows}LL; row += gridDim.x) {{");
    if dense {
        wl!(s, "    const long long bx = {};", offset_wide(lead, "row", lead, &x.strides[..r - nd]));
        wl!(s, "    const long long bo = {};", offset_wide(lead, "row", lead, &out.strides[..r - nd]));
    }
    let rms = format!(
        "    const float rms = sqrtf(mi::block_sum<{NT}>(ss, scratch) / {}{});",
        crate::emit::flit(len as f32),
        plus_eps(eps)
    );
    let store = |v: &str| format!("out0[{oi}] = mi::from_f32<{}>({});", out.storage.cty(), scale(v));
    // Each pass: its unroll pragma, loop head, then the sum of squares or the scaled store.
    let (unroll, head, sum, scaled) = match form {
        NormForm::Cached { per } => {
            wl!(s, "    float v[{per}];");
            (
                "#pragma unroll",
                format!("for (int k = 0; k < {per}; ++k) {{\n      const long long j = threadIdx.x + k * {NT};"),
                format!("v[k] = j < {len}LL ? {} : 0.0f;\n      ss += v[k] * v[k];", read(x, "in0", &xi)),
                format!("if (j < {len}LL) {}", store("v[k] / rms")),
            )
        }
        _ => (
            "#pragma unroll 8",
            format!("for (long long j = threadIdx.x; j < {len}LL; j += {NT}) {{"),
            format!("const float x = {};\n      ss += x * x;", read(x, "in0", &xi)),
            store(&format!("{} / rms", read(x, "in0", &xi))),
        ),
    };
    wl!(s, "    float ss = 0.0f;");
    for (k, body) in [sum, scaled].iter().enumerate() {
        if k == 1 {
            wl!(s, "{rms}");
        }
        wl!(s, "{unroll}");
        wl!(s, "    {head}");
        wl!(s, "      {body}");
        wl!(s, "    }}");
    }
    wl!(s, "  }}");
    wl!(s, "}}");
    Ok(Emitted { source: s, grid: [grid1(rows, 1), 1, 1], block: [NT as u32, 1, 1], smem_bytes: 0, parts: REDUCTIONS })
}

/// Softmax over `dim` (max subtracted first): a block per slice.
pub(crate) fn softmax(name: &str, dim: usize, x: &DevBuffer, out: &DevBuffer) -> Result<Emitted> {
    let mut sd = x.dims.clone();
    sd[dim] = 1;
    let slices = numel(&sd);
    let len = x.dims[dim];
    let (sx, so) = (x.strides[dim], out.strides[dim]);
    let xr = |idx: &str| read(x, "in0", idx);
    let mut s = String::new();
    s.push_str(&signature(name, NT, &[x], out));
    wl!(s, "  __shared__ float scratch[32];");
    wl!(s, "  for (long long sl = blockIdx.x; sl < {slices}LL; sl += gridDim.x) {{");
    wl!(s, "    const long long bx = {};", offset_wide(&sd, "sl", &sd, &x.strides));
    wl!(s, "    const long long bo = {};", offset_wide(&sd, "sl", &sd, &out.strides));
    wl!(s, "    float m = mi::neg_inf();");
    wl!(
        s,
        "    for (long long l = threadIdx.x; l < {len}LL; l += {NT}) m = fmaxf(m, {});",
        xr(&format!("bx + l * {sx}LL"))
    );
    wl!(s, "    m = mi::block_max<{NT}>(m, scratch);");
    wl!(s, "    float sum = 0.0f;");
    wl!(
        s,
        "    for (long long l = threadIdx.x; l < {len}LL; l += {NT}) sum += expf({} - m);",
        xr(&format!("bx + l * {sx}LL"))
    );
    wl!(s, "    sum = mi::block_sum<{NT}>(sum, scratch);");
    wl!(s, "    for (long long l = threadIdx.x; l < {len}LL; l += {NT})");
    wl!(
        s,
        "      out0[bo + l * {so}LL] = mi::from_f32<{}>(expf({} - m) / sum);",
        out.storage.cty(),
        xr(&format!("bx + l * {sx}LL"))
    );
    wl!(s, "  }}");
    wl!(s, "}}");
    Ok(Emitted {
        source: s,
        grid: [grid1(slices, 1), 1, 1],
        block: [NT as u32, 1, 1],
        smem_bytes: 0,
        parts: REDUCTIONS,
    })
}

/// Batched matmul `[.., m, k] x [.., k, n]`: 64x64 output tiles, k in steps of 32, through the
/// runtime's tile matmul; partial tiles are zero-padded.
pub(crate) fn matmul(name: &str, a: &DevBuffer, b: &DevBuffer, out: &DevBuffer) -> Result<Emitted> {
    let r = a.dims.len();
    let (m, k, n) = (a.dims[r - 2], a.dims[r - 1], b.dims[r - 1]);
    let bd = &a.dims[..r - 2];
    let nb = numel(bd);
    let (gx, gy) = (n.div_ceil(MM_TN), m.div_ceil(MM_TM));
    if gy > 65535 || nb > 65535 || gx > i32::MAX as usize {
        return unsupported(format!("{name}: matmul grid ({gx}, {gy}, {nb}) exceeds the CUDA grid limits"));
    }
    let (ta, tb, tc) = (a.storage.cty(), b.storage.cty(), out.storage.cty());
    let a_bytes = MM_TM * MM_TK * a.storage.size_bytes();
    let b_off = a_bytes.div_ceil(16) * 16;
    let c_off = (b_off + MM_TK * MM_TN * b.storage.size_bytes()).div_ceil(16) * 16;
    let smem = c_off + MM_TM * MM_TN * 4;
    let batch_off = |buf: &DevBuffer| {
        if bd.is_empty() {
            "0LL".to_string()
        } else {
            offset_wide(bd, "bz", bd, &buf.strides[..r - 2])
        }
    };
    let (sam, sak) = (a.strides[r - 2], a.strides[r - 1]);
    let (sbk, sbn) = (b.strides[r - 2], b.strides[r - 1]);
    let (scm, scn) = (out.strides[r - 2], out.strides[r - 1]);
    let mut s = String::new();
    s.push_str(&signature(name, MM_NT, &[a, b], out));
    wl!(s, "  extern __shared__ __align__(16) unsigned char mi_smem[];");
    wl!(s, "  constexpr int NT = {MM_NT};");
    wl!(s, "  {ta}* const As = reinterpret_cast<{ta}*>(mi_smem);");
    wl!(s, "  {tb}* const Bs = reinterpret_cast<{tb}*>(mi_smem + {b_off});");
    wl!(s, "  float* const Cs = reinterpret_cast<float*>(mi_smem + {c_off});");
    wl!(s, "  const int tid = mi::lin_tid();");
    wl!(s, "  const long long bz = blockIdx.z;");
    wl!(s, "  const long long offa = {}, offb = {}, offc = {};", batch_off(a), batch_off(b), batch_off(out));
    wl!(s, "  const int m0 = blockIdx.y * {MM_TM}, n0 = blockIdx.x * {MM_TN};");
    wl!(s, "  for (int i = tid; i < {}; i += NT) Cs[i] = 0.0f;", MM_TM * MM_TN);
    wl!(s, "  for (int k0 = 0; k0 < {k}; k0 += {MM_TK}) {{");
    wl!(s, "    __syncthreads();");
    wl!(s, "    for (int i = tid; i < {}; i += NT) {{", MM_TM * MM_TK);
    wl!(s, "      const int gm = m0 + i / {MM_TK}, gk = k0 + i % {MM_TK};");
    wl!(s, "      As[i] = (gm < {m} && gk < {k}) ? in0[offa + (long long)gm * {sam}LL + (long long)gk * {sak}LL] : mi::from_f32<{ta}>(0.0f);");
    wl!(s, "    }}");
    wl!(s, "    for (int i = tid; i < {}; i += NT) {{", MM_TK * MM_TN);
    wl!(s, "      const int gk = k0 + i / {MM_TN}, gn = n0 + i % {MM_TN};");
    wl!(s, "      Bs[i] = (gk < {k} && gn < {n}) ? in1[offb + (long long)gk * {sbk}LL + (long long)gn * {sbn}LL] : mi::from_f32<{tb}>(0.0f);");
    wl!(s, "    }}");
    wl!(s, "    __syncthreads();");
    // No split-K scratch: a 64x64 tile has 8 fragment groups for the 4 warps, so every warp
    // has its own fragments and `matmul_tile` never touches the scratch pointer.
    wl!(s, "    mi::matmul_tile<NT, 1, {MM_TM}, {MM_TN}, {MM_TK}, {MM_TK}, {MM_TN}>(As, Bs, nullptr, [&](int c, float v) {{ Cs[c] += v; }});");
    wl!(s, "  }}");
    wl!(s, "  __syncthreads();");
    wl!(s, "  for (int i = tid; i < {}; i += NT) {{", MM_TM * MM_TN);
    wl!(s, "    const int gm = m0 + i / {MM_TN}, gn = n0 + i % {MM_TN};");
    wl!(s, "    if (gm < {m} && gn < {n}) out0[offc + (long long)gm * {scm}LL + (long long)gn * {scn}LL] = mi::from_f32<{tc}>(Cs[i]);");
    wl!(s, "  }}");
    wl!(s, "}}");
    Ok(Emitted {
        source: s,
        grid: [gx as u32, gy as u32, nb.max(1) as u32],
        block: [MM_NT as u32, 1, 1],
        smem_bytes: smem,
        parts: Parts::NONE.with(Part::Matmul),
    })
}

/// Row-major strides (re-exported for the planner).
pub(crate) fn dense(dims: &[usize]) -> Vec<usize> {
    row_major(dims)
}

/// The C++ text that adds an RMS epsilon to a mean of squares: ` + <eps>`, nothing when it is 0.
pub(crate) fn plus_eps(eps: f32) -> String {
    if eps == 0.0 {
        String::new()
    } else {
        format!(" + {}", crate::emit::flit(eps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::BufferRef;

    fn buf(dims: &[usize], strides: &[usize]) -> DevBuffer {
        DevBuffer {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            storage: Storage::F16,
            location: BufferRef::Input(0),
        }
    }

    #[test]
    fn a_norms_rows_stay_in_registers_where_dense_and_short() {
        // A decode step's norm: one dense row of 4096, 16 elements a thread of 256.
        let x = buf(&[1, 4096], &[4096, 1]);
        assert_eq!(norm_form(&x, &x, 1), NormForm::Cached { per: 16 });
        // A row of 70: one element a thread, the rest masked.
        let x = buf(&[15, 70], &[70, 1]);
        assert_eq!(norm_form(&x, &x, 1), NormForm::Cached { per: 1 });
        // Two normalised dims, dense together; the leading dim strided (a view of rows).
        let x = buf(&[3, 5, 70], &[700, 70, 1]);
        assert_eq!(norm_form(&x, &x, 2), NormForm::Cached { per: 2 });
        // Longer than 16 a thread: streamed twice.
        let x = buf(&[4, 15000], &[15000, 1]);
        assert_eq!(norm_form(&x, &x, 1), NormForm::Streamed);
        // Column-major rows, in the input or the output, go through the strides.
        let col = buf(&[8, 64], &[1, 8]);
        let row = buf(&[8, 64], &[64, 1]);
        assert_eq!(norm_form(&col, &row, 1), NormForm::Strided);
        assert_eq!(norm_form(&row, &col, 1), NormForm::Strided);
        // Size-1 dims take any stride.
        let x = buf(&[2, 1, 64], &[64, 7, 1]);
        assert_eq!(norm_form(&x, &x, 2), NormForm::Cached { per: 1 });
    }
}
