//! Checking final candidates against the reference, all through [`verify_candidate`]:
//!
//! 1. the finite-field verifier ([`mirage_verify::equivalent`]: random inputs in a prime
//!    field, sampled output elements and one element per tile, a false-accept bound per
//!    element below 1e-9), which also simulates the candidate in its own precision;
//! 2. an f64 float check on the same kind of lazily generated inputs (nothing of paper-sized
//!    inputs is materialized), comparing a few random boxes of every output plus the last
//!    corner with the interpreter's demand-driven [`mirage_ugraph::run_region`]. It is the
//!    whole check when the field verifier declines a pair (e.g. two exponentials on a path).

use mirage_ugraph::{run_region, KernelGraph, Region, Source, Tensor};
use mirage_verify::{Numerics, Verdict};

use crate::config::VerifyOptions;

/// The outcome of checking one candidate.
#[derive(Debug, Clone, PartialEq)]
pub enum Verification {
    /// It computed the reference's values.
    Passed,
    /// It is equivalent, but simulating it in its own precision went wrong (e.g. `exp`
    /// overflowing in fp16 without max subtraction); it counts as passed. The search replaces
    /// such candidates by their online-softmax rewrite where that checks as [`Self::Passed`].
    Unstable(String),
    /// It did not (the reason says where).
    Failed(String),
    /// Not checked (beyond `VerifyOptions::top_n`, or the search stopped).
    NotChecked,
}

impl Verification {
    /// Whether the candidate passed.
    pub fn passed(&self) -> bool {
        matches!(self, Verification::Passed | Verification::Unstable(_))
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Graph inputs whose elements are a hash of (seed, input, flat index), in `[-1, 1)`.
struct LazyInputs {
    seed: u64,
    dims: Vec<Vec<usize>>,
}

impl Source<f64> for LazyInputs {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<f64> {
        let full = &self.dims[input];
        let rank = full.len();
        let mut strides = vec![1usize; rank];
        for i in (0..rank.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * full[i + 1];
        }
        let n: usize = extent.iter().product();
        let salt = splitmix(self.seed ^ (input as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        let mut data = Vec::with_capacity(n);
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            let flat: usize = (0..rank).map(|d| (off[d] + idx[d]) * strides[d]).sum();
            let h = splitmix(salt ^ flat as u64);
            data.push((h >> 11) as f64 / (1u64 << 52) as f64 - 1.0);
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < extent[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Tensor { dims: extent.to_vec(), data }
    }
}

/// Checks that `candidate` computes what `reference` computes (same inputs, same outputs).
pub fn verify_candidate(reference: &KernelGraph, candidate: &KernelGraph, opts: &VerifyOptions) -> Verification {
    let field = mirage_verify::Options { seed: opts.seed, ..mirage_verify::Options::default() };
    match mirage_verify::equivalent(reference, candidate, &field) {
        Ok(v @ Verdict::NotEquivalent { .. }) => Verification::Failed(format!("finite-field test: {v:?}")),
        Ok(Verdict::Equivalent { numerics: Numerics::Unstable { reason }, .. }) => {
            match float_check(reference, candidate, opts) {
                Verification::Passed => Verification::Unstable(reason),
                other => other,
            }
        }
        // Equivalent, or a pair the field test declines: the float check decides.
        Ok(Verdict::Equivalent { .. }) | Err(_) => float_check(reference, candidate, opts),
    }
}

fn float_check(reference: &KernelGraph, candidate: &KernelGraph, opts: &VerifyOptions) -> Verification {
    let (ri, ci) = (reference.input_ids(), candidate.input_ids());
    let dims: Vec<Vec<usize>> = ri.iter().map(|&t| reference.tensors[t].dims.clone()).collect();
    let cdims: Vec<Vec<usize>> = ci.iter().map(|&t| candidate.tensors[t].dims.clone()).collect();
    if dims != cdims {
        return Verification::Failed(format!("inputs differ: reference {dims:?}, candidate {cdims:?}"));
    }
    let (ro, co) = (reference.output_ids(), candidate.output_ids());
    let odims: Vec<Vec<usize>> = ro.iter().map(|&t| reference.tensors[t].dims.clone()).collect();
    let codims: Vec<Vec<usize>> = co.iter().map(|&t| candidate.tensors[t].dims.clone()).collect();
    if odims != codims {
        return Verification::Failed(format!("outputs differ: reference {odims:?}, candidate {codims:?}"));
    }
    let inputs = LazyInputs { seed: opts.seed, dims };
    for trial in 0..opts.trials.max(1) {
        let mut rng = splitmix(opts.seed ^ (trial as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let regions: Vec<Region> = odims
            .iter()
            .map(|d| {
                let mut start = Vec::with_capacity(d.len());
                let mut end = Vec::with_capacity(d.len());
                for &n in d {
                    let e = n.min(2);
                    rng = splitmix(rng);
                    let s = if trial == 0 { n - e } else { (rng % (n - e + 1) as u64) as usize };
                    start.push(s);
                    end.push(s + e);
                }
                Region { start, end }
            })
            .collect();
        let want = match run_region::<f64, _>(reference, &inputs, &regions) {
            Ok(w) => w,
            Err(e) => return Verification::Failed(format!("the reference does not run: {e}")),
        };
        let got = match run_region::<f64, _>(candidate, &inputs, &regions) {
            Ok(g) => g,
            Err(e) => return Verification::Failed(format!("the candidate does not run: {e}")),
        };
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            for (i, (&x, &y)) in w.data.iter().zip(&g.data).enumerate() {
                let tol = opts.tolerance * x.abs().max(y.abs()).max(1.0);
                if (x - y).abs() > tol || x.is_nan() != y.is_nan() {
                    return Verification::Failed(format!(
                        "output {k}, box {:?}..{:?}, element {i}: expected {x}, got {y}",
                        regions[k].start, regions[k].end
                    ));
                }
            }
        }
    }
    Verification::Passed
}
