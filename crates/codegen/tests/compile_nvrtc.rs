//! Every zoo µGraph (and its reference program of predefined ops) generates CUDA that NVRTC
//! compiles for sm_80 and sm_90. Skipped, with a message, only when NVRTC cannot be found
//! (set `MIRAGE_NVRTC_PATH`, or keep the repository's `.venv` with the nvidia pip packages).

use std::path::PathBuf;

use mirage_codegen::{generate, nvrtc, sass, Options, WsWarpgroups};
use mirage_ugraph::zoo::{self, Attn};
use mirage_ugraph::{Accum, BinaryOp, BlockGraph, DType, KernelGraph, KernelOpKind, Target, UnaryOp};

/// Points NVRTC discovery at the repository's virtualenv when nothing else is configured.
fn setup() -> bool {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut libs = Vec::new();
    let mut incs = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root.join(".venv/lib")) {
        for e in rd.flatten() {
            let cu = e.path().join("site-packages/nvidia/cu13");
            libs.push(cu.join("lib"));
            incs.push(cu.join("include"));
        }
    }
    nvrtc::configure(&libs, &incs);
    match nvrtc::info() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIPPED: NVRTC not found ({e}); set MIRAGE_NVRTC_PATH to run these tests");
            false
        }
    }
}

/// Compiles `g` for sm_80 and sm_90; where matmuls become cuBLAS steps, also with them on
/// the default kernel (what runs where cuBLAS does not load).
fn compile_all(name: &str, g: &KernelGraph) {
    for arch in [80, 90] {
        for cublas in [true, false] {
            let p = generate(g, &Options { cublas, ..Options::for_arch(arch) })
                .unwrap_or_else(|e| panic!("{name}: generate failed: {e}"));
            assert_waits_first(name, &p);
            if let Err(e) = nvrtc::compile(&p.source, arch) {
                panic!("{name} (sm_{arch}) failed to compile: {e}\n--- source ---\n{}", p.source);
            }
            if p.gemms().next().is_none() {
                break;
            }
        }
    }
}

/// Every kernel starts with the dependent-launch wait (it is launched as a programmatic
/// dependent of the previous kernel on sm_90, so it must not touch memory before it): only
/// L2 prefetches and their index arithmetic may come first. A kernel that waits without
/// letting the next one go (`mi::dep_wait`) lets it go later, exactly once (`mi::dep_launch`).
fn assert_waits_first(name: &str, p: &mirage_codegen::Program) {
    const BEFORE_WAIT: [&str; 9] = [
        "{",
        "}",
        "constexpr int NT = ",
        "const int tid = mi::lin_tid();",
        "const long long base = ",
        "for (int c = ",
        "const unsigned i = (unsigned)c * ",
        "mi::prefetch_l2(",
        "#pragma unroll",
    ];
    let mut lines = p.source.lines();
    let mut kernels = 0;
    while let Some(l) = lines.next() {
        if l.contains("__global__") {
            kernels += 1;
            loop {
                let next = lines.next().map(str::trim).unwrap_or_else(|| panic!("{name}: {l}: no wait"));
                if next == "mi::dep_enter();" {
                    break;
                }
                if next.starts_with("mi::dep_wait();") {
                    let body: String =
                        lines.clone().take_while(|b| !b.contains("__global__")).collect::<Vec<_>>().join("\n");
                    assert_eq!(
                        body.matches("mi::dep_launch();").count(),
                        1,
                        "{name}: {l}: the next kernel let go once"
                    );
                    break;
                }
                assert!(BEFORE_WAIT.iter().any(|w| next.starts_with(w)), "{name}: {l}: `{next}` before the wait");
            }
        }
    }
    assert_eq!(kernels, p.kernels.len(), "{name}");
    assert!(p.kernels.iter().all(|k| k.dep_wait), "{name}");
}

fn zoo_graphs(dt: DType) -> Vec<(String, KernelGraph)> {
    let a = Attn { b: 2, h: 32, d: 64, s: 512, splits: 4, frange: 2, qsplit: 1 };
    let mut pairs = vec![
        zoo::rmsnorm_linear(4, 256, 512, 8, 4, dt).unwrap(),
        zoo::gated_mlp(4, 256, 512, 8, 4, dt).unwrap(),
        zoo::lora(4, 256, 512, 16, 8, 4, dt).unwrap(),
        zoo::attention(a, false, dt).unwrap(),
        zoo::attention(a, true, dt).unwrap(),
        zoo::attention_online(a, dt).unwrap(),
        // One block per head: split across thread-block clusters on sm_90.
        zoo::attention_online(Attn { h: 64, splits: 1, frange: 4, ..a }, dt).unwrap(),
        // 64 rows: on sm_90 the wgmma form, with the normalised Q swizzled.
        zoo::qnorm_attention_online(Attn { h: 64, ..a }, dt).unwrap(),
        // ... and with V's tiles normalised in place in the loop.
        zoo::qknorm_attention_online(Attn { h: 64, ..a }, dt).unwrap(),
        zoo::ntrans(4, 512, dt).unwrap(),
    ];
    pairs.extend(zoo::paper_workloads(1).unwrap());
    let mut out = Vec::new();
    for p in pairs {
        out.push((format!("{}/ugraph/{}", p.name, dt.name()), p.ugraph));
        out.push((format!("{}/reference/{}", p.name, dt.name()), p.reference));
    }
    out
}

#[test]
fn zoo_compiles_for_sm80_and_sm90() {
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        for (name, g) in zoo_graphs(dt) {
            compile_all(&name, &g);
        }
    }
}

