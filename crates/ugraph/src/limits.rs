//! The size limits every graph obeys, whether built op by op or loaded from JSON: one
//! definition shared by the builders, the JSON loader, the interpreter and the Python package
//! (which reads them as `mirage._core.MAX_EXTENT`, ...). They keep every shape, element-count
//! and grid product of the builders and the interpreter inside `usize`.

use crate::error::{shape_err, Result};

/// Largest dim of a tensor, grid extent per axis, grid block count, loop range and
/// `reduction_dimx` (2^31: CUDA's largest grid extent along x).
pub const MAX_EXTENT: usize = 1 << 31;
/// Largest element count of one tensor of a graph (2^48).
pub const MAX_NUMEL: usize = 1 << 48;
/// Largest element count of one tensor the CPU interpreter materializes (2^31, 8 GiB of f32);
/// a run or verification that would need more is refused before it allocates.
pub const MAX_RUN_NUMEL: usize = 1 << 31;

/// Most thread blocks of one customized op the CPU interpreter runs (2^20); a larger grid is
/// refused before it is planned.
pub const MAX_RUN_BLOCKS: usize = 1 << 20;

/// The element count of `dims`, or `None` where the product overflows.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Checks every dim of `dims` (of `what`, for op `op`) is at most [`MAX_EXTENT`] and their
/// product at most [`MAX_NUMEL`].
pub fn check_size(op: &str, what: &str, dims: &[usize]) -> Result<()> {
    if let Some((i, d)) = dims.iter().enumerate().find(|(_, &d)| d > MAX_EXTENT) {
        return shape_err(
            op,
            format!("{what} has dims {dims:?}: dim {i} ({d}) exceeds the largest supported dim {MAX_EXTENT} (2^31)"),
        );
    }
    match checked_numel(dims) {
        Some(n) if n <= MAX_NUMEL => Ok(()),
        n => shape_err(
            op,
            format!(
                "{what} has dims {dims:?}: {} elements exceed the largest supported count {MAX_NUMEL} (2^48)",
                n.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
            ),
        ),
    }
}

/// `a * b` for a size named `what` of op `op`, at most `most`.
pub fn checked_size_mul(op: &str, what: &str, a: usize, b: usize, most: usize) -> Result<usize> {
    match a.checked_mul(b) {
        Some(n) if n <= most => Ok(n),
        _ => shape_err(op, format!("{what}: {a} * {b} exceeds the largest supported size {most}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_within_the_limits_pass() {
        assert!(check_size("t", "x", &[MAX_EXTENT, 1 << 17]).is_ok());
        assert_eq!(checked_numel(&[3, 4, 5]), Some(60));
    }

    #[test]
    fn oversized_dims_and_products_are_errors() {
        let e = check_size("new_input", "the input", &[MAX_EXTENT + 1, 2]).unwrap_err().to_string();
        assert!(e.contains("new_input") && e.contains("dim 0"), "{e}");
        let e = check_size("new_input", "the input", &[1 << 30, 1 << 30, 1 << 30]).unwrap_err().to_string();
        assert!(e.contains("elements exceed"), "{e}");
        let e = check_size("new_input", "the input", &[1 << 31, 1 << 31, 1 << 31, 1 << 31]).unwrap_err().to_string();
        assert!(e.contains("more than 2^64"), "{e}");
        assert_eq!(checked_numel(&[usize::MAX, 2]), None);
        assert!(checked_size_mul("op", "grid", 1 << 20, 1 << 20, MAX_EXTENT).is_err());
        assert_eq!(checked_size_mul("op", "grid", 4, 8, MAX_EXTENT).unwrap(), 32);
    }
}
