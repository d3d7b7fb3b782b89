//! verify: in progress.
