//! Lazy random graph inputs: a counter-based RNG (a hash of seed, trial, input and element
//! index) implements [`Source`], so the interpreter reads only the boxes it needs and a
//! 4096x4096 weight is never materialized. The same element always gets the same value, however
//! the box around it is cut, so reference and candidate see identical inputs.

use std::sync::atomic::{AtomicU64, Ordering};

use mirage_ugraph::{DType, KernelGraph, Scalar, Source, Tensor};
use rayon::prelude::*;

use crate::field::{hash_words, reduce32, Fp, P, Q};
use crate::lowp::round_to;

/// Calls `f(flat_index)` for every element of the box `[off, off + extent)` of a row-major
/// tensor of `dims` (rank 1 to 4), in row-major order of the box. Allocation-free: it runs for
/// every tile the interpreter loads.
#[inline]
fn for_each_flat(dims: &[usize], off: &[usize], extent: &[usize], mut f: impl FnMut(u64)) {
    let r = dims.len();
    if r == 0 || r > 4 || extent.contains(&0) {
        return;
    }
    // Pad to rank 4 with leading unit dims.
    let (mut d, mut o, mut e) = ([1usize; 4], [0usize; 4], [1usize; 4]);
    d[4 - r..].copy_from_slice(dims);
    o[4 - r..].copy_from_slice(off);
    e[4 - r..].copy_from_slice(extent);
    let s2 = d[3];
    let s1 = s2 * d[2];
    let s0 = s1 * d[1];
    for i0 in o[0]..o[0] + e[0] {
        for i1 in o[1]..o[1] + e[1] {
            for i2 in o[2]..o[2] + e[2] {
                let base = i0 * s0 + i1 * s1 + i2 * s2 + o[3];
                for i in base..base + e[3] {
                    f(i as u64);
                }
            }
        }
    }
}

/// A fast counter-based generator (wyrand's mixer): 64 random bits for counter `i` under `key`.
#[inline(always)]
pub fn counter_bits(key: u64, i: u64) -> u64 {
    let s = key.wrapping_add(i.wrapping_mul(0xa076_1d64_78bd_642f));
    let r = s as u128 * (s ^ 0xe703_7ed1_a0b4_28db) as u128;
    (r as u64) ^ ((r >> 64) as u64)
}

/// Uniformly random field inputs of one trial: element `i` of input `k` is a hash of
/// `(seed, trial, k, i)` with independent residues mod `P` and mod `Q`, carrying the trial's `w`.
/// Counts the elements read, so the sampler can keep each trial within its budget.
#[derive(Debug)]
pub struct FieldInputs {
    keys: Vec<u64>,
    dims: Vec<Vec<usize>>,
    w: u32,
    reads: AtomicU64,
}

impl FieldInputs {
    /// Inputs of `dims` for trial `trial` of a run seeded with `seed`, with generator `w`.
    pub fn new(seed: u64, trial: u64, dims: Vec<Vec<usize>>, w: u32) -> FieldInputs {
        let keys = (0..dims.len()).map(|k| hash_words(&[seed, trial, k as u64, 0x0066_6965_6c64])).collect();
        FieldInputs { keys, dims, w, reads: AtomicU64::new(0) }
    }

    /// Input elements read so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The value of element `flat` (row-major index) of input `input`.
    #[inline(always)]
    pub fn value(&self, input: usize, flat: u64) -> Fp {
        let h = counter_bits(self.keys[input], flat);
        Fp { p: reduce32(h, P), q: reduce32(h >> 32, Q), w: self.w }
    }
}

/// Boxes of at least this many elements are hashed in parallel (whole-output evaluation reads
/// inputs of up to 10^8 elements at once).
const PARALLEL_READ: usize = 1 << 16;