#[test]
fn kernel_ops_compile() {
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[3, 5, 7], dt, None).unwrap();
        let y = g.new_input(&[3, 1, 7], dt, Some(&[1, 1, 3])).unwrap();
        let w = g.new_input(&[7], dt, None).unwrap();
        let m = g.new_input(&[3, 7, 9], dt, None).unwrap();
        let a = g.binary(BinaryOp::Add, x, y).unwrap();
        let e = g.unary(UnaryOp::Gelu, a).unwrap();
        let c = g.unary(UnaryOp::Clamp { min: -1.5, max: f32::INFINITY }, e).unwrap();
        let r = g.reduction(c, 1).unwrap();
        let n = g.rms_norm(a, &[7], Some(w)).unwrap();
        let s = g.softmax(n, 1).unwrap();
        let mm = g.matmul(s, m).unwrap();
        let p = g.binary(BinaryOp::Pow, mm, mm).unwrap();
        g.mark_output(r, None).unwrap();
        g.mark_output(p, Some(&[1, 27, 3])).unwrap();
        g.mark_output(x, None).unwrap();
        compile_all(&format!("kernel ops {}", dt.name()), &g);
    }
}

#[test]
fn block_ops_compile() {
    if !setup() {
        return;
    }
    let dt = DType::Float16;
    let mut g = KernelGraph::new();
    let x = g.new_input(&[8, 64], dt, None).unwrap();
    let y = g.new_input(&[8, 64], dt, None).unwrap();
    let mut tb = BlockGraph::new([2, 2, 1], [96, 1, 1], 4, 4).unwrap();
    let tx = tb.new_input(&[8, 64], dt, [0, -1, -1], 1).unwrap();
    let ty = tb.new_input(&[8, 64], dt, [-1, 0, -1], -1).unwrap();
    let c = tb.concat(tx, tx, 1).unwrap();
    let r = tb.reduction(c, 0).unwrap();
    let (mx, diff) = tb.reduction_max(tx, 1).unwrap();
    let sq = tb.unary(UnaryOp::Sqrt, ty).unwrap();
    let rn = tb.rms_norm(sq).unwrap();
    let sc = tb.unary(UnaryOp::Exp, diff).unwrap();
    let a1 = tb.forloop_accum(r, Accum::SumToDimx).unwrap();
    let a2 = tb.forloop_accum_rescale(tx, sc, Accum::Sum).unwrap();
    let a3 = tb.forloop_accum_max(mx).unwrap();
    let a4 = tb.forloop_accum(tx, Accum::Mean).unwrap();
    tb.new_output(a1, [0, 1, -1], -1).unwrap();
    tb.new_output(a2, [0, 1, -1], -1).unwrap();
    tb.new_output(a3, [0, 1, -1], -1).unwrap();
    tb.new_output(a4, [0, 1, -1], -1).unwrap();
    tb.new_output(rn, [0, 1, -1], -1).unwrap();
    tb.new_output(c, [0, 1, -1], 1).unwrap();
    let outs = g.customized(&[x, y], tb).unwrap();
    for o in outs {
        g.mark_output(o, None).unwrap();
    }
    compile_all("block ops", &g);
}

/// A loop-free block graph of an RMS norm and an element-wise op over rows of `len`: the
/// register-row form (`rowreg`) for every row length it takes, and the general one beside it.
fn row_norm_graph(len: usize, dt: DType) -> KernelGraph {
    let rows = 4096 / len;
    let mut g = KernelGraph::new();
    let x = g.new_input(&[4, rows, len], dt, None).unwrap();
    let mut tb = BlockGraph::new([4, 2, 1], [128, 1, 1], 1, 4).unwrap();
    let tx = tb.new_input(&[4, rows, len], dt, [0, 1, -1], -1).unwrap();
    let rn = tb.rms_norm(tx).unwrap();
    let o = tb.binary(BinaryOp::Mul, rn, tx).unwrap();
    tb.new_output(o, [0, 1, -1], -1).unwrap();
    let outs = g.customized(&[x], tb).unwrap();
    g.mark_output(outs[0], None).unwrap();
    g
}

#[test]
fn register_row_norms_compile() {
    if !setup() {
        return;
    }
    for len in [8, 64, 128, 256, 512] {
        for dt in [DType::Float16, DType::Bfloat16] {
            let g = row_norm_graph(len, dt);
            let p = generate(&g, &Options::for_arch(90)).unwrap();
            assert!(p.source.contains("tiles in registers"), "rows of {len}: not the register form");
            assert_eq!(p.source.contains("mi::lanes_reduce<"), len < 256, "rows of {len}");
            compile_all(&format!("row norm {len} {}", dt.name()), &g);
        }
    }
}

#[test]
fn register_loops_compile() {
    if !setup() {
        return;
    }
    for (splits, threads) in [(8, 256), (8, 128), (64, 96)] {
        for dt in [DType::Float16, DType::Float32] {
            let g = zoo::combine(splits, threads, dt, false).unwrap();
            let p = generate(&g, &Options::for_arch(90)).unwrap();
            assert!(p.source.contains("element-wise in registers"), "{splits} splits: not the register form");
            // The per-row sum is stored by the first element of each row only.
            assert!(p.source.contains("if ((e % 64) == 0) out1["), "{splits} splits: per-row store");
            compile_all(&format!("combine {splits} x {threads} {}", dt.name()), &g);
        }
    }
}

