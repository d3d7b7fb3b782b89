//! The search on every workload of the paper (docs/reference.md: workloads) at batch `B` (default 1),
//! default config: time, states, candidates and what the best candidate looks like.
//!
//! `cargo run --release -p mirage-search --example paper_workloads`

use mirage_search::{superoptimize, SearchConfig};
use mirage_ugraph::{zoo, KernelOpKind};

fn main() {
    let b: usize = std::env::var("B").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    println!("| workload (b={b}) | search time (s) | states | candidates | best: kernels | best: verification | saturation limit hit |");
    println!("|---|---|---|---|---|---|---|");
    for pair in zoo::paper_workloads(b).expect("zoo builds") {
        let r = match superoptimize(&pair.reference, &SearchConfig::default()) {
            Ok(r) => r,
            Err(e) => {
                println!("| {} | error: {e} | | | | | |", pair.name);
                continue;
            }
        };
        let (kernels, verdict) = r.best().map_or(("-".to_string(), "-".to_string()), |c| {
            let n = c.graph.ops.iter().filter(|o| !matches!(o.kind, KernelOpKind::Input { .. })).count();
            (format!("{n} ({} customized)", c.customized_kernels), format!("{:?}", c.verification))
        });
        let verdict: String = verdict.chars().take(60).collect();
        println!(
            "| {} | {:.2} | {} | {} | {kernels} | {verdict} | {} |",
            pair.name,
            r.stats.elapsed.as_secs_f64(),
            r.stats.states_visited,
            r.stats.candidates,
            r.stats.saturation.limit_hit
        );
    }
}
