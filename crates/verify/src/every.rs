//! Every-element coverage: each trial evaluates all output elements of both graphs in the field
//! ([`mirage_ugraph::run_region`] over whole outputs, inputs hashed lazily by [`FieldInputs`]) and compares
//! every one of them, so the false-accept bound holds for the candidate as a whole (see the crate
//! docs). The reference's whole outputs are cached per trial in the [`Verifier`], so the many
//! candidates of one reference share them.

use std::sync::Arc;

use mirage_ugraph::interp::{held_elements, Region};
use mirage_ugraph::{run_region_with, Cancel, KernelGraph, Tensor};
use rayon::prelude::*;

use crate::check::{Evidence, Verifier};
use crate::error::VerifyError;
use crate::field::{hash_words, Fp};
use crate::inputs::FieldInputs;

/// Which output elements a trial compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Coverage {
    /// A sample per output and trial (random elements, first and last, one per tile of the
    /// candidate's final customized op): fast, for pruning. The bound is per compared element.
    #[default]
    Sampled,
    /// Every element of every output in every trial: the bound is on accepting the candidate.
    Every,
}

impl Coverage {
    /// `"sampled"` or `"every"`.
    pub fn name(self) -> &'static str {
        match self {
            Coverage::Sampled => "sampled",
            Coverage::Every => "every",
        }
    }
}

/// Most reference output elements kept in the per-trial cache of whole outputs (12 bytes each).
const FULL_CACHE_LIMIT: usize = 1 << 24;

/// The field inputs and generator of trial `trial` of a run seeded with `seed` (the same for
/// both coverages, so reference values agree wherever both are cached).
pub(crate) fn trial_inputs(seed: u64, trial: usize, in_dims: &[Vec<usize>]) -> FieldInputs {
    let w = Fp::generator(hash_words(&[seed, trial as u64, 0x7767_656e]));
    FieldInputs::new(seed, trial as u64, in_dims.to_vec(), w)
}

/// Whole outputs of `g` on `src`.
fn run_full(g: &KernelGraph, src: &FieldInputs, cancel: &Cancel) -> Result<Vec<Tensor<Fp>>, VerifyError> {
    let regions: Vec<Region> = g.output_ids().iter().map(|&t| Region::full(&g.tensors[t].dims)).collect();
    Ok(run_region_with(g, src, &regions, cancel)?)
}

/// Row-major multi-index of flat position `flat` in `dims`.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        let n = dims[d].max(1);
        idx[d] = flat % n;
        flat /= n;
    }
    idx
}

/// How a run of trials ended.
pub(crate) enum Outcome {
    /// Reference output `r` has no compatible candidate output left.
    Unmatched(usize),
    /// Every trial ran; this many elements were compared.
    Compared(usize),
}

impl Verifier {
    /// The reference's whole outputs in trial `trial`, from the cache when present.
    fn reference_full(&self, trial: usize, src: &FieldInputs) -> Result<Arc<Vec<Tensor<Fp>>>, VerifyError> {
        if let Some(v) = self.full_cache.lock().ok().and_then(|c| c.get(&trial).cloned()) {
            return Ok(v);
        }
        let v = Arc::new(run_full(&self.reference, src, &self.opts.cancel)?);
        let size: usize = v.iter().map(|t| t.data.len()).sum();
        if let Ok(mut c) = self.full_cache.lock() {
            let held: usize = c.values().map(|o| o.iter().map(|t| t.data.len()).sum::<usize>()).sum();
            if held + size <= FULL_CACHE_LIMIT {
                c.insert(trial, v.clone());
            }
        }
        Ok(v)
    }

