//! The element-wise unary op registry: one table, [`UNARY_OPS`], holds every parameterless
//! unary op with its Python/JSON name, arity, scalar meaning, LAX rule, abstract-expression
//! term and CUDA function. The [`UnaryOp`] enum, its `name`/`apply`/`lax` methods and the table
//! are generated from the one invocation of `unary_registry!` below; the interpreters (float,
//! low-precision, field), the verifier's LAX check, the search's abstract expressions and op
//! lists, the CUDA emitter, the Python bindings and `docs/ops.md` read the table.
//!
//! Adding an op: one entry below, its device function in `mirage_runtime.cuh` (named by
//! `cuda`), then `MIRAGE_BLESS=1 cargo test -p mirage-ugraph registry` rewrites `docs/ops.md`.
//! Ops with constants (`clamp`, `mul_scalar`) are the enum's hand-written tail.

use serde::{Deserialize, Serialize};

use crate::scalar::Scalar;

/// How the verifier's LAX check reads an op (see `mirage_verify::lax`). Degrees are the
/// `(num, den)` bounds on numerator and denominator degree of a rational function of the inputs;
/// `x^power * (num, den)` multiplies the operand's degree `power` times, then by `(num, den)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lax {
    /// A rational map of the operand with degree `x^power * (num, den)`.
    Rational {
        /// How many times the operand's degree enters.
        power: u32,
        /// Extra numerator degree.
        num: u64,
        /// Extra denominator degree.
        den: u64,
    },
    /// A rational map of the operand and of one exponential of it (a fresh variable of degree
    /// 1), degree `x^power * (num, den)`; the op is exp-bearing (at most one on a path).
    Exp {
        /// How many times the operand's degree enters.
        power: u32,
        /// Extra numerator degree (the exponential's contribution).
        num: u64,
        /// Extra denominator degree.
        den: u64,
    },
    /// The field's square root, a power map: halves the degree.
    Sqrt,
    /// No algebraic meaning: a deterministic uninterpreted function in the field (a fresh
    /// variable of degree 1); the graph is verified probabilistically, outside LAX.
    Uninterpreted,
}

/// One registry entry (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnaryDef {
    /// The op.
    pub op: UnaryOp,
    /// Name in the Python API and in JSON (`{"op": name}`).
    pub name: &'static str,
    /// Number of operands.
    pub arity: usize,
    /// The verifier's reading.
    pub lax: Lax,
    /// Operator of its abstract-expression term (`(term x)`).
    pub term: &'static str,
    /// The runtime header's device function (`cuda(x)`, fp32 in and out).
    pub cuda: &'static str,
    /// The scalar meaning in words (docs and Python docstrings).
    pub doc: &'static str,
}

macro_rules! unary_registry {
    (
        plain { $( $var:ident {
            name: $name:literal,
            meaning: |$x:ident| $meaning:expr,
            lax: $lax:expr,
            term: $term:literal,
            cuda: $cuda:literal,
            doc: $doc:literal $(,)?
        } ),* $(,)? }
        with_constants { $($extra:tt)* }
        names { $($names:tt)* }
        apply<$S:ident>(|$xa:ident| { $($arms:tt)* })
        lax { $($lax_arms:tt)* }
    ) => {
        /// Element-wise op with one operand (its meaning: [`UNARY_OPS`] and the variants' docs).
        #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case", tag = "op")]
        pub enum UnaryOp {
            $( #[doc = $doc] $var, )*
            $($extra)*
        }

        /// The parameterless element-wise unary ops, in the order the search enumerates them.
        pub static UNARY_OPS: &[UnaryDef] = &[
            $( UnaryDef { op: UnaryOp::$var, name: $name, arity: 1, lax: $lax, term: $term, cuda: $cuda, doc: $doc }, )*
        ];

        impl UnaryOp {
            /// The op's name in the Python API (and its JSON tag).
            pub fn name(&self) -> &'static str {
                match self {
                    $( UnaryOp::$var => $name, )*
                    $($names)*
                }
            }

            /// Applies the op to one value of a scalar domain.
            #[inline(always)]
            pub fn apply<$S: Scalar>(&self, $xa: $S) -> $S {
                match *self {
                    $( UnaryOp::$var => { let $x = $xa; $meaning } )*
                    $($arms)*
                }
            }

            /// How the verifier's LAX check reads the op.
            pub fn lax(&self) -> Lax {
                match self {
                    $( UnaryOp::$var => $lax, )*
                    $($lax_arms)*
                }
            }
        }
    };
}

