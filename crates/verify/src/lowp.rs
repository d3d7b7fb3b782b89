//! Simulated low-precision float domains for the numerical cross-check: [`Half`] and [`BHalf`]
//! compute each op in f32 and round its result to fp16 / bf16 (round to nearest even, overflow
//! to infinity, fp16 subnormals), as a kernel that keeps every tile in 16 bits would; running
//! sums of reductions and accumulators (`add_acc`, `mul_acc`) stay in f32, as GPU kernels
//! accumulate (tensor-core matmuls, fp32 accumulators).

use mirage_ugraph::{DType, Scalar};

/// Rounds an f32 to the nearest fp16 value (ties to even), returned as f32.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 6.103_515_6e-5 {
        // fp16 subnormal range: multiples of 2^-24.
        const S: f32 = 16_777_216.0;
        return (x * S).round_ties_even() / S;
    }
    let b = x.to_bits();
    let r = f32::from_bits(b.wrapping_add(0xfff + ((b >> 13) & 1)) & !0x1fff);
    if r.abs() > 65504.0 {
        return f32::INFINITY.copysign(x);
    }
    r
}

/// Rounds an f32 to the nearest bf16 value (ties to even), returned as f32.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

/// Rounds an f32 to the precision of `dtype`.
#[inline]
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::Float16 => round_f16(x),
        DType::Bfloat16 => round_bf16(x),
        DType::Float32 => x,
    }
}

macro_rules! lowp_scalar {
    ($name:ident, $round:path, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
        pub struct $name(pub f32);

        impl $name {
            #[inline(always)]
            fn r(x: f32) -> Self {
                $name($round(x))
            }
        }

        impl Scalar for $name {
            #[inline(always)]
            fn zero() -> Self {
                $name(0.0)
            }
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                Self::r(x)
            }
            #[inline(always)]
            fn from_count(n: usize) -> Self {
                Self::r(n as f32)
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                Self::r(self.0 + o.0)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                Self::r(self.0 - o.0)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                Self::r(self.0 * o.0)
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                Self::r(self.0 / o.0)
            }
            #[inline(always)]
            fn pow(self, o: Self) -> Self {
                Self::r(self.0.powf(o.0))
            }
            #[inline(always)]
            fn exp(self) -> Self {
                Self::r(self.0.exp())
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                Self::r(self.0.sqrt())
            }
            #[inline(always)]
            fn silu(self) -> Self {
                Self::r(self.0 / (1.0 + (-self.0).exp()))
            }
            #[inline(always)]
            fn gelu(self) -> Self {
                Self::r(0.5 * self.0 * (1.0 + libm::erff(self.0 * std::f32::consts::FRAC_1_SQRT_2)))
            }
            #[inline(always)]
            fn relu(self) -> Self {
                Self::r(self.0.max(0.0))
            }
            #[inline(always)]
            fn clamp(self, lo: f32, hi: f32) -> Self {
                Self::r(self.0.max(lo).min(hi))
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                Self::r(self.0.max(o.0))
            }
            #[inline(always)]
            fn float_or(self, float: fn(f64) -> f64, _exact: impl Fn(Self) -> Self) -> Self {
                Self::r(float(self.0 as f64) as f32)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self.0 as f64
            }
            #[inline(always)]
            fn add_acc(self, x: Self) -> Self {
                $name(self.0 + x.0)
            }
            #[inline(always)]
            fn mul_acc(self, a: Self, b: Self) -> Self {
                $name(self.0 + a.0 * b.0)
            }
        }
    };
}

lowp_scalar!(Half, round_f16, "An fp16 value held in an f32; every op result is rounded to fp16.");
lowp_scalar!(BHalf, round_bf16, "A bf16 value held in an f32; every op result is rounded to bf16.");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_rounding_matches_ieee() {
        assert_eq!(round_f16(1.0), 1.0);
        assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0); // tie -> even
        assert_eq!(round_f16(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9)); // tie -> even (up)
        assert_eq!(round_f16(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 1.0 + 2f32.powi(-10));
        assert_eq!(round_f16(65504.0), 65504.0);
        assert_eq!(round_f16(65519.0), 65504.0);
        assert_eq!(round_f16(65520.0), f32::INFINITY);
        assert_eq!(round_f16(-1e6), f32::NEG_INFINITY);
        assert_eq!(round_f16(2f32.powi(-24)), 2f32.powi(-24));
        assert_eq!(round_f16(2f32.powi(-26)), 0.0);
        assert_eq!(round_f16(3.0 * 2f32.powi(-25)), 2f32.powi(-23)); // 1.5 quanta -> 2 (even)
        assert!(round_f16(f32::NAN).is_nan());
        assert_eq!(round_f16(0.1), 0.099_975_586);
    }

    #[test]
    fn bf16_rounding_matches_ieee() {
        assert_eq!(round_bf16(1.0), 1.0);
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(0.1), 0.100_097_656);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
    }

    #[test]
    fn half_overflows_like_fp16() {
        assert_eq!(Half(12.0).exp().0, f32::INFINITY);
        assert_eq!(Half(10.0).exp().0, round_f16(10f32.exp()));
        assert!(BHalf(12.0).exp().0.is_finite());
    }
}