#[test]
fn compile_error_returns_the_log() {
    if !setup() {
        return;
    }
    let err = nvrtc::compile("__global__ void k() { this is not cuda; }", 90).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("error"), "{msg}");
}

#[test]
fn cluster_split_attention_compiles() {
    // One block per head, split across clusters of two on sm_90 (distributed shared memory).
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16] {
        let a = Attn { b: 2, h: 64, d: 64, s: 512, splits: 1, frange: 4, qsplit: 1 };
        let g = zoo::attention_online(a, dt).unwrap().ugraph;
        let p = generate(&g, &Options::for_arch(90)).unwrap();
        assert!(p.kernels.iter().any(|k| k.cluster == [1, 2, 1]), "{}", p.launch_summary());
        if let Err(e) = nvrtc::compile(&p.source, 90) {
            panic!("cluster split ({}) failed to compile: {e}", dt.name());
        }
    }
}

#[test]
fn lazy_and_gathering_cluster_merges_compile() {
    // `Options::lazy_merge` on and off on the summing cluster splits (RMSNorm+Linear, gated
    // MLP; f16 and bf16): the lazy epilogue reads the receive area, the gathering one does not;
    // the pushes with st.async onto an mbarrier (`Options::async_push`) beside the first, plain
    // stores released on the cluster barrier beside the second.
    if !setup() {
        return;
    }
    for lazy in [true, false] {
        let opts = Options { lazy_merge: lazy, async_push: lazy, ..Options::for_arch(90) };
        for dt in [DType::Float16, DType::Bfloat16] {
            for pair in [
                zoo::rmsnorm_linear(4, 1024, 512, 8, 16, dt).unwrap(),
                zoo::gated_mlp(4, 1024, 512, 8, 16, dt).unwrap(),
            ] {
                let p = generate(&pair.ugraph, &opts).unwrap();
                assert_eq!(p.source.contains(" + mi_recv["), lazy, "{}", p.source);
                assert_eq!(p.source.contains("mi::cluster_gather<NT, "), !lazy, "{}", p.source);
                assert_eq!(p.source.contains("mi::cluster_push_async<NT>("), lazy, "{}", p.source);
                assert_waits_first("cluster merge", &p);
                if let Err(e) = nvrtc::compile(&p.source, 90) {
                    panic!("cluster merge (lazy {lazy}, {}) failed to compile: {e}", dt.name());
                }
            }
        }
    }
}

#[test]
fn warpgroup_loop_matmuls_compile() {
    // `Options::wgmma_acc`: RMSNorm+Linear and gated MLP with 64 columns a block and 16 or
    // 32 rows (one or two warpgroups, clusters and not; f16 and bf16) sum their matmuls with
    // `mi::MmaAccWG`, whose stages sit on 1024-byte boundaries, X in column blocks (read so by
    // the register row sums too); 2 rows keep the warp form.
    if !setup() {
        return;
    }
    let opts = Options { wgmma_acc: true, ..Options::for_arch(90) };
    for dt in [DType::Float16, DType::Bfloat16] {
        let two = generate(&with_threads(zoo::rmsnorm_linear(2, 4096, 4096, 64, 16, dt).unwrap().ugraph, 128), &opts);
        assert!(!two.unwrap().source.contains("mi::MmaAccWG<"));
        for (m, threads) in [(32, 128), (32, 256), (16, 128)] {
            for pair in [
                zoo::rmsnorm_linear(m, 4096, 4096, 64, 16, dt).unwrap(),
                zoo::gated_mlp(m, 4096, 4096, 64, 16, dt).unwrap(),
            ] {
                let g = with_threads(pair.ugraph, threads);
                let p = generate(&g, &opts).unwrap();
                assert!(p.source.contains("mi::MmaAccWG<NT, 1, "), "{}", p.source);
                assert!(!p.source.contains("mi::MmaAcc<NT"), "{}", p.source);
                assert!(p.source.contains("mi::fence_proxy_async();\n    __syncthreads();"), "{}", p.source);
                assert!(p.source.contains("unsigned char mi_smem[]") && p.source.contains("__align__(1024)"));
                assert!(p.source.contains("mi::swzb<256,"), "{}", p.source);
                if m == 32 && p.source.contains("mi::RowSumAcc<") {
                    assert!(p.source.contains(", true, true, true> rs"), "{}", p.source);
                }
                if let Err(e) = nvrtc::compile(&p.source, 90) {
                    panic!("warpgroup loop matmul ({m} rows, {threads} threads, {}) failed to compile: {e}", dt.name());
                }
                // Off (the default): the warp form; a block graph asking for it
                // (`warpgroup_acc`, the search's warpgroup twin) gets the same kernel.
                let plain = generate(&g, &Options::for_arch(90)).unwrap().source;
                assert!(!plain.contains("mi::MmaAccWG<") && plain.contains("mi::MmaAcc<NT"), "{plain}");
                let mut asked = g.clone();
                for op in &mut asked.ops {
                    if let KernelOpKind::Customized { graph } = &mut op.kind {
                        graph.warpgroup_acc = true;
                    }
                }
                assert_eq!(generate(&asked, &Options::for_arch(90)).unwrap().source, p.source);
                assert!(!generate(&asked, &Options::for_arch(80)).unwrap().source.contains("mi::MmaAccWG<"));
            }
        }
    }
}

