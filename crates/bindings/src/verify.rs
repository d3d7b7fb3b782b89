//! `mirage._core.verify`: the finite-field equivalence check, its verdict as a dict.

use mirage::verify::{equivalent, Coverage, Fragment, Numerics, Options, Verdict, VerifyError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::interrupt::interruptible;
use crate::kernel::KernelGraph;

/// Checks whether `candidate` computes what `reference` computes; returns the verdict as a dict.
/// `coverage` is `"every"` (every output element in every trial) or `"sampled"`.
/// Ctrl-C stops the check and raises `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (reference, candidate, seed=None, trials=None, float_check=true, allow_non_lax=false, coverage="every"))]
#[allow(clippy::too_many_arguments)]
fn verify<'py>(
    py: Python<'py>,
    reference: &KernelGraph,
    candidate: &KernelGraph,
    seed: Option<u64>,
    trials: Option<usize>,
    float_check: bool,
    allow_non_lax: bool,
    coverage: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let coverage = match coverage {
        "every" => Coverage::Every,
        "sampled" => Coverage::Sampled,
        other => {
            return Err(PyValueError::new_err(format!("verify: coverage must be 'every' or 'sampled', got {other:?}")))
        }
    };
    let mut opts = Options { trials, float_check, allow_non_lax, coverage, ..Options::default() };
    if let Some(s) = seed {
        opts.seed = s;
    }
    let (r, c) = (&reference.inner, &candidate.inner);
    let verdict = interruptible(py, "verify", |cancel| {
        let opts = Options { cancel: cancel.clone(), ..opts };
        equivalent(r, c, &opts)
    })?
    .map_err(|e: VerifyError| PyValueError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    match verdict {
        Verdict::Equivalent { coverage, trials, samples, tiles, false_accept_bound, lax, assignment, numerics } => {
            d.set_item("equivalent", true)?;
            d.set_item("coverage", coverage.name())?;
            d.set_item("trials", trials)?;
            d.set_item("samples", samples)?;
            d.set_item("tiles", tiles)?;
            d.set_item("false_accept_bound", false_accept_bound)?;
            let (fragment, reason) = match &lax.fragment {
                Fragment::Lax => ("lax", String::new()),
                Fragment::Probabilistic { reason } => ("probabilistic, outside LAX", reason.clone()),
                other => ("not lax", format!("{other:?}")),
            };
            d.set_item("fragment", fragment)?;
            d.set_item("fragment_reason", reason)?;
            d.set_item("degree", lax.degree)?;
            d.set_item("exp_ops", lax.exp_ops)?;
            d.set_item("assignment", assignment)?;
            match numerics {
                Numerics::NotChecked => d.set_item("numerics", "not checked")?,
                Numerics::Stable { max_rel_err, dtype, .. } => {
                    d.set_item("numerics", "stable")?;
                    d.set_item("max_rel_err", max_rel_err)?;
                    d.set_item("numerics_dtype", dtype.name())?;
                }
                Numerics::Unstable { reason } => {
                    d.set_item("numerics", "unstable")?;
                    d.set_item("numerics_reason", reason)?;
                }
            }
        }
        Verdict::NotEquivalent { output, candidate_output, index, reference_value, candidate_value, trial } => {
            d.set_item("equivalent", false)?;
            d.set_item("output", output)?;
            d.set_item("candidate_output", candidate_output)?;
            d.set_item("index", index)?;
            d.set_item("reference_value", reference_value)?;
            d.set_item("candidate_value", candidate_value)?;
            d.set_item("trial", trial)?;
        }
    }
    Ok(d)
}

/// Registers `verify` in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify, m)?)
}
