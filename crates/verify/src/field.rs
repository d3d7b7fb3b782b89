//! The finite-field domain of LAX programs (docs/reference.md, "Verification").
//!
//! Values outside exponents live in `Z_P`, values inside exponents in `Z_Q`, with `P = 2Q + 1` a
//! safe prime, `Q ≡ 3 (mod 4)` (so `P ≡ 7 (mod 8)`: both are `3 (mod 4)` and square roots are a
//! single power), `P < 2^31` so every product of two residues fits a `u64`. An element [`Fp`]
//! carries both residues and the trial's generator `w` (an element of order `Q` in `Z_P^*`):
//! `exp(x) = (w^(x mod Q) mod P, poison)`. The exponent residue of an `exp` result is undefined
//! (`w^x mod P` has no consistent residue mod `Q`); it is marked [`POISON`], which every
//! operation propagates. LAX programs never feed an `exp` result into another `exp`
//! ([`crate::lax`] checks that statically), so a poisoned residue is never read by a LAX graph.
//!
//! Why `w` lives in the element: the interpreter's [`Scalar`] methods take no context, run on
//! rayon worker threads, and several verifications may run at once (tests, a parallel search).
//! A thread-local or global `w` would race; 4 bytes per element do not. Inputs carry the
//! trial's `w` and every operation passes it on (`max` of the operands' `w`: constants carry 0).
//! Per-thread caches (exp tables keyed by `w`, the last inverse, the last converted constant)
//! make `exp`, `div` and `mul_scalar` cheap without shared state.
//!
//! Meanings: `+ - *` componentwise; `/` by Fermat inverses (`inv(0) = 0`); `sqrt(x) =
//! x^((P+1)/4)` (and `^((Q+1)/4)` on the exponent side), a multiplicative map with `sqrt(x)^2 =
//! ±x`; `silu(x) = x / (1 + exp(-x))`; registry ops with a float meaning and an algebraic form
//! (`Scalar::float_or`, e.g. `tanh(x) = (e^2x - 1) / (e^2x + 1)`) take the form. Ops without an
//! algebraic meaning are deterministic uninterpreted functions: `max` is the maximum under a pseudo-random total order of the field
//! (keyed by `w`, so commutative, associative and idempotent like a real max), `relu(x) =
//! max(x, 0)` and `clamp(x, lo, hi) = min(max(x, lo), hi)` under that order, `gelu` and `pow`
//! keyed hashes. Every finite `f32` constant is a dyadic rational `m * 2^e` and maps exactly.

use std::cell::{Cell, RefCell};

use mirage_ugraph::Scalar;

/// The outer prime: `P = 2Q + 1`, the largest safe prime below `2^31` with `Q ≡ 3 (mod 4)`.
pub const P: u64 = 2_147_481_143;
/// The exponent prime: `Q = (P - 1) / 2`, `Q ≡ 3 (mod 4)`.
pub const Q: u64 = 1_073_740_571;
/// Marks an undefined exponent residue (the `q` part of an `exp` result); never a valid residue.
pub const POISON: u32 = u32::MAX;
/// Generator used only by an `exp` of a pure constant (no graph input below it, so no trial `w`).
const DEFAULT_W: u32 = 4;

/// An element of the LAX domain: a residue mod [`P`], a residue mod [`Q`] (or [`POISON`]) and
/// the trial's generator `w` (0 for constants). Build elements with [`Fp::new`], which reduces;
/// arithmetic assumes reduced residues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fp {
    /// Value mod `P` (the value outside exponents; this is what outputs are compared on).
    pub p: u32,
    /// Value mod `Q` (the exponent domain), or [`POISON`].
    pub q: u32,
    /// The trial's generator of the order-`Q` subgroup of `Z_P^*`; 0 for constants.
    pub w: u32,
}

#[inline(always)]
fn mulmod_p(a: u32, b: u32) -> u32 {
    (a as u64 * b as u64 % P) as u32
}

#[inline(always)]
fn mulmod_q(a: u32, b: u32) -> u32 {
    (a as u64 * b as u64 % Q) as u32
}