#[test]
fn read_once_copies_carry_the_l2_policy() {
    // `Options::evict_first` (the default): the weight tiles each block reads alone take
    // `mi::cp_async16_pol` with the evict_first policy, the X tile that every column block
    // shares the plain copy; off, no copy carries a policy. Both compile for sm_80 and sm_90
    // in every dtype (the fp32 gated MLP of 3 rows is the kernel the unshuffled form broke).
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        for pair in
            [zoo::rmsnorm_linear(32, 512, 512, 8, 4, dt).unwrap(), zoo::gated_mlp(3, 256, 512, 8, 4, dt).unwrap()]
        {
            for arch in [80, 90] {
                let on = generate(&pair.ugraph, &Options::for_arch(arch)).unwrap().source;
                let kernels = on.split("generated kernels").nth(1).unwrap_or_default();
                assert!(kernels.contains("// input 1 -> t"), "{kernels}");
                // The copies' blocks (`{ // input K -> tT`), not the prefetches' (`{ // input K`).
                let loads = kernels
                    .split("{ // input ")
                    .skip(1)
                    .filter(|b| b.lines().next().is_some_and(|l| l.contains(" -> t")));
                for block in loads {
                    let once = block.contains("mi::cp_async16_pol(");
                    assert_eq!(once, !block.starts_with('0'), "input {}", &block[..40.min(block.len())]);
                    assert_eq!(block.contains("mi::l2_policy<false>()"), once);
                }
                let off = Options { evict_first: false, ..Options::for_arch(arch) };
                let plain = generate(&pair.ugraph, &off).unwrap().source;
                assert!(!plain.split("generated kernels").nth(1).unwrap_or_default().contains("_pol("));
                let compile = |src: &str| {
                    nvrtc::compile(src, arch)
                        .unwrap_or_else(|e| panic!("{} (sm_{arch}) failed to compile: {e}", pair.name))
                };
                let cubin = compile(&on);
                compile(&plain);
                // No copy's memory descriptor (a 64-bit uniform register pair) starts at an odd
                // register (`desc[UR1]`, after CUDA 13.0's ptxas split a uniform part of the
                // shared address, `LDGSTS [R+UR]`: an illegal instruction), and the hinted
                // copies' shared addresses (one shuffle a tile) keep no uniform register.
                if arch == 90 && nvdisasm_or_skip() {
                    let mut hinted = 0;
                    for k in sass::disassemble(&cubin).unwrap() {
                        let shuffled: Vec<&str> = k
                            .instructions
                            .iter()
                            .filter(|i| i.starts_with("SHFL.IDX"))
                            .filter_map(|i| i.split(' ').nth(2).map(|r| r.trim_end_matches(',')))
                            .collect();
                        for i in k.instructions.iter().filter(|i| i.contains("LDGSTS")) {
                            let desc = i.split("desc[UR").nth(1).and_then(|d| d.split(']').next());
                            let odd = desc.and_then(|d| d.parse::<u32>().ok()).is_some_and(|r| r % 2 == 1);
                            assert!(!odd, "{} {}: {i}", pair.name, k.name);
                            let addr = i.split('[').nth(1).unwrap_or_default();
                            let base = addr.split(['+', ']']).next().unwrap_or_default();
                            if shuffled.contains(&base) {
                                hinted += 1;
                                assert!(!addr.contains("UR"), "{} {}: {i}", pair.name, k.name);
                            }
                        }
                    }
                    assert!(hinted > 0, "{} ({dt:?}): no copy from a shuffled address", pair.name);
                }
            }
        }
    }
}

/// The zoo's one-kernel attention with `threads` threads a block.
fn one_kernel_attention(a: Attn, dt: DType, threads: usize) -> KernelGraph {
    with_threads(zoo::attention_one_kernel(a, dt).unwrap().ugraph, threads)
}

/// [`one_kernel_attention`] with Q and V normalised (`zoo::qknorm_attention_one_kernel`).
fn one_kernel_qknorm_attention(a: Attn, dt: DType, threads: usize) -> KernelGraph {
    with_threads(zoo::qknorm_attention_one_kernel(a, dt).unwrap().ugraph, threads)
}

fn with_threads(mut g: KernelGraph, threads: usize) -> KernelGraph {
    for op in &mut g.ops {
        if let KernelOpKind::Customized { graph } = &mut op.kind {
            graph.block_dim = [threads, 1, 1];
        }
    }
    g
}

#[test]
fn warp_specialised_attention_compiles() {
    // Two warpgroups over 128 rows, 128-key stages, one wave (128 blocks: no cluster split): a
    // producer warpgroup fills the stages for them (`FlashWG::run_ws`, 384 threads); with
    // more blocks than SMs, the plain loop.
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16] {
        for (b, ws) in [(128, true), (200, false)] {
            let g = one_kernel_attention(Attn { b, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 1 }, dt, 256);
            let p = generate(&g, &Options::for_arch(90)).unwrap();
            assert!(p.source.contains("mi::FlashWG<NT, 1, 128, 64, 128,"), "{}", p.launch_summary());
            assert_eq!(p.source.contains("fa.run_ws<"), ws, "{}", p.launch_summary());
            let threads = if ws { 384 } else { 256 };
            assert!(p.kernels.iter().any(|k| k.block == [threads, 1, 1]), "{}", p.launch_summary());
            if let Err(e) = nvrtc::compile(&p.source, 90) {
                panic!("attention ({}, {b} blocks) failed to compile: {e}", dt.name());
            }
        }
    }
}

