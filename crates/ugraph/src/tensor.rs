//! Dense row-major tensors of any scalar domain and the tile kernels the interpreter uses.

use rayon::prelude::*;

use crate::error::{shape_err, Result};
use crate::ops::{BinaryOp, UnaryOp};
use crate::scalar::Scalar;
use crate::types::{numel, row_major_strides};

/// Matmuls of at least this many multiply-adds run their output rows in parallel.
const PARALLEL_MATMUL: usize = 1 << 22;
/// Most output rows of a parallel matmul one task computes.
const MATMUL_BAND_ROWS: usize = 32;
/// Most elements of `b` a column-block task of a few-row matmul reads (a field domain makes
/// residue planes of them: about 8 MB).
const MATMUL_BLOCK_ELEMS: usize = 1 << 20;
/// Softmaxes over at least this many elements run their rows in parallel.
const PARALLEL_ELEMENTWISE: usize = 1 << 16;

/// A dense row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<S> {
    /// Dims.
    pub dims: Vec<usize>,
    /// Elements in row-major order.
    pub data: Vec<S>,
}

impl<S: Scalar> Tensor<S> {
    /// Wraps `data`, checking its length against `dims`.
    pub fn new(dims: Vec<usize>, data: Vec<S>) -> Result<Self> {
        if numel(&dims) != data.len() {
            return shape_err("tensor", format!("dims {dims:?} need {} elements, got {}", numel(&dims), data.len()));
        }
        Ok(Tensor { dims, data })
    }

    /// A tensor filled with zero.
    pub fn zeros(dims: &[usize]) -> Self {
        Tensor { dims: dims.to_vec(), data: vec![S::zero(); numel(dims)] }
    }

    /// Applies `f` to every element.
    pub fn map(&self, f: impl Fn(S) -> S) -> Self {
        Tensor { dims: self.dims.clone(), data: self.data.iter().map(|&x| f(x)).collect() }
    }

    /// Element-wise unary op.
    pub fn unary(&self, op: &UnaryOp) -> Self {
        self.map(|x| op.apply(x))
    }

    /// Element-wise binary op, broadcasting dims of size 1 (ranks must already agree).
    pub fn binary(&self, op: BinaryOp, o: &Tensor<S>) -> Self {
        self.zip_with(o, |a, b| op.apply(a, b))
    }

    /// Combines two tensors element-wise with `f`, broadcasting dims of size 1.
    pub fn zip_with(&self, o: &Tensor<S>, f: impl Fn(S, S) -> S) -> Self {
        if self.dims == o.dims {
            let data = self.data.iter().zip(&o.data).map(|(&a, &b)| f(a, b)).collect();
            return Tensor { dims: self.dims.clone(), data };
        }
        let rank = self.dims.len();
        let dims: Vec<usize> = self.dims.iter().zip(&o.dims).map(|(&a, &b)| a.max(b)).collect();
        // Pad to rank 4 with leading 1s; broadcast dims get stride 0.
        let pad = |d: &[usize]| -> ([usize; 4], [usize; 4]) {
            let st = row_major_strides(d);
            let (mut pd, mut ps) = ([1usize; 4], [0usize; 4]);
            for i in 0..rank {
                pd[4 - rank + i] = d[i];
                ps[4 - rank + i] = if d[i] == 1 { 0 } else { st[i] };
            }
            (pd, ps)
        };
        let (_, sa) = pad(&self.dims);
        let (_, sb) = pad(&o.dims);
        let (od, _) = pad(&dims);
        let mut data = Vec::with_capacity(numel(&dims));
        for i0 in 0..od[0] {
            for i1 in 0..od[1] {
                for i2 in 0..od[2] {
                    let ba = i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
                    let bb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
                    for i3 in 0..od[3] {
                        data.push(f(self.data[ba + i3 * sa[3]], o.data[bb + i3 * sb[3]]));
                    }
                }
            }
        }
        Tensor { dims, data }
    }

