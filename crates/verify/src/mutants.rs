//! Sparse mutants of a reference and candidate pair: the cases that show every-element
//! coverage's bound (docs/verifier.md). A mutant differs from the reference in one element, one
//! row, one column, one tile, the tail tile or one column at a tile boundary of its first
//! output, and nowhere else; a sampled comparison can miss it, every-element coverage must not.
//!
//! Construction: the reference and the candidate both get, added to their first output, a delta
//! that a block graph assembles by concatenating new graph inputs (a 3x3 partition of the
//! output's last two dims around the box). The mutant is the candidate whose block graph scales
//! the box's piece by 2, so its float result differs exactly on the box ([`check_pair`] checks
//! that with the f64 interpreter before it asks the verifier).
//!
//! ```
//! use mirage_ugraph::{zoo, DType};
//! let pair = zoo::rmsnorm_linear(4, 32, 64, 4, 4, DType::Float32).unwrap();
//! for m in mirage_verify::mutants::check_pair(&pair.reference, &pair.ugraph, "rmsnorm").unwrap() {
//!     assert!(m.sound(), "{m:?}");
//! }
//! ```

use mirage_ugraph::{run, BinaryOp, BlockGraph, KernelGraph, Tensor, UnaryOp};

use crate::check::{equivalent, Options, Verdict};
use crate::every::Coverage;
use crate::inputs::normal_inputs;
use crate::sample::tiles;
use crate::VerifyError;

/// A box of the last two dims of an output: rows `r0..r1`, columns `c0..c1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseBox {
    /// Which sparse case: "element", "row", "column", "tile", "tail tile" or "boundary".
    pub what: &'static str,
    /// First row.
    pub r0: usize,
    /// One past the last row.
    pub r1: usize,
    /// First column.
    pub c0: usize,
    /// One past the last column.
    pub c1: usize,
}

impl SparseBox {
    fn contains(&self, row: usize, col: usize) -> bool {
        (self.r0..self.r1).contains(&row) && (self.c0..self.c1).contains(&col)
    }
}

/// `[0, n)` cut at `a` and `b`: the non-empty pieces `(length, is_middle)`.
fn cuts(n: usize, a: usize, b: usize) -> Vec<(usize, bool)> {
    [(a, false), (b - a, true), (n - b, false)].into_iter().filter(|p| p.0 > 0).collect()
}

/// The six sparse boxes of `candidate`'s first output `[.., m, n]`, its tiles (as the sampled
/// coverage sees them) placing the tile, tail-tile and boundary cases. Empty when the output
/// has fewer than two dims.
pub fn sparse_boxes(candidate: &KernelGraph) -> Vec<SparseBox> {
    let Some(&out) = candidate.output_ids().first() else { return Vec::new() };
    let dims = &candidate.tensors[out].dims;
    let r = dims.len();
    if r < 2 {
        return Vec::new();
    }
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let ts = tiles(candidate, out, 1 << 20, 0);
    let tile_box = |what, i: usize| {
        let t = &ts[i];
        SparseBox {
            what,
            r0: t.start[r - 2],
            r1: t.start[r - 2] + t.extent[r - 2],
            c0: t.start[r - 1],
            c1: t.start[r - 1] + t.extent[r - 1],
        }
    };
    let (tile, tail) = if ts.len() >= 3 {
        (tile_box("tile", ts.len() / 2), tile_box("tail tile", ts.len() - 1))
    } else {
        (
            SparseBox { what: "tile", r0: 0, r1: m.div_ceil(2), c0: 0, c1: n.div_ceil(2) },
            SparseBox { what: "tail tile", r0: m / 2, r1: m, c0: n / 2, c1: n },
        )
    };
    // The first column (or row) of the second tile: an off-by-one at a tile boundary.
    let boundary = match ts.get(1) {
        Some(t) if t.start[r - 1] > 0 => {
            SparseBox { what: "boundary", r0: 0, r1: m, c0: t.start[r - 1], c1: t.start[r - 1] + 1 }
        }
        Some(t) if t.start[r - 2] > 0 => {
            SparseBox { what: "boundary", r0: t.start[r - 2], r1: t.start[r - 2] + 1, c0: 0, c1: n }
        }
        _ => SparseBox { what: "boundary", r0: 0, r1: m, c0: n / 2, c1: n / 2 + 1 },
    };
    vec![
        SparseBox { what: "element", r0: m / 3, r1: m / 3 + 1, c0: n / 3, c1: n / 3 + 1 },
        SparseBox { what: "row", r0: m / 2, r1: m / 2 + 1, c0: 0, c1: n },
        SparseBox { what: "column", r0: 0, r1: m, c0: 2 * n / 3, c1: 2 * n / 3 + 1 },
        tile,
        tail,
        boundary,
    ]
}

