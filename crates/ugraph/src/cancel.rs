//! Cooperative cancellation of long interpreter runs: a shared flag the interpreter polls
//! between kernel ops, row bands of a kernel op, thread blocks and loop iterations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A cancellation flag; [`Cancel::default`] never fires. Set the shared flag from any thread
/// to stop a run, which then returns [`Error::Cancelled`].
#[derive(Clone, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

impl Cancel {
    /// A handle that is cancelled once `flag` is set.
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Cancel(Some(flag))
    }

    /// Whether the flag is set.
    #[inline]
    pub fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(Error::Cancelled)` once the flag is set.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.is_set() {
            return Err(Error::Cancelled);
        }
        Ok(())
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cancel({})", if self.is_set() { "set" } else { "clear" })
    }
}

/// Cancellation handles carry no settings: any two compare equal (so that option structs
/// holding one keep their `PartialEq`).
impl PartialEq for Cancel {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
