//! codegen: in progress.
