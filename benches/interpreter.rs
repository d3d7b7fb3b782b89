//! Interpreter throughput: the paper's µGraphs on the CPU (f32), one core and all cores.

use criterion::{criterion_group, criterion_main, Criterion};
use mirage::{random_inputs, run, zoo, DType};

fn bench(c: &mut Criterion) {
    let f16 = DType::Float16;
    let cases = [
        ("rmsnorm_linear_16x4096x4096", zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, f16).expect("builds")),
        ("gated_mlp_8x4096x4096", zoo::gated_mlp(8, 4096, 4096, 64, 32, f16).expect("builds")),
        (
            "gqa_b1",
            zoo::attention(zoo::Attn { b: 2, h: 256, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 1 }, false, f16)
                .expect("builds"),
        ),
    ];
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    let mut group = c.benchmark_group("interpreter");
    group.sample_size(10);
    for (name, pair) in &cases {
        let ins = random_inputs(&pair.ugraph, 1);
        group.bench_function(format!("{name}/ugraph/1-thread"), |b| {
            b.iter(|| one.install(|| run(&pair.ugraph, &ins).expect("runs")))
        });
        group.bench_function(format!("{name}/ugraph/all-threads"), |b| {
            b.iter(|| run(&pair.ugraph, &ins).expect("runs"))
        });
        group.bench_function(format!("{name}/reference/1-thread"), |b| {
            b.iter(|| one.install(|| run(&pair.reference, &ins).expect("runs")))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