    /// Runs `trials` every-element trials of `candidate`, ruling out `compat[r][c]` at the first
    /// element where reference output `r` and candidate output `c` differ (recorded in
    /// `evidence`). Stops early when some reference output has no compatible candidate output
    /// left.
    pub(crate) fn every_trials(
        &self,
        candidate: &KernelGraph,
        trials: usize,
        compat: &mut [Vec<bool>],
        evidence: &mut [Vec<Option<Evidence>>],
    ) -> Result<Outcome, VerifyError> {
        let mut compared = 0usize;
        // Trials run side by side, as many as fit `PARALLEL_TRIAL_BYTES`, and are compared in
        // order: the outcome and evidence are those of running them one after another.
        let batch = trial_batch(&self.reference, candidate);
        let mut done = 0;
        while done < trials {
            let end = done.saturating_add(batch).min(trials);
            let runs: Vec<Result<_, VerifyError>> = (done..end)
                .into_par_iter()
                .map(|trial| {
                    let src = trial_inputs(self.opts.seed, trial, &self.in_dims);
                    Ok((self.reference_full(trial, &src)?, run_full(candidate, &src, &self.opts.cancel)?))
                })
                .collect();
            for (trial, run) in (done..end).zip(runs) {
                let (rv, cv) = run?;
                if let Some(r) = compare_trial(trial, &rv, &cv, compat, evidence) {
                    return Ok(Outcome::Unmatched(r));
                }
                compared = compared.saturating_add(rv.iter().map(|t| t.data.len()).sum());
            }
            done = end;
        }
        Ok(Outcome::Compared(compared))
    }
}

/// Compares one trial's whole outputs, ruling out `compat[r][c]` where they differ; returns a
/// reference output left with no compatible candidate output.
fn compare_trial(
    trial: usize,
    rv: &[Tensor<Fp>],
    cv: &[Tensor<Fp>],
    compat: &mut [Vec<bool>],
    evidence: &mut [Vec<Option<Evidence>>],
) -> Option<usize> {
    let n = compat.len();
    for r in 0..n {
        for c in 0..n {
            if !compat[r][c] {
                continue;
            }
            let (a, b) = (&rv[r], &cv[c]);
            if a.dims != b.dims {
                compat[r][c] = false;
                continue;
            }
            let at = a.data.par_iter().zip(&b.data).position_first(|(x, y)| x.p != y.p);
            if let Some(i) = at {
                compat[r][c] = false;
                evidence[r][c] = Some(Evidence {
                    trial,
                    index: unravel(i, &a.dims),
                    reference: a.data[i].p,
                    candidate: b.data[i].p,
                });
            }
        }
        if !compat[r].iter().any(|&x| x) {
            return Some(r);
        }
    }
    None
}

/// Most bytes the kernel-level tensors of trials run side by side may take (an estimate of
/// what the interpreter holds: every tensor of both graphs but the inputs it reads box by box,
/// each element an [`Fp`]).
const PARALLEL_TRIAL_BYTES: usize = 2 << 30;

/// How many trials of `reference` against `candidate` run side by side: as many as the
/// threads, within [`PARALLEL_TRIAL_BYTES`]; at least one.
fn trial_batch(reference: &KernelGraph, candidate: &KernelGraph) -> usize {
    let bytes = |g: &KernelGraph| held_elements(g).saturating_mul(std::mem::size_of::<Fp>());
    let per = bytes(reference).saturating_add(bytes(candidate)).max(1);
    (PARALLEL_TRIAL_BYTES / per).clamp(1, rayon::current_num_threads().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_run_side_by_side_within_the_memory_bound() {
        use mirage_ugraph::DType;
        let graph = |dims: &[usize]| {
            let mut g = KernelGraph::new();
            let x = g.new_input(dims, DType::Float32, None).unwrap();
            let y = g.unary(mirage_ugraph::UnaryOp::Exp, x).unwrap();
            g.mark_output(y, None).unwrap();
            g
        };
        let threads = rayon::current_num_threads().max(1);
        // Small graphs: a trial a thread.
        let small = graph(&[4, 4]);
        assert_eq!(trial_batch(&small, &small), threads);
        // The exp reads its input band by band: the outputs alone are held. One of 2^27
        // elements in each graph (3.2 GB of field elements in all): one trial.
        let big = graph(&[1 << 13, 1 << 14]);
        assert_eq!(trial_batch(&big, &big), 1);
        // Two tensors of 2^24 elements a trial (403 MB): five side by side.
        let mid = graph(&[1 << 12, 1 << 12]);
        assert_eq!(trial_batch(&mid, &mid), 5.min(threads));
    }

    #[test]
    fn unravel_is_row_major() {
        assert_eq!(unravel(0, &[2, 3, 4]), vec![0, 0, 0]);
        assert_eq!(unravel(23, &[2, 3, 4]), vec![1, 2, 3]);
        assert_eq!(unravel(13, &[2, 3, 4]), vec![1, 0, 1]);
    }
}
