//! Long interpreter calls (`KernelGraph.run`, `verify`) run with the GIL released and stay
//! interruptible: the work runs on a scoped worker thread while the calling thread wakes up
//! every [`POLL`] to re-acquire the GIL and run Python's signal handlers. A pending exception
//! (`KeyboardInterrupt` from Ctrl-C) sets the work's [`Cancel`] flag, which the interpreter
//! polls between kernel ops, row bands, blocks and loop iterations; once the work has
//! returned, the exception is raised.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use mirage::Cancel;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often the waiting thread checks for signals.
const POLL: Duration = Duration::from_millis(50);

/// Runs `work` on a scoped thread with the GIL released; every `interval` the calling thread
/// takes the GIL and runs `poll`. The first error `poll` returns sets `flag` (the work's cancel
/// flag) and is kept; later polls are skipped. Returns the work's outcome (`Err`: it panicked)
/// and that error.
pub fn polled<T: Send>(
    py: Python<'_>,
    interval: Duration,
    flag: &AtomicBool,
    work: impl FnOnce() -> T + Send,
    mut poll: impl FnMut(Python<'_>) -> PyResult<()> + Send,
) -> (std::thread::Result<T>, Option<PyErr>) {
    py.detach(|| {
        std::thread::scope(|s| {
            let (tx, rx) = channel::<()>();
            let worker = s.spawn(move || {
                let r = work();
                let _ = tx.send(());
                r
            });
            let mut pending: Option<PyErr> = None;
            loop {
                match rx.recv_timeout(interval) {
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) if pending.is_none() => {
                        if let Err(e) = Python::attach(&mut poll) {
                            flag.store(true, Ordering::Relaxed);
                            pending = Some(e);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            (worker.join(), pending)
        })
    })
}

/// The message of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `work` with the GIL released, cancelling it when a signal handler raises; `op` names
/// the call in the error raised for a panic (a bug).
pub fn interruptible<T: Send>(py: Python<'_>, op: &str, work: impl FnOnce(&Cancel) -> T + Send) -> PyResult<T> {
    let flag = Arc::new(AtomicBool::new(false));
    let cancel = Cancel::new(Arc::clone(&flag));
    let cancel = &cancel;
    let (outcome, pending) = polled(py, POLL, &flag, move || work(cancel), |py| py.check_signals());
    if let Some(e) = pending {
        return Err(e);
    }
    outcome
        .map_err(|panic| PyRuntimeError::new_err(format!("{op}: internal error (a bug): {}", panic_message(&*panic))))
}
