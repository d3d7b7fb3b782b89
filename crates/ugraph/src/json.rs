//! Versioned JSON of kernel graphs (with their block graphs): the envelope
//! `{"format": "mirage-ugraph", "version": N, "graph": ...}`, loading with full revalidation
//! through the checked builders, and the exact encoding of `f32` constants (non-finite ones as
//! the strings `"inf"`, `"-inf"`, `"nan"`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::block::BlockGraph;
use crate::error::{Error, Result};
use crate::kernel::KernelGraph;

/// Value of the envelope's `"format"` field.
pub const FORMAT_NAME: &str = "mirage-ugraph";
/// Newest file format version this build writes and reads. Version 2 adds the `eps` field of
/// `rms_norm` (kernel and block level) and of the `rms` accumulator; a graph without a nonzero
/// epsilon is written as version 1 (the same bytes as before, readable by older builds), and
/// version 1 files load with every `eps = 0`. A builder that ignored `eps` would compute a
/// different function, so a graph that has one is marked version 2, which such builds refuse.
pub const FORMAT_VERSION: u64 = 2;

/// The version a graph is written as: 2 when some RMS op has a nonzero epsilon, else 1.
fn version_of(g: &KernelGraph) -> u64 {
    use crate::block::BlockOpKind;
    use crate::kernel::KernelOpKind;
    let block = |bg: &BlockGraph| {
        bg.ops.iter().any(
            |o| matches!(o.kind, BlockOpKind::RmsNorm { eps } | BlockOpKind::ForloopAccum { eps, .. } if eps != 0.0),
        )
    };
    let eps = g.ops.iter().any(|o| match &o.kind {
        KernelOpKind::RmsNorm { eps, .. } => *eps != 0.0,
        KernelOpKind::Customized { graph } => block(graph),
        _ => false,
    });
    if eps {
        FORMAT_VERSION
    } else {
        1
    }
}

/// Most characters of the input that an error message quotes.
const MAX_ECHO: usize = 300;

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    format: &'a str,
    version: u64,
    graph: &'a KernelGraph,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    graph: KernelGraph,
}

/// Serializes `g` with the format envelope (compact, deterministic).
pub fn to_json(g: &KernelGraph) -> String {
    let env = EnvelopeOut { format: FORMAT_NAME, version: version_of(g), graph: g };
    // Cannot fail: the graph has no maps and every float is encoded by `float` below.
    serde_json::to_string(&env).expect("a KernelGraph always serializes")
}

/// Parses and validates a graph written by [`to_json`] (this or an older format version).
/// Every size goes through the checked builders ([`KernelGraph::revalidate`]), so a loaded
/// graph obeys the same limits ([`crate::limits`]) as a built one. Error messages quote at
/// most a few hundred characters of the input.
pub fn from_json(s: &str) -> Result<KernelGraph> {
    parse(s).map_err(|e| match e {
        Error::Json(m) => Error::Json(clip(&m)),
        e => e,
    })
}

/// Shortens `m` to [`MAX_ECHO`] characters, saying how much was left out.
fn clip(m: &str) -> String {
    match m.char_indices().nth(MAX_ECHO) {
        None => m.to_string(),
        Some((cut, _)) => format!("{}... ({} more characters)", &m[..cut], m[cut..].chars().count()),
    }
}

