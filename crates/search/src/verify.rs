//! Checking final candidates against the reference, all through a [`Checker`] (one per
//! search: the reference side is prepared once and its sampled values are shared by every
//! candidate) or [`verify_candidate`] for a single pair:
//!
//! 1. the finite-field verifier ([`mirage_verify::Verifier`]: random inputs in a prime
//!    field, sampled output elements and one element per tile, a false-accept bound per
//!    compared element below 1e-9: pruning only; `superoptimize` confirms the candidate it
//!    returns on every output element, see docs/verifier.md), which also simulates the
//!    candidate in its own precision;
//! 2. an f64 float check on the same kind of lazily generated inputs (nothing of paper-sized
//!    inputs is materialized), comparing a few random boxes of every output plus the last
//!    corner with the interpreter's demand-driven [`mirage_ugraph::run_region`]. It is the
//!    whole check when the field verifier declines a pair (e.g. two exponentials on a path).

use std::sync::OnceLock;

use mirage_ugraph::{run_region, KernelGraph, Region, Source, Tensor};
use mirage_verify::inputs::read_box;
use mirage_verify::{Numerics, Verdict, Verifier};

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
        let salt = splitmix(self.seed ^ (input as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        let data = read_box(&self.dims[input], off, extent, |flat| {
            (splitmix(salt ^ flat) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        });
        Tensor { dims: extent.to_vec(), data }
    }
}

/// Checks that `candidate` computes what `reference` computes (same inputs, same outputs).
pub fn verify_candidate(reference: &KernelGraph, candidate: &KernelGraph, opts: &VerifyOptions) -> Verification {
    Checker::new(reference, opts).check(candidate)
}

/// The reference's float-check values of one trial: the sampled boxes of every output and
/// the reference's values there (or why it could not run).
type FloatTrial = Result<(Vec<Region>, Vec<Tensor<f64>>), String>;

/// A reference prepared for checking many candidates: the finite-field verifier (its
/// analysis done once, its reference values cached across candidates) and the float check's
/// reference boxes, each computed on first use. Shared by the search's checking threads.
pub struct Checker<'a> {
    reference: &'a KernelGraph,
    opts: &'a VerifyOptions,
    /// `None` where the field verifier declines the reference (the float check then decides).
    field: Option<Verifier>,
    /// The reference's input and output dims (a candidate must have the same).
    in_dims: Vec<Vec<usize>>,
    out_dims: Vec<Vec<usize>>,
    trials: Vec<OnceLock<FloatTrial>>,
}

/// The dims of `ids`' tensors in `g`.
fn dims_of(g: &KernelGraph, ids: &[usize]) -> Vec<Vec<usize>> {
    ids.iter().map(|&t| g.tensors[t].dims.clone()).collect()
}

impl<'a> Checker<'a> {
    /// Prepares `reference` for `opts`.
    pub fn new(reference: &'a KernelGraph, opts: &'a VerifyOptions) -> Self {
        let field =
            Verifier::new(reference, mirage_verify::Options { seed: opts.seed, ..mirage_verify::Options::default() })
                .ok();
        let trials = (0..opts.trials.max(1)).map(|_| OnceLock::new()).collect();
        let (in_dims, out_dims) =
            (dims_of(reference, &reference.input_ids()), dims_of(reference, &reference.output_ids()));
        Checker { reference, opts, field, in_dims, out_dims, trials }
    }

    /// Checks one candidate (see [`verify_candidate`]).
    pub fn check(&self, candidate: &KernelGraph) -> Verification {
        match self.field.as_ref().map(|v| v.check(candidate)) {
            Some(Ok(v @ Verdict::NotEquivalent { .. })) => Verification::Failed(format!("finite-field test: {v:?}")),
            Some(Ok(Verdict::Equivalent { numerics: Numerics::Unstable { reason }, .. })) => {
                match self.float_check(candidate) {
                    Verification::Passed => Verification::Unstable(reason),
                    other => other,
                }
            }
            // Equivalent, or a reference or pair the field test declines: the float check decides.
            Some(Ok(Verdict::Equivalent { .. }) | Err(_)) | None => self.float_check(candidate),
        }
    }

