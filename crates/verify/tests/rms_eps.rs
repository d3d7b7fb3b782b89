//! The verifier models `rms_norm`'s epsilon: a fused form with the reference's epsilon is
//! accepted, one with another epsilon (or none) is refused.

use mirage_ugraph::zoo;
use mirage_ugraph::DType;
use mirage_verify::{equivalent, Options};

#[test]
fn equal_eps_is_accepted_and_a_different_eps_refused() {
    for dt in [DType::Float16, DType::Float32] {
        let eps = |e: f32| zoo::rmsnorm_linear_eps(4, 64, 128, 4, 4, dt, e).unwrap();
        let (a, b, none) = (eps(1e-5), eps(1e-6), eps(0.0));
        let opts = Options::default();
        let same = equivalent(&a.reference, &a.ugraph, &opts).unwrap();
        assert!(same.is_equivalent(), "{same:?}");
        for (name, other) in [("eps 1e-6", &b.ugraph), ("no eps", &none.ugraph)] {
            let v = equivalent(&a.reference, other, &opts).unwrap();
            assert!(!v.is_equivalent(), "{name} accepted against eps 1e-5: {v:?}");
        }
        let v = equivalent(&none.reference, &a.ugraph, &opts).unwrap();
        assert!(!v.is_equivalent(), "eps 1e-5 accepted against no eps: {v:?}");
    }
}
