//! Which predefined matmuls cuBLAS can run, and how: the layout of A, B and C (dims and
//! strides in elements) turned into one `cublasGemmStridedBatchedEx` call ([`GemmSpec`]).
//!
//! cuBLAS reads column-major matrices, each possibly transposed, with a leading dimension,
//! and writes a column-major result. So every matrix needs one of its two inner dims
//! contiguous (stride 1), the other's stride being the leading dimension; C may not be
//! transposed, so a row-major C (`C[m, n]`, n contiguous) is computed as `C^T = B^T · A^T`.
//! The batch dims of each operand must collapse into one stride. Inputs share a storage
//! (f16, bf16 or f32); the result has it too or is fp32. Anything else stays on the default
//! kernel.

use crate::program::{BufferRef, DevBuffer, GemmOperand, GemmSpec, Storage};

/// Bytes of cuBLAS workspace a program with GEMM steps reserves (what cuBLAS asks for on
/// sm_90; the calls of one launch run in order and share it).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// `X[rows, cols]` with element strides `(rs, cs)` as a stored column-major cuBLAS matrix:
/// `(trans, ld)` such that `op(stored) = X`, or `None` when neither inner dim is contiguous.
fn as_column_major(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(bool, usize)> {
    if rs == 1 || rows == 1 {
        let ld = if cols == 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some((false, ld));
        }
    }
    if cs == 1 || cols == 1 {
        let ld = if rows == 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some((true, ld));
        }
    }
    None
}

/// The one stride the batch dims of an operand step by, or `None` when they do not nest
/// (size-1 dims drop out; no batch dims left: 0).
fn batch_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let kept: Vec<(usize, usize)> = dims.iter().zip(strides).filter(|(&d, _)| d != 1).map(|(&d, &s)| (d, s)).collect();
    for w in kept.windows(2) {
        if w[0].1 != w[1].1.checked_mul(w[1].0)? {
            return None;
        }
    }
    Some(kept.last().map_or(0, |&(_, s)| s))
}

/// Whether a size fits cuBLAS's `int` arguments.
fn fits_int(x: usize) -> bool {
    i32::try_from(x).is_ok()
}

/// The cuBLAS call for `c = a · b` (a predefined matmul `[.., m, k] x [.., k, n]`, op `op`,
/// step `name`), or `None` when cuBLAS cannot take the layout or the storages (the default
/// kernel is kept). `workspace` is where the call's cuBLAS workspace lies.
pub fn plan(
    name: &str,
    op: usize,
    a: &DevBuffer,
    b: &DevBuffer,
    c: &DevBuffer,
    workspace: BufferRef,
) -> Option<GemmSpec> {
    let r = a.dims.len();
    if r < 2 || b.dims.len() != r || c.dims.len() != r {
        return None;
    }
    if [&a.strides, &b.strides, &c.strides].iter().any(|s| s.len() != r) {
        return None;
    }
    let (m, k, n) = (a.dims[r - 2], a.dims[r - 1], b.dims[r - 1]);
    if b.dims[r - 2] != k || c.dims[r - 2] != m || c.dims[r - 1] != n {
        return None;
    }
    let bd = &a.dims[..r - 2];
    if b.dims[..r - 2] != *bd || c.dims[..r - 2] != *bd {
        return None;
    }
    let batch = bd.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    if m == 0 || n == 0 || k == 0 || batch == 0 || ![m, n, k, batch].into_iter().all(fits_int) {
        return None;
    }
    if a.storage != b.storage || (c.storage != a.storage && c.storage != Storage::F32) {
        return None;
    }
    let sa = batch_stride(bd, &a.strides[..r - 2])?;
    let sb = batch_stride(bd, &b.strides[..r - 2])?;
    let sc = batch_stride(bd, &c.strides[..r - 2])?;
    if batch > 1 && sc == 0 {
        return None; // every batch would write the same matrix
    }
    let inner = |x: &DevBuffer| (x.strides[r - 2], x.strides[r - 1]);
    let ((sam, sak), (sbk, sbn), (scm, scn)) = (inner(a), inner(b), inner(c));
    // Row-major C first: C^T[n, m] = B^T[n, k] · A^T[k, m]; then column-major C = A · B.
    let forms = [
        (true, (n, m, scn, scm), (b, n, k, sbn, sbk, sb), (a, k, m, sak, sam, sa)),
        (false, (m, n, scm, scn), (a, m, k, sam, sak, sa), (b, k, n, sbk, sbn, sb)),
    ];
    for (swapped, (cr, cc, crs, ccs), x, y) in forms {
        let Some((false, ldc)) = as_column_major(cr, cc, crs, ccs) else { continue };
        let operand = |(buf, rows, cols, rs, cs, bs): (&DevBuffer, usize, usize, usize, usize, usize)| {
            as_column_major(rows, cols, rs, cs).map(|(trans, ld)| GemmOperand {
                location: buf.location,
                trans,
                ld,
                batch_stride: if batch > 1 { bs } else { 0 },
            })
        };
        let (Some(first), Some(second)) = (operand(x), operand(y)) else { continue };
        if ![first.ld, second.ld, ldc].into_iter().all(fits_int) {
            continue;
        }
        let out =
            GemmOperand { location: c.location, trans: false, ld: ldc, batch_stride: if batch > 1 { sc } else { 0 } };
        return Some(GemmSpec {
            name: name.to_string(),
            op,
            m,
            n,
            k,
            batch,
            swapped,
            first,
            second,
            out,
            input_storage: a.storage,
            out_storage: c.storage,
            workspace,
            workspace_bytes: WORKSPACE_BYTES,
        });
    }
    None
}