    /// Batched matmul `[.., m, k] x [.., k, n]` (shapes already checked).
    pub fn matmul(&self, o: &Tensor<S>) -> Self {
        let r = self.dims.len();
        let (m, k, n) = (self.dims[r - 2], self.dims[r - 1], o.dims[r - 1]);
        let batch = numel(&self.dims[..r - 2]);
        let mut dims = self.dims.clone();
        dims[r - 1] = n;
        let mut data = vec![S::zero(); batch * m * n];
        if n == 0 || m == 0 || k == 0 {
            return Tensor { dims, data };
        }
        if batch * m * n * k >= PARALLEL_MATMUL {
            let threads = rayon::current_num_threads();
            if batch * m < 8 * threads && n >= 128 {
                self.matmul_column_blocks(o, (batch, m, k, n), threads, &mut data);
                return Tensor { dims, data };
            }
            // Bands of output rows per task, each band sharing its batch's `b` (whole-output
            // verification multiplies 4096-wide weights).
            // A few tasks a thread, each of 8 to MATMUL_BAND_ROWS rows of one batch (a domain
            // may prepare `b` once per task); one row a task when there are few rows.
            let band = if batch * m < 8 * threads {
                1
            } else {
                (batch * m).div_ceil(4 * threads).clamp(8, MATMUL_BAND_ROWS).min(m)
            };
            data.par_chunks_mut(m * n).enumerate().for_each(|(bt, cb)| {
                let b = &o.data[bt * k * n..(bt + 1) * k * n];
                cb.par_chunks_mut(band * n).enumerate().for_each(|(j, cc)| {
                    let row = bt * m + j * band;
                    let a = &self.data[row * k..(row + cc.len() / n) * k];
                    S::matmul_rows(cc, a, b, k);
                });
            });
            return Tensor { dims, data };
        }
        for bt in 0..batch {
            let a = &self.data[bt * m * k..(bt + 1) * m * k];
            let b = &o.data[bt * k * n..(bt + 1) * k * n];
            S::matmul_rows(&mut data[bt * m * n..(bt + 1) * m * n], a, b, k);
        }
        Tensor { dims, data }
    }

    /// [`Tensor::matmul`] for few output rows (decode-shaped, as whole-output verification of
    /// a GEMV multiplies them): one task per batch and block of `b`'s columns, which computes
    /// those columns of every row of the batch ([`Scalar::matmul_cols`], `b` read in place).
    /// Row tasks alone would leave cores idle (one task per row, one in all for a single row).
    fn matmul_column_blocks(
        &self,
        o: &Tensor<S>,
        (batch, m, k, n): (usize, usize, usize, usize),
        threads: usize,
        data: &mut [S],
    ) {
        let per_batch = (4 * threads).div_ceil(batch).max(1);
        let cap = (MATMUL_BLOCK_ELEMS / k.max(1)).max(64);
        let cols = n.div_ceil(per_batch).next_multiple_of(64).clamp(64, cap);
        let blocks = n.div_ceil(cols);
        let parts: Vec<Vec<S>> = (0..batch * blocks)
            .into_par_iter()
            .map(|t| {
                let (bt, j0) = (t / blocks, (t % blocks) * cols);
                let w = cols.min(n - j0);
                let b = &o.data[bt * k * n..(bt + 1) * k * n];
                let mut c = vec![S::zero(); m * w];
                S::matmul_cols(&mut c, &self.data[bt * m * k..(bt + 1) * m * k], b, k, n, j0);
                c
            })
            .collect();
        for (t, c) in parts.iter().enumerate() {
            let (bt, j0) = (t / blocks, (t % blocks) * cols);
            let w = cols.min(n - j0);
            for (i, row) in c.chunks(w).enumerate() {
                let at = (bt * m + i) * n + j0;
                data[at..at + w].copy_from_slice(row);
            }
        }
    }

    /// Splits dims around `dim` into (outer, len, inner) extents.
    fn around(&self, dim: usize) -> (usize, usize, usize) {
        (numel(&self.dims[..dim]), self.dims[dim], numel(&self.dims[dim + 1..]))
    }

