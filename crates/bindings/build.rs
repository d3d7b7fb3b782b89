//! Computes `MIRAGE_BUILD_HASH`: a SHA-256 over the sources that determine search results and
//! generated code (the Rust sources of the workspace's crates, the CUDA runtime header, the
//! manifests and the lock file). `mirage._core.__build_hash__` exposes it; the Python package
//! keys its search cache by it, so an entry written by other code is never served.
//!
//! Cargo reruns this script when any of those files or folders changes.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Paths (relative to the workspace root) whose contents make up the hash: folders are walked
/// recursively, every file in them counts.
const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "src",
    "crates/ugraph/Cargo.toml",
    "crates/ugraph/src",
    "crates/verify/Cargo.toml",
    "crates/verify/src",
    "crates/search/Cargo.toml",
    "crates/search/src",
    "crates/codegen/Cargo.toml",
    "crates/codegen/src",
    "crates/codegen/runtime",
    "crates/bindings/Cargo.toml",
    "crates/bindings/src",
];

/// Every file under `path` (itself when a file), sorted, so the hash does not depend on the
/// order the file system lists them in.
fn files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(entries) = fs::read_dir(path) else { return };
        let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        children.sort();
        for c in children {
            files(&c, out);
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("..").join("..");
    let mut h = Sha256::new();
    for input in INPUTS {
        let path = root.join(input);
        println!("cargo:rerun-if-changed={}", path.display());
        let mut found = Vec::new();
        files(&path, &mut found);
        for f in found {
            let rel = f.strip_prefix(&root).unwrap_or(&f);
            // Path separators normalised, so the same tree hashes alike on every platform.
            h.update(rel.to_string_lossy().replace('\\', "/").as_bytes());
            h.update([0]);
            match fs::read(&f) {
                Ok(bytes) => {
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(&bytes);
                }
                Err(_) => h.update(b"<unreadable>"),
            }
            h.update([0]);
        }
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=MIRAGE_BUILD_HASH={hex}");
}
