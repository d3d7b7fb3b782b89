//! Bad input never hangs: unsatisfiable settings, empty graphs, graphs without outputs,
//! cancellation, tiny budgets; a graph with unmarked outputs is searched like a marked one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mirage_search::{superoptimize, Phase, SearchConfig, SearchError, StopReason};
use mirage_ugraph::{zoo, DType, KernelGraph, UnaryOp};

fn small_rmsnorm() -> zoo::Pair {
    zoo::rmsnorm_linear(16, 512, 512, 8, 8, DType::Float16).expect("zoo")
}

#[test]
fn griddims_that_divide_nothing_is_a_clear_error() {
    let cfg = SearchConfig { griddims: Some(vec![[7, 1, 1]]), ..SearchConfig::default() };
    let t = Instant::now();
    match superoptimize(&small_rmsnorm().reference, &cfg) {
        Err(SearchError::Unsatisfiable(why)) => assert!(why.contains("griddims"), "{why}"),
        other => panic!("expected Unsatisfiable, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn imaps_that_fit_no_configuration_is_a_clear_error() {
    let cfg = SearchConfig { imaps: Some(vec![[3, 3, 3]]), ..SearchConfig::default() };
    assert!(matches!(superoptimize(&small_rmsnorm().reference, &cfg), Err(SearchError::Unsatisfiable(_))));
}

#[test]
fn too_few_block_ops_gives_an_empty_result_with_a_reason() {
    let cfg = SearchConfig { max_block_ops: 4, max_kernel_ops: 1, ..SearchConfig::default() };
    let r = superoptimize(&small_rmsnorm().reference, &cfg).expect("search runs");
    assert!(r.candidates.is_empty());
    let why = r.empty_reason.expect("a reason");
    assert!(why.contains("4 ops per block graph"), "{why}");
}

#[test]
fn empty_graph_is_an_error() {
    assert!(matches!(superoptimize(&KernelGraph::new(), &SearchConfig::default()), Err(SearchError::EmptyGraph)));
}

#[test]
fn graph_of_inputs_only_has_no_output() {
    let mut g = KernelGraph::new();
    g.new_input(&[4, 4], DType::Float16, None).expect("input");
    assert!(matches!(superoptimize(&g, &SearchConfig::default()), Err(SearchError::NoOutput)));
}

#[test]
fn unmarked_output_is_searched_like_a_marked_one() {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[16, 256], DType::Float16, None).expect("input");
    let w = g.new_input(&[256, 256], DType::Float16, None).expect("input");
    let m = g.matmul(x, w).expect("matmul");
    g.unary(UnaryOp::Exp, m).expect("exp");
    let cfg = SearchConfig { max_kernel_ops: 1, ..SearchConfig::default() };
    let unmarked = superoptimize(&g, &cfg).expect("search runs");
    let mut marked = g.clone();
    marked.mark_output(3, None).expect("mark");
    let marked = superoptimize(&marked, &cfg).expect("search runs");
    assert!(unmarked.best().is_some());
    assert_eq!(unmarked.candidates.len(), marked.candidates.len());
}

#[test]
fn invalid_settings_are_rejected() {
    let pair = small_rmsnorm();
    for cfg in [
        SearchConfig { franges: Some(vec![]), ..SearchConfig::default() },
        SearchConfig { max_block_ops: 1, ..SearchConfig::default() },
        SearchConfig { num_threads: Some(0), ..SearchConfig::default() },
        SearchConfig { blockdims: Some(vec![[2048, 1, 1]]), ..SearchConfig::default() },
    ] {
        assert!(matches!(superoptimize(&pair.reference, &cfg), Err(SearchError::InvalidConfig { .. })));
    }
}

#[test]
fn cancellation_stops_the_search() {
    let cancel = Arc::new(AtomicBool::new(true));
    let pair = zoo::paper_workloads(1).expect("zoo").into_iter().find(|p| p.name == "gqa").expect("gqa");
    // A pool of its own: on rayon's global pool the search's work would queue behind the other
    // tests' searches in this process (14 s on two cores), which no flag of this one stops.
    let cfg = SearchConfig { cancel: Some(cancel), num_threads: Some(2), ..SearchConfig::default() };
    let t = Instant::now();
    let r = superoptimize(&pair.reference, &cfg).expect("search runs");
    assert_eq!(r.stopped, Some(StopReason::Cancelled));
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

#[test]
fn a_tiny_budget_returns_promptly_with_best_so_far() {
    let pair = zoo::paper_workloads(1).expect("zoo").into_iter().find(|p| p.name == "mha").expect("mha");
    let cfg = SearchConfig { time_budget: Some(Duration::from_millis(50)), ..SearchConfig::default() };
    let t = Instant::now();
    let r = superoptimize(&pair.reference, &cfg).expect("search runs");
    assert_eq!(r.stopped, Some(StopReason::TimeBudget));
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert!(r.candidates.is_empty() == r.empty_reason.is_some());
}

#[test]
fn progress_is_reported() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let cfg = SearchConfig {
        progress: Some(Arc::new(move |p: &mirage_search::Progress| {
            assert!(p.kernel_ops >= 1);
            seen.fetch_add(1, Ordering::Relaxed);
        })),
        ..SearchConfig::default()
    };
    superoptimize(&small_rmsnorm().reference, &cfg).expect("search runs");
    assert!(calls.load(Ordering::Relaxed) >= 2);
}

#[test]
fn progress_counters_grow_and_end_at_the_totals() {
    let seen: Arc<Mutex<Vec<mirage_search::Progress>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let cfg = SearchConfig {
        progress: Some(Arc::new(move |p: &mirage_search::Progress| {
            sink.lock().expect("lock").push(p.clone());
        })),
        progress_interval: Duration::from_millis(1),
        max_kernel_ops: 1,
        ..SearchConfig::default()
    };
    let r = superoptimize(&small_rmsnorm().reference, &cfg).expect("search runs");
    let seen = seen.lock().expect("lock").clone();
    let key = |p: &mirage_search::Progress| {
        [p.states, p.block_graphs, p.candidates, p.checked, p.verified, p.verification_failed]
    };
    // The last report is the final one, after every search thread is done; reports before it
    // never exceed it.
    let last = key(seen.last().expect("reports"));
    for p in &seen {
        assert!(key(p).iter().zip(&last).all(|(a, b)| a <= b), "{:?} before the final {last:?}", key(p));
    }
    assert!(seen.iter().any(|p| p.phase == Phase::Verify));
    let last = seen.last().expect("reports");
    assert_eq!(last.phase, Phase::Done);
    let s = &r.stats;
    assert_eq!(last.candidates, s.candidates as u64);
    assert_eq!(last.verified, s.verified as u64);
    assert_eq!(last.verification_failed, s.verification_failed as u64);
    assert_eq!(last.states, s.states_visited);
    assert_eq!(last.block_graphs, s.block_graphs);
    assert!(last.checked >= last.verified + last.verification_failed && last.verified >= 1);
}

#[test]
fn a_huge_verify_top_n_still_verifies_candidates() {
    // `top_n` near usize::MAX must not overflow the check loop's bounds (which would check
    // nothing and report that no candidate passed).
    let mut cfg = SearchConfig { max_kernel_ops: 1, ..SearchConfig::default() };
    cfg.verify.top_n = 1 << 62;
    let r = superoptimize(&small_rmsnorm().reference, &cfg).expect("search runs");
    assert!(r.best().is_some(), "no verified candidate: {:?}", r.empty_reason);
}

#[test]
fn too_many_threads_is_a_config_error() {
    let cfg = SearchConfig { num_threads: Some(mirage_search::search::MAX_THREADS + 1), ..SearchConfig::default() };
    assert!(matches!(
        superoptimize(&small_rmsnorm().reference, &cfg),
        Err(SearchError::InvalidConfig { name: "num_threads", .. })
    ));
}
