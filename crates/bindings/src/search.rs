//! `mirage._core.search`: the µGraph search (`mirage::search::superoptimize`) run with the GIL
//! released, Ctrl-C and a progress display handled from Python's main thread.
//!
//! The search runs on a scoped worker thread (which drives the rayon pool); the calling thread
//! waits for it with the GIL released and wakes up every `tick_interval` seconds to re-acquire
//! the GIL and (a) check for signals: a pending `KeyboardInterrupt` (or any exception raised by
//! a signal handler or by the optional `tick` callable) sets the search's cancel flag, waits for
//! the search to return (promptly: it polls the flag) and is then re-raised; (b) when `verbose`,
//! write a one-line progress display to `sys.stderr`. Signals can only be checked here: Python
//! runs signal handlers on the main thread, never on rayon's.
//!
//! Results come back as plain Python data: candidates as dicts holding the graph as JSON
//! (`mirage::json::to_json`), cost, hash and verification; statistics as a dict.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mirage::search::{
    superoptimize, Candidate, Phase, Progress, SearchConfig, SearchError, SearchResult, SearchStats, StopReason,
    Verification,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::interrupt::{panic_message, polled};
use crate::kernel::KernelGraph;

/// Maps a search error: bad settings and graphs raise `ValueError`, internal failures
/// `RuntimeError`; the message is prefixed with `superoptimize:`.
fn to_py(e: SearchError) -> PyErr {
    let msg = format!("superoptimize: {e}");
    match e {
        SearchError::Ir(_) | SearchError::ThreadPool { .. } => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

fn positive_secs(name: &str, v: f64) -> PyResult<Duration> {
    if !v.is_finite() || v <= 0.0 {
        return Err(PyValueError::new_err(format!(
            "superoptimize: {name} must be a positive number of seconds, got {v}"
        )));
    }
    Duration::try_from_secs_f64(v)
        .map_err(|e| PyValueError::new_err(format!("superoptimize: {name} {v} is out of range: {e}")))
}

fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The one-line progress display.
fn progress_line(p: Option<&Progress>, elapsed: Duration, budget: Option<Duration>) -> String {
    let time = match budget {
        Some(b) => format!("{:.1}s / {:.1}s", elapsed.as_secs_f64(), b.as_secs_f64()),
        None => format!("{:.1}s", elapsed.as_secs_f64()),
    };
    match p {
        None => format!("[mirage] superoptimize {time}: saturating the target's e-graph"),
        Some(p) if p.phase >= Phase::Verify => format!(
            "[mirage] superoptimize {time}: verifying {} candidates: checked {}, equivalent {} (goal {}), failed {}",
            fmt_count(p.candidates),
            p.checked,
            p.verified,
            p.verify_goal,
            p.verification_failed
        ),
        Some(p) => format!(
            "[mirage] superoptimize {time}: kernel ops {}, states {}, pruned {} (expression) + {} (limits), block graphs {}",
            p.kernel_ops,
            fmt_count(p.states),
            fmt_count(p.pruned_by_expression),
            fmt_count(p.pruned_by_limits),
            fmt_count(p.block_graphs)
        ),
    }
}

/// The snapshot before the first report (the target's e-graph is being saturated).
fn no_progress(elapsed: Duration) -> Progress {
    Progress {
        phase: Phase::Search,
        kernel_ops: 0,
        states: 0,
        pruned_by_expression: 0,
        pruned_by_limits: 0,
        block_graphs: 0,
        candidates: 0,
        checked: 0,
        verified: 0,
        verification_failed: 0,
        verify_goal: 0,
        elapsed,
        budget: None,
    }
}

/// Keeps in `slot` the largest value of each counter seen: reports come from several search
/// threads and may arrive out of order, and what Python reads must only grow.
fn merge_progress(slot: &mut Option<Progress>, p: &Progress) {
    let Some(s) = slot else {
        *slot = Some(p.clone());
        return;
    };
    s.phase = s.phase.max(p.phase);
    s.kernel_ops = s.kernel_ops.max(p.kernel_ops);
    s.states = s.states.max(p.states);
    s.pruned_by_expression = s.pruned_by_expression.max(p.pruned_by_expression);
    s.pruned_by_limits = s.pruned_by_limits.max(p.pruned_by_limits);
    s.block_graphs = s.block_graphs.max(p.block_graphs);
    s.candidates = s.candidates.max(p.candidates);
    s.checked = s.checked.max(p.checked);
    s.verified = s.verified.max(p.verified);
    s.verification_failed = s.verification_failed.max(p.verification_failed);
    s.verify_goal = s.verify_goal.max(p.verify_goal);
    s.elapsed = s.elapsed.max(p.elapsed);
}

fn progress_dict<'py>(py: Python<'py>, p: Option<&Progress>, elapsed: Duration) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("elapsed", elapsed.as_secs_f64())?;
    let p = p.cloned().unwrap_or_else(|| no_progress(elapsed));
    d.set_item("phase", if p.kernel_ops == 0 && p.phase == Phase::Search { "saturate" } else { p.phase.name() })?;
    d.set_item("kernel_ops", p.kernel_ops)?;
    d.set_item("states", p.states)?;
    d.set_item("pruned_by_expression", p.pruned_by_expression)?;
    d.set_item("pruned_by_limits", p.pruned_by_limits)?;
    d.set_item("block_graphs", p.block_graphs)?;
    d.set_item("candidates", p.candidates)?;
    d.set_item("checked", p.checked)?;
    d.set_item("verified", p.verified)?;
    d.set_item("verification_failed", p.verification_failed)?;
    d.set_item("verify_goal", p.verify_goal)?;
    Ok(d)
}

