//! The equivalence check: interface checks, the LAX check, then independent field trials on
//! sampled output elements evaluated demand-driven ([`mirage_ugraph::run_region`]) or on every output element
//! ([`crate::every`]), output assignment by matching, and the float cross-check of an accepted
//! candidate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mirage_ugraph::interp::Region;
use mirage_ugraph::{run_region_with, Cancel, DType, KernelGraph, Tensor};

use crate::bound::{per_trial, trials_for};
use crate::error::VerifyError;
use crate::every::{trial_inputs, Coverage, Outcome};
use crate::field::{hash_words, Fp};
use crate::float_check::{check_numerics, Numerics};
use crate::inputs::FieldInputs;
use crate::lax::{analyze, Fragment, LaxReport};
use crate::matching::perfect_matching;
use crate::sample::{tiles, ClassPlan};

/// Knobs of [`equivalent`]; `Options::default()` is what the search uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Seed of every random choice (inputs, `w`, sampled elements). Same seed, same verdict.
    pub seed: u64,
    /// Number of trials; `None`: the smallest count whose bound `b^t` is below `target_bound`.
    pub trials: Option<usize>,
    /// Which output elements each trial compares (default [`Coverage::Sampled`], the search's
    /// pruning; [`Verifier::confirm`] always uses [`Coverage::Every`]).
    pub coverage: Coverage,
    /// Target false-accept bound `b^t` (default `1e-9`); see [`Verdict::Equivalent`] for what
    /// it bounds under each coverage.
    pub target_bound: f64,
    /// Cap on the trial count derived from the bound (default 64).
    pub max_trials: usize,
    /// Uniformly random elements compared per output and trial (default 2).
    pub samples_per_output: usize,
    /// Most tiles of the candidate's final customized op covered per output over the run, one
    /// element each, dealt over the trials (default 64).
    pub tile_samples: usize,
    /// Input elements the candidate may read per trial before further samples of that trial
    /// are skipped (the first sample of a trial always runs; default `1 << 20`). Keeps the
    /// cost of a trial near a few milliseconds whatever an element's dependency cone costs.
    pub read_budget: u64,
    /// Run the float cross-check on an accepted candidate (default on).
    pub float_check: bool,
    /// Random elements compared per output by the float cross-check, within `read_budget`
    /// (default 4).
    pub float_samples: usize,
    /// Test graphs with two exponentials on a path anyway (nested exps become uninterpreted),
    /// instead of returning [`VerifyError::NotLax`] (default off).
    pub allow_non_lax: bool,
    /// Stops the check with [`mirage_ugraph::Error::Cancelled`] once set (default: never).
    pub cancel: Cancel,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 0x6d69_7261_6765,
            coverage: Coverage::Sampled,
            trials: None,
            target_bound: 1e-9,
            max_trials: 64,
            samples_per_output: 2,
            tile_samples: 64,
            read_budget: 1 << 20,
            float_check: true,
            float_samples: 4,
            allow_non_lax: false,
            cancel: Cancel::default(),
        }
    }
}

/// The outcome of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every compared element agreed in every trial under some output assignment.
    Equivalent {
        /// Which elements were compared: with [`Coverage::Every`], all of them in every trial.
        coverage: Coverage,
        /// Independent trials run.
        trials: usize,
        /// Output elements compared, over all trials and outputs.
        samples: usize,
        /// Tiles of the candidate's final customized ops that had an element compared, and how
        /// many tiles were listed (at most `tile_samples` per output class); `(0, 0)` under
        /// [`Coverage::Every`], which compares every element of every tile.
        tiles: (usize, usize),
        /// `b^trials`. Under [`Coverage::Every`]: the bound on accepting a candidate that
        /// differs (as a function of the inputs, over LAX semantics) from the reference in at
        /// least one output element under every output assignment. Under
        /// [`Coverage::Sampled`]: only per compared element (a difference confined to elements
        /// that were not compared is not covered). See the crate docs for its scope.
        false_accept_bound: f64,
        /// The pair's LAX report (fragment, degree `d`, exp count `k`).
        lax: LaxReport,
        /// `assignment[r]` is the candidate output standing for reference output `r`.
        assignment: Vec<usize>,
        /// What the float cross-check found (separate from equivalence).
        numerics: Numerics,
    },
    /// A compared element differs.
    NotEquivalent {
        /// Reference output.
        output: usize,
        /// Candidate output it was compared with.
        candidate_output: usize,
        /// Element index.
        index: Vec<usize>,
        /// Reference value (residue mod `P`).
        reference_value: u64,
        /// Candidate value (residue mod `P`).
        candidate_value: u64,
        /// Trial that found it.
        trial: usize,
    },
}

