//! GPU facts live in one place, `mirage_ugraph::target`: no other Rust source of the crates
//! (sources, tests, benches, examples; comments aside) spells an SM count, a shared-memory
//! size of a GPU, or a register budget.

use std::fs;
use std::path::{Path, PathBuf};

/// Numbers that are GPU facts: SM counts (132 on the H100, 108 on the A100 is too common a
/// number to ban, as 164 or 163 alone), shared memory in KiB (227, 228) and bytes.
const NUMBERS: &[&str] = &["132", "227", "228", "232448", "233472", "166912", "167936"];
/// Names of the constants the target replaced.
const NAMES: &[&str] = &[
    "ONE_WAVE_BLOCKS",
    "CO_RESIDENT_SMEM",
    "WIDE_CLUSTER_BLOCKS",
    "SM90_SMEM_BYTES",
    "PIPELINE_SMEM_BUDGET",
    "ONE_WAVE_SMEM_BUDGET",
];

/// The offending tokens of one source text: forbidden numbers and names, identifiers ending in
/// `_REGS` (register budgets), `num_sms` set to a literal and `setmaxnreg` with a literal count.
fn offences(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let tokens: Vec<&str> = code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
        for t in tokens.iter().filter(|t| !t.is_empty()) {
            if NUMBERS.contains(t) || NAMES.contains(t) || t.ends_with("_REGS") {
                found.push((i + 1, t.to_string()));
            }
        }
        let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        for pat in ["num_sms:", "setmaxnreg_inc<", "setmaxnreg_dec<"] {
            let after = squeezed.split(pat).skip(1);
            if after.into_iter().any(|rest| rest.starts_with(|c: char| c.is_ascii_digit())) {
                found.push((i + 1, pat.to_string()));
            }
        }
    }
    found
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_scanner_finds_gpu_constants() {
    assert_eq!(offences("const WS_CONSUMER_REGS: usize = 240;").len(), 1);
    assert_eq!(offences("let cap = 227 * 1024;").len(), 1);
    assert_eq!(offences("if blocks <= ONE_WAVE_BLOCKS {").len(), 1);
    assert_eq!(offences("CostModel { num_sms: 132, .. }").len(), 2);
    assert_eq!(offences(r#"wl!(s, "mi::setmaxnreg_dec<24>();");"#).len(), 1);
    assert!(offences("// 132 SMs on an H100").is_empty());
    assert!(offences("let sms = t.num_sms.max(1); let x = 1132; wl!(s, \"setmaxnreg_inc<{}>\", r);").is_empty());
}

#[test]
fn no_gpu_constant_outside_the_target_module() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    assert!(files.len() > 50, "the crates' sources were not found under {}", crates.display());
    let exempt = [Path::new("ugraph/src/target.rs"), Path::new("ugraph/tests/gpu_constants.rs")];
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&crates).unwrap_or(f);
        if exempt.contains(&rel) {
            continue;
        }
        let text = fs::read_to_string(f).unwrap_or_default();
        for (line, what) in offences(&text) {
            bad.push(format!("{}:{line}: {what}", rel.display()));
        }
    }
    assert!(bad.is_empty(), "GPU constants outside crates/ugraph/src/target.rs:\n{}", bad.join("\n"));
}
