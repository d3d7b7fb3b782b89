//! Search settings: the reference's keyword arguments (`griddims`, `blockdims`, `imaps`,
//! `omaps`, `fmaps`, `franges`) with the same meaning, plus limits, budget and reporting.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::axioms::SaturationLimits;
use crate::cost::CostModel;
use mirage_ugraph::Target;

/// What a running search is doing.
/// Phases come in this order (`Ord` follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Phase {
    /// Enumerating µGraphs (kernel graphs and their block graphs).
    #[default]
    Search,
    /// Checking the cheapest candidates for equivalence and stability.
    Verify,
    /// Finished: the counters are the search's totals.
    Done,
}

impl Phase {
    /// The phase's name: `"search"`, `"verify"` or `"done"`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Search => "search",
            Phase::Verify => "verify",
            Phase::Done => "done",
        }
    }
}

/// A snapshot of a running search, passed to the progress callback. Every counter only grows
/// during a search; in the [`Phase::Done`] snapshot they equal the [`crate::SearchStats`].
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// What the search is doing.
    pub phase: Phase,
    /// Kernel ops of the µGraphs being searched now (iterative deepening level).
    pub kernel_ops: usize,
    /// Block-graph states visited so far.
    pub states: u64,
    /// Candidate ops pruned by abstract expressions.
    pub pruned_by_expression: u64,
    /// Candidate ops pruned by shape, label, phase, shared-memory or op-count limits.
    pub pruned_by_limits: u64,
    /// Complete block graphs found.
    pub block_graphs: u64,
    /// Distinct candidate µGraphs generated (known once enumeration ends; 0 before).
    pub candidates: u64,
    /// Candidates checked so far.
    pub checked: u64,
    /// Candidates checked and found equivalent (`SearchStats::verified`).
    pub verified: u64,
    /// Candidates checked and found wrong (`SearchStats::verification_failed`).
    pub verification_failed: u64,
    /// Stable candidates the checking aims for (`VerifyOptions::top_n`, at most `candidates`).
    pub verify_goal: u64,
    /// Time since the search started.
    pub elapsed: Duration,
    /// The time budget, if any.
    pub budget: Option<Duration>,
}

/// A progress callback; called from search threads, at most every `progress_interval`.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How final candidates are checked.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyOptions {
    /// Check candidates (in the order `spread` chooses) until this many pass as numerically
    /// stable; unstable ones met on the way are kept beside them (the rest stay `NotChecked`).
    pub top_n: usize,
    /// Random output boxes compared per candidate.
    pub trials: usize,
    /// Relative tolerance of the float comparison.
    pub tolerance: f64,
    /// Seed of the random inputs and boxes.
    pub seed: u64,
    /// Check the cheapest candidate of each structure (kernel count, predefined ops, loop
    /// ranges) first; then, in turn, the cheapest of each main shape (the structure and its
    /// costliest kernel's launch shape) near the cheapest cost and the cheapest of each launch
    /// shape: for a GPU that times the verified set and picks the fastest, a set spanning
    /// structures and main-kernel shapes beats near-copies of the model's favourite. Without a
    /// GPU the model's cheapest verified candidate is chosen, so the default checks by launch
    /// shape only.
    pub spread: bool,
    /// Add co-resident twins (`BlockGraph::smem_cap`) and warpgroup twins
    /// (`BlockGraph::warpgroup_acc`) of the first verified candidates, for a GPU to time
    /// beside them; off by default (without a GPU the model chooses).
    pub co_resident: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions { top_n: 8, trials: 3, tolerance: 1e-6, seed: 0x5eed, spread: false, co_resident: false }
    }
}

