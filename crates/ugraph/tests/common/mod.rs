//! Graph builders shared by the integration tests: the reference's hand-written µGraphs, a
//! graph using every op kind, and a random builder-call generator.
#![allow(dead_code)]

use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph, Phase, STensorId, TensorId, UnaryOp};

/// RMSNorm + Linear as one customized kernel (X [16,4096] f16, W [4096,4096]).
pub fn rmsnorm_linear() -> KernelGraph {
    let mut g = KernelGraph::new();
    let x = g.new_input(&[16, 4096], DType::Float16, None).unwrap();
    let w = g.new_input(&[4096, 4096], DType::Float16, None).unwrap();
    let mut tb = BlockGraph::new([64, 1, 1], [128, 1, 1], 64, 64).unwrap();
    let tx = tb.new_input(&[16, 4096], DType::Float16, [-1, -1, -1], 1).unwrap();
    let tw = tb.new_input(&[4096, 4096], DType::Float16, [1, -1, -1], 0).unwrap();
    let mm = tb.matmul(tx, tw).unwrap();
    let acc = tb.forloop_accum(mm, Accum::None).unwrap();
    let rms = tb.forloop_accum(tx, Accum::Rms).unwrap();
    let out = tb.binary(BinaryOp::Div, acc, rms).unwrap();
    tb.new_output(out, [1, -1, -1], -1).unwrap();
    let outs = g.customized(&[x, w], tb).unwrap();
    g.mark_output(outs[0], None).unwrap();
    g
}

/// Every unary op, with constants.
pub fn all_unary() -> Vec<UnaryOp> {
    use UnaryOp::*;
    vec![Exp, Silu, Gelu, Relu, Sqrt, Square, Clamp { min: -1.5, max: f32::INFINITY }, MulScalar { scalar: 0.1 }]
}

/// Every binary op.
pub const ALL_BINARY: [BinaryOp; 5] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow];

/// A block graph using every block op kind (grid (2,1,1), loop 2, dimx 2) on A [8,16], B [16,8].
pub fn every_block_op() -> BlockGraph {
    let f = DType::Float32;
    let mut tb = BlockGraph::new([2, 1, 1], [128, 1, 1], 2, 2).unwrap();
    let a = tb.new_input(&[8, 16], f, [0, -1, -1], 1).unwrap(); // [4,8]
    let b = tb.new_input(&[16, 8], f, [-1, -1, -1], 0).unwrap(); // [8,8]
    let mm = tb.matmul(a, b).unwrap(); // [4,8]
    let mut u = mm;
    for op in all_unary() {
        u = tb.unary(op, u).unwrap();
    }
    let (m, d) = tb.reduction_max(mm, 1).unwrap(); // [4,1]
    let sc = tb.unary(UnaryOp::Exp, d).unwrap();
    let r = tb.reduction(u, 1).unwrap();
    let resc = tb.forloop_accum_rescale(r, sc, Accum::None).unwrap();
    let resc_sum = tb.forloop_accum_rescale(u, sc, Accum::Sum).unwrap();
    let cat = tb.concat(mm, u, 1).unwrap(); // [4,16]
    let acc = tb.forloop_accum(cat, Accum::None).unwrap();
    let sum = tb.forloop_accum(mm, Accum::Sum).unwrap();
    let mean = tb.forloop_accum(mm, Accum::Mean).unwrap();
    let rms = tb.forloop_accum(a, Accum::Rms).unwrap();
    let dimx = tb.forloop_accum(mm, Accum::SumToDimx).unwrap(); // [4,2]
    let mx = tb.forloop_accum_max(m).unwrap();
    let rn = tb.rms_norm(acc).unwrap();
    let o1 = tb.binary(BinaryOp::Div, rn, rms).unwrap();
    let mut s = sum;
    for (op, t) in ALL_BINARY.iter().zip([mean, mx, resc, resc_sum, mean]) {
        s = tb.binary(*op, s, t).unwrap();
    }
    tb.new_output(o1, [0, -1, -1], -1).unwrap();
    tb.new_output(dimx, [0, -1, -1], -1).unwrap();
    tb.new_output(s, [0, -1, -1], -1).unwrap();
    tb.new_output(mm, [0, -1, -1], 1).unwrap();
    tb
}

