//! Shape rules and the accumulators; the element-wise ops live in [`crate::registry`].
//!
//! Element-wise ops ([`UnaryOp`] and [`BinaryOp`], from [`crate::registry`]) are shared by
//! all three graph levels; the structural ops of each level ([`crate::kernel::KernelOpKind`],
//! [`crate::block::BlockOpKind`]) call the shape rules below. Semantics of the accumulators are documented on [`Accum`].

use serde::{Deserialize, Serialize};

use crate::error::{invalid, shape_err, Result};

use crate::registry::Lax;
pub use crate::registry::{BinaryOp, UnaryOp};

impl UnaryOp {
    /// Whether the op has an algebraic (field) meaning (not uninterpreted in the verifier).
    pub fn is_algebraic(&self) -> bool {
        self.lax() != Lax::Uninterpreted
    }

    /// Checks the op's constants (finite, ordered bounds).
    pub fn validate(&self) -> Result<()> {
        match *self {
            UnaryOp::Clamp { min, max } if min.is_nan() || max.is_nan() || min > max => {
                invalid("clamp", format!("bounds min={min}, max={max} must be ordered numbers"))
            }
            UnaryOp::MulScalar { scalar } if !scalar.is_finite() => {
                invalid("mul_scalar", format!("scalar {scalar} is not finite"))
            }
            _ => Ok(()),
        }
    }
}

/// Checks an RMS epsilon (`rms_norm`'s `eps`, the `rms` accumulator's): finite and `>= 0`.
/// Returns it with `-0.0` made `0.0`, so equal values have equal bits (hash, JSON).
pub fn check_eps(op: &str, eps: f32) -> Result<f32> {
    if !eps.is_finite() || eps < 0.0 {
        return invalid(op, format!("eps {eps} must be a finite number >= 0"));
    }
    Ok(eps + 0.0)
}

/// Whether `eps` is zero (serde: an RMS op without epsilon writes no `eps` field).
pub fn eps_is_zero(eps: &f32) -> bool {
    *eps == 0.0
}

/// How a block graph's for-loop accumulator combines per-iteration tiles.
///
/// With `T_i` the input tile at iteration `i` of `forloop_range = R` iterations and `L` the
/// tile's last dim: `None`: `sum_i T_i`; `Sum`: `sum_i sum_last(T_i)` (last dim becomes 1);
/// `Mean`: `Sum / (L * R)`; `Rms`: `sqrt(sum_i sum_last(T_i^2) / (L * R))`; `SumToDimx`:
/// `sum_i fold(T_i)` where `fold(x)[.., j] = sum_k x[.., j + k * reduction_dimx]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accum {
    /// Element-wise sum over iterations.
    None,
    /// Sum over iterations and over the last dim.
    Sum,
    /// Mean over iterations and the last dim.
    Mean,
    /// Root mean square over iterations and the last dim.
    Rms,
    /// Sum over iterations, last dim folded to `reduction_dimx`.
    SumToDimx,
}

impl Accum {
    /// The `acc=` string of the Python API (`None` for element-wise).
    pub fn name(&self) -> Option<&'static str> {
        match self {
            Accum::None => None,
            Accum::Sum => Some("sum"),
            Accum::Mean => Some("mean"),
            Accum::Rms => Some("rms"),
            Accum::SumToDimx => Some("sum_todimx"),
        }
    }

    /// Parses the `acc=` string of the Python API.
    pub fn from_name(name: Option<&str>) -> Option<Accum> {
        match name {
            None | Some("none") | Some("None") => Some(Accum::None),
            Some("sum") => Some(Accum::Sum),
            Some("mean") => Some(Accum::Mean),
            Some("rms") => Some(Accum::Rms),
            Some("sum_todimx") => Some(Accum::SumToDimx),
            _ => None,
        }
    }

    /// Shape of the accumulated tensor for an input tile of `dims`.
    pub fn out_dims(&self, dims: &[usize], reduction_dimx: usize) -> Result<Vec<usize>> {
        let mut out = dims.to_vec();
        let last = dims.len() - 1;
        match self {
            Accum::None => {}
            Accum::Sum | Accum::Mean | Accum::Rms => out[last] = 1,
            Accum::SumToDimx => {
                if !dims[last].is_multiple_of(reduction_dimx) {
                    return shape_err(
                        "forloop_accum",
                        format!("sum_todimx: last dim {} of input {dims:?} is not a multiple of reduction_dimx {reduction_dimx}", dims[last]),
                    );
                }
                out[last] = reduction_dimx;
            }
        }
        Ok(out)
    }
}

/// Shape rule of `matmul`: `[.., m, k] x [.., k, n] -> [.., m, n]`, equal ranks >= 2, equal batch dims.
pub fn matmul_dims(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.len() != b.len() || a.len() < 2 {
        return shape_err(op, format!("A has dims {a:?} and B has dims {b:?}: ranks must be equal and at least 2"));
    }
    let r = a.len();
    if a[r - 1] != b[r - 2] {
        return shape_err(
            op,
            format!(
                "A has dims {a:?} and B has dims {b:?}: inner dims {} (A dim {}) and {} (B dim {}) differ",
                a[r - 1],
                r - 1,
                b[r - 2],
                r - 2
            ),
        );
    }
    if a[..r - 2] != b[..r - 2] {
        return shape_err(op, format!("A has dims {a:?} and B has dims {b:?}: batch dims differ"));
    }
    let mut out = a[..r - 1].to_vec();
    out.push(b[r - 1]);
    Ok(out)
}

/// Shape rule of element-wise binary ops: equal ranks; each dim equal or 1 on one side.
pub fn broadcast_dims(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.len() != b.len() {
        return shape_err(op, format!("A has dims {a:?} and B has dims {b:?}: ranks must be equal"));
    }
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (&x, &y))| {
            if x == y || y == 1 {
                Ok(x)
            } else if x == 1 {
                Ok(y)
            } else {
                shape_err(
                    op,
                    format!("A has dims {a:?} and B has dims {b:?}: dim {i} ({x} vs {y}) neither matches nor is 1"),
                )
            }
        })
        .collect()
}

/// Shape rule of `concat`: equal ranks, all dims but `dim` equal; `dim` adds up.
pub fn concat_dims(op: &str, a: &[usize], b: &[usize], dim: usize) -> Result<Vec<usize>> {
    if a.len() != b.len() {
        return shape_err(op, format!("A has dims {a:?} and B has dims {b:?}: ranks must be equal"));
    }
    for i in 0..a.len() {
        if i != dim && a[i] != b[i] {
            return shape_err(
                op,
                format!(
                    "A has dims {a:?} and B has dims {b:?}: dim {i} differs ({} vs {}) and is not the concat dim {dim}",
                    a[i], b[i]
                ),
            );
        }
    }
    let mut out = a.to_vec();
    out[dim] = match a[dim].checked_add(b[dim]) {
        Some(n) if n <= crate::limits::MAX_EXTENT => n,
        _ => {
            return shape_err(
                op,
                format!(
                    "A has dims {a:?} and B has dims {b:?}: concat dim {dim} would have {} + {}, more than the largest supported dim {}",
                    a[dim],
                    b[dim],
                    crate::limits::MAX_EXTENT
                ),
            )
        }
    };
    Ok(out)
}

/// Shape rule of a reduction over `dim` that keeps the dim with size 1.
pub fn reduce_dims(dims: &[usize], dim: usize) -> Vec<usize> {
    let mut out = dims.to_vec();
    out[dim] = 1;
    out
}
