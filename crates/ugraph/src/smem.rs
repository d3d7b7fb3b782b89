//! Shared memory a block graph needs at its busiest point: the tiles live at once, by the
//! order in which a kernel runs them (before the loop, each iteration, after the loop).
//!
//! The search bounds its block graphs with it ([`BlockGraph::shared_memory_peak`]) rather than
//! with the sum of every tile ([`BlockGraph::shared_memory_upper_bound`]), which counts, for
//! example, an attention step's scores, exponentials and running sums as if none were ever
//! freed. It is still a bound from above for what the code generator allocates: tiles are
//! counted in their dtype, inputs are live throughout (the loop's are multi-buffered on top
//! of it), and tiles a kernel keeps in registers are counted too.
//!
//! ```
//! use mirage_ugraph::smem::{peak_bytes, TileLife};
//! use mirage_ugraph::Phase;
//! // An input tile of 4 KiB, a loop tile of 8 KiB read by the next op (2 KiB), then freed;
//! // the last, an output, lives to the end.
//! let tile = |bytes, input, readers: &[usize]| TileLife {
//!     bytes,
//!     phase: Phase::Loop,
//!     input,
//!     accumulator: false,
//!     output: readers.is_empty(),
//!     readers: readers.to_vec(),
//! };
//! let tiles = [tile(4096, true, &[1]), tile(8192, false, &[2]), tile(2048, false, &[3]), tile(1024, false, &[])];
//! assert_eq!(peak_bytes(&tiles), 4096 + 8192 + 2048);
//! ```

use crate::block::{BlockGraph, BlockOpKind, Phase};
use crate::types::numel;

/// One tile, made by the op at its own index in the slice given to [`peak_bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileLife {
    /// Bytes of the tile.
    pub bytes: usize,
    /// When it is computed.
    pub phase: Phase,
    /// A tile loaded from device memory (live throughout).
    pub input: bool,
    /// Made by a for-loop accumulator (live from the loop's start).
    pub accumulator: bool,
    /// Saved to device memory by the kernel (live to the end).
    pub output: bool,
    /// Indices of the tiles whose ops read it.
    pub readers: Vec<usize>,
}

/// Where the op making tile `i` runs: its section (before the loop, in it, after it), then
/// its index. Accumulators update in the loop.
fn at(t: &TileLife, i: usize) -> (u8, usize) {
    let section = match t.phase {
        Phase::Invariant => 0,
        Phase::Loop => 1,
        Phase::Post if t.accumulator => 1,
        Phase::Post => 2,
    };
    (section, i)
}

/// Largest sum of bytes of the tiles live at once. A tile lives from its op to its last
/// reader's; one read in the loop but made before it, until the loop ends; an accumulator,
/// from the loop's start; an input or an output, to the end. A tile no op reads (yet) lives
/// only at its own op: of a partial graph, this stays a lower bound of what any completion
/// needs, so a search may prune on it.
pub fn peak_bytes(tiles: &[TileLife]) -> usize {
    const END: (u8, usize) = (3, 0);
    let spans: Vec<((u8, usize), (u8, usize))> = tiles
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let me = at(t, i);
            let from = if t.input {
                (0, 0)
            } else if t.accumulator {
                (1, 0)
            } else {
                me
            };
            let mut to = if t.input || t.output { END } else { me };
            for &r in &t.readers {
                let r_at = at(&tiles[r], r);
                to = to.max(if r_at.0 == 1 && me.0 == 0 { (1, usize::MAX) } else { r_at });
            }
            (from, to)
        })
        .collect();
    spans
        .iter()
        .map(|&(p, _)| tiles.iter().zip(&spans).filter(|(_, &(f, t))| f <= p && p <= t).map(|(x, _)| x.bytes).sum())
        .max()
        .unwrap_or(0)
}

