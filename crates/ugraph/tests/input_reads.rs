//! How the interpreter reads graph inputs from a `Source`: an input one predefined op alone
//! reads is read band by band (each element once, never as one whole box when it is large); an
//! input a customized kernel alone reads is read tile by tile where its blocks read each
//! element at most twice; an input several ops read, or whose tiles many blocks read, is read
//! once whole. Values match the materialised run either way.

use std::sync::Mutex;

use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{random_inputs, run, run_region, BinaryOp, DType, KernelGraph, Region, Source, Tensor};

/// A source over materialised tensors that records every box read: (input, elements).
struct Counting {
    xs: Vec<Tensor<f32>>,
    reads: Mutex<Vec<(usize, usize)>>,
}

impl Source<f32> for Counting {
    fn read(&self, input: usize, off: &[usize], extent: &[usize]) -> Tensor<f32> {
        self.reads.lock().unwrap().push((input, extent.iter().product()));
        self.xs[input].slice(off, extent)
    }
}

/// Runs `g` whole through a counting source, checks its values against `run`, returns the reads.
fn reads(g: &KernelGraph) -> Vec<(usize, usize)> {
    let xs = random_inputs(g, 1);
    let src = Counting { xs: xs.clone(), reads: Mutex::new(Vec::new()) };
    let regions: Vec<Region> = g.output_ids().iter().map(|&t| Region::full(&g.tensors[t].dims)).collect();
    let got = run_region(g, &src, &regions).unwrap();
    assert_eq!(got[0].data, run(g, &xs).unwrap()[0].data);
    src.reads.into_inner().unwrap()
}

#[test]
fn an_input_one_predefined_op_reads_is_read_in_bands() {
    // Batched Q K^T, decode-shaped: K (64 x 128 x 1024) is 8M elements, read a band at a time.
    let (b, d, keys) = (64, 128, 1024);
    let mut g = KernelGraph::new();
    let q = g.new_input(&[b, 4, d], DType::Float32, None).unwrap();
    let k = g.new_input(&[b, d, keys], DType::Float32, None).unwrap();
    let s = g.matmul(q, k).unwrap();
    g.mark_output(s, None).unwrap();
    let r = reads(&g);
    let k_reads: Vec<usize> = r.iter().filter(|x| x.0 == 1).map(|x| x.1).collect();
    assert!(k_reads.len() > 1, "{k_reads:?}");
    assert_eq!(k_reads.iter().sum::<usize>(), b * d * keys, "each element of K once");
    assert!(k_reads.iter().all(|&n| n <= 1 << 21), "{k_reads:?}");
}

#[test]
fn an_input_several_ops_read_or_every_band_needs_is_read_once_whole() {
    // x feeds two matmuls; W (every row band needs it whole) feeds one.
    let (m, k, n) = (256, 512, 64);
    let mut g = KernelGraph::new();
    let x = g.new_input(&[m, k], DType::Float32, None).unwrap();
    let w = g.new_input(&[k, n], DType::Float32, None).unwrap();
    let v = g.new_input(&[k, n], DType::Float32, None).unwrap();
    let a = g.matmul(x, w).unwrap();
    let c = g.matmul(x, v).unwrap();
    let y = g.binary(BinaryOp::Add, a, c).unwrap();
    g.mark_output(y, None).unwrap();
    let mut r = reads(&g);
    r.sort_unstable();
    assert_eq!(r, vec![(0, m * k), (1, k * n), (2, k * n)]);
}

#[test]
fn a_customized_kernel_reads_its_tiles_unless_many_blocks_read_each() {
    // Split-KV attention: each block reads its own K and V tiles, one a loop iteration; every
    // one of the 4 splits of a batch item reads its Q rows.
    let (b, h, d, s) = (2, 8, 64, 1024);
    let attn = |qsplit| Attn { b, h, d, s, splits: 4, frange: 4, qsplit };
    let g = zoo::attention_online(attn(1), DType::Float32).unwrap().ugraph;
    let r = reads(&g);
    let of = |input: usize| -> Vec<usize> { r.iter().filter(|x| x.0 == input).map(|x| x.1).collect() };
    assert_eq!(of(0), vec![b * h * d], "Q, which every split reads, whole");
    for input in [1, 2] {
        let tiles = of(input);
        assert_eq!(tiles.len(), b * 4 * 4, "input {input}: a tile a block and iteration");
        assert!(tiles.iter().all(|&n| n == d * s / 16), "input {input}: {tiles:?}");
    }
    // With the rows of each item split over 4 blocks too, each K and V tile is read 4 times:
    // they are read whole.
    let g = zoo::attention_online(attn(4), DType::Float32).unwrap().ugraph;
    let mut r = reads(&g);
    r.sort_unstable();
    assert_eq!(r, vec![(0, b * h * d), (1, b * d * s), (2, b * s * d)]);
}