unary_registry! {
    plain {
        Exp { name: "exp", meaning: |x| x.exp(), lax: Lax::Exp { power: 0, num: 1, den: 0 }, term: "exp",
              cuda: "mi::op_exp", doc: "`e^x`." },
        Silu { name: "silu", meaning: |x| x.silu(), lax: Lax::Exp { power: 1, num: 0, den: 1 }, term: "silu",
               cuda: "mi::op_silu", doc: "`x * sigmoid(x)` (`x / (1 + e^-x)`)." },
        Gelu { name: "gelu", meaning: |x| x.gelu(), lax: Lax::Uninterpreted, term: "gelu",
               cuda: "mi::op_gelu", doc: "`x * Phi(x)` (erf form)." },
        Relu { name: "relu", meaning: |x| x.relu(), lax: Lax::Uninterpreted, term: "relu",
               cuda: "mi::op_relu", doc: "`max(x, 0)`." },
        Sqrt { name: "sqrt", meaning: |x| x.sqrt(), lax: Lax::Sqrt, term: "sqrt",
               cuda: "mi::op_sqrt", doc: "`sqrt(x)`." },
        Square { name: "square", meaning: |x| x.mul(x), lax: Lax::Rational { power: 2, num: 0, den: 0 },
                 term: "square", cuda: "mi::op_square", doc: "`x * x`." },
        Tanh { name: "tanh", meaning: |x| x.float_or(f64::tanh, tanh_exact), lax: Lax::Exp { power: 0, num: 1, den: 1 },
               term: "tanh", cuda: "mi::op_tanh", doc: "`tanh(x)` (`(e^2x - 1) / (e^2x + 1)`)." },
    }
    with_constants {
        /// `min(max(x, min), max)`.
        Clamp {
            /// Lower bound.
            #[serde(with = "crate::json::float")]
            min: f32,
            /// Upper bound.
            #[serde(with = "crate::json::float")]
            max: f32,
        },
        /// `x * scalar`.
        MulScalar {
            /// The constant factor.
            #[serde(with = "crate::json::float")]
            scalar: f32,
        },
    }
    names {
        UnaryOp::Clamp { .. } => "clamp",
        UnaryOp::MulScalar { .. } => "mul_scalar",
    }
    apply<S>(|x| {
        UnaryOp::Clamp { min, max } => x.clamp(min, max),
        UnaryOp::MulScalar { scalar } => x.mul(S::from_f32(scalar)),
    })
    lax {
        UnaryOp::Clamp { .. } => Lax::Uninterpreted,
        UnaryOp::MulScalar { .. } => Lax::Rational { power: 1, num: 0, den: 0 },
    }
}

/// `tanh` built from one exponential, `(e^2x - 1) / (e^2x + 1)`: its meaning in domains without
/// a native `tanh` (the field), where `e^2x` is the one exponential of the op.
fn tanh_exact<S: Scalar>(x: S) -> S {
    let one = S::from_f32(1.0);
    let e = x.add(x).exp();
    e.sub(one).div(e.add(one))
}

impl UnaryOp {
    /// The op's registry entry (`None` for the ops with constants).
    pub fn def(&self) -> Option<&'static UnaryDef> {
        UNARY_OPS.iter().find(|d| d.op == *self)
    }

    /// The parameterless op named `name`.
    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UNARY_OPS.iter().find(|d| d.name == name).map(|d| d.op)
    }
}

/// `docs/ops.md`: the element-wise unary op table, rendered from [`UNARY_OPS`].
pub fn ops_markdown() -> String {
    let mut s = String::from(
        "# Element-wise unary ops\n\n\
         Generated from the registry (`crates/ugraph/src/registry.rs`) by\n\
         `MIRAGE_BLESS=1 cargo test -p mirage-ugraph registry`; a test checks it matches.\n\
         Each op is `g.<name>(x)` on a kernel graph and `tb.<name>(x)` on a block graph.\n\n\
         | name | meaning | verifier (LAX) | term | CUDA |\n\
         |------|---------|----------------|------|------|\n",
    );
    for d in UNARY_OPS {
        let lax = match d.lax {
            Lax::Rational { .. } => "rational",
            Lax::Exp { .. } => "one exponential",
            Lax::Sqrt => "square root (power map)",
            Lax::Uninterpreted => "uninterpreted (probabilistic)",
        };
        s.push_str(&format!("| `{}` | {} | {lax} | `({} x)` | `{}(x)` |\n", d.name, d.doc, d.term, d.cuda));
    }
    s.push_str(
        "\nWith constants: `clamp(x, min_val, max_val)` (uninterpreted in the verifier) and \
         `mul_scalar(x, scalar)` (`tb` only).\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_are_the_json_tags() {
        for (i, d) in UNARY_OPS.iter().enumerate() {
            assert_eq!(d.op.name(), d.name);
            assert_eq!(d.op.def(), Some(d));
            assert_eq!(UnaryOp::from_name(d.name), Some(d.op));
            assert_eq!(d.arity, 1);
            assert!(UNARY_OPS[..i].iter().all(|e| e.name != d.name && e.term != d.term), "{} twice", d.name);
            let json = serde_json::to_string(&d.op).expect("serializes");
            assert_eq!(json, format!("{{\"op\":\"{}\"}}", d.name));
            let back: UnaryOp = serde_json::from_str(&json).expect("parses");
            assert_eq!(back, d.op);
        }
        assert_eq!(UnaryOp::Clamp { min: 0.0, max: 1.0 }.def(), None);
        assert_eq!(UnaryOp::from_name("clamp"), None);
    }

    #[test]
    fn float_meanings() {
        for x in [-3.0f64, -0.5, 0.0, 1e-4, 0.7, 20.0] {
            assert_eq!(UnaryOp::Tanh.apply(x), x.tanh());
            assert_eq!(UnaryOp::Tanh.apply(x as f32), ((x as f32) as f64).tanh() as f32);
            assert_eq!(UnaryOp::Square.apply(x), x * x);
            assert_eq!(UnaryOp::Exp.apply(x), x.exp());
        }
        // The field form is the same function over the reals.
        for x in [-3.0f64, -0.5, 0.25, 2.0] {
            assert!((tanh_exact(x) - x.tanh()).abs() < 1e-12, "{x}");
        }
    }

    #[test]
    fn docs_ops_md_matches_the_registry() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ops.md");
        let want = ops_markdown();
        if std::env::var_os("MIRAGE_BLESS").is_some() {
            std::fs::write(path, &want).expect("writes docs/ops.md");
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(have == want, "docs/ops.md is stale: run MIRAGE_BLESS=1 cargo test -p mirage-ugraph registry");
        for d in UNARY_OPS {
            assert!(have.contains(&format!("| `{}` |", d.name)), "docs/ops.md lacks {}", d.name);
        }
    }
}
