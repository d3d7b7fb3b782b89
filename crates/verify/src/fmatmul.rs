//! The field matmul kernel behind [`Fp`]'s `Scalar::matmul_rows`: the right operand is split
//! once into residue planes (`p`, and `q` with poison read as 0), then each residue's sums of
//! products run over plain `u64` lanes, kept below `M^2` by one conditional subtraction a term
//! and reduced once per element. Rows, columns and the inner dim are cut in blocks so one block
//! of `b` stays in cache for a band of rows. The result equals the term-by-term field sums
//! exactly (field sums do not depend on their order); the poison and `w` of an element are
//! those of the operands it depends on (its `c`, its row of `a`, its column of `b`).
//!
//! On x86-64 the lane loop is compiled a second time for AVX2 and chosen at run time; both
//! versions compute the same integers.

use crate::field::{Fp, P, POISON, Q};

/// Columns of `b` per block (the accumulators of one row stay in L1).
const COLS: usize = 512;
/// Rows of `b` (the inner dim) per block: one block of both planes is `2 * 4 * COLS * DEPTH` bytes.
const DEPTH: usize = 64;
/// Fewer rows than this run the element-wise kernel: splitting `b` costs about one row's work.
const MIN_ROWS: usize = 4;

/// `t + x * y` with `t < m2` and `x, y` below `sqrt(m2) < 2^31`, reduced below `m2` (a sum
/// below `2^63`, so the signed comparison is exact and vectorizes).
#[inline(always)]
fn mac(t: u64, x: u64, y: u32, m2: u64) -> u64 {
    let t = (t + x * y as u64) as i64;
    let u = t - m2 as i64;
    (if u >= 0 { u } else { t }) as u64
}