impl BlockGraph {
    /// Bytes of shared memory of the tiles live at once ([`peak_bytes`] over the ops in order).
    pub fn shared_memory_peak(&self) -> usize {
        // One life per tensor, at the index of the op that makes it (ops are in order and make
        // their tensors in order; savers make none).
        let mut index = vec![0usize; self.tensors.len()];
        let mut lives: Vec<TileLife> = Vec::with_capacity(self.tensors.len());
        for op in &self.ops {
            for &t in &op.outputs {
                index[t] = lives.len();
                let s = &self.tensors[t];
                lives.push(TileLife {
                    bytes: numel(&s.dims) * s.dtype.size_bytes(),
                    phase: s.phase,
                    input: matches!(op.kind, BlockOpKind::Input { .. }),
                    accumulator: op.kind.is_accumulator(),
                    output: false,
                    readers: Vec::new(),
                });
            }
        }
        for op in &self.ops {
            match (&op.kind, op.outputs.first()) {
                (BlockOpKind::Output { .. }, _) => op.inputs.iter().for_each(|&t| lives[index[t]].output = true),
                (_, Some(&made)) => op.inputs.iter().for_each(|&t| lives[index[t]].readers.push(index[made])),
                (_, None) => {}
            }
        }
        peak_bytes(&lives)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(bytes: usize, phase: Phase, readers: &[usize]) -> TileLife {
        TileLife { bytes, phase, input: false, accumulator: false, output: false, readers: readers.to_vec() }
    }

    fn output(t: TileLife) -> TileLife {
        TileLife { output: true, ..t }
    }

    #[test]
    fn a_tile_made_before_the_loop_and_read_in_it_lives_through_the_loop() {
        // q (pre-loop, read by tile 2 in the loop), then two loop tiles.
        let mut tiles =
            vec![tile(100, Phase::Invariant, &[2]), tile(10, Phase::Loop, &[2]), tile(1, Phase::Loop, &[3])];
        tiles.push(output(tile(1000, Phase::Loop, &[])));
        // At tile 3 (the loop's last op) q is still live: the next iteration reads it.
        assert_eq!(peak_bytes(&tiles), 100 + 1 + 1000);
    }

    #[test]
    fn an_accumulator_lives_from_the_loops_start() {
        let mut acc = tile(500, Phase::Post, &[2]);
        acc.accumulator = true;
        let tiles = vec![tile(50, Phase::Loop, &[1]), acc, output(tile(7, Phase::Post, &[]))];
        // At tile 0 the accumulator already holds the earlier iterations' sum.
        assert_eq!(peak_bytes(&tiles), 550);
    }

    #[test]
    fn an_unread_tile_of_a_partial_graph_counts_only_at_its_op() {
        let tiles = vec![tile(100, Phase::Loop, &[]), tile(10, Phase::Loop, &[])];
        assert_eq!(peak_bytes(&tiles), 100);
        // Outputs (saved at the end) live to the end.
        assert_eq!(peak_bytes(&tiles.into_iter().map(output).collect::<Vec<_>>()), 110);
    }

    #[test]
    fn a_tile_read_by_later_ops_and_saved_lives_until_the_save() {
        // Tile 0 is read by tile 1 and also saved: it outlives its last reader.
        let tiles =
            vec![output(tile(100, Phase::Post, &[1])), tile(10, Phase::Post, &[2]), tile(1000, Phase::Post, &[])];
        assert_eq!(peak_bytes(&tiles), 100 + 10 + 1000);
    }

    #[test]
    fn the_peak_of_an_attention_block_is_below_the_sum_of_its_tiles() {
        let a = crate::zoo::Attn { b: 2, h: 128, d: 64, s: 1024, splits: 2, frange: 4, qsplit: 1 };
        let pair = crate::zoo::qknorm_attention_online(a, crate::types::DType::Float16).expect("zoo graph");
        let mut seen = 0;
        for op in &pair.ugraph.ops {
            if let crate::kernel::KernelOpKind::Customized { graph } = &op.kind {
                let (peak, sum) = (graph.shared_memory_peak(), graph.shared_memory_upper_bound());
                let inputs: usize = graph
                    .ops
                    .iter()
                    .filter(|o| matches!(o.kind, BlockOpKind::Input { .. }))
                    .map(|o| numel(&graph.tensors[o.outputs[0]].dims) * graph.tensors[o.outputs[0]].dtype.size_bytes())
                    .sum();
                assert!(inputs < peak && peak <= sum, "inputs {inputs} peak {peak} sum {sum}");
                if graph.forloop_range > 1 {
                    assert!(peak < sum, "a loop frees its scores: peak {peak} sum {sum}");
                }
                seen += 1;
            }
        }
        assert_eq!(seen, 2);
    }
}