fn write_stderr(py: Python<'_>, text: &str) -> PyResult<()> {
    let err = py.import("sys")?.getattr("stderr")?;
    if err.is_none() {
        return Ok(());
    }
    err.call_method1("write", (text,))?;
    err.call_method0("flush")?;
    Ok(())
}

fn verification_status(v: &Verification) -> (&'static str, Option<&str>) {
    match v {
        Verification::Passed => ("passed", None),
        Verification::Unstable(r) => ("unstable", Some(r)),
        Verification::Failed(r) => ("failed", Some(r)),
        Verification::NotChecked => ("not_checked", None),
    }
}

fn candidate_dict<'py>(py: Python<'py>, c: &Candidate) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("graph", mirage::json::to_json(&c.graph))?;
    d.set_item("hash", &c.hash)?;
    d.set_item("customized_kernels", c.customized_kernels)?;
    let (status, reason) = verification_status(&c.verification);
    d.set_item("verification", status)?;
    d.set_item("verification_reason", reason)?;
    let cost = PyDict::new(py);
    cost.set_item("est_us", c.cost.est_us)?;
    cost.set_item("dram_bytes", c.cost.dram_bytes)?;
    cost.set_item("l2_bytes", c.cost.l2_bytes)?;
    cost.set_item("flops", c.cost.flops)?;
    cost.set_item("launches", c.cost.launches)?;
    cost.set_item("shared_memory", c.cost.shared_memory)?;
    d.set_item("cost", cost)?;
    Ok(d)
}

fn stats_dict<'py>(py: Python<'py>, s: &SearchStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("states_visited", s.states_visited)?;
    d.set_item("pruned_by_expression", s.pruned_by_expression)?;
    d.set_item("pruned_by_limits", s.pruned_by_limits)?;
    d.set_item("ill_typed", s.ill_typed)?;
    d.set_item("configurations", s.configurations)?;
    d.set_item("block_graphs", s.block_graphs)?;
    d.set_item("candidates", s.candidates)?;
    d.set_item("verified", s.verified)?;
    d.set_item("verification_failed", s.verification_failed)?;
    d.set_item("builder_rejects", s.builder_rejects)?;
    d.set_item("kernel_ops_explored", s.kernel_ops_explored)?;
    d.set_item("elapsed", s.elapsed.as_secs_f64())?;
    let sat = PyDict::new(py);
    sat.set_item("iterations", s.saturation.iterations)?;
    sat.set_item("nodes", s.saturation.nodes)?;
    sat.set_item("classes", s.saturation.classes)?;
    sat.set_item("stop_reason", &s.saturation.stop_reason)?;
    sat.set_item("limit_hit", s.saturation.limit_hit)?;
    sat.set_item("elapsed", s.saturation.elapsed.as_secs_f64())?;
    d.set_item("saturation", sat)?;
    Ok(d)
}