impl Verdict {
    /// Whether the field test accepted the candidate.
    pub fn is_equivalent(&self) -> bool {
        matches!(self, Verdict::Equivalent { .. })
    }

    /// Whether the candidate is equivalent and not flagged numerically unstable.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Verdict::Equivalent { numerics, .. } if !matches!(numerics, Numerics::Unstable { .. }))
    }
}

/// A difference found at one element.
#[derive(Debug, Clone)]
pub(crate) struct Evidence {
    pub(crate) trial: usize,
    pub(crate) index: Vec<usize>,
    pub(crate) reference: u32,
    pub(crate) candidate: u32,
}

/// Output elements of one shape shared by reference and candidate outputs.
#[derive(Debug, Clone)]
pub(crate) struct Class {
    pub(crate) refs: Vec<usize>,
    pub(crate) cands: Vec<usize>,
    pub(crate) plan: ClassPlan,
}

/// The inputs' dims and dtypes of a graph.
pub(crate) fn interface(g: &KernelGraph) -> (Vec<Vec<usize>>, Vec<DType>) {
    g.input_ids().iter().map(|&t| (g.tensors[t].dims.clone(), g.tensors[t].dtype)).unzip()
}

/// Dims of every output of a graph.
pub(crate) fn output_dims(g: &KernelGraph) -> Vec<Vec<usize>> {
    g.output_ids().iter().map(|&t| g.tensors[t].dims.clone()).collect()
}

/// Evaluates one element per output (`idx[o]` for output `o`); returns the values.
pub(crate) fn eval_elements<S, I>(
    g: &KernelGraph,
    src: &I,
    idx: &[&Vec<usize>],
    cancel: &Cancel,
) -> Result<Vec<S>, VerifyError>
where
    S: mirage_ugraph::Scalar,
    I: mirage_ugraph::Source<S> + ?Sized,
{
    let regions: Vec<Region> =
        idx.iter().map(|i| Region { start: i.to_vec(), end: i.iter().map(|x| x + 1).collect() }).collect();
    let outs = run_region_with(g, src, &regions, cancel)?;
    outs.iter()
        .map(|t| {
            t.data.first().copied().ok_or_else(|| VerifyError::Interface("an output region came back empty".into()))
        })
        .collect()
}

/// Groups outputs by dims; errors when reference and candidate outputs do not pair up by shape.
pub(crate) fn classes(ref_dims: &[Vec<usize>], cand_dims: &[Vec<usize>]) -> Result<Vec<Class>, VerifyError> {
    if ref_dims.len() != cand_dims.len() {
        return Err(VerifyError::Interface(format!(
            "the reference has {} outputs, the candidate {}",
            ref_dims.len(),
            cand_dims.len()
        )));
    }
    let mut out: Vec<Class> = Vec::new();
    for (r, d) in ref_dims.iter().enumerate() {
        match out.iter_mut().find(|c| &c.plan.dims == d) {
            Some(c) => c.refs.push(r),
            None => {
                out.push(Class { refs: vec![r], cands: vec![], plan: ClassPlan { dims: d.clone(), tiles: vec![] } })
            }
        }
    }
    for (c, d) in cand_dims.iter().enumerate() {
        match out.iter_mut().find(|k| &k.plan.dims == d) {
            Some(k) => k.cands.push(c),
            None => {
                return Err(VerifyError::Interface(format!(
                    "candidate output {c} has dims {d:?}, no reference output does"
                )))
            }
        }
    }
    if let Some(k) = out.iter().find(|k| k.refs.len() != k.cands.len()) {
        return Err(VerifyError::Interface(format!(
            "{} reference outputs but {} candidate outputs have dims {:?}",
            k.refs.len(),
            k.cands.len(),
            k.plan.dims
        )));
    }
    Ok(out)
}