/// Settings of [`crate::superoptimize`].
#[derive(Clone)]
pub struct SearchConfig {
    /// Most ops in one block graph, inputs and output savers included (the paper's 11).
    pub max_block_ops: usize,
    /// Most kernel-level ops of a candidate (predefined and customized).
    pub max_kernel_ops: usize,
    /// Most customized (block-graph) kernels in a candidate.
    pub max_customized_ops: usize,
    /// Most outputs of a kernel whose results a later kernel consumes.
    pub max_intermediate_outputs: usize,
    /// Grid dims to try instead of the generated ones (reference `griddims`).
    pub griddims: Option<Vec<[usize; 3]>>,
    /// Block dims to try (reference `blockdims`); default `[128, 1, 1]` and `[256, 1, 1]`.
    pub blockdims: Option<Vec<[usize; 3]>>,
    /// Allowed input maps (reference `imaps`): a configuration is kept only if every block
    /// input's imap is in the list.
    pub imaps: Option<Vec<[i64; 3]>>,
    /// Allowed output maps (reference `omaps`).
    pub omaps: Option<Vec<[i64; 3]>>,
    /// Allowed for-loop dims of block inputs (reference `fmaps`, -1 = not iterated).
    pub fmaps: Option<Vec<i64>>,
    /// For-loop ranges to try (reference `franges`); default `{1, 4, 16, 64}` (1 = no loop).
    pub franges: Option<Vec<usize>>,
    /// Blocks per grid axis that generated grids use (an index of one of these sizes may be
    /// split fully, one block per value). Besides powers of two, 96 and 192: an index of
    /// 3 * 2^k (768, 3072, 6144 columns) then gets a grid of about one wave of an H100's SMs.
    /// Two: QK-norm attention's 256 query rows in two blocks of two warpgroups each.
    pub grid_sizes: Vec<usize>,
    /// An index of at most this size may also be split fully (one block per index value),
    /// whether or not its size is in `grid_sizes`. 512: MHA at b=16 (512 heads) runs one head
    /// per block, two blocks of two 32 KB stages an SM (179.3 us on the H100 against 181.8 for
    /// two heads per block in one stage, the best 256-block form).
    pub max_full_split: usize,
    /// Most grid axes of size > 1.
    pub max_grid_axes: usize,
    /// Most thread blocks in a grid.
    pub max_blocks: usize,
    /// Shared-memory limit per block, bytes: on the tiles live at once
    /// (`BlockGraph::shared_memory_peak`; pruned during generation on a partial graph's peak).
    pub shared_memory_limit: usize,
    /// Prune by abstract expressions (off only for the ablation: the search then explores every
    /// well-shaped graph and checks terms only on complete ones).
    pub expression_pruning: bool,
    /// Limits of the e-graph saturation.
    pub saturation: SaturationLimits,
    /// Stop generating after this long and return the best found so far. What was found is
    /// still verified: a few candidates at a time (one per thread) and, once half the budget
    /// again has passed, only until one passes (one verification of a large graph can take
    /// a tenth of a second).
    pub time_budget: Option<Duration>,
    /// Set to `true` from anywhere to stop the search (best-so-far is returned).
    pub cancel: Option<Arc<AtomicBool>>,
    /// Called with a [`Progress`] while searching.
    pub progress: Option<ProgressFn>,
    /// Least time between two progress calls.
    pub progress_interval: Duration,
    /// Threads; `None` runs in the current rayon pool.
    pub num_threads: Option<usize>,
    /// Checking of the final candidates.
    pub verify: VerifyOptions,
    /// Intermediate kernels kept per distinct output signature (cheapest first).
    pub keep_per_signature: usize,
    /// The ranking model.
    pub cost_model: CostModel,
    /// The GPU the candidates are priced for (SM count, pipelining budgets, cluster rules,
    /// the co-resident twins' cap); [`Target::sm90`] by default.
    pub target: Target,
    /// Replace equivalent candidates that accumulate a plain `exp` (unstable in fp16; in bf16
    /// and fp32 past logits of 88) by their online-softmax rewrite when it checks as stable.
    pub online_softmax: bool,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            max_block_ops: 11,
            max_kernel_ops: 2,
            max_customized_ops: 2,
            max_intermediate_outputs: 2,
            griddims: None,
            blockdims: None,
            imaps: None,
            omaps: None,
            fmaps: None,
            franges: None,
            grid_sizes: vec![2, 4, 8, 16, 32, 64, 96, 128, 192, 256],
            max_full_split: 512,
            max_grid_axes: 3,
            max_blocks: 4096,
            shared_memory_limit: 96 * 1024,
            expression_pruning: true,
            saturation: SaturationLimits::default(),
            time_budget: None,
            cancel: None,
            progress: None,
            progress_interval: Duration::from_millis(250),
            num_threads: None,
            verify: VerifyOptions::default(),
            keep_per_signature: 2,
            cost_model: CostModel::default(),
            target: Target::sm90(),
            online_softmax: true,
        }
    }
}

impl SearchConfig {
    /// The for-loop ranges searched.
    pub fn franges(&self) -> Vec<usize> {
        let mut f = self.franges.clone().unwrap_or_else(|| vec![1, 4, 16, 64]);
        f.sort_unstable();
        f.dedup();
        f
    }

    /// The block dims searched.
    pub fn blockdims(&self) -> Vec<[usize; 3]> {
        self.blockdims.clone().unwrap_or_else(|| vec![[128, 1, 1], [256, 1, 1]])
    }

    /// Every size a sum may be split by: franges, grid sizes and given grid dims.
    pub fn sum_factors(&self) -> Vec<u64> {
        let mut f: Vec<u64> = self.franges().iter().chain(&self.grid_sizes).map(|&x| x as u64).collect();
        if let Some(g) = &self.griddims {
            f.extend(g.iter().flatten().map(|&x| x as u64));
        }
        f.retain(|&x| x > 1);
        f.sort_unstable();
        f.dedup();
        f
    }
}

impl fmt::Debug for SearchConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchConfig")
            .field("max_block_ops", &self.max_block_ops)
            .field("max_kernel_ops", &self.max_kernel_ops)
            .field("max_customized_ops", &self.max_customized_ops)
            .field("max_intermediate_outputs", &self.max_intermediate_outputs)
            .field("griddims", &self.griddims)
            .field("blockdims", &self.blockdims)
            .field("imaps", &self.imaps)
            .field("omaps", &self.omaps)
            .field("fmaps", &self.fmaps)
            .field("franges", &self.franges)
            .field("grid_sizes", &self.grid_sizes)
            .field("max_full_split", &self.max_full_split)
            .field("max_grid_axes", &self.max_grid_axes)
            .field("max_blocks", &self.max_blocks)
            .field("shared_memory_limit", &self.shared_memory_limit)
            .field("expression_pruning", &self.expression_pruning)
            .field("saturation", &self.saturation)
            .field("time_budget", &self.time_budget)
            .field("cancel", &self.cancel.is_some())
            .field("progress", &self.progress.is_some())
            .field("num_threads", &self.num_threads)
            .field("verify", &self.verify)
            .field("keep_per_signature", &self.keep_per_signature)
            .field("cost_model", &self.cost_model)
            .field("target", &self.target)
            .field("online_softmax", &self.online_softmax)
            .finish()
    }
}
