//! search: in progress.
