//! The float cross-check: flags numerically unstable candidates, separately from inequivalence.
//!
//! The candidate runs in a simulated low-precision domain matching its input dtype ([`Half`],
//! [`BHalf`], or `f32`), every op result rounded; the reference runs in `f64`. Inputs are
//! realistic: about N(0, 1), rounded to the dtype (attention logits `q·k` then reach about ±30
//! at d = 64 and 4096 keys). Sampled output elements are compared through the output
//! assignment the field check found. A candidate is [`Numerics::Unstable`] when an element is
//! infinite or NaN in the low-precision run while finite in `f64` (overflowing `exp` in fp16),
//! or when the largest error relative to the RMS of the reference values of that output exceeds
//! the dtype's tolerance (catastrophic cancellation): 5e-2 for fp16, 1e-1 for bf16, 1e-3 for f32.
//!
//! A program with a `softmax` is probed again with its inputs [`LARGE_INPUTS`] times larger
//! (attention logits 16 times larger: past the 88 at which `exp` overflows in bf16 and f32). The
//! program as given, run in the same simulated dtype, keeps its softmax finite there (it
//! subtracts the row maximum); a candidate whose compared element is then infinite or NaN where
//! the program's is finite takes `exp` of a computed tensor without that maximum and is
//! [`Numerics::Unstable`] in every dtype, not only in fp16 (where the plain form already
//! overflows at realistic inputs).

use mirage_ugraph::{DType, KernelGraph, KernelOpKind, Scalar};

use crate::check::{classes, eval_elements, interface, output_dims, Options};
use crate::error::VerifyError;
use crate::field::hash_words;
use crate::inputs::NormalInputs;
use crate::lowp::{BHalf, Half};
use crate::sample::ClassPlan;

/// What the float cross-check found.
#[derive(Debug, Clone, PartialEq)]
pub enum Numerics {
    /// The check was off.
    NotChecked,
    /// Every compared element is finite and within tolerance.
    Stable {
        /// Largest error relative to the reference output's RMS.
        max_rel_err: f64,
        /// The dtype the candidate was simulated in.
        dtype: DType,
        /// Elements compared per output.
        samples: usize,
    },
    /// The candidate is numerically unstable in its dtype.
    Unstable {
        /// What went wrong, where.
        reason: String,
    },
}

/// The input scale of the overflow probe of programs with a `softmax` (module docs).
pub const LARGE_INPUTS: f32 = 4.0;

/// Relative-error tolerance of a dtype.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::Float16 => 5e-2,
        DType::Bfloat16 => 1e-1,
        DType::Float32 => 1e-3,
    }
}

/// Runs the cross-check; `assignment[r]` is the candidate output for reference output `r`.
pub fn check_numerics(
    reference: &KernelGraph,
    candidate: &KernelGraph,
    assignment: &[usize],
    opts: &Options,
) -> Result<Numerics, VerifyError> {
    let (dims, dtypes) = interface(candidate);
    let dtype = dtypes.first().copied().unwrap_or(DType::Float32);
    match dtype {
        DType::Float16 => run::<Half>(reference, candidate, assignment, opts, dims, dtypes, dtype),
        DType::Bfloat16 => run::<BHalf>(reference, candidate, assignment, opts, dims, dtypes, dtype),
        DType::Float32 => run::<f32>(reference, candidate, assignment, opts, dims, dtypes, dtype),
    }
}

