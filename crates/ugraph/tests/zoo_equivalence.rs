//! Every hand-written µGraph of the zoo computes what its plain program computes (f32 CPU runs).

use mirage_ugraph::{random_inputs, run, zoo, DType, Tensor};

fn rel_err(a: &Tensor<f32>, b: &Tensor<f32>) -> f64 {
    assert_eq!(a.dims, b.dims);
    let num: f64 = a.data.iter().zip(&b.data).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.data.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn check(p: zoo::Pair) {
    let ins = random_inputs(&p.reference, 7);
    let want = run(&p.reference, &ins).expect("reference runs");
    let got = run(&p.ugraph, &ins).expect("µGraph runs");
    assert_eq!(want.len(), got.len(), "{}", p.name);
    for (w, g) in want.iter().zip(&got) {
        let e = rel_err(g, w);
        assert!(e < 1e-5, "{}: relative error {e}", p.name);
    }
}

const F: DType = DType::Float32;
const SMALL_ATTN: zoo::Attn = zoo::Attn { b: 2, h: 8, d: 16, s: 256, splits: 4, frange: 4, qsplit: 2 };

#[test]
fn rmsnorm_linear_one_kernel() {
    check(zoo::rmsnorm_linear(8, 256, 128, 4, 8, F).unwrap());
}

#[test]
fn gated_mlp_one_kernel() {
    check(zoo::gated_mlp(4, 128, 96, 3, 4, F).unwrap());
}

#[test]
fn lora_one_kernel() {
    check(zoo::lora(4, 64, 128, 8, 4, 4, F).unwrap());
}

#[test]
fn attention_flash_decoding() {
    check(zoo::attention(SMALL_ATTN, false, F).unwrap());
}

#[test]
fn qknorm_attention_flash_decoding() {
    check(zoo::attention(SMALL_ATTN, true, F).unwrap());
}

#[test]
fn attention_online_softmax() {
    check(zoo::attention_online(SMALL_ATTN, F).unwrap());
}

#[test]
fn qknorm_attention_online_softmax() {
    check(zoo::qknorm_attention_online(SMALL_ATTN, F).unwrap());
}

#[test]
fn attention_in_one_kernel() {
    check(zoo::attention_one_kernel(zoo::Attn { splits: 1, ..SMALL_ATTN }, F).unwrap());
    // Its keys are split by the loop only.
    assert!(zoo::attention_one_kernel(SMALL_ATTN, F).is_err());
}

#[test]
fn ntrans_one_kernel() {
    check(zoo::ntrans(3, 64, F).unwrap());
}

#[test]
fn paper_workloads_build() {
    for b in [1, 8, 16] {
        let pairs = zoo::paper_workloads(b).unwrap();
        assert_eq!(pairs.len(), 8);
        for p in pairs {
            let r = p.reference.output_ids();
            let u = p.ugraph.output_ids();
            assert_eq!(p.reference.tensors[r[0]].dims, p.ugraph.tensors[u[0]].dims, "{}", p.name);
        }
    }
}

/// Every box of every output computed by `run_region` equals the same box of a full run.
#[test]
fn regions_match_full_runs() {
    use mirage_ugraph::{run_region, Region};
    let pairs = [
        zoo::rmsnorm_linear(8, 256, 128, 4, 8, F).unwrap(),
        zoo::gated_mlp(4, 128, 96, 3, 4, F).unwrap(),
        zoo::lora(4, 64, 128, 8, 4, 4, F).unwrap(),
        zoo::attention(SMALL_ATTN, true, F).unwrap(),
        zoo::attention_online(SMALL_ATTN, F).unwrap(),
        zoo::ntrans(3, 64, F).unwrap(),
    ];
    let mut s = 12345u64;
    let mut next = |n: usize| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) as usize) % n
    };
    for p in pairs {
        for g in [&p.reference, &p.ugraph] {
            let ins = random_inputs(g, 3);
            let full = run(g, &ins).unwrap();
            for _ in 0..20 {
                let regions: Vec<Region> = full
                    .iter()
                    .map(|t| {
                        let start: Vec<usize> = t.dims.iter().map(|&d| next(d)).collect();
                        let end = start.iter().zip(&t.dims).map(|(&a, &d)| a + 1 + next(d - a)).collect();
                        Region { start, end }
                    })
                    .collect();
                let got = run_region(g, &ins, &regions).unwrap();
                for ((f, r), x) in full.iter().zip(&regions).zip(&got) {
                    let want = f.slice(&r.start, &r.extent());
                    assert_eq!(want.dims, x.dims, "{}", p.name);
                    for (a, b) in want.data.iter().zip(&x.data) {
                        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{}: {a} vs {b} in {r:?}", p.name);
                    }
                }
            }
        }
    }
}