#[test]
fn attention_of_128_wide_values_runs_on_the_warpgroup_tensor_cores() {
    // Head dim 128 (prefill-shaped: 128 or 64 query rows a block over 128-key tiles): the
    // warpgroup form with Q and V in two column blocks of 64 (Q by descriptor, `FlashWG`'s DV),
    // one group of 64 rows a warpgroup; the warp-specialised loop stays with 64-wide values.
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16] {
        for (b, qsplit) in [(128, 1), (64, 2), (300, 1)] {
            let a = Attn { b, h: 128, d: 128, s: 1024, splits: 1, frange: 8, qsplit };
            let p = generate(&one_kernel_attention(a, dt, 256), &Options::for_arch(90)).unwrap();
            let targs = flash_wg_targs(&p.source);
            assert_eq!(targs.get(3).map(String::as_str), Some("128"), "{}", p.launch_summary());
            assert_eq!(targs.last().map(String::as_str), Some("128"), "{targs:?}");
            assert_eq!(targs.get(6).map(String::as_str), Some("1"), "{targs:?}");
            // Q by descriptor (QSS), in two column blocks of 64 as well.
            assert_eq!(targs.get(10).map(String::as_str), Some("true"), "{targs:?}");
            assert!(!p.source.contains("fa.run_ws<"));
            if let Err(e) = nvrtc::compile(&p.source, 90) {
                panic!("attention of 128-wide values ({}, {b} blocks) failed to compile: {e}", dt.name());
            }
        }
    }
}

/// One-kernel attention at head dim `d` whose values are split over `vsplit` blocks (grid z),
/// each block computing S = Q K for its 128 rows over 64-key tiles (the search's form at head
/// dim 256, where the warpgroup form takes values of at most 128).
fn value_split_attention(b: usize, d: usize, s: usize, vsplit: usize, dt: DType) -> KernelGraph {
    let (h, tiles) = (256, s / 64);
    let mut g = KernelGraph::new();
    let q = g.new_input(&[b, h, d], dt, None).unwrap();
    let k = g.new_input(&[b, d, s], dt, None).unwrap();
    let v = g.new_input(&[b, s, d], dt, None).unwrap();
    let mut k1 = BlockGraph::new([b, h / 128, vsplit], [256, 1, 1], tiles, 64).unwrap();
    let tq = k1.new_input(&[b, h, d], dt, [0, 1, -1], -1).unwrap();
    let tk = k1.new_input(&[b, d, s], dt, [0, -1, -1], 2).unwrap();
    let tv = k1.new_input(&[b, s, d], dt, [0, -1, 2], 1).unwrap();
    let (o, l, _) = zoo::online_loop(&mut k1, tq, tk, tv).unwrap();
    let out = k1.binary(BinaryOp::Div, o, l).unwrap();
    k1.new_output(out, [0, 1, 2], -1).unwrap();
    let outs = g.customized(&[q, k, v], k1).unwrap();
    g.mark_output(outs[0], None).unwrap();
    g
}

#[test]
fn head_dim_256_attention_takes_q_by_descriptor() {
    // Gemma-2's head dim 256 with the values split over two blocks: the warpgroup form over
    // 128-wide values, Q [128, 256] in four column blocks of 64 read by descriptor.
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16] {
        let p = generate(&value_split_attention(8, 256, 1024, 2, dt), &Options::for_arch(90)).unwrap();
        let targs = flash_wg_targs(&p.source);
        assert_eq!(targs.get(3).map(String::as_str), Some("256"), "{}", p.launch_summary());
        assert_eq!(targs.get(10).map(String::as_str), Some("true"), "{targs:?}");
        assert_eq!(targs.last().map(String::as_str), Some("128"), "{targs:?}");
        if let Err(e) = nvrtc::compile(&p.source, 90) {
            panic!("head dim 256 attention ({}) failed to compile: {e}", dt.name());
        }
    }
}

#[test]
fn the_target_decides_one_wave_and_the_register_split() {
    // 128 blocks are one wave on the H100 (the warp-specialised form, its register split from
    // the target's budgets); on a target whose wave is 100 blocks, the plain loop.
    let g = one_kernel_attention(
        Attn { b: 128, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 1 },
        DType::Float16,
        256,
    );
    let h100 = Target::sm90();
    let mut budgets = h100.budgets;
    budgets.ws_producer_regs += 8;
    budgets.ws_consumer_regs -= 8;
    let src = generate(&g, &Options::for_target(Target { budgets, ..h100 })).unwrap().source;
    let dec = format!("setmaxnreg_dec<{}>", budgets.ws_producer_regs);
    let inc = format!("setmaxnreg_inc<{}>", budgets.ws_consumer_regs);
    assert!(src.contains("fa.run_ws<") && src.contains(&dec) && src.contains(&inc));
    budgets.one_wave_blocks = 100;
    let src = generate(&g, &Options::for_target(Target { budgets, ..h100 })).unwrap().source;
    assert!(!src.contains("fa.run_ws<"));
}

/// The interleaved form's test graphs: fp16 and bf16, 64 blocks split in a cluster of two or
/// 128 unsplit, with and without Q and V normalised: `(dtype, blocks, cluster, qknorm, graph)`.
fn interleaved_cases() -> Vec<(DType, usize, u32, bool, KernelGraph)> {
    let mut cases = Vec::new();
    for dt in [DType::Float16, DType::Bfloat16] {
        for (b, cluster) in [(32, 2), (64, 1)] {
            for qknorm in [false, true] {
                let a = Attn { b, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 2 };
                let g = if qknorm { one_kernel_qknorm_attention(a, dt, 256) } else { one_kernel_attention(a, dt, 256) };
                cases.push((dt, b, cluster, qknorm, g));
            }
        }
    }
    cases
}

