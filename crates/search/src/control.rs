//! Shared run-time state of one search: statistics counters, the stop condition (time budget,
//! cancellation flag) and throttled progress reports. Everything here is atomic: search
//! threads share it by reference, with no locks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Phase, Progress, ProgressFn, SearchConfig};

/// Why a search stopped before exploring everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The time budget ran out.
    TimeBudget,
    /// The cancellation flag was set.
    Cancelled,
}

/// Counters of one search.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub states: AtomicU64,
    pub pruned_expr: AtomicU64,
    pub pruned_limits: AtomicU64,
    pub block_graphs: AtomicU64,
    pub configurations: AtomicU64,
    pub builder_rejects: AtomicU64,
    pub ill_typed: AtomicU64,
    pub candidates: AtomicU64,
    pub checked: AtomicU64,
    pub verified: AtomicU64,
    pub verification_failed: AtomicU64,
    pub verify_goal: AtomicU64,
}

/// Stop condition and progress reporting.
pub(crate) struct Control {
    pub start: Instant,
    deadline: Option<Instant>,
    budget: Option<Duration>,
    cancel: Option<Arc<AtomicBool>>,
    stopped: AtomicBool,
    reason: AtomicUsize,
    progress: Option<ProgressFn>,
    interval_ms: u64,
    last_progress_ms: AtomicU64,
    pub kernel_ops: AtomicUsize,
    phase: AtomicUsize,
    pub counters: Counters,
}

impl Control {
    /// The controls of a search that started at `start` (the time budget counts from there).
    pub fn new(cfg: &SearchConfig, start: Instant) -> Self {
        Control {
            start,
            deadline: cfg.time_budget.map(|b| start + b),
            budget: cfg.time_budget,
            cancel: cfg.cancel.clone(),
            stopped: AtomicBool::new(false),
            reason: AtomicUsize::new(0),
            progress: cfg.progress.clone(),
            interval_ms: cfg.progress_interval.as_millis() as u64,
            last_progress_ms: AtomicU64::new(0),
            kernel_ops: AtomicUsize::new(0),
            phase: AtomicUsize::new(0),
            counters: Counters::default(),
        }
    }

    /// Whether the search must stop; checks the clock and the flag (call every few hundred states).
    pub fn check(&self) -> bool {
        if self.stopped.load(Relaxed) {
            return true;
        }
        if self.cancel.as_ref().is_some_and(|c| c.load(Relaxed)) {
            self.stop(StopReason::Cancelled);
            return true;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.stop(StopReason::TimeBudget);
            return true;
        }
        self.report(false);
        false
    }

    /// Whether the cancellation flag is set (the time budget does not count).
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Relaxed))
    }

    /// Whether a stop was requested (cheap: one atomic load).
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stopped.load(Relaxed)
    }

    fn stop(&self, why: StopReason) {
        let code = match why {
            StopReason::TimeBudget => 1,
            StopReason::Cancelled => 2,
        };
        let _ = self.reason.compare_exchange(0, code, Relaxed, Relaxed);
        self.stopped.store(true, Relaxed);
    }

    /// Whether the time budget is spent with its grace: half the budget again, for checking
    /// what the search found (verification then goes a few candidates at a time and stops at
    /// the first that passes).
    pub fn past_grace(&self) -> bool {
        self.budget.is_some_and(|b| self.start.elapsed() >= b + b / 2)
    }

    /// Why the search stopped early, if it did.
    pub fn reason(&self) -> Option<StopReason> {
        match self.reason.load(Relaxed) {
            1 => Some(StopReason::TimeBudget),
            2 => Some(StopReason::Cancelled),
            _ => None,
        }
    }

    /// Moves to `phase` and reports it at once.
    pub fn enter(&self, phase: Phase) {
        let code = match phase {
            Phase::Search => 0,
            Phase::Verify => 1,
            Phase::Done => 2,
        };
        self.phase.store(code, Relaxed);
        self.report(true);
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Relaxed) {
            0 => Phase::Search,
            1 => Phase::Verify,
            _ => Phase::Done,
        }
    }

    /// Calls the progress callback if the interval has passed (or always with `force`).
    pub fn report(&self, force: bool) {
        let Some(cb) = &self.progress else { return };
        let now = self.start.elapsed().as_millis() as u64;
        let last = self.last_progress_ms.load(Relaxed);
        if !force && now < last + self.interval_ms {
            return;
        }
        if self.last_progress_ms.compare_exchange(last, now.max(last + 1), Relaxed, Relaxed).is_err() && !force {
            return;
        }
        cb(&self.snapshot());
    }

    /// The counters now.
    pub fn snapshot(&self) -> Progress {
        let c = &self.counters;
        Progress {
            phase: self.phase(),
            kernel_ops: self.kernel_ops.load(Relaxed),
            states: c.states.load(Relaxed),
            pruned_by_expression: c.pruned_expr.load(Relaxed),
            pruned_by_limits: c.pruned_limits.load(Relaxed),
            block_graphs: c.block_graphs.load(Relaxed),
            candidates: c.candidates.load(Relaxed),
            checked: c.checked.load(Relaxed),
            verified: c.verified.load(Relaxed),
            verification_failed: c.verification_failed.load(Relaxed),
            verify_goal: c.verify_goal.load(Relaxed),
            elapsed: self.start.elapsed(),
            budget: self.budget,
        }
    }
}
