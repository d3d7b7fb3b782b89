//! Small helpers for writing CUDA C++: index expressions over row-major and strided layouts,
//! float literals, element-wise op calls.

use mirage_ugraph::{BinaryOp, UnaryOp};

use crate::program::DevBuffer;

/// Appends one formatted line to a `String`.
macro_rules! wl {
    ($out:expr, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
}
pub(crate) use wl;

/// Row-major strides (in elements) of `dims`.
pub(crate) fn row_major(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Number of elements.
pub(crate) fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Expression for coordinate `k` of the row-major linear index `var` over `dims`.
pub(crate) fn coord(dims: &[usize], k: usize, var: &str) -> String {
    if dims[k] == 1 {
        return "0".into();
    }
    let rs = row_major(dims);
    let outer_is_one = dims[..k].iter().all(|&d| d == 1);
    match (rs[k] == 1, outer_is_one) {
        (true, true) => var.to_string(),
        (true, false) => format!("({var} % {})", dims[k]),
        (false, true) => format!("({var} / {})", rs[k]),
        (false, false) => format!("(({var} / {}) % {})", rs[k], dims[k]),
    }
}

/// Expression for the element offset, in a tensor of `in_dims` laid out with `in_strides`, of
/// the element that row-major index `var` over `out_dims` reads; dims of size 1 in `in_dims`
/// broadcast. Both shapes have the same rank.
pub(crate) fn offset(out_dims: &[usize], var: &str, in_dims: &[usize], in_strides: &[usize]) -> String {
    if in_dims == out_dims && in_strides == row_major(out_dims).as_slice() {
        return var.to_string();
    }
    let terms: Vec<String> = (0..in_dims.len())
        .filter(|&k| in_dims[k] != 1)
        .map(|k| {
            let c = coord(out_dims, k, var);
            if in_strides[k] == 1 {
                c
            } else {
                format!("{c} * {}", in_strides[k])
            }
        })
        .collect();
    if terms.is_empty() {
        "0".into()
    } else {
        terms.join(" + ")
    }
}

/// As [`offset`], in 64-bit arithmetic (for offsets that may pass 2^31).
pub(crate) fn offset_wide(out_dims: &[usize], var: &str, in_dims: &[usize], in_strides: &[usize]) -> String {
    let terms: Vec<String> = (0..in_dims.len())
        .filter(|&k| in_dims[k] != 1)
        .map(|k| format!("(long long){} * {}LL", coord(out_dims, k, var), in_strides[k]))
        .collect();
    if terms.is_empty() {
        "0LL".into()
    } else {
        format!("({})", terms.join(" + "))
    }
}

/// Whether offsets up to `max` need 64-bit arithmetic.
fn wide(max: usize) -> bool {
    max >= i32::MAX as usize / 2
}

/// [`offset`], or [`offset_wide`] where an offset into `in_dims` under `in_strides` may pass
/// 2^31: the element offset in a device tensor of what row-major index `var` over `out_dims`
/// reads.
pub(crate) fn dev_offset(out_dims: &[usize], var: &str, in_dims: &[usize], in_strides: &[usize]) -> String {
    let max: usize = in_dims.iter().zip(in_strides).map(|(&d, &s)| (d - 1) * s).sum();
    if wide(max) {
        offset_wide(out_dims, var, in_dims, in_strides)
    } else {
        offset(out_dims, var, in_dims, in_strides)
    }
}

/// The opening of a kernel: its signature (`bounds` as `__launch_bounds__`' arguments, `params`
/// from [`kernel_params`]), then `prefetches` (L2 prefetch statements over `NT` = `nt` threads
/// and `tid`, which touch no memory), then the dependent-launch wait every generated kernel
/// starts with (`mi::dep_enter`, which also lets the next kernel go; see
/// [`crate::program::KernelSpec::dep_wait`]).
pub(crate) fn kernel_open(bounds: &str, name: &str, params: &str, nt: usize, prefetches: &str) -> String {
    kernel_open_with(bounds, name, params, nt, prefetches, "mi::dep_enter();")
}

/// [`kernel_open`] with its own wait statement (`mi::dep_wait();` where the kernel lets the
/// next one go later, `mi::dep_launch`).
pub(crate) fn kernel_open_with(
    bounds: &str,
    name: &str,
    params: &str,
    nt: usize,
    prefetches: &str,
    wait: &str,
) -> String {
    let mut s = format!("extern \"C\" __global__ void __launch_bounds__({bounds}) {name}({params}) {{\n");
    if !prefetches.is_empty() {
        wl!(s, "  {{ // L2 prefetch before the wait");
        wl!(s, "    constexpr int NT = {nt};");
        wl!(s, "    const int tid = mi::lin_tid();");
        s.push_str(prefetches);
        wl!(s, "  }}");
    }
    wl!(s, "  {wait}");
    s
}

/// The parameter list of a kernel reading `ins` and writing `outs`: `in0, in1, ..., out0, ...`
/// as pointers to their storage types.
pub(crate) fn kernel_params(ins: &[DevBuffer], outs: &[DevBuffer]) -> String {
    let ins = ins.iter().enumerate().map(|(k, b)| format!("const {}* __restrict__ in{k}", b.storage.cty()));
    let outs = outs.iter().enumerate().map(|(j, b)| format!("{}* __restrict__ out{j}", b.storage.cty()));
    ins.chain(outs).collect::<Vec<_>>().join(", ")
}

/// Broadcast index into a row-major tile of `in_dims` for row-major index `var` over `out_dims`.
pub(crate) fn bcast(out_dims: &[usize], var: &str, in_dims: &[usize]) -> String {
    offset(out_dims, var, in_dims, &row_major(in_dims))
}

/// An exact C++ float literal (infinities through bit patterns).
pub(crate) fn flit(x: f32) -> String {
    if x.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "__int_as_float(0x7f800000)".into()
        } else {
            "__int_as_float((int)0xff800000u)".into()
        }
    } else {
        format!("{x:e}f")
    }
}