/// An empty vector with room for `n` elements. On Linux the kernel is asked to back it with
/// transparent huge pages: hashing a 10^7-element input into fresh 4 KiB pages costs several
/// times the hashing itself in page faults.
fn large_buffer<T>(n: usize) -> Vec<T> {
    let data: Vec<T> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = data.as_ptr() as usize;
        let end = start.saturating_add(n.saturating_mul(std::mem::size_of::<T>()));
        let (lo, hi) = (start.next_multiple_of(PAGE), end - end % PAGE);
        if hi > lo {
            // SAFETY: advice on pages inside this vector's own allocation; it changes how they
            // are backed, never their contents (none are written yet). A refusal is harmless.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    data
}

/// The values of the box at `off` of extent `extent` in a row-major tensor of `dims`, element
/// `i` (row-major flat index in the whole tensor) being `value(i)`: in parallel, one innermost
/// row a task, for boxes of [`PARALLEL_READ`] elements or more. Every lazy input source reads
/// its boxes through it.
pub fn read_box<T: Send>(dims: &[usize], off: &[usize], extent: &[usize], value: impl Fn(u64) -> T + Sync) -> Vec<T> {
    let n: usize = extent.iter().product();
    let (r, row) = (extent.len(), extent.last().copied().unwrap_or(1));
    if n < PARALLEL_READ || r == 0 || r > 4 || row == 0 {
        let mut data = Vec::with_capacity(n);
        for_each_flat(dims, off, extent, |i| data.push(value(i)));
        return data;
    }
    // Row `j` of the box starts at the row-major position of its multi-index (in the box's
    // leading dims) shifted by `off`. The buffer is written (and so faulted in) by the tasks,
    // not zeroed first.
    let mut data = large_buffer(n);
    data.spare_capacity_mut()[..n].par_chunks_mut(row).enumerate().for_each(|(j, out)| {
        let (mut rest, mut flat, mut stride) = (j, off[r - 1], dims[r - 1]);
        for d in (0..r - 1).rev() {
            flat += (off[d] + rest % extent[d]) * stride;
            rest /= extent[d];
            stride *= dims[d];
        }
        for (k, x) in out.iter_mut().enumerate() {
            x.write(value((flat + k) as u64));
        }
    });
    // SAFETY: the chunks above cover the first `n` slots, and each task wrote all of its own.
    unsafe { data.set_len(n) };
    data
}

impl Source<Fp> for FieldInputs {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<Fp> {
        let n: usize = extent.iter().product();
        self.reads.fetch_add(n as u64, Ordering::Relaxed);
        Tensor { dims: extent.to_vec(), data: read_box(&self.dims[input], off, extent, |i| self.value(input, i)) }
    }
}

/// Realistic float inputs: approximately standard normal (Irwin-Hall of four uniforms, scaled
/// to unit variance, times `scale`), rounded to the graph input's dtype, so every float domain
/// (f64 reference, fp16/bf16-simulated candidate) reads the very same values.
#[derive(Debug)]
pub struct NormalInputs {
    keys: Vec<u64>,
    dims: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
    scale: f32,
    reads: AtomicU64,
}

impl NormalInputs {
    /// Inputs of `dims`/`dtypes` seeded with `seed`, standard deviation about `scale`.
    pub fn new(seed: u64, dims: Vec<Vec<usize>>, dtypes: Vec<DType>, scale: f32) -> NormalInputs {
        let keys = (0..dims.len()).map(|k| hash_words(&[seed, k as u64, 0x0066_6c6f_6174])).collect();
        NormalInputs { keys, dims, dtypes, scale, reads: AtomicU64::new(0) }
    }

    /// Input elements read so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The value of element `flat` of input `input`.
    #[inline(always)]
    pub fn value(&self, input: usize, flat: u64) -> f32 {
        let h = counter_bits(self.keys[input], flat);
        let u = (0..4).map(|i| ((h >> (16 * i)) & 0xffff) as f32 + 0.5).sum::<f32>() / 65536.0;
        round_to(self.dtypes[input], (u - 2.0) * 3f32.sqrt() * self.scale)
    }
}

/// Every input of `g` whole, about N(0, 1), seeded with `seed` (rounded to each input's dtype).
pub fn normal_inputs<S: Scalar>(g: &KernelGraph, seed: u64) -> Vec<Tensor<S>> {
    let (dims, dtypes): (Vec<Vec<usize>>, Vec<DType>) =
        g.input_ids().iter().map(|&t| (g.tensors[t].dims.clone(), g.tensors[t].dtype)).unzip();
    let src = NormalInputs::new(seed, dims.clone(), dtypes, 1.0);
    dims.iter().enumerate().map(|(i, d)| src.read(i, &vec![0; d.len()], d)).collect()
}

impl<S: Scalar> Source<S> for NormalInputs {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<S> {
        let n: usize = extent.iter().product();
        self.reads.fetch_add(n as u64, Ordering::Relaxed);
        let data = read_box(&self.dims[input], off, extent, |i| S::from_f32(self.value(input, i)));
        Tensor { dims: extent.to_vec(), data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_agree_with_the_whole() {
        let dims = vec![vec![3, 4, 5]];
        let src = FieldInputs::new(7, 1, dims.clone(), Fp::generator(3));
        let whole = src.read(0, &[0, 0, 0], &[3, 4, 5]);
        let part = src.read(0, &[1, 2, 3], &[2, 2, 2]);
        assert_eq!(part, whole.slice(&[1, 2, 3], &[2, 2, 2]));
        let other = FieldInputs::new(7, 2, dims, Fp::generator(3)).read(0, &[0, 0, 0], &[3, 4, 5]);
        assert_ne!(whole, other);
    }

    #[test]
    fn parallel_reads_agree_with_serial_ones() {
        let dims = vec![vec![5, 70, 300]];
        let src = FieldInputs::new(7, 1, dims, Fp::generator(3));
        let big = src.read(0, &[1, 3, 7], &[4, 60, 290]);
        assert!(big.data.len() >= PARALLEL_READ);
        for (o, e) in [([1, 3, 7], [1, 1, 290]), ([4, 62, 7], [1, 1, 290]), ([2, 10, 100], [2, 3, 5])] {
            let small = src.read(0, &o, &e);
            let rel: Vec<usize> = o.iter().zip([1, 3, 7]).map(|(a, b)| a - b).collect();
            assert_eq!(small, big.slice(&rel, &e));
        }
    }

    #[test]
    fn normal_inputs_have_unit_scale() {
        let n = 20_000;
        let src = NormalInputs::new(1, vec![vec![n]], vec![DType::Float32], 1.0);
        let t: Tensor<f64> = src.read(0, &[0], &[n]);
        let mean = t.data.iter().sum::<f64>() / n as f64;
        let var = t.data.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
    }
}