/// A graph with every kernel op kind and a customized op with every block op kind.
pub fn every_op() -> KernelGraph {
    let f = DType::Float32;
    let mut g = KernelGraph::new();
    let a = g.new_input(&[8, 16], f, None).unwrap();
    let b = g.new_input(&[16, 8], f, Some(&[1, 16])).unwrap();
    let w = g.new_input(&[8], f, None).unwrap();
    let mm = g.matmul(a, b).unwrap(); // [8,8]
    let mut u = mm;
    for op in all_unary() {
        u = g.unary(op, u).unwrap();
    }
    let mut x = u;
    for op in ALL_BINARY {
        x = g.binary(op, x, mm).unwrap();
    }
    let r = g.reduction(x, -1).unwrap();
    let n1 = g.rms_norm(x, &[8], Some(w)).unwrap();
    let n2 = g.rms_norm(n1, &[8, 8], None).unwrap();
    let sm = g.softmax(n2, 0).unwrap();
    let outs = g.customized(&[a, b], every_block_op()).unwrap();
    g.mark_output(r, None).unwrap();
    g.mark_output(sm, Some(&[1, 8])).unwrap();
    for o in outs {
        g.mark_output(o, None).unwrap();
    }
    g
}

/// SplitMix64: a deterministic stream driven by a proptest seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    pub fn f32_finite(&mut self) -> f32 {
        loop {
            let x = f32::from_bits(self.next() as u32);
            if x.is_finite() {
                return x;
            }
        }
    }
}

fn random_unary(r: &mut Rng) -> UnaryOp {
    match r.below(8) {
        0 => UnaryOp::Exp,
        1 => UnaryOp::Silu,
        2 => UnaryOp::Gelu,
        3 => UnaryOp::Relu,
        4 => UnaryOp::Sqrt,
        5 => UnaryOp::Square,
        6 => {
            let mut v = [r.f32_finite(), r.f32_finite()];
            if r.below(4) == 0 {
                v[r.below(2)] = r.pick(&[f32::INFINITY, f32::NEG_INFINITY]);
            }
            v.sort_by(f32::total_cmp);
            UnaryOp::Clamp { min: v[0], max: v[1] }
        }
        _ => UnaryOp::MulScalar { scalar: r.f32_finite() },
    }
}

fn random_dims(r: &mut Rng) -> Vec<usize> {
    (0..r.range(1, 4)).map(|_| r.pick(&[1, 2, 4, 8])).collect()
}

fn random_accum(r: &mut Rng) -> Accum {
    r.pick(&[Accum::None, Accum::Sum, Accum::Mean, Accum::Rms, Accum::SumToDimx])
}

/// Dense strides of `dims` in a random dim order.
fn random_strides(r: &mut Rng, dims: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..dims.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, r.below(i + 1));
    }
    let mut strides = vec![0; dims.len()];
    let mut s = 1;
    for &i in order.iter().rev() {
        strides[i] = s;
        s *= dims[i];
    }
    strides
}