/// Picks, for each class, the index of slot `s` (cycling through shorter lists), per output.
fn slot_indices<'a>(per_class: &'a [Vec<(Vec<usize>, bool)>], class_of: &[usize], s: usize) -> Vec<&'a Vec<usize>> {
    class_of.iter().map(|&k| &per_class[k][s % per_class[k].len()].0).collect()
}

/// Reference values cached across candidates: (trial, element per output) -> values.
type Cache = HashMap<(usize, Vec<Vec<usize>>), Vec<Fp>>;
/// Whole reference outputs cached across candidates, per trial.
pub(crate) type FullCache = HashMap<usize, Arc<Vec<Tensor<Fp>>>>;

/// A reference graph prepared for checking many candidates (the search's use): its LAX report
/// and interface are computed once, and its sampled values and whole outputs are cached across
/// candidates (the random inputs of trial `t` depend only on the seed, so they are the same for
/// every candidate).
pub struct Verifier {
    pub(crate) reference: KernelGraph,
    pub(crate) opts: Options,
    report: LaxReport,
    pub(crate) in_dims: Vec<Vec<usize>>,
    in_dtypes: Vec<DType>,
    out_dims: Vec<Vec<usize>>,
    cache: Mutex<Cache>,
    pub(crate) full_cache: Mutex<FullCache>,
}

/// Most cached reference evaluations before the cache is cleared.
const CACHE_LIMIT: usize = 1 << 16;

impl Verifier {
    /// Prepares `reference`; fails if it does not validate, is not LAX (unless allowed) or the
    /// options are unusable.
    pub fn new(reference: &KernelGraph, opts: Options) -> Result<Verifier, VerifyError> {
        if opts.trials == Some(0) || opts.max_trials == 0 {
            return Err(VerifyError::Options("at least one trial is needed".into()));
        }
        if !(opts.target_bound > 0.0 && opts.target_bound < 1.0) {
            return Err(VerifyError::Options(format!("target_bound {} is not in (0, 1)", opts.target_bound)));
        }
        // Graphs with public fields may be inconsistent: rebuild through the checked builder so
        // the interpreter only ever sees valid graphs.
        let reference = reference.revalidate()?;
        let report = analyze(&reference);
        if let (Fragment::NotLax { reason }, false) = (&report.fragment, opts.allow_non_lax) {
            return Err(VerifyError::NotLax { graph: "reference", reason: reason.clone() });
        }
        let (in_dims, in_dtypes) = interface(&reference);
        let out_dims = output_dims(&reference);
        if out_dims.is_empty() {
            return Err(VerifyError::Interface("the reference has no outputs".into()));
        }
        Ok(Verifier {
            reference,
            opts,
            report,
            in_dims,
            in_dtypes,
            out_dims,
            cache: Mutex::new(HashMap::new()),
            full_cache: Mutex::new(HashMap::new()),
        })
    }

    /// The options in use.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The reference's own LAX report.
    pub fn reference_report(&self) -> &LaxReport {
        &self.report
    }

    fn check_inputs(&self, candidate: &KernelGraph) -> Result<(), VerifyError> {
        let (dims, dtypes) = interface(candidate);
        if dims.len() != self.in_dims.len() {
            return Err(VerifyError::Interface(format!(
                "the reference has {} inputs, the candidate {}",
                self.in_dims.len(),
                dims.len()
            )));
        }
        for (i, ((d, t), (rd, rt))) in
            dims.iter().zip(&dtypes).zip(self.in_dims.iter().zip(&self.in_dtypes)).enumerate()
        {
            if d != rd || t != rt {
                return Err(VerifyError::Interface(format!(
                    "input {i} is {d:?} {} in the candidate but {rd:?} {} in the reference",
                    t.name(),
                    rt.name()
                )));
            }
        }
        Ok(())
    }

