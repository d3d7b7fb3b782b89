//! Search throughput on RMSNorm + Linear at the paper's shape (X 16x4096, W 4096x4096):
//! block-graph states visited per second, for one-kernel and up-to-two-kernel searches, and
//! candidates verified per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mirage_search::{superoptimize, verify_candidate, SearchConfig, VerifyOptions};
use mirage_ugraph::{zoo, DType};

fn search_throughput(c: &mut Criterion) {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo builds");
    let mut group = c.benchmark_group("rmsnorm_linear_search");
    group.sample_size(10);
    for (name, kernel_ops) in [("states_1_kernel", 1), ("states_2_kernels", 2)] {
        // Search only: no verification, so the throughput is the generator's.
        let cfg = SearchConfig {
            max_kernel_ops: kernel_ops,
            verify: VerifyOptions { top_n: 0, ..VerifyOptions::default() },
            ..SearchConfig::default()
        };
        let states = superoptimize(&pair.reference, &cfg).expect("search runs").stats.states_visited;
        group.throughput(Throughput::Elements(states));
        group.bench_function(name, |b| b.iter(|| superoptimize(&pair.reference, &cfg).expect("search runs")));
    }
    let found = superoptimize(&pair.reference, &SearchConfig::default()).expect("search runs");
    let top: Vec<_> = found.candidates.iter().take(8).map(|c| c.graph.clone()).collect();
    group.throughput(Throughput::Elements(top.len() as u64));
    let opts = VerifyOptions::default();
    group.bench_function("candidates_verified", |b| {
        b.iter(|| top.iter().filter(|g| verify_candidate(&pair.reference, g, &opts).passed()).count())
    });
    group.finish();
}

criterion_group!(benches, search_throughput);
criterion_main!(benches);