/// A random customized op on 1-2 random tensors of `g`; `None` when the builder rejects it.
fn random_customized(r: &mut Rng, g: &mut KernelGraph) -> Option<Vec<TensorId>> {
    let ins: Vec<TensorId> = (0..r.range(1, 3)).map(|_| r.below(g.tensors.len())).collect();
    let grid = [r.pick(&[1, 2, 4]), r.pick(&[1, 2]), 1];
    let mut tb = BlockGraph::new(grid, [r.pick(&[32, 128]), 1, 1], r.pick(&[1, 2, 4]), r.pick(&[1, 2])).ok()?;
    let mut ts: Vec<STensorId> = Vec::new();
    for &t in &ins {
        let (dims, dtype) = (g.tensors[t].dims.clone(), g.tensors[t].dtype);
        let rank = dims.len() as i64;
        let tile = (0..8)
            .find_map(|_| {
                let imap = [r.range(-1, rank), r.range(-1, rank), r.range(-1, rank)];
                tb.new_input(&dims, dtype, imap, r.range(-1, rank)).ok()
            })
            .or_else(|| tb.new_input(&dims, dtype, [-1, -1, -1], -1).ok())?;
        ts.push(tile);
    }
    for _ in 0..r.range(0, 8) {
        let (a, b) = (r.pick(&ts), r.pick(&ts));
        let rank = tb.tensors[a].dims.len() as i64;
        let res = match r.below(10) {
            0 => tb.matmul(a, b),
            1 | 2 => tb.unary(random_unary(r), a),
            3 => tb.binary(r.pick(&ALL_BINARY), a, b),
            4 => tb.reduction(a, r.range(-rank, rank)),
            5 => tb.reduction_max(a, r.range(-rank, rank)).map(|(m, _)| m),
            6 => tb.rms_norm(a),
            7 => tb.concat(a, b, r.range(-rank, rank)),
            8 => tb.forloop_accum(a, random_accum(r)),
            _ => match r.below(2) {
                0 => tb.forloop_accum_rescale(a, b, r.pick(&[Accum::None, Accum::Sum])),
                _ => tb.forloop_accum_max(a),
            },
        };
        if let Ok(t) = res {
            ts.push(t);
        }
    }
    for _ in 0..r.range(1, 3) {
        let mut t = r.pick(&ts);
        if tb.tensors[t].phase == Phase::Loop && r.below(2) == 0 {
            t = tb.forloop_accum(t, random_accum(r)).unwrap_or(t);
        }
        let rank = tb.tensors[t].dims.len() as i64;
        for _ in 0..8 {
            let omap = [r.range(-1, rank), r.range(-1, rank), r.range(-1, rank)];
            if tb.new_output(t, omap, r.range(-1, rank)).is_ok() {
                break;
            }
        }
    }
    g.customized(&ins, tb).ok()
}

/// A random valid graph: random builder calls, skipping the ones the builder rejects.
pub fn random_graph(seed: u64, steps: usize) -> KernelGraph {
    let r = &mut Rng(seed);
    let mut g = KernelGraph::new();
    for _ in 0..r.range(1, 4) {
        let dims = random_dims(r);
        let strides = (r.below(3) == 0).then(|| random_strides(r, &dims));
        g.new_input(&dims, r.pick(&[DType::Float16, DType::Bfloat16, DType::Float32]), strides.as_deref()).unwrap();
    }
    for _ in 0..steps {
        let n = g.tensors.len();
        let (a, b) = (r.below(n), r.below(n));
        let rank = g.tensors[a].dims.len() as i64;
        let _ = match r.below(9) {
            0 => g.new_input(&random_dims(r), DType::Float32, None).map(drop),
            1 => g.matmul(a, b).map(drop),
            2 => g.unary(random_unary(r), a).map(drop),
            3 => g.binary(r.pick(&ALL_BINARY), a, b).map(drop),
            4 => g.reduction(a, r.range(-rank, rank)).map(drop),
            5 => {
                let dims = g.tensors[a].dims.clone();
                let k = r.range(1, rank + 1) as usize;
                let w = (r.below(2) == 0).then_some(b);
                g.rms_norm(a, &dims[dims.len() - k..], w).map(drop)
            }
            6 => g.softmax(a, r.range(-rank, rank)).map(drop),
            _ => {
                random_customized(r, &mut g);
                Ok(())
            }
        };
    }
    for t in 0..g.tensors.len() {
        if r.below(4) == 0 {
            let strides = (r.below(2) == 0).then(|| random_strides(r, &g.tensors[t].dims.clone()));
            g.mark_output(t, strides.as_deref()).unwrap();
        }
    }
    g
}
