//! RMSNorm + Linear as one customized kernel, built through the facade crate's builder API and
//! run on the CPU interpreter against the plain two-op graph.
//!
//! `cargo run --release --example rmsnorm_linear`

use std::time::Instant;

use mirage::{Accum, BinaryOp, BlockGraph, DType, KernelGraph, Tensor};

fn main() -> mirage::Result<()> {
    let (m, k, n) = (16, 4096, 4096);
    // The fused µGraph: grid of 64 blocks over W's columns, loop of 64 over k.
    let mut fused = KernelGraph::new();
    let x = fused.new_input(&[m, k], DType::Float16, None)?;
    let w = fused.new_input(&[k, n], DType::Float16, None)?;
    let mut tb = BlockGraph::new([64, 1, 1], [128, 1, 1], 64, 64)?;
    let tx = tb.new_input(&[m, k], DType::Float16, [-1, -1, -1], 1)?;
    let tw = tb.new_input(&[k, n], DType::Float16, [1, -1, -1], 0)?;
    let mm = tb.matmul(tx, tw)?;
    let acc = tb.forloop_accum(mm, Accum::None)?;
    let rms = tb.forloop_accum(tx, Accum::Rms)?;
    let out = tb.binary(BinaryOp::Div, acc, rms)?;
    tb.new_output(out, [1, -1, -1], -1)?;
    let z = fused.customized(&[x, w], tb)?;
    fused.mark_output(z[0], None)?;

    // The plain program: rms_norm then matmul.
    let mut plain = KernelGraph::new();
    let px = plain.new_input(&[m, k], DType::Float16, None)?;
    let pw = plain.new_input(&[k, n], DType::Float16, None)?;
    let y = plain.rms_norm(px, &[k], None)?;
    let pz = plain.matmul(y, pw)?;
    plain.mark_output(pz, None)?;

    let inputs = [Tensor::random(&[m, k], 1), Tensor::random(&[k, n], 2)];
    let t0 = Instant::now();
    let got = mirage::run(&fused, &inputs)?;
    let fused_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let want = mirage::run(&plain, &inputs)?;
    let plain_s = t1.elapsed().as_secs_f64();
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in got[0].data.iter().zip(&want[0].data) {
        num += ((a - b) as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    println!("RMSNorm+Linear X {m}x{k}, W {k}x{n}");
    println!("  one-kernel µGraph on the interpreter: {fused_s:.3} s ({} rayon threads)", rayon_threads());
    println!("  plain rms_norm + matmul graph:        {plain_s:.3} s");
    println!("  relative error ||fused - plain|| / ||plain|| = {:.2e}", (num / den).sqrt());
    Ok(())
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}