    fn reference_values(&self, trial: usize, src: &FieldInputs, idx: &[&Vec<usize>]) -> Result<Vec<Fp>, VerifyError> {
        let key = (trial, idx.iter().map(|i| (*i).clone()).collect::<Vec<_>>());
        if let Some(v) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(v);
        }
        let v = eval_elements(&self.reference, src, idx, &self.opts.cancel)?;
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_LIMIT {
                c.clear();
            }
            c.insert(key, v.clone());
        }
        Ok(v)
    }

    /// Compares `candidate` with the reference under the options' coverage.
    pub fn check(&self, candidate: &KernelGraph) -> Result<Verdict, VerifyError> {
        self.check_with(candidate, self.opts.coverage)
    }

    /// Compares `candidate` with the reference on every output element in every trial
    /// ([`Coverage::Every`]) whatever the options say: the check for a final decision, whose
    /// bound holds for the candidate as a whole.
    pub fn confirm(&self, candidate: &KernelGraph) -> Result<Verdict, VerifyError> {
        self.check_with(candidate, Coverage::Every)
    }

    /// Compares `candidate` with the reference comparing the elements `coverage` says.
    pub fn check_with(&self, candidate: &KernelGraph, coverage: Coverage) -> Result<Verdict, VerifyError> {
        let opts = &self.opts;
        let candidate = &candidate.revalidate()?;
        self.check_inputs(candidate)?;
        let cand_report = analyze(candidate);
        if let (Fragment::NotLax { reason }, false) = (&cand_report.fragment, opts.allow_non_lax) {
            return Err(VerifyError::NotLax { graph: "candidate", reason: reason.clone() });
        }
        let lax = LaxReport::pair(&self.report, &cand_report);
        let b = per_trial(lax.degree, lax.exp_ops);
        let trials = opts.trials.unwrap_or_else(|| trials_for(b, opts.target_bound, opts.max_trials));

        let cand_dims = output_dims(candidate);
        let mut classes = classes(&self.out_dims, &cand_dims)?;
        if coverage == Coverage::Sampled {
            let cand_ids = candidate.output_ids();
            for (k, class) in classes.iter_mut().enumerate() {
                for &c in &class.cands {
                    for t in tiles(candidate, cand_ids[c], opts.tile_samples, hash_words(&[opts.seed, k as u64])) {
                        if !class.plan.tiles.contains(&t) {
                            class.plan.tiles.push(t);
                        }
                    }
                }
                class.plan.tiles.truncate(opts.tile_samples);
            }
        }
        let n = self.out_dims.len();
        let mut ref_class = vec![0; n];
        let mut compat = vec![vec![false; n]; n];
        for (k, class) in classes.iter().enumerate() {
            for &r in &class.refs {
                ref_class[r] = k;
                for &c in &class.cands {
                    compat[r][c] = true;
                }
            }
        }
        let mut evidence: Vec<Vec<Option<Evidence>>> = vec![vec![None; n]; n];
        let tiles_total: usize = classes.iter().map(|c| c.plan.tiles.len()).sum();
        let outcome = match coverage {
            Coverage::Sampled => self.sampled_trials(candidate, &classes, trials, &mut compat, &mut evidence)?,
            Coverage::Every => (self.every_trials(candidate, trials, &mut compat, &mut evidence)?, 0),
        };
        let (samples, tiles_compared) = match outcome {
            (Outcome::Unmatched(r), _) => return Ok(not_equivalent(r, &classes[ref_class[r]], &evidence[r])),
            (Outcome::Compared(s), t) => (s, t),
        };
        let Some(assignment) = perfect_matching(&compat) else {
            // Hall's condition fails: some reference output's candidates are all taken.
            let r = (0..n).find(|&r| evidence[r].iter().any(Option::is_some)).unwrap_or(0);
            return Ok(not_equivalent(r, &classes[ref_class[r]], &evidence[r]));
        };
        let numerics = if opts.float_check {
            check_numerics(&self.reference, candidate, &assignment, opts)?
        } else {
            Numerics::NotChecked
        };
        Ok(Verdict::Equivalent {
            coverage,
            trials,
            samples,
            tiles: (tiles_compared, tiles_total),
            false_accept_bound: b.powi(trials.min(i32::MAX as usize) as i32),
            lax,
            assignment,
            numerics,
        })
    }

    /// Runs `trials` sampled trials (see [`crate::sample`]), ruling out `compat[r][c]` at the
    /// first compared element where they differ; returns how it ended and the tiles compared.
    fn sampled_trials(
        &self,
        candidate: &KernelGraph,
        classes: &[Class],
        trials: usize,
        compat: &mut [Vec<bool>],
        evidence: &mut [Vec<Option<Evidence>>],
    ) -> Result<(Outcome, usize), VerifyError> {
        let opts = &self.opts;
        let n = compat.len();
        let mut ref_class = vec![0; n];
        let mut cand_class = vec![0; n];
        for (k, class) in classes.iter().enumerate() {
            class.refs.iter().for_each(|&r| ref_class[r] = k);
            class.cands.iter().for_each(|&c| cand_class[c] = k);
        }
        let (mut samples, mut tiles_compared) = (0, 0);
        for trial in 0..trials {
            let src = trial_inputs(opts.seed, trial, &self.in_dims);
            let per_class: Vec<Vec<(Vec<usize>, bool)>> = classes
                .iter()
                .enumerate()
                .map(|(k, c)| c.plan.indices(opts.seed, k, trial, trials, opts.samples_per_output))
                .collect();
            let slots = per_class.iter().map(Vec::len).max().unwrap_or(0);
            let mut cand_reads = 0;
            for s in 0..slots {
                if s > 0 && cand_reads / s as u64 * (s as u64 + 1) > opts.read_budget {
                    break;
                }
                let ref_idx = slot_indices(&per_class, &ref_class, s);
                let cand_idx = slot_indices(&per_class, &cand_class, s);
                let rv = self.reference_values(trial, &src, &ref_idx)?;
                let before = src.reads();
                let cv: Vec<Fp> = eval_elements(candidate, &src, &cand_idx, &opts.cancel)?;
                cand_reads += src.reads() - before;
                samples += n;
                tiles_compared += per_class.iter().filter(|l| l.get(s).is_some_and(|x| x.1)).count();
                for r in 0..n {
                    for c in 0..n {
                        if compat[r][c] && rv[r].p != cv[c].p {
                            compat[r][c] = false;
                            evidence[r][c] = Some(Evidence {
                                trial,
                                index: ref_idx[r].clone(),
                                reference: rv[r].p,
                                candidate: cv[c].p,
                            });
                        }
                    }
                    if !compat[r].iter().any(|&x| x) {
                        return Ok((Outcome::Unmatched(r), tiles_compared));
                    }
                }
            }
        }
        Ok((Outcome::Compared(samples), tiles_compared))
    }
}