/// The template arguments of the source's `fa.run_ws<...>` call.
fn run_ws_targs(src: &str) -> Vec<String> {
    let call = src.split("fa.run_ws<").nth(1).and_then(|c| c.split('>').next()).unwrap_or("");
    call.split(", ").map(str::to_string).collect()
}

/// The template arguments of the source's `mi::FlashWG` declaration.
fn flash_wg_targs(src: &str) -> Vec<String> {
    let decl = src.split("mi::FlashWG<").nth(1).and_then(|c| c.split("> fa;").next()).unwrap_or("");
    decl.split(", ").map(str::to_string).collect()
}

/// Whether the interleaved warp-specialised loop of `src` (`ILV`, FlashWG's 13th template
/// argument) runs the QK-norm variant that scales P by V's row factors (its 14th: `VARIANT`,
/// with Q's norm in the softmax too or not), and whether V is marked full apart (`run_ws`'s
/// SPLITV, its second).
fn interleaved_variant(src: &str) -> (bool, bool, bool) {
    let (decl, call) = (flash_wg_targs(src), run_ws_targs(src));
    let ilv = decl.get(12).is_some_and(|t| t == "true");
    let v = decl.get(13).is_some_and(|t| t == "mi::VRowFactors" || t == "mi::QkNormAttention");
    (ilv, v, call.get(1).is_some_and(|t| t == "true"))
}

#[test]
fn interleaved_warp_specialised_attention_compiles() {
    // Two warpgroups over the same 64 rows taking 128-key stages in turn (`FlashWG`'s ILV),
    // with and without a cluster split, with and without Q and V normalised (P scaled by V's
    // row factors: the `mi::VRowFactors` hooks).
    if !setup() {
        return;
    }
    for (dt, b, cluster, qknorm, g) in interleaved_cases() {
        let p = generate(&g, &Options { ws_warpgroups: WsWarpgroups::Two, ..Options::for_arch(90) }).unwrap();
        let what = p.launch_summary();
        assert!(p.source.contains("mi::FlashWG<NT, 1, 64, 64, 128,"), "{what}");
        assert!(p.source.contains("fa.run_ws<"), "{what}");
        assert!(!p.source.contains("  constexpr int NC = "), "{what}");
        // With V normalised, `run_ws` scales P by V's row factors (the variant's hooks);
        // without, each stage's V is marked full apart from its K (SPLITV).
        assert_eq!(interleaved_variant(&p.source), (true, qknorm, !qknorm), "{what}");
        assert_eq!(p.source.contains("mi::cp_async_mbar_arrive(mi_vfull + st);"), !qknorm, "{what}");
        // A cluster pair finishes half the rows in each block (`finish`'s HALVES): no block
        // leaves after the merge, and each writes its half.
        assert_eq!(p.source.contains("fa.finish<2, true, true>("), cluster == 2, "{what}");
        assert_eq!(p.source.contains("const int lo = (int)mi::cluster_rank() * 2048;"), cluster == 2, "{what}");
        assert!(!p.source.contains("if (mi::cluster_rank() != 0) return;"), "{what}");
        assert!(
            p.kernels.iter().any(|k| k.block == [384, 1, 1] && k.cluster.iter().product::<u32>() == cluster),
            "{what}"
        );
        if let Err(e) = nvrtc::compile(&p.source, 90) {
            panic!("interleaved attention ({}, {b} blocks, qknorm {qknorm}) failed to compile: {e}", dt.name());
        }
    }
}

#[test]
fn three_warpgroup_interleaved_attention_compiles() {
    // `Options::ws_warpgroups` 3: the interleaved form on three consumer warpgroups taking
    // 64-key stages in turn, the loop of 128-key tiles made twice as fine (its iterations and
    // the producer's copies), ten stages, 512 threads a block.
    if !setup() {
        return;
    }
    for (dt, b, cluster, qknorm, g) in interleaved_cases() {
        let p = generate(&g, &Options { ws_warpgroups: WsWarpgroups::Three, ..Options::for_arch(90) }).unwrap();
        let what = p.launch_summary();
        assert!(p.source.contains("constexpr int NC = 384;"), "{what}");
        assert!(p.source.contains("mi::FlashWG<NC, 1, 64, 64, 64,"), "{what}");
        // Without a cluster the first warpgroup's warps read back their own rows (the other
        // two leave); with one, the block graph's threads read after a barrier.
        let leave = if cluster == 1 {
            "if (tid >= 128) return; // warpgroup 0 stored every row"
        } else {
            "if (tid >= NT) return; // the third attention warpgroup"
        };
        assert!(p.source.contains(leave), "{what}");
        let targs = run_ws_targs(&p.source);
        // 1024 keys: 16 iterations of 64 a block, 8 in a cluster of two; up to ten stages.
        let iters = 16 / cluster;
        assert_eq!(targs.first(), Some(&iters.min(10).to_string()), "{what}");
        assert_eq!(interleaved_variant(&p.source), (true, qknorm, !qknorm), "{what}");
        assert!(p.source.contains(&format!("for (int it = 0; it < {iters}; ++it) {{")), "{what}");
        assert!(p.source.contains(&format!("mi_full, mi_empty, {iters}")), "{what}");
        assert!(
            p.kernels.iter().any(|k| k.block == [512, 1, 1] && k.cluster.iter().product::<u32>() == cluster),
            "{what}"
        );
        if let Err(e) = nvrtc::compile(&p.source, 90) {
            panic!("three-warpgroup attention ({}, {b} blocks, qknorm {qknorm}) failed to compile: {e}", dt.name());
        }
    }
}

