//! The search's result does not depend on the number of threads: the same candidates, in the
//! same order, with one rayon thread and with two.

use mirage_search::{superoptimize, SearchConfig, SearchResult};
use mirage_ugraph::{zoo, DType, KernelGraph};

fn in_pool(threads: usize, g: &KernelGraph, cfg: &SearchConfig) -> SearchResult {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    pool.install(|| superoptimize(g, cfg)).expect("search runs")
}

fn hashes(r: &SearchResult) -> Vec<String> {
    r.candidates.iter().map(|c| c.hash.clone()).collect()
}

#[test]
fn one_and_two_threads_find_the_same_candidates() {
    // Two kernel ops: intermediate kernels, grouping and the final kernels all take part.
    let pair = zoo::rmsnorm_linear(16, 1024, 1024, 16, 16, DType::Float16).expect("zoo");
    let cfg = SearchConfig::default();
    let one = in_pool(1, &pair.reference, &cfg);
    let two = in_pool(2, &pair.reference, &cfg);
    assert!(one.candidates.len() > 1, "the search should find several candidates");
    assert!(one.candidates.iter().any(|c| c.customized_kernels == 2), "two-kernel forms take part");
    assert_eq!(hashes(&one), hashes(&two));
    assert_eq!(one.stats.states_visited, two.stats.states_visited);
    let verdicts = |r: &SearchResult| r.candidates.iter().map(|c| c.verification.clone()).collect::<Vec<_>>();
    assert_eq!(verdicts(&one), verdicts(&two));
}

#[test]
fn num_threads_setting_matches_the_ambient_pool() {
    let pair = zoo::gated_mlp(8, 512, 512, 8, 8, DType::Float16).expect("zoo");
    let ambient = in_pool(2, &pair.reference, &SearchConfig::default());
    let own = superoptimize(&pair.reference, &SearchConfig { num_threads: Some(1), ..SearchConfig::default() })
        .expect("search runs");
    assert_eq!(hashes(&ambient), hashes(&own));
}