fn result_dict<'py>(py: Python<'py>, r: &SearchResult) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let cands = PyList::empty(py);
    for c in &r.candidates {
        cands.append(candidate_dict(py, c)?)?;
    }
    d.set_item("candidates", cands)?;
    d.set_item("stats", stats_dict(py, &r.stats)?)?;
    let stopped = r.stopped.map(|s| match s {
        StopReason::TimeBudget => "time_budget",
        StopReason::Cancelled => "cancelled",
    });
    d.set_item("stopped", stopped)?;
    d.set_item("empty_reason", r.empty_reason.as_deref())?;
    Ok(d)
}

/// One wake-up of the waiting thread (GIL held): signals, the optional `tick` callable, and the
/// progress display.
struct Ticker<'a> {
    verbose: bool,
    tty: bool,
    tick: Option<&'a Py<PyAny>>,
    budget: Option<Duration>,
    start: Instant,
    last_line: Option<Instant>,
    printed: bool,
}

impl Ticker<'_> {
    fn run(&mut self, py: Python<'_>, latest: Option<&Progress>) -> PyResult<()> {
        py.check_signals()?;
        let elapsed = self.start.elapsed();
        if let Some(cb) = self.tick {
            cb.call1(py, (progress_dict(py, latest, elapsed)?,))?;
        }
        if self.verbose {
            // On a terminal the line is redrawn in place; elsewhere (logs) one line per second.
            let due = self.tty || self.last_line.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if due {
                let line = progress_line(latest, elapsed, self.budget);
                write_stderr(py, &if self.tty { format!("\r{line}\x1b[K") } else { format!("{line}\n") })?;
                self.last_line = Some(Instant::now());
                self.printed = true;
            }
        }
        Ok(())
    }

    fn finish(&self, py: Python<'_>, r: &SearchResult) -> PyResult<()> {
        if !self.verbose {
            return Ok(());
        }
        let s = &r.stats;
        let stopped = match r.stopped {
            Some(StopReason::TimeBudget) => ", stopped by the time budget",
            Some(StopReason::Cancelled) => ", cancelled",
            None => "",
        };
        let line = format!(
            "[mirage] superoptimize done in {:.2}s{stopped}: states {}, pruned {} (expression) + {} (limits), block graphs {}, candidates {}, verified {}, failed verification {}",
            s.elapsed.as_secs_f64(),
            fmt_count(s.states_visited),
            fmt_count(s.pruned_by_expression),
            fmt_count(s.pruned_by_limits),
            fmt_count(s.block_graphs),
            s.candidates,
            s.verified,
            s.verification_failed
        );
        let prefix = if self.tty && self.printed { "\r" } else { "" };
        let clear = if self.tty { "\x1b[K" } else { "" };
        write_stderr(py, &format!("{prefix}{line}{clear}\n"))
    }
}

fn stderr_is_tty(py: Python<'_>) -> bool {
    (|| -> PyResult<bool> { py.import("sys")?.getattr("stderr")?.call_method0("isatty")?.extract() })().unwrap_or(false)
}