#[test]
fn attention_warpgroups_follow_the_region_by_default() {
    // `WsWarpgroups::Auto`: three warpgroups of 64-key stages where V is normalised, two of
    // 128-key stages otherwise (the sources are what `Two` and `Three` give).
    for (_, _, _, qknorm, g) in interleaved_cases() {
        let with = |w| generate(&g, &Options { ws_warpgroups: w, ..Options::for_arch(90) }).unwrap().source;
        let auto = with(WsWarpgroups::Auto);
        let want = with(if qknorm { WsWarpgroups::Three } else { WsWarpgroups::Two });
        assert!(auto == want, "qknorm {qknorm}: the default form is not the expected one");
        assert_eq!(auto.contains("constexpr int NC = 384;"), qknorm);
    }
}

#[test]
fn skewed_warpgroup_attention_compiles() {
    // Two warpgroups over 128 rows sharing 64-key stages (three stages or more: lookahead):
    // the skewed form of `FlashWG::step` (the odd warpgroup half a step behind).
    if !setup() {
        return;
    }
    for dt in [DType::Float16, DType::Bfloat16] {
        // 32 iterations, four a block of its cluster of eight.
        let g = one_kernel_attention(Attn { b: 2, h: 128, d: 64, s: 2048, splits: 1, frange: 32, qsplit: 1 }, dt, 256);
        let p = generate(&g, &Options::for_arch(90)).unwrap();
        assert!(p.source.contains("constexpr int NT = 256;"), "{}", p.launch_summary());
        assert!(p.source.contains("mi::FlashWG<NT, 1, 128, 64, 64,"), "{}", p.launch_summary());
        assert!(p.source.contains("fa.step<true>("), "no lookahead: {}", p.launch_summary());
        if let Err(e) = nvrtc::compile(&p.source, 90) {
            panic!("skewed attention ({}) failed to compile: {e}", dt.name());
        }
    }
}

#[test]
fn ptxas_report_names_each_kernel_and_its_spills() {
    // Two kernels: one held to 32 registers (1024 threads, two blocks an SM) while 96 values
    // stay live, which must spill; one that needs few registers.
    if !setup() {
        return;
    }
    let src = r#"
extern "C" __global__ void __launch_bounds__(1024, 2) starved(float* a) {
  float x[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) x[i] = a[i * 1024 + threadIdx.x];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 96; ++i) s += x[i] * x[95 - i] * a[(i + 96) * 1024 + threadIdx.x];
#pragma unroll
  for (int i = 0; i < 96; ++i) a[(i + 192) * 1024 + threadIdx.x] = x[i] * s;
}
extern "C" __global__ void plain(float* a) { a[threadIdx.x] += 1.0f; }
"#;
    let r = nvrtc::resources(src, 90).unwrap();
    let names: Vec<&str> = r.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.len() == 2 && names.contains(&"starved") && names.contains(&"plain"), "{r:?}");
    let starved = r.kernel("starved").unwrap();
    assert!(starved.spills() && starved.registers <= 32 && starved.stack_frame_bytes > 0, "{starved:?}");
    let plain = r.kernel("plain").unwrap();
    assert!(!plain.spills() && plain.registers > 0 && plain.registers < 32, "{plain:?}");
    // Asked again for the same source (and after a plain compile of it), the report is whole:
    // NVRTC 13.0 skips ptxas, and its report, for PTX it compiled before in the process.
    nvrtc::compile(src, 90).unwrap();
    let again = nvrtc::resources(src, 90).unwrap();
    assert_eq!(again.kernels, r.kernels, "{}", again.log);
}

#[test]
fn warp_specialised_attention_spills_no_more_than_measured() {
    // ptxas's report of the warp-specialised attention forms the GPU search picks (GQA and
    // QK-norm b=8: 64-row interleaved; MQA b=16: 128 rows on two warpgroups) with the venv's
    // NVRTC (13.2, measured 2026-11-29, since `FlashWG` broadcasts its warpgroup index):
    // three consumer warpgroups (QK-norm's default) spill nothing, two interleaved (GQA's
    // default) 4 bytes stored / 20 loaded at most, the 128-row form 16 / 16 (before: 32 / 72
    // and 80 / 180). A change that makes one spill more fails here before it reaches
    // the GPU (spills in these kernels cost up to 2 us a call on the H100).
    if !setup() {
        return;
    }
    let mut cases: Vec<(String, KernelGraph, WsWarpgroups, u32, u32)> = Vec::new();
    for (_, b, cluster, qknorm, g) in interleaved_cases().into_iter().filter(|c| c.0 == DType::Float16) {
        // Two warpgroups with QK-norm's V factors (every consumer thread releases a stage):
        // 8 bytes stored.
        let two = if qknorm { 8 } else { 4 };
        for (w, st, ld) in [(WsWarpgroups::Three, 0, 0), (WsWarpgroups::Two, two, 20)] {
            cases.push((format!("interleaved, {b} blocks, cluster {cluster}, qknorm {qknorm}"), g.clone(), w, st, ld));
        }
    }
    let a = Attn { b: 128, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 1 };
    cases.push(("128 rows".into(), one_kernel_attention(a, DType::Float16, 256), WsWarpgroups::Auto, 16, 16));
    for (name, g, w, max_st, max_ld) in cases {
        let p = generate(&g, &Options { ws_warpgroups: w, ..Options::for_arch(90) }).unwrap();
        assert!(p.source.contains("fa.run_ws<"), "{name}: not warp-specialised");
        let r = nvrtc::resources(&p.source, 90).unwrap();
        let what = format!("{name}, {w:?}: {r:?}");
        assert!(r.warnings.is_empty(), "ptxas warned: {what}");
        for k in &p.kernels {
            let res = r.kernel(&k.name).unwrap_or_else(|| panic!("no report of {}: {what}", k.name));
            assert!(res.spill_store_bytes <= max_st && res.spill_load_bytes <= max_ld, "{what}");
        }
    }
}