    /// Folds `dim` with `f`, keeping it with size 1.
    pub fn fold_dim(&self, dim: usize, f: impl Fn(S, S) -> S) -> Self {
        let (outer, len, inner) = self.around(dim);
        let mut data = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            let base = o * len * inner;
            for i in 0..inner {
                let mut acc = self.data[base + i];
                for l in 1..len {
                    acc = f(acc, self.data[base + l * inner + i]);
                }
                data.push(acc);
            }
        }
        let mut dims = self.dims.clone();
        dims[dim] = 1;
        Tensor { dims, data }
    }

    /// Sum over `dim`, kept with size 1.
    pub fn sum_dim(&self, dim: usize) -> Self {
        self.fold_dim(dim, |a, b| a.add_acc(b))
    }

    /// Max over `dim`, kept with size 1.
    pub fn max_dim(&self, dim: usize) -> Self {
        self.fold_dim(dim, |a, b| a.max(b))
    }

    /// Folds the last dim to `dimx` by strided groups: `out[.., j] = sum_k x[.., j + k * dimx]`.
    pub fn sum_to_dimx(&self, dimx: usize) -> Self {
        let last = *self.dims.last().unwrap_or(&1);
        let rows = self.data.len() / last;
        let mut data = vec![S::zero(); rows * dimx];
        for r in 0..rows {
            let src = &self.data[r * last..(r + 1) * last];
            let dst = &mut data[r * dimx..(r + 1) * dimx];
            dst.copy_from_slice(&src[..dimx]);
            for chunk in src[dimx..].chunks(dimx) {
                for (d, &s) in dst.iter_mut().zip(chunk) {
                    *d = d.add_acc(s);
                }
            }
        }
        let mut dims = self.dims.clone();
        if let Some(l) = dims.last_mut() {
            *l = dimx;
        }
        Tensor { dims, data }
    }

    /// RMS normalisation over the trailing `len` elements of each row, times `weight` if given.
    pub fn rms_norm(&self, len: usize, weight: Option<&Tensor<S>>, eps: f32) -> Self {
        let mut data = Vec::with_capacity(self.data.len());
        let n = S::from_count(len);
        for row in self.data.chunks(len) {
            let mut ss = S::zero();
            for &x in row {
                ss = ss.mul_acc(x, x);
            }
            let r = add_eps(ss.div(n), eps).sqrt();
            match weight {
                Some(w) => data.extend(row.iter().zip(&w.data).map(|(&x, &wv)| x.div(r).mul(wv))),
                None => data.extend(row.iter().map(|&x| x.div(r))),
            }
        }
        Tensor { dims: self.dims.clone(), data }
    }

    /// Softmax over `dim`, subtracting the max first.
    pub fn softmax(&self, dim: usize) -> Self {
        let (outer, len, inner) = self.around(dim);
        let mut data = self.data.clone();
        if len == 0 || inner == 0 {
            return Tensor { dims: self.dims.clone(), data };
        }
        // Each outer slab is independent: large tensors run them in parallel.
        let slab = |chunk: &mut [S]| {
            for i in 0..inner {
                let idx = |l: usize| l * inner + i;
                let mut m = chunk[idx(0)];
                for l in 1..len {
                    m = m.max(chunk[idx(l)]);
                }
                let mut s = S::zero();
                for l in 0..len {
                    let e = chunk[idx(l)].sub(m).exp();
                    chunk[idx(l)] = e;
                    s = s.add_acc(e);
                }
                for l in 0..len {
                    chunk[idx(l)] = chunk[idx(l)].div(s);
                }
            }
        };
        if data.len() >= PARALLEL_ELEMENTWISE && outer > 1 {
            data.par_chunks_mut(len * inner).for_each(slab);
        } else {
            data.chunks_mut(len * inner).for_each(slab);
        }
        Tensor { dims: self.dims.clone(), data }
    }

    /// Concatenation along `dim` (shapes already checked).
    pub fn concat(&self, o: &Tensor<S>, dim: usize) -> Self {
        let (outer, la, inner) = self.around(dim);
        let lb = o.dims[dim];
        let mut data = Vec::with_capacity(self.data.len() + o.data.len());
        for i in 0..outer {
            data.extend_from_slice(&self.data[i * la * inner..(i + 1) * la * inner]);
            data.extend_from_slice(&o.data[i * lb * inner..(i + 1) * lb * inner]);
        }
        let mut dims = self.dims.clone();
        dims[dim] = la + lb;
        Tensor { dims, data }
    }

    /// Copies the box `[off, off + extent)` out of this tensor.
    pub fn slice(&self, off: &[usize], extent: &[usize]) -> Self {
        let mut out = Tensor::zeros(extent);
        copy_box(&self.data, &self.dims, off, &mut out.data, extent, &vec![0; extent.len()], extent);
        out
    }

    /// Copies the box `[src_off, src_off + extent)` of `src` to `[off, off + extent)` of this tensor.
    pub fn copy_from(&mut self, off: &[usize], src: &Tensor<S>, src_off: &[usize], extent: &[usize]) {
        copy_box(&src.data, &src.dims, src_off, &mut self.data, &self.dims, off, extent);
    }
}