#[inline(always)]
fn addmod(a: u32, b: u32, m: u64) -> u32 {
    let s = a as u64 + b as u64;
    (if s >= m { s - m } else { s }) as u32
}

#[inline(always)]
fn submod(a: u32, b: u32, m: u64) -> u32 {
    let (a, b) = (a as u64, b as u64);
    (if a >= b { a - b } else { a + m - b }) as u32
}

/// `b^e mod m` by square-and-multiply.
pub fn powmod(b: u64, mut e: u64, m: u64) -> u64 {
    let mut r = 1 % m;
    let mut b = b % m;
    while e > 0 {
        if e & 1 == 1 {
            r = (r as u128 * b as u128 % m as u128) as u64;
        }
        b = (b as u128 * b as u128 % m as u128) as u64;
        e >>= 1;
    }
    r
}

/// `b^e mod P` with the constant-modulus multiply (no 128-bit division).
#[inline]
fn pow_p(b: u32, mut e: u64) -> u32 {
    let (mut r, mut b) = (1u32, b);
    while e > 0 {
        if e & 1 == 1 {
            r = mulmod_p(r, b);
        }
        b = mulmod_p(b, b);
        e >>= 1;
    }
    r
}

/// `b^e mod Q` with the constant-modulus multiply.
#[inline]
fn pow_q(b: u32, mut e: u64) -> u32 {
    let (mut r, mut b) = (1u32, b);
    while e > 0 {
        if e & 1 == 1 {
            r = mulmod_q(r, b);
        }
        b = mulmod_q(b, b);
        e >>= 1;
    }
    r
}

/// Deterministic Miller-Rabin, exact for every `n < 3.3 * 10^24` (so every `u64`).
pub fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    for &b in &BASES {
        if n.is_multiple_of(b) {
            return n == b;
        }
    }
    let (mut d, mut s) = (n - 1, 0);
    while d % 2 == 0 {
        d /= 2;
        s += 1;
    }
    'witness: for &a in &BASES {
        let mut x = powmod(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = (x as u128 * x as u128 % n as u128) as u64;
            if x == n - 1 {
                continue 'witness;
            }
        }
        return false;
    }
    true
}