    /// The reference's boxes and values of float-check trial `trial`.
    fn reference_trial(&self, trial: usize, inputs: &LazyInputs) -> &FloatTrial {
        self.trials[trial].get_or_init(|| {
            let mut rng = splitmix(self.opts.seed ^ (trial as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
            let regions: Vec<Region> = self
                .out_dims
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
            match run_region::<f64, _>(self.reference, inputs, &regions) {
                Ok(w) => Ok((regions, w)),
                Err(e) => Err(format!("the reference does not run: {e}")),
            }
        })
    }

    fn float_check(&self, candidate: &KernelGraph) -> Verification {
        let (dims, odims) = (&self.in_dims, &self.out_dims);
        let cdims = dims_of(candidate, &candidate.input_ids());
        if *dims != cdims {
            return Verification::Failed(format!("inputs differ: reference {dims:?}, candidate {cdims:?}"));
        }
        let codims = dims_of(candidate, &candidate.output_ids());
        if *odims != codims {
            return Verification::Failed(format!("outputs differ: reference {odims:?}, candidate {codims:?}"));
        }
        let opts = self.opts;
        let inputs = LazyInputs { seed: opts.seed, dims: dims.clone() };
        for trial in 0..self.trials.len() {
            let (regions, want) = match self.reference_trial(trial, &inputs) {
                Ok(t) => t,
                Err(e) => return Verification::Failed(e.clone()),
            };
            let got = match run_region::<f64, _>(candidate, &inputs, regions) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirage_ugraph::zoo::{self, Attn};
    use mirage_ugraph::DType;

    #[test]
    fn one_checker_gives_each_candidate_its_own_verdict() {
        // One checker, many candidates (the search's use): the reference side is computed once
        // and reused, and each candidate still gets the verdict a fresh check gives it, right
        // or wrong, through the field test (two-kernel attention) and through the float check
        // alone (online softmax: two exponentials on a path, which the field test declines).
        let a = Attn { b: 2, h: 16, d: 16, s: 64, splits: 2, frange: 2, qsplit: 1 };
        let plain = zoo::attention(a, false, DType::Float32).expect("zoo");
        let online = zoo::attention_online(a, DType::Float32).expect("zoo");
        let qknorm = zoo::qknorm_attention_online(a, DType::Float32).expect("zoo");
        let opts = VerifyOptions::default();
        let checker = Checker::new(&plain.reference, &opts);
        let cands = [&plain.ugraph, &qknorm.ugraph, &online.ugraph, &qknorm.ugraph, &plain.ugraph, &online.ugraph];
        let verdicts: Vec<Verification> = cands.iter().map(|g| checker.check(g)).collect();
        let fresh: Vec<Verification> = cands.iter().map(|g| verify_candidate(&plain.reference, g, &opts)).collect();
        assert_eq!(verdicts, fresh);
        let passed: Vec<bool> = verdicts.iter().map(Verification::passed).collect();
        assert_eq!(passed, [true, false, true, false, true, true], "{verdicts:?}");
        assert!(checker.trials.iter().all(|t| t.get().is_some_and(|r| r.is_ok())), "float-check boxes cached");
    }

    #[test]
    fn lazy_input_boxes_agree_with_the_whole_and_differ_between_inputs() {
        // A box large enough to be hashed in parallel, and small boxes read serially inside it.
        let dims = vec![vec![3, 40, 1000], vec![3, 40, 1000]];
        let src = LazyInputs { seed: 5, dims };
        let whole = src.read(0, &[0, 0, 0], &[3, 40, 1000]);
        assert!(whole.data.iter().all(|x| (-1.0..1.0).contains(x)));
        for (o, e) in [([1, 3, 7], [1, 1, 990]), ([2, 39, 0], [1, 1, 1000]), ([0, 10, 100], [3, 3, 5])] {
            assert_eq!(src.read(0, &o, &e), whole.slice(&o, &e));
        }
        assert_ne!(src.read(1, &[0, 0, 0], &[3, 40, 1000]), whole);
    }
}
