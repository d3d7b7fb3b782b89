//! The paper's equivalent pairs (the zoo) are accepted, at small shapes and at the paper's.

use std::time::Instant;

use mirage_ugraph::zoo::{self, Attn, Pair};
use mirage_ugraph::DType;
use mirage_verify::{equivalent, Fragment, Numerics, Options, Verdict};

fn small_pairs(dt: DType) -> Vec<Pair> {
    let gqa = Attn { b: 2, h: 8, d: 16, s: 64, splits: 4, frange: 2, qsplit: 1 };
    let mha = Attn { b: 8, h: 2, d: 16, s: 64, splits: 2, frange: 4, qsplit: 1 };
    vec![
        zoo::rmsnorm_linear(4, 64, 128, 4, 4, dt).unwrap(),
        zoo::gated_mlp(4, 64, 128, 4, 4, dt).unwrap(),
        zoo::lora(4, 64, 128, 8, 4, 4, dt).unwrap(),
        zoo::attention(gqa, false, dt).unwrap(),
        zoo::attention(mha, false, dt).unwrap(),
        zoo::attention(gqa, true, dt).unwrap(),
        zoo::attention_online(gqa, dt).unwrap(),
        zoo::ntrans(4, 64, dt).unwrap(),
    ]
}

fn accept(p: &Pair, opts: &Options) -> Verdict {
    let t = Instant::now();
    let v = equivalent(&p.reference, &p.ugraph, opts).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    println!("{:<18} {:>8.2} ms  {v:?}", p.name, t.elapsed().as_secs_f64() * 1e3);
    assert!(v.is_equivalent(), "{}: {v:?}", p.name);
    v
}

#[test]
fn small_shapes_are_accepted() {
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        for p in small_pairs(dt) {
            let v = accept(&p, &Options::default());
            let Verdict::Equivalent { lax, false_accept_bound, .. } = &v else { unreachable!() };
            assert!(*false_accept_bound < 1e-9, "{}: {false_accept_bound}", p.name);
            let online = p.name == "attention_online";
            assert_eq!(matches!(lax.fragment, Fragment::Probabilistic { .. }), online, "{}", p.name);
        }
    }
}

#[test]
fn paper_shapes_are_accepted_quickly() {
    for p in zoo::paper_workloads(1).unwrap() {
        accept(&p, &Options { float_check: false, ..Options::default() });
    }
}

/// The plain `exp(Q K)` of flash decoding overflows in fp16 at realistic inputs, and in bf16 and
/// f32 once the logits pass 88 (the probe with inputs `LARGE_INPUTS` times larger, where the
/// program's own softmax stays finite): unstable in every dtype. The online form is stable.
#[test]
fn float_check_flags_unsafe_softmax_in_every_dtype() {
    let gqa = Attn { b: 2, h: 16, d: 64, s: 512, splits: 4, frange: 2, qsplit: 1 };
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        let v = accept(&zoo::attention(gqa, false, dt).unwrap(), &Options::default());
        let Verdict::Equivalent { numerics: Numerics::Unstable { reason }, .. } = &v else { panic!("{dt:?}: {v:?}") };
        if dt != DType::Float16 {
            assert!(reason.contains("times larger"), "{dt:?}: {reason}");
        }
        assert!(!v.is_accepted());
        let v = accept(&zoo::attention_online(gqa, dt).unwrap(), &Options::default());
        assert!(v.is_accepted(), "{dt:?}: {v:?}");
    }
    // Programs without a softmax are not probed: the gated MLP's products overflow fp16 with
    // larger inputs in the program as given too.
    let mlp = zoo::gated_mlp(4, 256, 512, 4, 4, DType::Float16).unwrap();
    assert!(accept(&mlp, &Options::default()).is_accepted());
}

/// Reductions accumulate in f32 in the simulated fp16 domain, as GPU kernels do: nTrans's
/// 4096-wide rms sums are stable (they were flagged when every partial sum was rounded).
#[test]
fn ntrans_is_stable_in_fp16_with_f32_accumulation() {
    let p = zoo::ntrans(1, 4096, DType::Float16).unwrap();
    match equivalent(&p.reference, &p.ugraph, &Options::default()).unwrap() {
        Verdict::Equivalent { numerics: Numerics::Stable { max_rel_err, .. }, .. } => {
            assert!(max_rel_err < 1e-2, "{max_rel_err}")
        }
        other => panic!("expected an equivalent, stable verdict, got {other:?}"),
    }
}

/// Time per candidate at the paper's shapes under both coverages, on a fresh verifier (no cached
/// reference values) and on one that already checked the candidate once (reference cached).
/// Run: `cargo test --release -p mirage-verify --test paper_pairs -- --ignored --nocapture`.
#[test]
#[ignore = "timing report, not a check"]
fn paper_shapes_time_per_candidate() {
    use mirage_verify::{Coverage, Verifier};
    for p in zoo::paper_workloads(1).unwrap() {
        let mut line = format!("{:<16}", p.name);
        for coverage in [Coverage::Sampled, Coverage::Every] {
            let opts = Options { coverage, float_check: false, ..Options::default() };
            let v = Verifier::new(&p.reference, opts).unwrap();
            let t = Instant::now();
            let first = v.check(&p.ugraph).unwrap();
            let cold = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            v.check(&p.ugraph).unwrap();
            let warm = t.elapsed().as_secs_f64() * 1e3;
            let Verdict::Equivalent { trials, samples, .. } = first else { panic!("{}: {first:?}", p.name) };
            line += &format!(
                "  {}: {cold:>9.1} ms cold {warm:>9.1} ms warm ({trials} trials, {samples} elements)",
                coverage.name()
            );
        }
        println!("{line}");
    }
}