/// The SplitMix64 finalizer: a bijective 64-bit mixer (the counter-based RNG of this crate).
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of a sequence of words (order-sensitive).
#[inline(always)]
pub fn hash_words(words: &[u64]) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c909u64;
    for &w in words {
        h = mix64(h ^ w.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    h
}

/// Maps 32 random bits to `[0, m)` by multiply-shift (bias below `2^-31`).
#[inline(always)]
pub fn reduce32(bits: u64, m: u64) -> u32 {
    (((bits & 0xffff_ffff) * m) >> 32) as u32
}

/// Exponent tables for one `w`: `w^x = T0[x & 1023] * T1[(x >> 10) & 1023] * T2[x >> 20]`.
struct ExpTable {
    w: u32,
    t: [[u32; 1024]; 3],
}

impl ExpTable {
    fn new(w: u32) -> Box<ExpTable> {
        let mut t = Box::new(ExpTable { w, t: [[0; 1024]; 3] });
        let mut base = w;
        for level in 0..3 {
            let mut acc = 1u32;
            for i in 0..1024 {
                t.t[level][i] = acc;
                acc = mulmod_p(acc, base);
            }
            base = acc; // base^1024
        }
        t
    }

    #[inline(always)]
    fn pow(&self, x: u32) -> u32 {
        let x = x as usize;
        let a = mulmod_p(self.t[0][x & 1023], self.t[1][(x >> 10) & 1023]);
        mulmod_p(a, self.t[2][x >> 20])
    }
}

thread_local! {
    static EXP: RefCell<Option<Box<ExpTable>>> = const { RefCell::new(None) };
    static INV_P: Cell<(u32, u32)> = const { Cell::new((1, 1)) };
    static INV_Q: Cell<(u32, u32)> = const { Cell::new((1, 1)) };
    static CONST: Cell<(u32, Fp)> = const { Cell::new((0, Fp { p: 0, q: 0, w: 0 })) };
}

/// `w^x mod P` through this thread's table for `w` (rebuilt, ~3k multiplications, when `w` changes).
#[inline]
fn exp_w(w: u32, x: u32) -> u32 {
    EXP.with(|cell| {
        let mut slot = cell.borrow_mut();
        match slot.as_ref() {
            Some(t) if t.w == w => t.pow(x),
            _ => {
                let t = ExpTable::new(w);
                let r = t.pow(x);
                *slot = Some(t);
                r
            }
        }
    })
}

/// Inverse mod `P` (0 for 0), with a one-entry per-thread cache (rows divide by one value).
#[inline]
fn inv_p(a: u32) -> u32 {
    INV_P.with(|c| {
        let (k, v) = c.get();
        if k == a {
            return v;
        }
        let v = pow_p(a, P - 2);
        c.set((a, v));
        v
    })
}

/// Inverse mod `Q` (0 for 0, poison for poison), cached like [`inv_p`].
#[inline]
fn inv_q(a: u32) -> u32 {
    if a == POISON {
        return POISON;
    }
    INV_Q.with(|c| {
        let (k, v) = c.get();
        if k == a {
            return v;
        }
        let v = pow_q(a, Q - 2);
        c.set((a, v));
        v
    })
}

#[inline(always)]
fn qop(a: u32, b: u32, f: impl Fn(u32, u32) -> u32) -> u32 {
    if a == POISON || b == POISON {
        POISON
    } else {
        f(a, b)
    }
}

/// Op tags keying the uninterpreted functions.
const TAG_GELU: u64 = 0x6765_6c75;
const TAG_POW: u64 = 0x0070_6f77;
const TAG_ORDER: u64 = 0x006f_7264_6572;
const TAG_NONFINITE: u64 = 0x006e_616e;
const TAG_NESTED_EXP: u64 = 0x6e65_7374;

impl Fp {
    /// An element from its residues (reduced here) and a generator.
    pub fn new(p: u64, q: u64, w: u32) -> Fp {
        Fp { p: (p % P) as u32, q: (q % Q) as u32, w }
    }

    /// A fresh generator of the order-`Q` subgroup from 64 random bits: `r^2` for `r` in
    /// `[2, P - 2]`; every square other than 1 has order `Q` because `P - 1 = 2Q`.
    pub fn generator(bits: u64) -> u32 {
        let r = 2 + bits % (P - 3);
        mulmod_p(r as u32, r as u32)
    }

    /// Whether the exponent residue is undefined.
    pub fn is_poisoned(self) -> bool {
        self.q == POISON
    }

    #[inline(always)]
    fn ctx(self, o: Fp) -> u32 {
        self.w.max(o.w)
    }

    /// A keyed hash of this element (both residues) mapped to an element: an uninterpreted
    /// function of the value.
    fn uninterpreted(tag: u64, args: &[Fp], w: u32) -> Fp {
        let mut words = Vec::with_capacity(2 + 2 * args.len());
        words.push(tag);
        words.push(w as u64);
        for a in args {
            words.push(((a.p as u64) << 32) | a.q as u64);
        }
        let h = hash_words(&words);
        let h2 = mix64(h);
        Fp { p: reduce32(h, P), q: reduce32(h2, Q), w }
    }

    /// The key of the pseudo-random total order behind `max` (fresh per trial through `w`).
    #[inline]
    fn order_key(self, w: u32) -> u64 {
        hash_words(&[TAG_ORDER, w as u64, ((self.p as u64) << 32) | self.q as u64])
    }

    /// The order's minimum (used by `clamp`).
    fn min_by_order(self, o: Fp) -> Fp {
        let w = self.ctx(o);
        let (ka, kb) = (self.order_key(w), o.order_key(w));
        let mut r = if (ka, self.p, self.q) <= (kb, o.p, o.q) { self } else { o };
        r.w = w;
        r
    }

    /// `2^e` mod `m` for any integer `e` (negative: powers of the inverse of 2).
    fn pow2(e: i32, m: u64) -> u64 {
        if e >= 0 {
            powmod(2, e as u64, m)
        } else {
            powmod(m.div_ceil(2), (-e) as u64, m) // (m + 1) / 2 is the inverse of 2
        }
    }

    /// Exact field image of a finite `f32` (a dyadic rational); a keyed constant otherwise.
    fn convert_f32(x: f32) -> Fp {
        if !x.is_finite() {
            return Fp::uninterpreted(TAG_NONFINITE, &[Fp { p: x.to_bits(), q: 0, w: 0 }], 0);
        }
        let bits = x.to_bits();
        let neg = bits >> 31 == 1;
        let exp = ((bits >> 23) & 0xff) as i32;
        let frac = (bits & 0x7f_ffff) as u64;
        // value = m * 2^e exactly.
        let (m, e) = if exp == 0 { (frac, -149) } else { (frac | 0x80_0000, exp - 150) };
        let side = |modulus: u64| -> u32 {
            let v = (m % modulus) * Fp::pow2(e, modulus) % modulus;
            (if neg && v != 0 { modulus - v } else { v }) as u32
        };
        Fp { p: side(P), q: side(Q), w: 0 }
    }
}

impl Scalar for Fp {
    #[inline(always)]
    fn zero() -> Self {
        Fp { p: 0, q: 0, w: 0 }
    }

    #[inline]
    fn from_f32(x: f32) -> Self {
        CONST.with(|c| {
            let (k, v) = c.get();
            if k == x.to_bits() {
                return v;
            }
            let v = Fp::convert_f32(x);
            c.set((x.to_bits(), v));
            v
        })
    }

    #[inline]
    fn from_count(n: usize) -> Self {
        Fp { p: (n as u64 % P) as u32, q: (n as u64 % Q) as u32, w: 0 }
    }

    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Fp { p: addmod(self.p, o.p, P), q: qop(self.q, o.q, |a, b| addmod(a, b, Q)), w: self.ctx(o) }
    }

    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Fp { p: submod(self.p, o.p, P), q: qop(self.q, o.q, |a, b| submod(a, b, Q)), w: self.ctx(o) }
    }

    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Fp { p: mulmod_p(self.p, o.p), q: qop(self.q, o.q, mulmod_q), w: self.ctx(o) }
    }

    /// The sums of products kept below `P^2` (and `Q^2`) by one conditional subtraction a
    /// term, reduced once per element (exact, so equal to the default's term-by-term sums).
    fn matmul_row(c: &mut [Self], a: &[Self], b: &[Self]) {
        crate::fmatmul::row_by_elements(c, a, b)
    }

    /// As [`Scalar::matmul_row`] per row, `b` split into residue planes once for all rows.
    fn matmul_rows(c: &mut [Self], a: &[Self], b: &[Self], k: usize) {
        crate::fmatmul::matmul_rows(c, a, b, k)
    }

    /// As [`Scalar::matmul_rows`] over a block of `b`'s columns, its planes made from those
    /// columns only.
    fn matmul_cols(c: &mut [Self], a: &[Self], b: &[Self], k: usize, ldb: usize, j0: usize) {
        crate::fmatmul::matmul_cols(c, a, b, k, ldb, j0)
    }

    #[inline]
    fn div(self, o: Self) -> Self {
        Fp { p: mulmod_p(self.p, inv_p(o.p)), q: qop(self.q, inv_q(o.q), mulmod_q), w: self.ctx(o) }
    }

    fn pow(self, o: Self) -> Self {
        Fp::uninterpreted(TAG_POW, &[self, o], self.ctx(o))
    }

    #[inline]
    fn exp(self) -> Self {
        let w = if self.w == 0 { DEFAULT_W } else { self.w };
        let x = if self.q == POISON {
            // Only non-LAX graphs (an exp inside an exp) get here: an uninterpreted exponent.
            Fp::uninterpreted(TAG_NESTED_EXP, &[self], self.w).q
        } else if self.q as u64 >= Q {
            (self.q as u64 % Q) as u32 // a hand-built element with an unreduced residue
        } else {
            self.q
        };
        Fp { p: exp_w(w, x), q: POISON, w: self.w }
    }

    fn sqrt(self) -> Self {
        let p = pow_p(self.p, P.div_ceil(4));
        let q = if self.q == POISON { POISON } else { pow_q(self.q, Q.div_ceil(4)) };
        Fp { p, q, w: self.w }
    }

    #[inline]
    fn silu(self) -> Self {
        let one = Fp { p: 1, q: 1, w: self.w };
        self.div(one.add(Fp::zero().sub(self).exp()))
    }

    fn gelu(self) -> Self {
        Fp::uninterpreted(TAG_GELU, &[self], self.w)
    }

    fn relu(self) -> Self {
        self.max(Fp::zero())
    }

    fn clamp(self, lo: f32, hi: f32) -> Self {
        self.max(Fp::from_f32(lo)).min_by_order(Fp::from_f32(hi))
    }

    #[inline]
    fn max(self, o: Self) -> Self {
        let w = self.ctx(o);
        let (ka, kb) = (self.order_key(w), o.order_key(w));
        let mut r = if (ka, self.p, self.q) >= (kb, o.p, o.q) { self } else { o };
        r.w = w;
        r
    }

    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.p as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_row_equals_term_by_term_sums() {
        // Residues near the top of each field (sums wrap many times), a poisoned exponent
        // residue in one row of b and one element of a, constants (w = 0) beside trial values.
        let (k, n) = (37, 11);
        let at = |i: u64| hash_words(&[i, 0x6d6d]);
        let elem = |i: u64| {
            let h = at(i);
            let (p, q) = if h % 3 == 0 { (P - 1 - h % 5, Q - 1 - h % 7) } else { (h >> 8, h >> 20) };
            Fp::new(p, q, if h % 4 == 0 { 0 } else { 77 })
        };
        for poison_a in [false, true] {
            let mut a: Vec<Fp> = (0..k as u64).map(elem).collect();
            let mut b: Vec<Fp> = (0..(k * n) as u64).map(|i| elem(i + 1000)).collect();
            b[5 * n + 3].q = POISON;
            if poison_a {
                a[9].q = POISON;
            }
            let c0: Vec<Fp> = (0..n as u64).map(|i| elem(i + 9000)).collect();
            let mut fast = c0.clone();
            Fp::matmul_row(&mut fast, &a, &b);
            let mut slow = c0.clone();
            for (kk, &av) in a.iter().enumerate() {
                for (j, cv) in slow.iter_mut().enumerate() {
                    *cv = cv.add(av.mul(b[kk * n + j]));
                }
            }
            assert_eq!(fast, slow, "poisoned a: {poison_a}");
        }
    }

    #[test]
    fn primes_are_safe_and_three_mod_four() {
        assert!(is_prime(P), "P is prime");
        assert!(is_prime(Q), "Q is prime");
        assert_eq!(P, 2 * Q + 1);
        assert_eq!(Q % 4, 3);
        assert_eq!(P % 4, 3);
        const { assert!(P < 1 << 31) };
        // No larger safe prime with Q ≡ 3 (mod 4) below 2^31.
        let mut p = P + 2;
        while p < 1 << 31 {
            assert!(!(is_prime(p) && is_prime((p - 1) / 2) && ((p - 1) / 2) % 4 == 3), "{p}");
            p += 2;
        }
        assert!(!is_prime(1) && is_prime(2) && !is_prime(561) && !is_prime(3_215_031_751));
    }

    fn el(p: u64, q: u64) -> Fp {
        Fp::new(p, q, Fp::generator(12345))
    }

    #[test]
    fn arithmetic_is_componentwise() {
        let (a, b) = (el(P - 1, Q - 1), el(5, 7));
        assert_eq!(a.add(b), el(4, 6));
        assert_eq!(b.sub(a), el(6, 8));
        assert_eq!(a.mul(b), el(P - 5, Q - 7));
        let c = a.div(b);
        assert_eq!(c.mul(b), a);
        assert_eq!(Fp::zero().div(Fp::zero()).p, 0);
    }

    #[test]
    fn exp_is_a_homomorphism_into_the_order_q_subgroup() {
        let w = Fp::generator(99);
        assert_ne!(w, 1);
        assert_eq!(powmod(w as u64, Q, P), 1);
        let (a, b) = (Fp::new(123_456, 987_654_321, w), Fp::new(55, 1_000_000_007, w));
        assert_eq!(a.add(b).exp(), Fp { w, ..a.exp().mul(b.exp()) });
        assert_eq!(a.exp().p as u64, powmod(w as u64, a.q as u64, P));
        assert_eq!(pow_p(a.p, 12345) as u64, powmod(a.p as u64, 12345, P));
        assert_eq!(pow_q(a.q, Q - 2) as u64, powmod(a.q as u64, Q - 2, Q));
        assert!(a.exp().is_poisoned());
        assert!(a.exp().add(b).is_poisoned());
        let t = ExpTable::new(w);
        for x in [0u32, 1, 1023, 1024, 1 << 20, (Q - 1) as u32] {
            assert_eq!(t.pow(x) as u64, powmod(w as u64, x as u64, P));
        }
    }

    #[test]
    fn sqrt_is_a_multiplicative_square_root_up_to_sign() {
        let a = el(1_234_567, 7_654_321);
        let s = a.sqrt();
        let sq = s.mul(s);
        assert!(sq.p == a.p || sq.p as u64 == P - a.p as u64);
        let b = el(42, 43);
        assert_eq!(a.mul(b).sqrt(), a.sqrt().mul(b.sqrt()));
        let four = Fp::from_count(4);
        assert_eq!(four.mul(four).sqrt().p, 4); // 4 is a square, so sqrt(16) = 4 * legendre(4) = 4
    }

    #[test]
    fn f32_constants_are_exact_dyadics() {
        let half = Fp::from_f32(0.5);
        assert_eq!(half.mul(Fp::from_count(2)), Fp::from_count(1));
        assert_eq!(Fp::from_f32(-3.0), Fp::zero().sub(Fp::from_count(3)));
        assert_eq!(Fp::from_f32(0.125).mul(Fp::from_count(8)), Fp::from_count(1));
        let tiny = Fp::from_f32(f32::from_bits(1)); // 2^-149
        assert_eq!(tiny.mul(Fp::new(Fp::pow2(149, P), Fp::pow2(149, Q), 0)), Fp::from_count(1));
        assert_eq!(Fp::from_f32(0.0), Fp::zero());
        assert_eq!(Fp::from_f32(1.5), Fp::from_f32(1.5));
        assert_ne!(Fp::from_f32(f32::INFINITY), Fp::from_f32(f32::NEG_INFINITY));
    }

    #[test]
    fn max_is_an_order_max() {
        let xs: Vec<Fp> = (0..20).map(|i| el(i * 7919 + 3, i * 104_729 + 1)).collect();
        for &a in &xs {
            assert_eq!(a.max(a), a);
            for &b in &xs {
                assert_eq!(a.max(b), b.max(a));
                for &c in &xs {
                    assert_eq!(a.max(b).max(c), a.max(b.max(c)));
                }
            }
            assert_eq!(a.relu(), a.max(Fp::zero()));
            let c = a.clamp(-1.0, 2.0);
            assert!(c == a || c.p == Fp::from_f32(-1.0).p || c.p == Fp::from_f32(2.0).p);
        }
    }

    #[test]
    fn silu_matches_its_definition_and_uninterpreted_ops_are_functions() {
        let a = el(77, 88);
        let one = Fp::from_count(1);
        assert_eq!(a.silu().p, a.div(one.add(Fp::zero().sub(a).exp())).p);
        assert_eq!(a.gelu(), a.gelu());
        assert_ne!(a.gelu(), el(78, 88).gelu());
        assert_eq!(a.pow(one), a.pow(one));
    }
}
