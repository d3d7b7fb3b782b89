//! Conversions between Python arguments and the core's types, and the one error mapping.

use mirage::{Accum, BinaryOp, DType, Error, UnaryOp, BINARY_OPS, UNARY_OPS};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::PyErr;

/// Maps a core error to a Python exception: dtype errors raise `TypeError`, everything else
/// `ValueError`; the message is the error's `Display` (it names the op, operand and dims).
pub fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::DType { .. } => PyTypeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// `Result::map_err(to_py_err)` as a method.
pub trait OrPyErr<T> {
    /// Converts the error with [`to_py_err`].
    fn py_err(self) -> pyo3::PyResult<T>;
}

impl<T> OrPyErr<T> for mirage::Result<T> {
    fn py_err(self) -> pyo3::PyResult<T> {
        self.map_err(to_py_err)
    }
}

/// Parses a dtype name (`float16`, `bfloat16`, `float32` and their aliases).
pub fn parse_dtype(op: &str, name: &str) -> pyo3::PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        PyTypeError::new_err(format!("{op}: unknown dtype {name:?}; expected \"float16\", \"bfloat16\" or \"float32\""))
    })
}

/// Parses an element-wise unary op and its constants.
pub fn parse_unary(name: &str, min: Option<f64>, max: Option<f64>, scalar: Option<f64>) -> pyo3::PyResult<UnaryOp> {
    let plain = |op: UnaryOp| {
        if min.is_some() || max.is_some() || scalar.is_some() {
            return Err(PyValueError::new_err(format!("{name}: takes no min/max/scalar parameter")));
        }
        Ok(op)
    };
    if let Some(op) = UnaryOp::from_name(name) {
        return plain(op);
    }
    match name {
        "clamp" => match (min, max, scalar) {
            (Some(lo), Some(hi), None) => Ok(UnaryOp::Clamp { min: lo as f32, max: hi as f32 }),
            _ => Err(PyValueError::new_err("clamp: needs min and max (and no scalar)")),
        },
        "mul_scalar" => match (min, max, scalar) {
            (None, None, Some(s)) => Ok(UnaryOp::MulScalar { scalar: s as f32 }),
            _ => Err(PyValueError::new_err("mul_scalar: needs scalar (and no min/max)")),
        },
        _ => {
            let names: Vec<&str> = UNARY_OPS.iter().map(|d| d.name).chain(["clamp", "mul_scalar"]).collect();
            Err(PyValueError::new_err(format!("unknown unary op {name:?}; expected one of {}", names.join(", "))))
        }
    }
}

/// The registry's unary ops as `(name, doc)` pairs (docs/ops.md), for the Python front's
/// per-op methods.
pub fn unary_ops() -> Vec<(&'static str, &'static str)> {
    UNARY_OPS.iter().map(|d| (d.name, d.doc)).collect()
}

/// The registry's binary ops as `(name, doc)` pairs (docs/ops.md).
pub fn binary_ops() -> Vec<(&'static str, &'static str)> {
    BINARY_OPS.iter().map(|d| (d.name, d.doc)).collect()
}

/// Parses an element-wise binary op by its registry name.
pub fn parse_binary(name: &str) -> pyo3::PyResult<BinaryOp> {
    BinaryOp::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = BINARY_OPS.iter().map(|d| d.name).collect();
        PyValueError::new_err(format!("unknown binary op {name:?}; expected one of {}", names.join(", ")))
    })
}

/// Parses the `acc=` argument of a for-loop accumulator.
pub fn parse_accum(op: &str, acc: Option<&str>) -> pyo3::PyResult<Accum> {
    Accum::from_name(acc).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{op}: unknown accumulator {:?}; expected None, \"sum\", \"mean\", \"rms\" or \"sum_todimx\"",
            acc.unwrap_or_default()
        ))
    })
}

/// Parses an RMS epsilon: a finite number `>= 0` that fits an `f32`.
pub fn parse_eps(op: &str, eps: f64) -> pyo3::PyResult<f32> {
    if !eps.is_finite() || eps < 0.0 || eps > f32::MAX as f64 {
        return Err(PyValueError::new_err(format!("{op}: eps {eps} must be a finite float32 number >= 0")));
    }
    Ok(eps as f32)
}
