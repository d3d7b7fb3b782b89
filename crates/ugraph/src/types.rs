//! Element types and shape helpers shared by every level of a µGraph.

use serde::{Deserialize, Serialize};

use crate::error::{dtype_err, shape_err, Result};

/// Largest tensor rank a µGraph supports.
pub const MAX_RANK: usize = 4;

/// Element type of a tensor in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE half precision.
    Float16,
    /// bfloat16.
    Bfloat16,
    /// IEEE single precision.
    Float32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Float16 | DType::Bfloat16 => 2,
            DType::Float32 => 4,
        }
    }

    /// The name used by the Python API (`float16`, `bfloat16`, `float32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Float32 => "float32",
        }
    }

    /// Parses a Python-API name.
    pub fn from_name(name: &str) -> Option<DType> {
        match name {
            "float16" | "half" | "fp16" => Some(DType::Float16),
            "bfloat16" | "bf16" => Some(DType::Bfloat16),
            "float32" | "float" | "fp32" => Some(DType::Float32),
            _ => None,
        }
    }
}

/// Number of elements of a shape.
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major strides (in elements) of a shape.
pub fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Checks that `dims` is a valid tensor shape (rank 1..=4, every dim positive, within the
/// size limits of [`crate::limits`]).
pub fn check_dims(op: &str, what: &str, dims: &[usize]) -> Result<()> {
    if dims.is_empty() || dims.len() > MAX_RANK {
        return shape_err(
            op,
            format!("{what} has rank {} (dims {dims:?}); ranks 1 to {MAX_RANK} are supported", dims.len()),
        );
    }
    if dims.contains(&0) {
        return shape_err(op, format!("{what} has a zero dim in {dims:?}"));
    }
    crate::limits::check_size(op, what, dims)
}

/// Resolves a possibly negative dim index against a rank.
pub fn resolve_dim(op: &str, what: &str, dim: i64, rank: usize) -> Result<usize> {
    let d = if dim < 0 { dim + rank as i64 } else { dim };
    if d < 0 || d >= rank as i64 {
        return shape_err(op, format!("dim {dim} is out of range for {what} of rank {rank}"));
    }
    Ok(d as usize)
}

/// Checks that two operands share an element type.
pub fn same_dtype(op: &str, a: DType, b: DType) -> Result<DType> {
    if a != b {
        return dtype_err(op, format!("operands have different dtypes {} and {}", a.name(), b.name()));
    }
    Ok(a)
}

/// Checks that `strides` describe a non-overlapping layout of `dims` (a permutation of a dense
/// layout, as the reference allows: row-major, column-major or any dim order).
pub fn check_strides(op: &str, dims: &[usize], strides: &[usize]) -> Result<()> {
    if strides.len() != dims.len() {
        return shape_err(
            op,
            format!("strides {strides:?} have {} entries but dims {dims:?} have {}", strides.len(), dims.len()),
        );
    }
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| (strides[i], dims[i]));
    let mut expect = 1usize;
    for &i in &order {
        if dims[i] == 1 {
            continue;
        }
        if strides[i] != expect {
            return shape_err(op, format!("strides {strides:?} do not describe a dense layout of dims {dims:?}"));
        }
        expect *= dims[i];
    }
    Ok(())
}