/// Searches µGraphs equivalent to `graph`; returns `{"candidates": [...], "stats": {...},
/// "stopped": None | "time_budget" | "cancelled", "empty_reason": None | str}`.
///
/// Candidates are cheapest first by the cost model, each `{"graph": JSON, "hash", "cost":
/// {...}, "customized_kernels", "verification": "passed" | "unstable" | "not_checked",
/// "verification_reason"}`. `None` settings keep the search's defaults. `tick`, if given, is
/// called every `tick_interval` seconds with a progress dict (`phase`: "saturate", "search",
/// "verify" or "done", and counters that only grow), and once more when the search has
/// returned, with phase "done" and the search's totals; an exception it raises cancels the
/// search and is re-raised (as is `KeyboardInterrupt` from Ctrl-C).
#[pyfunction]
#[pyo3(signature = (
    graph, *, griddims=None, blockdims=None, imaps=None, omaps=None, fmaps=None, franges=None,
    max_block_ops=None, max_kernel_ops=None, max_customized_ops=None, shared_memory_limit=None,
    expression_pruning=None, verify_top_n=None, verify_spread=None, verify_co_resident=None, time_budget=None, num_threads=None, verbose=false,
    tick=None, tick_interval=0.2
))]
#[allow(clippy::too_many_arguments)]
fn search<'py>(
    py: Python<'py>,
    graph: PyRef<'_, KernelGraph>,
    griddims: Option<Vec<[usize; 3]>>,
    blockdims: Option<Vec<[usize; 3]>>,
    imaps: Option<Vec<[i64; 3]>>,
    omaps: Option<Vec<[i64; 3]>>,
    fmaps: Option<Vec<i64>>,
    franges: Option<Vec<usize>>,
    max_block_ops: Option<usize>,
    max_kernel_ops: Option<usize>,
    max_customized_ops: Option<usize>,
    shared_memory_limit: Option<usize>,
    expression_pruning: Option<bool>,
    verify_top_n: Option<usize>,
    verify_spread: Option<bool>,
    verify_co_resident: Option<bool>,
    time_budget: Option<f64>,
    num_threads: Option<usize>,
    verbose: bool,
    tick: Option<Py<PyAny>>,
    tick_interval: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let interval = positive_secs("tick_interval", tick_interval)?;
    let budget = time_budget.map(|b| positive_secs("time_budget", b)).transpose()?;
    let cancel = Arc::new(AtomicBool::new(false));
    let latest: Arc<Mutex<Option<Progress>>> = Arc::new(Mutex::new(None));
    let sink = Arc::clone(&latest);
    let mut cfg = SearchConfig {
        griddims,
        blockdims,
        imaps,
        omaps,
        fmaps,
        franges,
        time_budget: budget,
        cancel: Some(Arc::clone(&cancel)),
        progress: Some(Arc::new(move |p: &Progress| {
            if let Ok(mut slot) = sink.lock() {
                merge_progress(&mut slot, p);
            }
        })),
        progress_interval: Duration::from_millis(100),
        num_threads,
        ..SearchConfig::default()
    };
    if let Some(v) = max_block_ops {
        cfg.max_block_ops = v;
    }
    if let Some(v) = max_kernel_ops {
        cfg.max_kernel_ops = v;
    }
    if let Some(v) = max_customized_ops {
        cfg.max_customized_ops = v;
    }
    if let Some(v) = shared_memory_limit {
        cfg.shared_memory_limit = v;
    }
    if let Some(v) = expression_pruning {
        cfg.expression_pruning = v;
    }
    if let Some(v) = verify_top_n {
        cfg.verify.top_n = v;
    }
    if let Some(v) = verify_spread {
        cfg.verify.spread = v;
    }
    if let Some(v) = verify_co_resident {
        cfg.verify.co_resident = v;
    }

    let mut ticker = Ticker {
        verbose,
        tty: verbose && stderr_is_tty(py),
        tick: tick.as_ref(),
        budget,
        start: Instant::now(),
        last_line: None,
        printed: false,
    };
    let reference = &graph.inner;
    let cfg = &cfg;
    let latest_final = Arc::clone(&latest);
    let (outcome, pending) = polled(
        py,
        interval,
        &cancel,
        move || superoptimize(reference, cfg),
        |py| {
            let snap = latest.lock().ok().and_then(|g| g.clone());
            ticker.run(py, snap.as_ref())
        },
    );
    if ticker.printed && ticker.tty && pending.is_some() {
        let _ = write_stderr(py, "\n");
    }
    let result = match outcome {
        Ok(r) => r,
        Err(panic) => {
            let what = panic_message(&*panic);
            return Err(PyRuntimeError::new_err(format!("superoptimize: the search panicked (a bug): {what}")));
        }
    };
    if let Some(e) = pending {
        return Err(e);
    }
    let result = result.map_err(to_py)?;
    // The last tick sees the final counters (the search's totals, phase "done").
    if let Some(cb) = ticker.tick {
        let snap = latest_final.lock().ok().and_then(|g| g.clone());
        cb.call1(py, (progress_dict(py, snap.as_ref(), ticker.start.elapsed())?,))?;
    }
    ticker.finish(py, &result)?;
    result_dict(py, &result)
}

/// Registers `search` in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(search, m)?)
}