/// The source comment that shows a GEMM step where its kernel would be.
pub(crate) fn comment(g: &GemmSpec) -> String {
    let (cm, cn, ck) = g.call_dims();
    let op = |o: &GemmOperand| if o.trans { "T" } else { "N" };
    format!(
        "// {}: cuBLAS gemm {} x {} x {} (batch {}), {} inputs, {} output, fp32 accumulation:\n\
         //   cublasGemmStridedBatchedEx(op {}{}, m {cm}, n {cn}, k {ck}, lda {}, ldb {}, ldc {}, \
         strides {}/{}/{}){}\n",
        g.name,
        g.m,
        g.n,
        g.k,
        g.batch,
        g.input_storage.name(),
        g.out_storage.name(),
        op(&g.first),
        op(&g.second),
        g.first.ld,
        g.second.ld,
        g.out.ld,
        g.first.batch_stride,
        g.second.batch_stride,
        g.out.batch_stride,
        if g.swapped { ", computing C^T = B^T A^T" } else { "" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(dims: &[usize], strides: &[usize], storage: Storage, location: BufferRef) -> DevBuffer {
        DevBuffer { dims: dims.to_vec(), strides: strides.to_vec(), storage, location }
    }

    fn row_major(dims: &[usize]) -> Vec<usize> {
        let mut s = vec![1; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * dims[i + 1];
        }
        s
    }

    /// A, B and C of `[.., m, k] x [.., k, n]`, each with the given strides (row-major where None).
    fn plan_of(
        a: (&[usize], Option<&[usize]>),
        b: (&[usize], Option<&[usize]>),
        c: (&[usize], Option<&[usize]>),
        st: Storage,
        out_st: Storage,
    ) -> Option<GemmSpec> {
        let mk = |(d, s): (&[usize], Option<&[usize]>), st, loc| {
            buf(d, &s.map_or_else(|| row_major(d), <[usize]>::to_vec), st, loc)
        };
        plan(
            "mi_k2_matmul",
            2,
            &mk(a, st, BufferRef::Input(0)),
            &mk(b, st, BufferRef::Input(1)),
            &mk(c, out_st, BufferRef::Output(0)),
            BufferRef::Workspace(0),
        )
    }

    /// Evaluates the planned cuBLAS call on the CPU (column-major semantics, exactly as cuBLAS
    /// defines them) over flat buffers, and returns C's flat buffer.
    fn run_call(g: &GemmSpec, a: &[f64], b: &[f64], c_len: usize) -> Vec<f64> {
        let (cm, cn, ck) = g.call_dims();
        let (x, y) = if g.swapped { (b, a) } else { (a, b) };
        let at = |o: &GemmOperand, mem: &[f64], bz: usize, i: usize, j: usize| {
            // op(stored)(i, j): stored(i, j) or stored(j, i), column-major with o.ld.
            let (r, c) = if o.trans { (j, i) } else { (i, j) };
            mem[bz * o.batch_stride + r + c * o.ld]
        };
        let mut out = vec![f64::NAN; c_len];
        for bz in 0..g.batch {
            for i in 0..cm {
                for j in 0..cn {
                    let s: f64 = (0..ck).map(|l| at(&g.first, x, bz, i, l) * at(&g.second, y, bz, l, j)).sum();
                    out[bz * g.out.batch_stride + i + j * g.out.ld] = s;
                }
            }
        }
        out
    }

    /// Checks a plan against the strided definition of the matmul.
    fn check(dims_a: &[usize], sa: &[usize], dims_b: &[usize], sb: &[usize], sc: &[usize]) {
        let r = dims_a.len();
        let mut dims_c = dims_a[..r - 1].to_vec();
        dims_c.push(dims_b[r - 1]);
        let g = plan_of((dims_a, Some(sa)), (dims_b, Some(sb)), (&dims_c, Some(sc)), Storage::F16, Storage::F16)
            .expect("cuBLAS takes this layout");
        let len = |d: &[usize], s: &[usize]| d.iter().zip(s).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1;
        let a: Vec<f64> = (0..len(dims_a, sa)).map(|i| ((i * 7 + 3) % 11) as f64 - 5.0).collect();
        let b: Vec<f64> = (0..len(dims_b, sb)).map(|i| ((i * 5 + 1) % 13) as f64 - 6.0).collect();
        let c = run_call(&g, &a, &b, len(&dims_c, sc));
        let (m, k, n) = (dims_a[r - 2], dims_a[r - 1], dims_b[r - 1]);
        let batches: usize = dims_a[..r - 2].iter().product();
        for bz in 0..batches {
            // The batch index's offset in each operand, from its own batch strides.
            let off = |s: &[usize]| {
                let mut rem = bz;
                let mut o = 0;
                for d in (0..r - 2).rev() {
                    o += (rem % dims_a[d]) * s[d];
                    rem /= dims_a[d];
                }
                o
            };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|l| {
                            a[off(sa) + i * sa[r - 2] + l * sa[r - 1]] * b[off(sb) + l * sb[r - 2] + j * sb[r - 1]]
                        })
                        .sum();
                    assert_eq!(c[off(sc) + i * sc[r - 2] + j * sc[r - 1]], want, "batch {bz} ({i}, {j}) of {g:?}");
                }
            }
        }
    }

    #[test]
    fn a_row_major_product_is_computed_transposed() {
        let g = plan_of((&[16, 64], None), (&[64, 32], None), (&[16, 32], None), Storage::BF16, Storage::BF16)
            .expect("row-major");
        assert!(g.swapped && !g.first.trans && !g.second.trans, "{g:?}");
        assert_eq!((g.call_dims(), g.first.ld, g.second.ld, g.out.ld), ((32, 16, 64), 32, 64, 32));
        assert_eq!((g.first.location, g.second.location, g.batch), (BufferRef::Input(1), BufferRef::Input(0), 1));
        check(&[5, 7], &[7, 1], &[7, 3], &[3, 1], &[3, 1]);
    }

    #[test]
    fn transposed_views_of_a_and_b_become_transpose_flags() {
        // A stored as [k, m] (column-major view), B row-major.
        let g = plan_of((&[16, 64], Some(&[1, 16])), (&[64, 32], None), (&[16, 32], None), Storage::F16, Storage::F16)
            .expect("A^T view");
        assert!(g.swapped && !g.first.trans && g.second.trans, "{g:?}");
        check(&[5, 7], &[1, 5], &[7, 3], &[3, 1], &[3, 1]);
        // B stored as [n, k] (a Linear weight).
        check(&[5, 7], &[7, 1], &[7, 3], &[1, 7], &[3, 1]);
        // Both transposed, and a column-major C.
        check(&[5, 7], &[1, 5], &[7, 3], &[1, 7], &[1, 5]);
        check(&[5, 7], &[7, 1], &[7, 3], &[3, 1], &[1, 5]);
    }

    #[test]
    fn batched_products_take_one_stride_per_operand() {
        let g = plan_of((&[4, 64, 128], None), (&[4, 128, 96], None), (&[4, 64, 96], None), Storage::F32, Storage::F32)
            .expect("batched");
        assert_eq!(
            (g.batch, g.first.batch_stride, g.second.batch_stride, g.out.batch_stride),
            (4, 128 * 96, 64 * 128, 64 * 96)
        );
        check(&[3, 5, 7], &[35, 7, 1], &[3, 7, 2], &[14, 2, 1], &[10, 2, 1]);
        // Two batch dims that nest, and a batch dim stored between the matrix dims.
        check(&[2, 3, 4, 5], &[60, 20, 5, 1], &[2, 3, 5, 2], &[30, 10, 2, 1], &[24, 8, 2, 1]);
        check(&[3, 4, 5], &[5, 15, 1], &[3, 5, 2], &[10, 2, 1], &[2, 6, 1]);
        // A broadcast operand (batch stride 0): every batch reads the same B.
        check(&[3, 4, 5], &[20, 5, 1], &[3, 5, 2], &[0, 2, 1], &[8, 2, 1]);
    }

    #[test]
    fn a_layout_or_storage_cublas_cannot_take_keeps_the_default_kernel() {
        // No unit stride in A's inner dims.
        assert!(
            plan_of((&[4, 8], Some(&[16, 2])), (&[8, 4], None), (&[4, 4], None), Storage::F16, Storage::F16).is_none()
        );
        // Batch dims that do not nest into one stride.
        assert!(plan_of(
            (&[2, 3, 4, 8], Some(&[24 * 8, 4 * 8, 8, 1])),
            (&[2, 3, 8, 4], None),
            (&[2, 3, 4, 4], None),
            Storage::F16,
            Storage::F16
        )
        .is_none());
        // Every batch writing one C.
        assert!(plan_of(
            (&[3, 4, 5], None),
            (&[3, 5, 2], None),
            (&[3, 4, 2], Some(&[0, 2, 1])),
            Storage::F16,
            Storage::F16
        )
        .is_none());
        // Mixed input storages, and an f16 result of f32 inputs.
        let a = buf(&[4, 8], &[8, 1], Storage::F32, BufferRef::Workspace(0));
        let b = buf(&[8, 4], &[4, 1], Storage::F16, BufferRef::Input(0));
        let c = buf(&[4, 4], &[4, 1], Storage::F16, BufferRef::Output(0));
        assert!(plan("k", 1, &a, &b, &c, BufferRef::Workspace(256)).is_none());
        assert!(plan_of((&[4, 8], None), (&[8, 4], None), (&[4, 4], None), Storage::F32, Storage::F16).is_none());
        // f16 inputs with an fp32 result (an intermediate) are fine.
        assert!(plan_of((&[4, 8], None), (&[8, 4], None), (&[4, 4], None), Storage::F16, Storage::F32).is_some());
    }

    #[test]
    fn vectors_and_size_one_dims_take_any_stride() {
        // m = 1 (a decode step): A's row stride is irrelevant.
        check(&[1, 7], &[999, 1], &[7, 3], &[3, 1], &[3, 1]);
        // n = 1 and k = 1.
        check(&[5, 7], &[7, 1], &[7, 1], &[1, 1], &[1, 1]);
        check(&[5, 1], &[1, 1], &[1, 3], &[3, 1], &[3, 1]);
    }

    #[test]
    fn the_comment_names_the_call() {
        let g = plan_of((&[16, 14336], None), (&[14336, 4096], None), (&[16, 4096], None), Storage::F16, Storage::F16)
            .expect("plan");
        let c = comment(&g);
        assert!(c.starts_with("// mi_k2_matmul: cuBLAS gemm 16 x 4096 x 14336"), "{c}");
        assert!(c.lines().all(|l| l.starts_with("//")), "{c}");
    }
}