fn run<S: Scalar>(
    reference: &KernelGraph,
    candidate: &KernelGraph,
    assignment: &[usize],
    opts: &Options,
    dims: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
    dtype: DType,
) -> Result<Numerics, VerifyError> {
    let seed = hash_words(&[opts.seed, 0x0066_6c6f_6174]);
    // The overflow probe's inputs, for a program with a softmax only.
    let large = reference
        .ops
        .iter()
        .any(|op| matches!(op.kind, KernelOpKind::Softmax { .. }))
        .then(|| NormalInputs::new(seed, dims.clone(), dtypes.clone(), LARGE_INPUTS));
    let src = NormalInputs::new(seed, dims, dtypes, 1.0);
    let ref_dims = output_dims(reference);
    let cls = classes(&ref_dims, &output_dims(candidate))?;
    let n = ref_dims.len();
    let mut class_of = vec![0; n];
    for (k, c) in cls.iter().enumerate() {
        for &r in &c.refs {
            class_of[r] = k;
        }
    }
    let per_class: Vec<Vec<(Vec<usize>, bool)>> = cls
        .iter()
        .enumerate()
        .map(|(k, c)| ClassPlan { dims: c.plan.dims.clone(), tiles: vec![] }.indices(seed, k, 0, 1, opts.float_samples))
        .collect();
    let slots = per_class.iter().map(Vec::len).max().unwrap_or(0);
    let mut pairs: Vec<Vec<(f64, f64, Vec<usize>)>> = vec![Vec::new(); n];
    let mut cand_reads = 0;
    let mut compared = 0;
    for s in 0..slots {
        if s > 0 && cand_reads / s as u64 * (s as u64 + 1) > opts.read_budget {
            break;
        }
        compared += 1;
        let ref_idx: Vec<&Vec<usize>> =
            (0..n).map(|r| &per_class[class_of[r]][s % per_class[class_of[r]].len()].0).collect();
        let mut cand_idx = ref_idx.clone();
        for (r, &c) in assignment.iter().enumerate() {
            cand_idx[c] = ref_idx[r];
        }
        let rv: Vec<f64> = eval_elements::<f64, _>(reference, &src, &ref_idx, &opts.cancel)?;
        let before = src.reads();
        let cv: Vec<S> = eval_elements::<S, _>(candidate, &src, &cand_idx, &opts.cancel)?;
        cand_reads += src.reads() - before;
        if let Some(large) = &large {
            let rl: Vec<S> = eval_elements::<S, _>(reference, large, &ref_idx, &opts.cancel)?;
            let before = large.reads();
            let cl: Vec<S> = eval_elements::<S, _>(candidate, large, &cand_idx, &opts.cancel)?;
            cand_reads += large.reads() - before;
            for (r, &c) in assignment.iter().enumerate() {
                let (rl, cl) = (rl[r].to_f64(), cl[c].to_f64());
                if rl.is_finite() && !cl.is_finite() {
                    return Ok(Numerics::Unstable {
                        reason: format!(
                            "output {r} at {:?} is {cl} in simulated {} with the inputs {LARGE_INPUTS} times larger, where the program as given gives {rl:.6e} (exp of a computed tensor without its row maximum)",
                            ref_idx[r],
                            dtype.name()
                        ),
                    });
                }
            }
        }
        for (r, &c) in assignment.iter().enumerate() {
            pairs[r].push((rv[r], cv[c].to_f64(), ref_idx[r].clone()));
        }
    }
    let mut worst = 0.0f64;
    for (r, ps) in pairs.iter().enumerate() {
        let finite: Vec<f64> = ps.iter().filter(|p| p.0.is_finite()).map(|p| p.0).collect();
        let rms = (finite.iter().map(|x| x * x).sum::<f64>() / finite.len().max(1) as f64).sqrt();
        for (rv, cv, idx) in ps {
            if !rv.is_finite() {
                continue;
            }
            if !cv.is_finite() {
                return Ok(Numerics::Unstable {
                    reason: format!(
                        "output {r} at {idx:?} is {cv} in simulated {} (f64 reference: {rv:.6e})",
                        dtype.name()
                    ),
                });
            }
            let err = (cv - rv).abs() / if rms > 0.0 { rms } else { 1.0 };
            if err > tolerance(dtype) {
                return Ok(Numerics::Unstable {
                    reason: format!(
                        "output {r} at {idx:?}: simulated {} gives {cv:.6e}, f64 reference {rv:.6e}: error {err:.3e} of the output's RMS {rms:.3e} exceeds {:.0e}",
                        dtype.name(),
                        tolerance(dtype)
                    ),
                });
            }
            worst = worst.max(err);
        }
    }
    Ok(Numerics::Stable { max_rel_err: worst, dtype, samples: compared })
}