impl Tensor<f32> {
    /// A deterministic pseudo-random tensor (xorshift64 of `seed`) with values in `[-0.5, 0.5)`,
    /// for examples, tests and benches.
    pub fn random(dims: &[usize], seed: u64) -> Tensor<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data = (0..numel(dims))
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Tensor { dims: dims.to_vec(), data }
    }
}

/// Copies an N-d box of `extent` from `src` at `so` to `dst` at `dof` (row-major, same rank).
fn copy_box<S: Copy>(
    src: &[S],
    sd: &[usize],
    so: &[usize],
    dst: &mut [S],
    dd: &[usize],
    dof: &[usize],
    extent: &[usize],
) {
    let r = extent.len();
    let (ss, ds) = (row_major_strides(sd), row_major_strides(dd));
    let inner = extent[r - 1];
    let rows = numel(&extent[..r - 1]);
    let mut idx = vec![0usize; r.saturating_sub(1)];
    for _ in 0..rows {
        let (mut sb, mut db) = (so[r - 1], dof[r - 1]);
        for d in 0..r - 1 {
            sb += (so[d] + idx[d]) * ss[d];
            db += (dof[d] + idx[d]) * ds[d];
        }
        dst[db..db + inner].copy_from_slice(&src[sb..sb + inner]);
        for d in (0..r - 1).rev() {
            idx[d] += 1;
            if idx[d] < extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `v + eps`; `v` itself when `eps` is 0, so an epsilon-free norm computes exactly what it did
/// without the addition.
pub fn add_eps<S: Scalar>(v: S, eps: f32) -> S {
    if eps == 0.0 {
        v
    } else {
        v.add(S::from_f32(eps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(dims: &[usize], salt: usize) -> Tensor<f64> {
        let n = numel(dims);
        Tensor { dims: dims.to_vec(), data: (0..n).map(|i| ((i * 31 + salt * 17) % 13) as f64 - 6.0).collect() }
    }

    #[test]
    fn parallel_matmul_bands_equal_plain_sums() {
        // Large enough for the parallel path; m not a multiple of the band, several batches.
        let (batch, m, k, n) = (3, 37, 64, 640);
        assert!(batch * m * k * n >= PARALLEL_MATMUL);
        let (a, b) = (ints(&[batch, m, k], 1), ints(&[batch, k, n], 2));
        let c = a.matmul(&b);
        for bt in 0..batch {
            for i in 0..m {
                for j in (0..n).step_by(7) {
                    let s: f64 = (0..k).map(|kk| a.data[(bt * m + i) * k + kk] * b.data[(bt * k + kk) * n + j]).sum();
                    assert_eq!(c.data[(bt * m + i) * n + j], s, "batch {bt} row {i} col {j}");
                }
            }
        }
    }

    #[test]
    fn few_row_matmul_column_blocks_equal_plain_sums() {
        // Decode-shaped: 1 and 3 rows, n not a multiple of the column block, two batches.
        for (batch, m, k, n) in [(1, 1, 4096, 1100), (2, 3, 1024, 1500)] {
            assert!(batch * m * k * n >= PARALLEL_MATMUL);
            let (a, b) = (ints(&[batch, m, k], 4), ints(&[batch, k, n], 5));
            let c = a.matmul(&b);
            for bt in 0..batch {
                for i in 0..m {
                    for j in (0..n).step_by(13).chain([n - 1]) {
                        let s: f64 =
                            (0..k).map(|kk| a.data[(bt * m + i) * k + kk] * b.data[(bt * k + kk) * n + j]).sum();
                        assert_eq!(c.data[(bt * m + i) * n + j], s, "batch {bt} row {i} col {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn parallel_softmax_rows_equal_single_rows() {
        let (rows, len) = (300, 400);
        assert!(rows * len >= PARALLEL_ELEMENTWISE);
        let x = ints(&[rows, len], 3);
        let y = x.softmax(1);
        for r in [0, 151, rows - 1] {
            let one = Tensor { dims: vec![1, len], data: x.data[r * len..(r + 1) * len].to_vec() }.softmax(1);
            assert_eq!(&y.data[r * len..(r + 1) * len], &one.data[..], "row {r}");
        }
    }
}