fn parse(s: &str) -> Result<KernelGraph> {
    let v: Value = serde_json::from_str(s).map_err(|e| Error::Json(format!("not valid JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| Error::Json("the top level is not a JSON object".into()))?;
    match obj.get("format") {
        Some(Value::String(f)) if f == FORMAT_NAME => {}
        Some(f) => return Err(Error::Json(format!("\"format\" is {f}, expected \"{FORMAT_NAME}\""))),
        None => return Err(Error::Json(format!("missing \"format\": not a {FORMAT_NAME} file"))),
    }
    let version = match obj.get("version") {
        Some(x) => x.as_u64().ok_or_else(|| Error::Json(format!("\"version\" is {x}, expected a positive integer")))?,
        None => return Err(Error::Json("missing \"version\"".into())),
    };
    if version == 0 {
        return Err(Error::Json("\"version\" is 0, expected a positive integer".into()));
    }
    if version > FORMAT_VERSION {
        return Err(Error::Version { found: version, supported: FORMAT_VERSION });
    }
    if !obj.contains_key("graph") {
        return Err(Error::Json("missing \"graph\"".into()));
    }
    // Deserialize from the text (not the Value) so errors carry serde's line/column.
    let g = serde_json::from_str::<EnvelopeIn>(s).map_err(|e| Error::Json(format!("graph: {e}")))?.graph;
    let rebuilt = std::panic::catch_unwind(|| g.revalidate())
        .map_err(|_| Error::Json("graph: its sizes break the shape arithmetic".into()))??;
    if let Some(d) = first_difference(&g, &rebuilt) {
        return Err(Error::Json(format!("inconsistent: {d}")));
    }
    Ok(g)
}

impl KernelGraph {
    /// Serializes this graph as versioned JSON (see [`to_json`]).
    pub fn to_json(&self) -> String {
        to_json(self)
    }

    /// Parses and validates a graph from versioned JSON (see [`from_json`]).
    pub fn from_json(s: &str) -> Result<KernelGraph> {
        from_json(s)
    }
}

/// Describes the first place where a deserialized graph differs from its rebuilt version.
fn first_difference(file: &KernelGraph, built: &KernelGraph) -> Option<String> {
    for (k, (a, b)) in file.ops.iter().zip(&built.ops).enumerate() {
        if a == b {
            continue;
        }
        let name = a.kind.name();
        if a.outputs != b.outputs {
            return Some(format!(
                "kernel op #{k} ({name}) lists output tensors {:?} but defines {:?}",
                a.outputs, b.outputs
            ));
        }
        if let (
            crate::kernel::KernelOpKind::Customized { graph: ga },
            crate::kernel::KernelOpKind::Customized { graph: gb },
        ) = (&a.kind, &b.kind)
        {
            if let Some(d) = block_difference(ga, gb) {
                return Some(format!("kernel op #{k} (customized): {d}"));
            }
        }
        return Some(format!("kernel op #{k} ({name}) differs from its rebuilt form {b:?}"));
    }
    if file.tensors.len() != built.tensors.len() {
        return Some(format!(
            "the file lists {} tensors but its ops define {}",
            file.tensors.len(),
            built.tensors.len()
        ));
    }
    for (i, (a, b)) in file.tensors.iter().zip(&built.tensors).enumerate() {
        if a != b {
            return Some(format!(
                "tensor #{i} is stored with dims {:?} and dtype {} but its op computes dims {:?} and dtype {}",
                a.dims,
                a.dtype.name(),
                b.dims,
                b.dtype.name()
            ));
        }
    }
    (file.outputs != built.outputs).then(|| format!("outputs {:?} differ from {:?}", file.outputs, built.outputs))
}

fn block_difference(a: &BlockGraph, b: &BlockGraph) -> Option<String> {
    for (j, (x, y)) in a.ops.iter().zip(&b.ops).enumerate() {
        if x != y {
            return Some(format!(
                "block op #{j} ({}) lists output stensors {:?} but defines {:?}",
                x.kind.name(),
                x.outputs,
                y.outputs
            ));
        }
    }
    if a.tensors.len() != b.tensors.len() {
        return Some(format!(
            "the block graph lists {} stensors but its ops define {}",
            a.tensors.len(),
            b.tensors.len()
        ));
    }
    for (i, (x, y)) in a.tensors.iter().zip(&b.tensors).enumerate() {
        if x != y {
            return Some(format!("stensor #{i} is stored as {x:?} but its op computes {y:?}"));
        }
    }
    None
}

/// Serde codec of `f32` constants: finite values as JSON numbers (shortest round-trip form),
/// non-finite ones as `"inf"`, `"-inf"` or `"nan"`.
pub(crate) mod float {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes `x` as a number, or as a string when it is not finite.
    pub fn serialize<S: Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
        match *x {
            x if x.is_finite() => s.serialize_f32(x),
            x if x.is_nan() => s.serialize_str("nan"),
            x if x > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    struct F32Visitor;

    impl Visitor<'_> for F32Visitor {
        type Value = f32;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number or one of \"inf\", \"-inf\", \"nan\"")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f32, E> {
            Ok(v as f32)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f32, E> {
            Ok(v as f32)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f32, E> {
            Ok(v as f32)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<f32, E> {
            match v {
                "inf" => Ok(f32::INFINITY),
                "-inf" => Ok(f32::NEG_INFINITY),
                "nan" => Ok(f32::NAN),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }

    /// Reads a value written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        d.deserialize_any(F32Visitor)
    }
}
