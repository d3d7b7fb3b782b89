//! `tests/fixtures/zoo.json` holds the zoo's workloads at a few shapes, as the JSON the Rust zoo
//! writes: the Python fixtures (`benches/gpu/zoo.py`, which build the same graphs with the
//! Python API) are checked against it (`tests/test_zoo_fixtures.py`). This test checks the file
//! against the zoo; `MIRAGE_BLESS=1 cargo test -p mirage-ugraph --test zoo_fixtures` rewrites it
//! after a change of the zoo.

use mirage_ugraph::zoo::{self, Attn, Pair};
use mirage_ugraph::{json, DType};
use serde_json::{json as js, Value};

/// The cases: (workload, dtype, parameters as `benches/gpu/zoo.py` takes them).
fn cases() -> Vec<(&'static str, DType, Vec<usize>)> {
    let mut out = Vec::new();
    for dt in [DType::Float16, DType::Bfloat16, DType::Float32] {
        out.push(("rmsnorm_linear", dt, vec![4, 256, 512, 8, 4]));
        out.push(("ntrans", dt, vec![2, 4096]));
    }
    let f16 = DType::Float16;
    out.extend([
        ("gated_mlp", f16, vec![3, 256, 512, 8, 4]),
        ("lora", f16, vec![4, 256, 512, 16, 8, 4]),
        ("attention", f16, vec![2, 32, 64, 512, 4, 2]),
        ("qknorm_attention", f16, vec![2, 32, 64, 512, 4, 2, 2]),
        ("attention_online", f16, vec![2, 64, 64, 1024, 4, 4, 1]),
        ("qnorm_attention_online", f16, vec![2, 64, 64, 1024, 4, 4, 2]),
        ("qknorm_attention_online", f16, vec![2, 64, 64, 1024, 4, 4, 1]),
        ("attention_one_kernel", f16, vec![2, 128, 64, 1024, 1, 8, 2]),
        ("qknorm_attention_one_kernel", f16, vec![2, 128, 64, 1024, 1, 8, 2]),
    ]);
    out
}

/// The zoo's pair of `name` at parameters `p`.
fn build(name: &str, dt: DType, p: &[usize]) -> Pair {
    let attn = || Attn {
        b: p[0],
        h: p[1],
        d: p[2],
        s: p[3],
        splits: p[4],
        frange: p[5],
        qsplit: p.get(6).copied().unwrap_or(1),
    };
    match name {
        "rmsnorm_linear" => zoo::rmsnorm_linear(p[0], p[1], p[2], p[3], p[4], dt),
        "gated_mlp" => zoo::gated_mlp(p[0], p[1], p[2], p[3], p[4], dt),
        "lora" => zoo::lora(p[0], p[1], p[2], p[3], p[4], p[5], dt),
        "attention" => zoo::attention(attn(), false, dt),
        "qknorm_attention" => zoo::attention(attn(), true, dt),
        "attention_online" => zoo::attention_online(attn(), dt),
        "qnorm_attention_online" => zoo::qnorm_attention_online(attn(), dt),
        "qknorm_attention_online" => zoo::qknorm_attention_online(attn(), dt),
        "attention_one_kernel" => zoo::attention_one_kernel(attn(), dt),
        "qknorm_attention_one_kernel" => zoo::qknorm_attention_one_kernel(attn(), dt),
        "ntrans" => zoo::ntrans(p[0], p[1], dt),
        other => panic!("no workload {other}"),
    }
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn dtype_name(dt: DType) -> &'static str {
    match dt {
        DType::Float16 => "float16",
        DType::Bfloat16 => "bfloat16",
        _ => "float32",
    }
}

fn fixtures() -> Value {
    let entries: Vec<Value> = cases()
        .into_iter()
        .map(|(name, dt, p)| {
            let pair = build(name, dt, &p);
            let parse = |s: String| serde_json::from_str::<Value>(&s).expect("the zoo's JSON");
            js!({
                "name": name,
                "dtype": dtype_name(dt),
                "params": p,
                "reference": parse(json::to_json(&pair.reference)),
                "ugraph": parse(json::to_json(&pair.ugraph)),
            })
        })
        .collect();
    Value::Array(entries)
}

#[test]
fn the_fixture_file_holds_the_zoos_graphs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/zoo.json");
    let want = fixtures();
    if std::env::var("MIRAGE_BLESS").is_ok_and(|v| v == "1") {
        let text = serde_json::to_string(&want).expect("serialises");
        std::fs::write(path, text + "\n").expect("the fixture file written");
        return;
    }
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e} (MIRAGE_BLESS=1 writes it)"));
    let have: Value = serde_json::from_str(&text).expect("the fixture file is JSON");
    let (Value::Array(have), Value::Array(want)) = (&have, &want) else { panic!("a list of cases") };
    assert_eq!(have.len(), want.len(), "cases (MIRAGE_BLESS=1 rewrites the file after a change of the zoo)");
    for (h, w) in have.iter().zip(want) {
        assert_eq!(
            h, w,
            "{} {} {} (MIRAGE_BLESS=1 rewrites the file after a change of the zoo)",
            w["name"], w["dtype"], w["params"]
        );
    }
}