/// The verdict for reference output `r` left without a compatible candidate output: the
/// difference against the candidate output in the same position of its shape class (or any).
fn not_equivalent(r: usize, class: &Class, evidence: &[Option<Evidence>]) -> Verdict {
    let pos = class.refs.iter().position(|&x| x == r).unwrap_or(0);
    let natural = class.cands.get(pos).copied().unwrap_or(0);
    let c = if evidence[natural].is_some() {
        natural
    } else {
        evidence.iter().position(Option::is_some).unwrap_or(natural)
    };
    match &evidence[c] {
        Some(e) => Verdict::NotEquivalent {
            output: r,
            candidate_output: c,
            index: e.index.clone(),
            reference_value: e.reference as u64,
            candidate_value: e.candidate as u64,
            trial: e.trial,
        },
        None => Verdict::NotEquivalent {
            output: r,
            candidate_output: c,
            index: vec![],
            reference_value: 0,
            candidate_value: 0,
            trial: 0,
        },
    }
}

/// Compares `candidate` with `reference` (see the crate docs). Errors (not verdicts) when the
/// inputs or outputs do not line up by count, dims and dtype, or a graph is not LAX.
pub fn equivalent(reference: &KernelGraph, candidate: &KernelGraph, opts: &Options) -> Result<Verdict, VerifyError> {
    Verifier::new(reference, opts.clone())?.check(candidate)
}
