//! The scalar domain the interpreter computes in: `f32` for CPU runs; the verifier adds a
//! finite-field element. Every op's meaning in a domain is one method here.

/// Arithmetic an interpreter domain provides. Ops with no algebraic meaning (`relu`, `clamp`,
/// `max`) may be deterministic uninterpreted functions in a non-float domain.
pub trait Scalar: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Additive identity.
    fn zero() -> Self;
    /// Converts a constant of the graph (scalar factor, clamp bound). Every finite `f32` is a
    /// dyadic rational, so a field domain can represent it exactly.
    fn from_f32(x: f32) -> Self;
    /// Converts an element count (the divisor of a mean).
    fn from_count(n: usize) -> Self;
    /// `a + b`.
    fn add(self, o: Self) -> Self;
    /// `a - b`.
    fn sub(self, o: Self) -> Self;
    /// `a * b`.
    fn mul(self, o: Self) -> Self;
    /// `a / b`.
    fn div(self, o: Self) -> Self;
    /// `a ^ b`.
    fn pow(self, o: Self) -> Self;
    /// `e ^ a`.
    fn exp(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `a * sigmoid(a)`.
    fn silu(self) -> Self;
    /// `a * Phi(a)` (the erf form, as torch's default).
    fn gelu(self) -> Self;
    /// `max(a, 0)` (a float NaN stays NaN).
    fn relu(self) -> Self;
    /// `min(max(a, lo), hi)` (a float NaN stays NaN).
    fn clamp(self, lo: f32, hi: f32) -> Self;
    /// Larger of two values.
    fn max(self, o: Self) -> Self;
    /// An op with a float meaning `float` and an algebraic one `exact` built from the other
    /// methods (the same function over the reals): float domains evaluate `float` in f64 and
    /// round; other domains (the verifier's field) evaluate `exact`.
    #[inline(always)]
    fn float_or(self, float: fn(f64) -> f64, exact: impl Fn(Self) -> Self) -> Self {
        let _ = float;
        exact(self)
    }
    /// Widens to f64 for reporting (a field domain returns its canonical representative).
    fn to_f64(self) -> f64;
    /// `acc + x` inside a reduction (sums, accumulators). A simulated low-precision domain
    /// keeps the running sum in f32 here, as GPU kernels do.
    #[inline(always)]
    fn add_acc(self, x: Self) -> Self {
        self.add(x)
    }
    /// `acc + a * b` inside a reduction (matmul, sums of squares); see [`Scalar::add_acc`].
    #[inline(always)]
    fn mul_acc(self, a: Self, b: Self) -> Self {
        self.add(a.mul(b))
    }
    /// One output row of a matmul: `c[j] = c[j] + sum_kk a[kk] * b[kk * n + j]` with
    /// `n = c.len()`, summed in `kk` order by [`Scalar::mul_acc`]. A field domain, whose sums
    /// do not depend on their order, overrides it to reduce once per element.
    #[inline]
    fn matmul_row(c: &mut [Self], a: &[Self], b: &[Self]) {
        row_cols(c, a, b, c.len(), 0);
    }
    /// Output rows of a matmul sharing one right operand `b` (`k x n`): for each row `i` of
    /// `c` (`c.len() / n` rows), `c[i] += a[i] b` as [`Scalar::matmul_row`] with `a[i]` the
    /// `k` elements at `a[i * k..]`. A domain may override it to prepare `b` once for all rows.
    #[inline]
    fn matmul_rows(c: &mut [Self], a: &[Self], b: &[Self], k: usize) {
        let n = b.len().checked_div(k).unwrap_or(0);
        if n == 0 {
            return;
        }
        for (crow, arow) in c.chunks_mut(n).zip(a.chunks(k)) {
            Self::matmul_row(crow, arow, b);
        }
    }
    /// Columns `j0..j0 + w` of [`Scalar::matmul_rows`], `b` read in place with its `k` rows
    /// `ldb` apart: `c` holds `a.len() / k` rows of `w = c.len() / rows` elements and gets
    /// `c[i] += a[i] b[.., j0..j0 + w]`, summed in `kk` order by [`Scalar::mul_acc`].
    #[inline]
    fn matmul_cols(c: &mut [Self], a: &[Self], b: &[Self], k: usize, ldb: usize, j0: usize) {
        let rows = a.len().checked_div(k).unwrap_or(0);
        let w = c.len().checked_div(rows).unwrap_or(0);
        for (crow, arow) in c.chunks_mut(w.max(1)).zip(a.chunks(k.max(1))) {
            row_cols(crow, arow, b, ldb, j0);
        }
    }
}

/// One output row over columns `j0..j0 + c.len()` of `b`, whose rows are `ldb` apart:
/// `c[j] += sum_kk a[kk] * b[kk * ldb + j0 + j]`, summed in `kk` order by [`Scalar::mul_acc`].
#[inline]
fn row_cols<S: Scalar>(c: &mut [S], a: &[S], b: &[S], ldb: usize, j0: usize) {
    let w = c.len();
    for (kk, &av) in a.iter().enumerate() {
        for (cv, &bv) in c.iter_mut().zip(&b[kk * ldb + j0..kk * ldb + j0 + w]) {
            *cv = cv.mul_acc(av, bv);
        }
    }
}

/// Float domains: IEEE arithmetic, `gelu` in its erf form.
macro_rules! float_scalar {
    ($t:ty, $erf:path) => {
        impl Scalar for $t {
            #[inline(always)]
            fn zero() -> Self {
                0.0
            }
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                x as $t
            }
            #[inline(always)]
            fn from_count(n: usize) -> Self {
                n as $t
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn pow(self, o: Self) -> Self {
                self.powf(o)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn silu(self) -> Self {
                self / (1.0 + <$t>::exp(-self))
            }
            #[inline(always)]
            fn gelu(self) -> Self {
                0.5 * self * (1.0 + $erf(self / (2.0 as $t).sqrt()))
            }
            #[inline(always)]
            fn relu(self) -> Self {
                // NaN stays NaN, as in torch.
                if self > 0.0 || self.is_nan() {
                    self
                } else {
                    0.0
                }
            }
            #[inline(always)]
            fn clamp(self, lo: f32, hi: f32) -> Self {
                // NaN stays NaN, as in torch (f32::max/min would return a bound).
                if self.is_nan() {
                    self
                } else {
                    self.max(lo as $t).min(hi as $t)
                }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            #[inline(always)]
            fn float_or(self, float: fn(f64) -> f64, _exact: impl Fn(Self) -> Self) -> Self {
                float(self as f64) as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}

float_scalar!(f32, libm::erff);
float_scalar!(f64, libm::erf);

#[cfg(test)]
mod tests {
    use super::Scalar;

    #[test]
    fn relu_and_clamp_keep_nan_as_torch_does() {
        assert!(Scalar::relu(f32::NAN).is_nan());
        assert!(Scalar::clamp(f32::NAN, -1.0, 1.0).is_nan());
        assert!(Scalar::relu(f64::NAN).is_nan());
        assert!(Scalar::clamp(f64::NAN, -1.0, 1.0).is_nan());
        assert_eq!(Scalar::relu(-2.0f32), 0.0);
        assert_eq!(Scalar::relu(3.0f32), 3.0);
        assert_eq!(Scalar::clamp(5.0f32, -1.0, 1.0), 1.0);
        assert_eq!(Scalar::clamp(f32::NEG_INFINITY, -1.0, 1.0), -1.0);
    }
}