/// `base` with its first output replaced by `output + delta`, the delta assembled from new
/// graph inputs (one per piece of the 3x3 partition around `bx`), its box piece scaled by
/// `scale` when given.
pub fn with_delta(base: &KernelGraph, bx: SparseBox, scale: Option<f32>) -> Result<KernelGraph, VerifyError> {
    let mut g = base.clone();
    let Some(&out) = g.output_ids().first() else {
        return Err(VerifyError::Interface("the graph has no output".into()));
    };
    let dims = g.tensors[out].dims.clone();
    let dt = g.tensors[out].dtype;
    let r = dims.len();
    if r < 2 || bx.r1 > dims[r - 2] || bx.c1 > dims[r - 1] || bx.r0 >= bx.r1 || bx.c0 >= bx.c1 {
        return Err(VerifyError::Interface(format!("box {bx:?} does not fit the output {dims:?}")));
    }
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let mut tb = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 64)?;
    let mut ins = Vec::new();
    let mut rows = Vec::new();
    for (r_len, r_mid) in cuts(m, bx.r0, bx.r1) {
        let mut row = None;
        for (c_len, c_mid) in cuts(n, bx.c0, bx.c1) {
            let mut d = dims.clone();
            d[r - 2] = r_len;
            d[r - 1] = c_len;
            ins.push(g.new_input(&d, dt, None)?);
            let mut t = tb.new_input(&d, dt, [-1, -1, -1], -1)?;
            if let (true, true, Some(s)) = (r_mid, c_mid, scale) {
                t = tb.unary(UnaryOp::MulScalar { scalar: s }, t)?;
            }
            row = Some(match row {
                None => t,
                Some(acc) => tb.concat(acc, t, r as i64 - 1)?,
            });
        }
        rows.extend(row);
    }
    let mut delta = None;
    for row in rows {
        delta = Some(match delta {
            None => row,
            Some(acc) => tb.concat(acc, row, r as i64 - 2)?,
        });
    }
    let Some(delta) = delta else { return Err(VerifyError::Interface("an empty output".into())) };
    tb.new_output(delta, [-1, -1, -1], -1)?;
    let d = g.customized(&ins, tb)?[0];
    let sum = g.binary(BinaryOp::Add, out, d)?;
    g.outputs[0].tensor = sum;
    Ok(g.revalidate()?)
}

/// What the verifier made of one sparse mutant of a pair.
#[derive(Debug, Clone)]
pub struct MutantOutcome {
    /// The pair's name and the box.
    pub what: String,
    /// The f64 interpreter sees the mutant differ from the reference inside the box only.
    pub differs_only_in_box: bool,
    /// Every-element coverage accepts the candidate with the same (unscaled) delta.
    pub fused_accepted: bool,
    /// Every-element coverage rejects the mutant.
    pub mutant_rejected: bool,
    /// The rejection's evidence lies in the box (true when not rejected).
    pub evidence_in_box: bool,
    /// The default sampled coverage accepts the mutant (not sound for sparse differences).
    pub sampled_accepted: bool,
}

impl MutantOutcome {
    /// The case is a real sparse mutant, the fused form passes, the mutant fails where it
    /// differs.
    pub fn sound(&self) -> bool {
        self.differs_only_in_box && self.fused_accepted && self.mutant_rejected && self.evidence_in_box
    }
}

/// Whether the f64 outputs of `a` and `b` differ inside `bx` (by more than 1e-3) and agree
/// outside it (within 1e-9) on normal inputs.
fn differs_only_in(a: &KernelGraph, b: &KernelGraph, bx: SparseBox) -> Result<bool, VerifyError> {
    let ins: Vec<Tensor<f64>> = normal_inputs(a, 3);
    let (x, y) = (run(a, &ins)?, run(b, &ins)?);
    let (Some(x), Some(y)) = (x.first(), y.first()) else { return Ok(false) };
    let r = x.dims.len();
    let (m, n) = (x.dims[r - 2], x.dims[r - 1]);
    let (mut inside, mut outside) = (0.0f64, 0.0f64);
    for (i, (u, v)) in x.data.iter().zip(&y.data).enumerate() {
        let d = (u - v).abs();
        if bx.contains((i / n) % m, i % n) {
            inside = inside.max(d);
        } else {
            outside = outside.max(d);
        }
    }
    Ok(inside > 1e-3 && outside < 1e-9)
}

/// The six sparse mutants of `(reference, candidate)` ([`sparse_boxes`]), each judged by
/// every-element coverage (and, for the record, by the default sampled coverage).
pub fn check_pair(
    reference: &KernelGraph,
    candidate: &KernelGraph,
    name: &str,
) -> Result<Vec<MutantOutcome>, VerifyError> {
    let every = Options { coverage: Coverage::Every, float_check: false, ..Options::default() };
    let sampled = Options { float_check: false, ..Options::default() };
    let mut out = Vec::new();
    for bx in sparse_boxes(candidate) {
        let reference = with_delta(reference, bx, None)?;
        let fused = with_delta(candidate, bx, None)?;
        let mutant = with_delta(candidate, bx, Some(2.0))?;
        let fused_accepted =
            matches!(equivalent(&reference, &fused, &every)?, Verdict::Equivalent { coverage: Coverage::Every, .. });
        let v = equivalent(&reference, &mutant, &every)?;
        let evidence_in_box = match &v {
            Verdict::NotEquivalent { index, .. } if index.len() >= 2 => {
                bx.contains(index[index.len() - 2], index[index.len() - 1])
            }
            _ => true,
        };
        out.push(MutantOutcome {
            what: format!("{name} {} {bx:?}", bx.what),
            differs_only_in_box: differs_only_in(&reference, &mutant, bx)?,
            fused_accepted,
            mutant_rejected: !v.is_equivalent(),
            evidence_in_box,
            sampled_accepted: equivalent(&reference, &mutant, &sampled)?.is_equivalent(),
        });
    }
    Ok(out)
}
