//! The false-accept bound of the paper's theorem and the number of trials it asks for.
//!
//! For LAX programs of degree `d` with `k` exponentials, one random test (inputs uniform in
//! `Z_P x Z_Q`, `w` a random element of order `Q`) accepts a non-equivalent output element with
//! probability at most
//!
//! ```text
//! b(d, k) = 8 d k^4 / Q + Q^(-1 / k^2)        (k taken >= 1)
//! ```
//!
//! and `t` independent trials with at most `b^t`. The default trial count is the smallest `t`
//! with `b^t < 1e-9` ([`trials_for`]). `d` and `k` come from [`crate::lax`]. What the bound
//! covers and what it does not is spelled out in the crate docs: per compared element under
//! sampled coverage, for the whole candidate under every-element coverage.

use crate::field::Q;

/// Per-trial false-accept probability bound `min(1, 8 d k^4 / Q + Q^(-1/k^2))`, `k >= 1`.
pub fn per_trial(d: u64, k: usize) -> f64 {
    let k = k.max(1) as f64;
    let q = Q as f64;
    (8.0 * d as f64 * k.powi(4) / q + q.powf(-1.0 / (k * k))).min(1.0)
}

/// Smallest number of trials `t >= 1` with `b^t < target`, at most `max`.
pub fn trials_for(b: f64, target: f64, max: usize) -> usize {
    if b <= 0.0 {
        return 1;
    }
    if b >= 1.0 {
        return max.max(1);
    }
    let t = (target.ln() / b.ln()).floor() as usize + 1;
    t.clamp(1, max.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_and_trials() {
        // No exponentials: about 8 d / Q + 1 / Q.
        let b = per_trial(10_000, 0);
        assert!(b > 7e-5 && b < 8e-5, "{b}");
        assert_eq!(trials_for(b, 1e-9, 64), 3);
        // Two exponentials: Q^(-1/4) ~ 2^-7.5 dominates.
        let b = per_trial(10, 2);
        assert!(b > 0.005 && b < 0.006, "{b}");
        let t = trials_for(b, 1e-9, 64);
        assert!(b.powi(t as i32) < 1e-9 && b.powi(t as i32 - 1) >= 1e-9);
        assert_eq!(trials_for(1.0, 1e-9, 64), 64);
        assert_eq!(per_trial(u64::MAX, 3), 1.0);
    }
}