/// `acc[j] += x[kk] * b[kk * ldb + j]` over `kk`, each sum kept below `m2`; four `kk` per pass
/// over the accumulators.
#[inline(always)]
fn lanes(acc: &mut [u64], x: &[u32], b: &[u32], ldb: usize, m2: u64) {
    let n = acc.len();
    let mut kk = 0;
    while kk + 4 <= x.len() {
        let (x0, x1, x2, x3) = (x[kk] as u64, x[kk + 1] as u64, x[kk + 2] as u64, x[kk + 3] as u64);
        let r0 = &b[kk * ldb..kk * ldb + n];
        let r1 = &b[(kk + 1) * ldb..(kk + 1) * ldb + n];
        let r2 = &b[(kk + 2) * ldb..(kk + 2) * ldb + n];
        let r3 = &b[(kk + 3) * ldb..(kk + 3) * ldb + n];
        for ((((s, &y0), &y1), &y2), &y3) in acc.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
            *s = mac(mac(mac(mac(*s, x0, y0, m2), x1, y1, m2), x2, y2, m2), x3, y3, m2);
        }
        kk += 4;
    }
    for (kk, &xv) in x.iter().enumerate().skip(kk) {
        let row = &b[kk * ldb..kk * ldb + n];
        for (s, &y) in acc.iter_mut().zip(row) {
            *s = mac(*s, xv as u64, y, m2);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lanes_avx2(acc: &mut [u64], x: &[u32], b: &[u32], ldb: usize, m2: u64) {
    lanes(acc, x, b, ldb, m2)
}

type Lanes = fn(&mut [u64], &[u32], &[u32], usize, u64);

/// The fastest lane loop this CPU runs.
fn pick_lanes() -> Lanes {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return |acc, x, b, ldb, m2| unsafe { lanes_avx2(acc, x, b, ldb, m2) };
    }
    lanes
}

/// `c[i] += a[i] b` for each row `i` of `c` (`k` elements of `a` a row; `b` is `k x n`).
pub(crate) fn matmul_rows(c: &mut [Fp], a: &[Fp], b: &[Fp], k: usize) {
    let n = b.len().checked_div(k).unwrap_or(0);
    matmul_cols(c, a, b, k, n, 0);
}

/// Columns `j0..j0 + w` of [`matmul_rows`] with `b` of `k` rows `ldb` apart: `c` holds
/// `a.len() / k` rows of `w = c.len() / rows` elements, `c[i] += a[i] b[.., j0..j0 + w]`. Only
/// those columns of `b` are read (a block of a wide weight needs no copy of its own).
pub(crate) fn matmul_cols(c: &mut [Fp], a: &[Fp], b: &[Fp], k: usize, ldb: usize, j0: usize) {
    let rows = a.len().checked_div(k).unwrap_or(0);
    let n = c.len().checked_div(rows).unwrap_or(0);
    if n == 0 || k == 0 {
        return;
    }
    if rows < MIN_ROWS {
        for (crow, arow) in c.chunks_mut(n).zip(a.chunks(k)) {
            row_cols(crow, arow, b, ldb, j0);
        }
        return;
    }
    let kernel = pick_lanes();
    // One pass over the block of `b`: its residue planes (in this thread's reused buffers: a
    // fresh allocation of a wide weight's planes costs more in page faults than the pass) and
    // the poison and `w` of each column.
    PLANES.with(|cell| {
        let mut planes = cell.borrow_mut();
        let (bp, bq) = &mut *planes;
        bp.clear();
        bq.clear();
        let mut col_poison = vec![false; n];
        let mut col_w = vec![0u32; n];
        for kk in 0..k {
            let brow = &b[kk * ldb + j0..kk * ldb + j0 + n];
            bp.extend(brow.iter().map(|x| x.p));
            bq.extend(brow.iter().map(|x| if x.q == POISON { 0 } else { x.q }));
            for ((z, v), x) in col_poison.iter_mut().zip(col_w.iter_mut()).zip(brow) {
                *z |= x.q == POISON;
                *v = (*v).max(x.w);
            }
        }
        blocked(c, a, (bp, bq), (&col_poison, &col_w), (rows, k, n), kernel);
        if bp.capacity() > RETAINED_PLANE {
            *planes = (Vec::new(), Vec::new());
        }
    });
}

/// Most elements of a plane a thread keeps between calls (a column block of a few-row matmul
/// is at most `2^20`; a whole wide weight, planed by a band of rows, is let go).
const RETAINED_PLANE: usize = 1 << 21;

thread_local! {
    /// Residue planes of the current block of `b`, reused by each thread's calls.
    static PLANES: std::cell::RefCell<(Vec<u32>, Vec<u32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The blocked sums of [`matmul_cols`] over `b`'s planes (`k x n`, unit stride).
fn blocked(
    c: &mut [Fp],
    a: &[Fp],
    (bp, bq): (&[u32], &[u32]),
    (col_poison, col_w): (&[bool], &[u32]),
    (rows, k, n): (usize, usize, usize),
    kernel: Lanes,
) {
    let every_col_poisoned = col_poison.iter().all(|&z| z);
    let ap: Vec<u32> = a.iter().map(|x| x.p).collect();
    let aq: Vec<u32> = a.iter().map(|x| x.q).collect();
    let row_poison: Vec<bool> = a.chunks(k).map(|r| r.iter().any(|x| x.q == POISON)).collect();
    let row_w: Vec<u32> = a.chunks(k).map(|r| r.iter().map(|x| x.w).max().unwrap_or(0)).collect();
    let cw = COLS.min(n);
    let (mut sp, mut sq) = (vec![0u64; rows * cw], vec![0u64; rows * cw]);
    for j0 in (0..n).step_by(cw) {
        let w = cw.min(n - j0);
        for i in 0..rows {
            for j in 0..w {
                let x = c[i * n + j0 + j];
                sp[i * cw + j] = x.p as u64;
                sq[i * cw + j] = if x.q == POISON { 0 } else { x.q as u64 };
            }
        }
        for k0 in (0..k).step_by(DEPTH) {
            let d = DEPTH.min(k - k0);
            let (pb, qb) = (&bp[k0 * n + j0..], &bq[k0 * n + j0..]);
            for i in 0..rows {
                let acc = i * cw..i * cw + w;
                kernel(&mut sp[acc.clone()], &ap[i * k + k0..i * k + k0 + d], pb, n, P * P);
                if !row_poison[i] && !every_col_poisoned {
                    kernel(&mut sq[acc], &aq[i * k + k0..i * k + k0 + d], qb, n, Q * Q);
                }
            }
        }
        for i in 0..rows {
            for j in 0..w {
                let cv = &mut c[i * n + j0 + j];
                let poisoned = cv.q == POISON || row_poison[i] || col_poison[j0 + j];
                *cv = Fp {
                    p: (sp[i * cw + j] % P) as u32,
                    q: if poisoned { POISON } else { (sq[i * cw + j] % Q) as u32 },
                    w: cv.w.max(row_w[i]).max(col_w[j0 + j]),
                };
            }
        }
    }
}

/// One row, element by element (no split of `b`): the kernel for a few rows.
pub(crate) fn row_by_elements(c: &mut [Fp], a: &[Fp], b: &[Fp]) {
    row_cols(c, a, b, c.len(), 0)
}

/// [`row_by_elements`] over columns `j0..j0 + c.len()` of `b`, whose rows are `ldb` apart.
fn row_cols(c: &mut [Fp], a: &[Fp], b: &[Fp], ldb: usize, j0: usize) {
    const P2: u64 = P * P;
    const Q2: u64 = Q * Q;
    let n = c.len();
    let mut sp: Vec<u64> = c.iter().map(|x| x.p as u64).collect();
    let mut sq: Vec<u64> = c.iter().map(|x| x.q as u64).collect();
    let mut poison: Vec<bool> = c.iter().map(|x| x.q == POISON).collect();
    let mut w: Vec<u32> = c.iter().map(|x| x.w).collect();
    let a_poison = a.iter().any(|x| x.q == POISON);
    let a_w = a.iter().map(|x| x.w).max().unwrap_or(0);
    for (kk, av) in a.iter().enumerate() {
        let brow = &b[kk * ldb + j0..kk * ldb + j0 + n];
        // A poisoned exponent residue makes the q sums meaningless: they are dropped below.
        let (ap, aq) = (av.p as u64, if av.q == POISON { 0 } else { av.q as u64 });
        for ((((x, y), z), v), bv) in
            sp.iter_mut().zip(sq.iter_mut()).zip(poison.iter_mut()).zip(w.iter_mut()).zip(brow)
        {
            let bq = if bv.q == POISON { 0 } else { bv.q as u64 };
            let tp = *x + ap * bv.p as u64;
            *x = if tp >= P2 { tp - P2 } else { tp };
            let tq = *y + aq * bq;
            *y = if tq >= Q2 { tq - Q2 } else { tq };
            *z |= bv.q == POISON;
            *v = (*v).max(bv.w);
        }
    }
    for (j, cv) in c.iter_mut().enumerate() {
        *cv = Fp {
            p: (sp[j] % P) as u32,
            q: if poison[j] || a_poison { POISON } else { (sq[j] % Q) as u32 },
            w: w[j].max(a_w),
        };
    }
}

#[cfg(test)]
mod tests {
    use mirage_ugraph::Scalar;

    use super::*;
    use crate::field::hash_words;

    /// An element with residues near the top of each field (sums wrap many times) or random,
    /// a constant (w = 0) or a trial value.
    fn elem(i: u64) -> Fp {
        let h = hash_words(&[i, 0x6d6d]);
        let (p, q) = if h.is_multiple_of(3) { (P - 1 - h % 5, Q - 1 - h % 7) } else { (h >> 8, h >> 20) };
        Fp::new(p, q, if h.is_multiple_of(4) { 0 } else { 77 + (h % 2) as u32 })
    }

    #[test]
    fn blocked_rows_equal_term_by_term_sums() {
        // Several column and depth blocks, poison in a row of a, a column of b and one c.
        let (rows, k, n) = (MIN_ROWS + 1, DEPTH * 2 + 3, COLS + 37);
        let mut a: Vec<Fp> = (0..(rows * k) as u64).map(elem).collect();
        let mut b: Vec<Fp> = (0..(k * n) as u64).map(|i| elem(i + 100_000)).collect();
        let mut c0: Vec<Fp> = (0..(rows * n) as u64).map(|i| elem(i + 900_000)).collect();
        a[2 * k + 9].q = POISON;
        b[70 * n + COLS + 3].q = POISON;
        c0[3 * n + 11].q = POISON;
        let mut fast = c0.clone();
        matmul_rows(&mut fast, &a, &b, k);
        let c0_rows = c0.clone();
        let mut slow = c0;
        for i in 0..rows {
            for kk in 0..k {
                for j in 0..n {
                    slow[i * n + j] = slow[i * n + j].add(a[i * k + kk].mul(b[kk * n + j]));
                }
            }
        }
        assert_eq!(fast, slow);
        assert!(fast[2 * n].is_poisoned() && fast[COLS + 3].is_poisoned() && !fast[n].is_poisoned());
        // A block of columns of the same `b`, read in place, many rows and one.
        for r in [rows, 1] {
            let (j0, w) = (COLS - 5, 41);
            let mut part: Vec<Fp> = (0..r).flat_map(|i| c_row(&c0_rows, i, n, j0, w)).collect();
            matmul_cols(&mut part, &a[..r * k], &b, k, n, j0);
            let want: Vec<Fp> = (0..r).flat_map(|i| c_row(&slow, i, n, j0, w)).collect();
            assert_eq!(part, want, "{r} rows");
        }
    }

    fn c_row(c: &[Fp], i: usize, n: usize, j0: usize, w: usize) -> Vec<Fp> {
        c[i * n + j0..i * n + j0 + w].to_vec()
    }
}
