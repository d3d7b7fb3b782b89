//! Prints the generated CUDA (kernels only) and launch summary of a zoo workload:
//! `cargo run -p mirage-codegen --example dump_zoo -- gqa 1`.

use mirage_codegen::{generate, Options};
use mirage_ugraph::zoo;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map(String::as_str).unwrap_or("gqa");
    let b: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let Ok(pairs) = zoo::paper_workloads(b) else { return };
    let mut all = pairs;
    if let Ok(p) = zoo::attention_online(
        zoo::Attn { b: 2, h: 256, d: 64, s: 4096, splits: 16, frange: 4, qsplit: 2 },
        mirage_ugraph::DType::Float16,
    ) {
        all.push(p);
    }
    for p in all.iter().filter(|p| p.name == name) {
        for (what, g) in [("ugraph", &p.ugraph), ("reference", &p.reference)] {
            match generate(g, &Options::for_arch(90)) {
                Ok(prog) => {
                    println!("==== {name} {what}: {}", prog.launch_summary());
                    println!("{}", prog.kernels_source());
                }
                Err(e) => println!("==== {name} {what}: error {e}"),
            }
        }
    }
}