/// C++ expression applying a unary op to `a`: the registry's device function (docs/ops.md).
pub(crate) fn unary_expr(op: &UnaryOp, a: &str) -> String {
    match (*op, op.def()) {
        (UnaryOp::Clamp { min, max }, _) => format!("mi::op_clamp({a}, {}, {})", flit(min), flit(max)),
        (UnaryOp::MulScalar { scalar }, _) => format!("({a} * {})", flit(scalar)),
        (_, Some(d)) => format!("{}({a})", d.cuda),
        (op, None) => unreachable!("unary op {} is neither in the registry nor has constants", op.name()),
    }
}

/// C++ expression applying a binary op to `a` and `b`: the registry's operator or device
/// function (docs/ops.md).
pub(crate) fn binary_expr(op: BinaryOp, a: &str, b: &str) -> String {
    op.def().cuda.expr(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets() {
        assert_eq!(offset(&[4, 8], "i", &[4, 8], &[8, 1]), "i");
        assert_eq!(offset(&[4, 8], "i", &[4, 1], &[1, 1]), "(i / 8)");
        assert_eq!(offset(&[4, 8], "i", &[1, 8], &[8, 1]), "(i % 8)");
        assert_eq!(offset(&[4, 8], "i", &[4, 8], &[1, 4]), "(i / 8) + (i % 8) * 4");
        assert_eq!(offset(&[2, 3, 4], "i", &[2, 3, 4], &[1, 2, 6]), "(i / 12) + ((i / 4) % 3) * 2 + (i % 4) * 6");
        assert_eq!(flit(1.5), "1.5e0f");
        assert_eq!(flit(-0.25), "-2.5e-1f");
    }

    #[test]
    fn every_registry_op_calls_a_device_function_the_runtime_header_defines() {
        let header = crate::runtime::Part::Common.text();
        for d in mirage_ugraph::UNARY_OPS {
            assert_eq!(unary_expr(&d.op, "v"), format!("{}(v)", d.cuda), "{}", d.name);
            let f =
                d.cuda.strip_prefix("mi::").unwrap_or_else(|| panic!("{}: {} is not in namespace mi", d.name, d.cuda));
            let def = format!("__device__ __forceinline__ float {f}(float x)");
            assert!(header.contains(&def), "the runtime header lacks `{def}` for {}", d.name);
        }
    }

    #[test]
    fn every_binary_op_is_an_operator_or_a_device_function_the_runtime_header_defines() {
        let header = crate::runtime::Part::Common.text();
        for d in mirage_ugraph::BINARY_OPS {
            match d.cuda {
                mirage_ugraph::BinaryCuda::Infix(op) => {
                    assert_eq!(binary_expr(d.op, "a", "b"), format!("(a {op} b)"), "{}", d.name);
                    assert!(["+", "-", "*", "/"].contains(&op), "{}: `{op}` is not a C++ float operator", d.name);
                }
                mirage_ugraph::BinaryCuda::Call(f) => {
                    assert_eq!(binary_expr(d.op, "a", "b"), format!("{f}(a, b)"), "{}", d.name);
                    let f = f.strip_prefix("mi::").unwrap_or_else(|| panic!("{}: {f} is not in namespace mi", d.name));
                    let def = format!("__device__ __forceinline__ float {f}(float a, float b)");
                    assert!(header.contains(&def), "the runtime header lacks `{def}` for {}", d.name);
                }
            }
        }
    }
}
