//! Writes the generated CUDA source of every graph JSON in the given folders, as
//! `benches/dump_sources.py dump` does, without building the Python extension:
//! `cargo run -p mirage-codegen --example dump_sources -- OUT FOLDER...` writes
//! `<graph hash>_sm<arch>.cu` (or `.err` with the error) for sm_80 and sm_90 into OUT; compare
//! two dumps with `benches/dump_sources.py diff`. With `--compile` first, NVRTC also compiles
//! every source (for sm_80 and sm_90a; `MIRAGE_NVRTC_PATH` and `MIRAGE_CUDA_INCLUDE` point at
//! NVRTC) and the failures are listed; the exit status is 1 if any failed.

use std::path::Path;

use mirage_codegen::{generate, nvrtc, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let compile = args.first().is_some_and(|a| a == "--compile");
    if compile {
        args.remove(0);
    }
    let Some((out, folders)) = args.split_first() else {
        return Err("usage: dump_sources [--compile] OUT FOLDER...".into());
    };
    let (mut compiled, mut failed) = (0, 0);
    std::fs::create_dir_all(out)?;
    let mut files = Vec::new();
    for folder in folders {
        for e in std::fs::read_dir(folder)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                files.push(p);
            }
        }
    }
    let mut hashes = std::collections::BTreeSet::new();
    for path in files {
        let g = mirage_ugraph::from_json(&std::fs::read_to_string(&path)?)?;
        let h = mirage_ugraph::hash::graph_hash(&g)[..16].to_string();
        for arch in [80, 90] {
            let (text, ext) = match Options::for_arch_from_env(arch).and_then(|o| generate(&g, &o)) {
                Ok(p) => {
                    if compile {
                        compiled += 1;
                        if let Err(e) = nvrtc::compile(&p.source, arch) {
                            failed += 1;
                            eprintln!("FAILED {} sm_{arch}: {e}", path.display());
                        }
                    }
                    (p.source, "cu")
                }
                Err(e) => (format!("Error: {e}\n"), "err"),
            };
            std::fs::write(Path::new(out).join(format!("{h}_sm{arch}.{ext}")), text)?;
        }
        hashes.insert(h);
    }
    println!("dumped {} graphs into {out}", hashes.len());
    if compile {
        println!("compiled {compiled} sources: {failed} failed");
        if failed > 0 {
            std::process::exit(1);
        }
    }
    Ok(())
}
