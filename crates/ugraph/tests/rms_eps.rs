//! `rms_norm`'s epsilon: values against a direct computation, validation, JSON (with version 1
//! files loading as `eps = 0`), hash and DOT.

use mirage_ugraph::{from_json, run, to_json, zoo, Accum, BlockGraph, DType, KernelGraph, Tensor};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32 * 37 + seed * 11) % 23) as f32 / 23.0 - 0.4).collect()
}

/// `x / sqrt(mean(x^2) + eps) * w` row by row, in f64.
fn direct(x: &[f32], w: &[f32], len: usize, eps: f64) -> Vec<f32> {
    let mut out = Vec::new();
    for row in x.chunks(len) {
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / len as f64;
        let r = (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &wv)| (v as f64 / r * wv as f64) as f32));
    }
    out
}

#[test]
fn kernel_rms_norm_adds_eps_to_the_mean_of_squares() {
    // Small values make eps matter: mean(x^2) is about 0.03 while eps is 0.05.
    let (m, k) = (3, 8);
    let x: Vec<f32> = data(m * k, 1).iter().map(|v| v * 0.5).collect();
    let w = data(k, 2);
    for eps in [0.0f32, 1e-5, 0.05] {
        let mut g = KernelGraph::new();
        let a = g.new_input(&[m, k], DType::Float32, None).unwrap();
        let b = g.new_input(&[k], DType::Float32, None).unwrap();
        let y = g.rms_norm_eps(a, &[k], Some(b), eps).unwrap();
        g.mark_output(y, None).unwrap();
        let out =
            run(&g, &[Tensor::new(vec![m, k], x.clone()).unwrap(), Tensor::new(vec![k], w.clone()).unwrap()]).unwrap();
        let want = direct(&x, &w, k, eps as f64);
        for (o, e) in out[0].data.iter().zip(&want) {
            assert!((o - e).abs() <= 1e-5 * e.abs().max(1.0), "eps {eps}: {o} vs {e}");
        }
    }
}

#[test]
fn the_fused_form_with_eps_computes_the_reference() {
    let p = zoo::rmsnorm_linear_eps(4, 64, 32, 4, 4, DType::Float32, 0.25).unwrap();
    let ins = [Tensor::new(vec![4, 64], data(256, 3)).unwrap(), Tensor::new(vec![64, 32], data(64 * 32, 4)).unwrap()];
    let a = run(&p.reference, &ins).unwrap();
    let b = run(&p.ugraph, &ins).unwrap();
    let p0 = zoo::rmsnorm_linear(4, 64, 32, 4, 4, DType::Float32).unwrap();
    let c = run(&p0.ugraph, &ins).unwrap();
    let mut differs = false;
    for ((x, y), z) in a[0].data.iter().zip(&b[0].data).zip(&c[0].data) {
        assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
        differs |= (x - z).abs() > 1e-3 * x.abs().max(1.0);
    }
    assert!(differs, "eps 0.25 changes nothing");
}

#[test]
fn bad_eps_is_refused_naming_the_op() {
    let mut g = KernelGraph::new();
    let a = g.new_input(&[2, 4], DType::Float32, None).unwrap();
    for eps in [-1e-6f32, f32::NAN, f32::INFINITY] {
        let e = g.rms_norm_eps(a, &[4], None, eps).unwrap_err().to_string();
        assert!(e.contains("rms_norm") && e.contains("eps"), "{e}");
    }
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 2, 64).unwrap();
    let t = tb.new_input(&[2, 4], DType::Float32, [-1, -1, -1], 1).unwrap();
    let e = tb.rms_norm_eps(t, -0.5).unwrap_err().to_string();
    assert!(e.contains("tb.rms_norm"), "{e}");
    let e = tb.forloop_accum_eps(t, Accum::Sum, 1e-5).unwrap_err().to_string();
    assert!(e.contains("tb.forloop_accum") && e.contains("rms"), "{e}");
}

#[test]
fn eps_round_trips_and_changes_the_hash_only_when_nonzero() {
    let p0 = zoo::rmsnorm_linear(4, 64, 32, 4, 4, DType::Float16).unwrap();
    let pz = zoo::rmsnorm_linear_eps(4, 64, 32, 4, 4, DType::Float16, 0.0).unwrap();
    let pe = zoo::rmsnorm_linear_eps(4, 64, 32, 4, 4, DType::Float16, 1e-5).unwrap();
    assert_eq!(p0.ugraph.hash(), pz.ugraph.hash());
    assert_ne!(p0.ugraph.hash(), pe.ugraph.hash());
    assert_ne!(p0.reference.hash(), pe.reference.hash());
    for g in [&pe.reference, &pe.ugraph, &p0.ugraph] {
        let back = from_json(&to_json(g)).unwrap();
        assert_eq!(&back, g);
    }
    assert!(to_json(&pe.reference).contains(",\"eps\":0.00001"), "{}", to_json(&pe.reference));
    assert!(!to_json(&p0.reference).contains("eps"));
    let dot = mirage_ugraph::dot::to_dot(&pe.reference);
    assert!(dot.contains("eps=0.00001"), "{dot}");
}

#[test]
fn only_graphs_with_an_eps_are_written_as_version_2() {
    let p0 = zoo::rmsnorm_linear(4, 64, 32, 4, 4, DType::Float16).unwrap();
    let pe = zoo::rmsnorm_linear_eps(4, 64, 32, 4, 4, DType::Float16, 1e-5).unwrap();
    assert!(to_json(&p0.ugraph).contains("\"version\":1,"));
    assert!(to_json(&pe.reference).contains("\"version\":2,"));
    assert!(to_json(&pe.ugraph).contains("\"version\":2,"));
    // A version 1 file (no eps field) loads with eps = 0.
    let v1 = to_json(&pe.reference).replace("\"version\":2", "\"version\":1").replace(",\"eps\":0.00001", "");
    assert_eq!(from_json(&v1).unwrap(), p0.reference);
}