/// Whether `nvdisasm` can be found (in CI, with the venv's nvidia-cuda-nvdisasm, it must be).
fn nvdisasm_or_skip() -> bool {
    match sass::nvdisasm() {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

#[test]
fn warp_specialised_attention_sass() {
    // The SASS of the warp-specialised attention forms (the interleaved ones with two and
    // three consumer warpgroups, the 128-row one): the matrix products run as wgmma (HGMMA,
    // no HMMA fallback), both warpgroup roles' `setmaxnreg` survive (two USETMAXREG), every
    // cp.async moves 16 bytes, and three warpgroups touch no local memory.
    if !setup() || !nvdisasm_or_skip() {
        return;
    }
    let mut cases: Vec<(String, KernelGraph, WsWarpgroups)> = Vec::new();
    for (_, b, cluster, qknorm, g) in interleaved_cases().into_iter().filter(|c| c.0 == DType::Float16) {
        for w in [WsWarpgroups::Two, WsWarpgroups::Three] {
            cases.push((format!("interleaved, {b} blocks, cluster {cluster}, qknorm {qknorm}"), g.clone(), w));
        }
    }
    let a = Attn { b: 128, h: 128, d: 64, s: 1024, splits: 1, frange: 8, qsplit: 1 };
    cases.push(("128 rows".into(), one_kernel_attention(a, DType::Float16, 256), WsWarpgroups::Auto));
    for (name, g, w) in cases {
        let p = generate(&g, &Options { ws_warpgroups: w, ..Options::for_arch(90) }).unwrap();
        let kernels = sass::disassemble(&nvrtc::compile(&p.source, 90).unwrap()).unwrap();
        assert_eq!(kernels.len(), p.kernels.len(), "{name}, {w:?}");
        for k in &kernels {
            let what = format!("{name}, {w:?}, {}: {:?}", k.name, k.opcode_counts());
            assert!(k.count("HGMMA") > 0 && k.count("HMMA") == 0, "{what}");
            assert_eq!(k.count("USETMAXREG"), 2, "{what}");
            let copies: Vec<&String> =
                k.instructions.iter().zip(k.opcodes()).filter(|&(_, op)| op == "LDGSTS").map(|(i, _)| i).collect();
            assert!(!copies.is_empty() && copies.iter().all(|i| i.contains(".128 ")), "{what}: {copies:?}");
            if w == WsWarpgroups::Three {
                assert_eq!(k.count("LDL") + k.count("STL"), 0, "{what}");
            }
        }
    }
}

/// `g` with every RMS op (kernel `rms_norm`, block `rms_norm`, `rms` accumulator) given `eps`.
fn with_eps(mut g: KernelGraph, e: f32) -> KernelGraph {
    use mirage_ugraph::BlockOpKind;
    for op in &mut g.ops {
        match &mut op.kind {
            KernelOpKind::RmsNorm { eps, .. } => *eps = e,
            KernelOpKind::Customized { graph } => {
                for o in &mut graph.ops {
                    match &mut o.kind {
                        BlockOpKind::RmsNorm { eps } | BlockOpKind::ForloopAccum { acc: Accum::Rms, eps } => *eps = e,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    g
}

#[test]
fn rms_eps_reaches_every_norm_form_and_compiles() {
    // The loop's rms accumulator, the predefined rms_norm kernel, the register-row and the
    // shared-row norms, and the attention forms whose Q / V norms are specialised for eps = 0.
    let have_nvrtc = setup();
    let a = Attn { b: 2, h: 64, d: 64, s: 512, splits: 4, frange: 2, qsplit: 1 };
    for dt in [DType::Float16, DType::Float32] {
        let p = zoo::rmsnorm_linear(4, 256, 512, 8, 4, dt).unwrap();
        let mut graphs = vec![
            ("rmsnorm_linear/ugraph", p.ugraph),
            ("rmsnorm_linear/reference", p.reference),
            ("ntrans", zoo::ntrans(4, 512, dt).unwrap().ugraph),
            ("qnorm attention", zoo::qnorm_attention_online(a, dt).unwrap().ugraph),
            ("qknorm attention", zoo::qknorm_attention_online(a, dt).unwrap().ugraph),
        ];
        if dt != DType::Float32 {
            graphs.push(("row norm 64", row_norm_graph(64, dt)));
            graphs.push(("row norm 512", row_norm_graph(512, dt)));
        }
        for (name, g) in graphs {
            let ge = with_eps(g.clone(), 0.125);
            for arch in [80, 90] {
                let plain = generate(&g, &Options::for_arch(arch)).unwrap().source;
                let src = generate(&ge, &Options::for_arch(arch))
                    .unwrap_or_else(|e| panic!("{name}: generate failed: {e}"))
                    .source;
                let n = src.matches("+ 1.25e-1f").count();
                assert!(n >= 1, "{name} sm_{arch}: no eps in the source");
                assert_eq!(plain.matches("1.25e-1f").count(), 0, "{name}");
            }
            if have_nvrtc {
                compile_all(&format!("{name} eps {}", dt.name()), &ge);
            }
        }
    }
}
