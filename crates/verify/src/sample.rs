//! Which output elements each trial compares.
//!
//! Outputs are grouped into shape classes (reference and candidate outputs of equal dims); one
//! index list per class and trial serves every output of the class, so any candidate output can
//! be compared with any reference output of its shape. Per class and trial:
//!
//! - `random` elements uniform over the output;
//! - in trial 0, the first and the last element (off-by-one tilings show there);
//! - tile coverage: the tiles of the customized op that writes the candidate output (one per
//!   block and, for per-iteration savers, per iteration) are listed, thinned to at most
//!   `max_tiles` by stratified choice, and dealt round-robin over the trials; each dealt tile
//!   contributes one random element inside it. With at most `max_tiles` tiles every tile is
//!   compared at least once over the run.

use mirage_ugraph::{BlockGraph, BlockOpKind, KernelGraph, KernelOpKind, TensorId};

use crate::field::hash_words;

/// A box of an output: the tile one block (and iteration) writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tile {
    /// First index.
    pub start: Vec<usize>,
    /// Extent.
    pub extent: Vec<usize>,
}

/// Number of tiles the customized op writing `t` produces for it, and a function giving tile
/// `i` (None when `t` is not written by a customized op).
fn tiling(g: &KernelGraph, t: TensorId) -> Option<(usize, impl Fn(usize) -> Tile + '_)> {
    let op = g.ops.iter().find(|o| o.outputs.contains(&t))?;
    let KernelOpKind::Customized { graph } = &op.kind else { return None };
    let k = op.outputs.iter().position(|&x| x == t)?;
    let out = graph.output_ops().nth(k)?;
    let BlockOpKind::Output { omap, forloop_dim } = out.kind else { return None };
    let tile = graph.tensors.get(*out.inputs.first()?)?.dims.clone();
    let iters = if forloop_dim >= 0 { graph.forloop_range } else { 1 };
    let n = graph.num_blocks() * iters;
    let f = move |i: usize| {
        let (b, it) = (i / iters, i % iters);
        Tile { start: tile_offset(graph, b, omap, forloop_dim, &tile, it), extent: tile.clone() }
    };
    Some((n, f))
}

/// Offset of block `b`'s tile (iteration `it`) in an output, as the interpreter places it.
fn tile_offset(bg: &BlockGraph, b: usize, map: [i64; 3], loop_dim: i64, tile: &[usize], it: usize) -> Vec<usize> {
    let [gx, gy, _] = bg.grid_dim;
    let coord = [b % gx, (b / gx) % gy, b / (gx * gy)];
    let mut off = vec![0; tile.len()];
    let lr = if loop_dim >= 0 { bg.forloop_range } else { 1 };
    for a in 0..3 {
        if bg.grid_dim[a] > 1 && map[a] >= 0 && (map[a] as usize) < tile.len() {
            let d = map[a] as usize;
            let part = if d as i64 == loop_dim { tile[d] * lr } else { tile[d] };
            off[d] += coord[a] * part;
        }
    }
    if loop_dim >= 0 && (loop_dim as usize) < tile.len() {
        off[loop_dim as usize] += it * tile[loop_dim as usize];
    }
    off
}

/// Up to `max` tiles of the candidate output `t`, stratified over the tile numbering.
pub fn tiles(g: &KernelGraph, t: TensorId, max: usize, seed: u64) -> Vec<Tile> {
    let Some((n, f)) = tiling(g, t) else { return Vec::new() };
    if n <= 1 || max == 0 {
        return Vec::new();
    }
    if n <= max {
        return (0..n).map(f).collect();
    }
    let u = (seed % 1_000_003) as f64 / 1_000_003.0;
    (0..max).map(|j| f((((j as f64 + u) * n as f64 / max as f64) as usize).min(n - 1))).collect()
}

/// A random index in the box `[start, start + extent)` from a hash key.
pub fn random_index(key: &[u64], start: &[usize], extent: &[usize]) -> Vec<usize> {
    extent
        .iter()
        .zip(start)
        .enumerate()
        .map(|(d, (&e, &s))| {
            let mut words = key.to_vec();
            words.push(d as u64);
            s + (hash_words(&words) % e.max(1) as u64) as usize
        })
        .collect()
}

/// What one shape class compares over the whole run.
#[derive(Debug, Clone)]
pub struct ClassPlan {
    /// Output dims of the class.
    pub dims: Vec<usize>,
    /// Tiles dealt round-robin over trials.
    pub tiles: Vec<Tile>,
}

impl ClassPlan {
    /// Elements to compare in `trial` (of `trials`), in priority order (a trial's read budget
    /// may cut the tail): one random element inside each tile dealt to this trial, one random
    /// element of the output, the first and last element (trial 0), then `random - 1` more
    /// random elements. The flag marks tile elements.
    pub fn indices(
        &self,
        seed: u64,
        class: usize,
        trial: usize,
        trials: usize,
        random: usize,
    ) -> Vec<(Vec<usize>, bool)> {
        let zeros = vec![0; self.dims.len()];
        let rand =
            |j: usize| random_index(&[seed, class as u64, trial as u64, j as u64, 0x7261_6e64], &zeros, &self.dims);
        let mut out: Vec<(Vec<usize>, bool)> = Vec::new();
        for (i, tile) in self.tiles.iter().enumerate().skip(trial).step_by(trials.max(1)) {
            out.push((random_index(&[seed, class as u64, i as u64, 0x7469_6c65], &tile.start, &tile.extent), true));
        }
        if random > 0 {
            out.push((rand(0), false));
        }
        if trial == 0 {
            out.push((zeros.clone(), false));
            out.push((self.dims.iter().map(|d| d - 1).collect(), false));
        }
        out.extend((1..random).map(|j| (rand(j), false)));
        if out.is_empty() {
            out.push((zeros, false));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirage_ugraph::{zoo, DType};

    #[test]
    fn tiles_cover_the_output() {
        let p = zoo::rmsnorm_linear(4, 16, 32, 4, 4, DType::Float32).unwrap();
        let t = p.ugraph.output_ids()[0];
        let ts = tiles(&p.ugraph, t, 64, 1);
        assert_eq!(ts.len(), 4);
        let starts: Vec<usize> = ts.iter().map(|t| t.start[1]).collect();
        assert_eq!(starts, vec![0, 8, 16, 24]);
        assert!(ts.iter().all(|t| t.extent == vec![4, 8]));
        assert_eq!(tiles(&p.ugraph, t, 2, 1).len(), 2);
        let plan = ClassPlan { dims: vec![4, 32], tiles: ts };
        let all: Vec<(Vec<usize>, bool)> = (0..3).flat_map(|tr| plan.indices(9, 0, tr, 3, 1)).collect();
        assert_eq!(all.iter().filter(|x| x.1).count(), 4);
        for k in 0..4 {
            assert!(all.iter().any(|(i, tile)| *tile && i[1] / 8 == k), "tile {k} sampled");
        }
    }
}
