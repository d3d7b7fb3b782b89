//! The paper's ablation on RMSNorm + Linear (X 16x4096, W 4096x4096): search time for max
//! block ops 5..11, with and without abstract-expression pruning, on 1 and 2 threads.
//! Unpruned runs are capped by a time budget (`CAP` seconds, default 30).
//!
//! `cargo run --release -p mirage-search --example ablation`

use std::time::Duration;

use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{zoo, DType};

fn main() {
    let pair = zoo::rmsnorm_linear(16, 4096, 4096, 64, 64, DType::Float16).expect("zoo builds");
    let cap: u64 = std::env::var("CAP").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    println!("| pruning | threads | max block ops | time (s) | states | candidates | stopped | best |");
    println!("|---|---|---|---|---|---|---|---|");
    for pruning in [true, false] {
        for threads in [1, 2] {
            for ops in 5..=11 {
                let cfg = SearchConfig {
                    max_block_ops: ops,
                    expression_pruning: pruning,
                    num_threads: Some(threads),
                    time_budget: Some(Duration::from_secs(cap)),
                    ..SearchConfig::default()
                };
                let r = superoptimize(&pair.reference, &cfg).expect("search runs");
                let best = r
                    .best()
                    .map_or("-".to_string(), |c| format!("{} launch(es), {:.2} us", c.cost.launches, c.cost.est_us));
                println!(
                    "| {pruning} | {threads} | {ops} | {:.3} | {} | {} | {:?} | {best} |",
                    r.stats.elapsed.as_secs_f64(),
                    r.stats.states_visited,
                    r.stats.candidates,
                    r.stopped
                );
            }
        }
    }
}
