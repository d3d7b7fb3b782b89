//! The element-wise op registry: two tables hold every parameterless element-wise op.
//!
//! [`UNARY_OPS`] holds each unary op with its Python/JSON name, arity, scalar meaning, LAX rule,
//! abstract-expression term and CUDA function; [`BINARY_OPS`] holds each binary op with the same
//! and whether it commutes and where the searches try it. The [`UnaryOp`] and [`BinaryOp`] enums,
//! their `apply` methods and the tables are generated from the one invocation each of
//! `unary_registry!` and `binary_registry!` below; the interpreters (float, low-precision,
//! field), the verifier's LAX check, the search's abstract expressions and op lists, the CUDA
//! emitter, the Python bindings and `docs/ops.md` read the tables.
//!
//! Adding a unary op: one entry below, its device function in `mirage_runtime.cuh` (named by
//! `cuda`), then `MIRAGE_BLESS=1 cargo test -p mirage-ugraph registry` rewrites `docs/ops.md`.
//! Ops with constants (`clamp`, `mul_scalar`) are the enum's hand-written tail. Adding a binary
//! op: one entry (a term operator the search's expression language parses), its Python methods
//! (`KNGraph`/`TBGraph`, checked by `tests/test_op_registry.py`) and the docs as above.

use serde::{Deserialize, Serialize};

use crate::scalar::Scalar;
use crate::structural::STRUCTURAL_OPS;

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

/// How the verifier's LAX check reads a binary op (see `mirage_verify::lax`), in terms of the
/// operands' degree bounds `(num, den)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryLax {
    /// `a + b` or `a - b`: a common denominator, `(max(na + db, nb + da), da + db)`.
    Sum,
    /// `a * b`: degrees add.
    Product,
    /// `a / b`: degrees cross-add.
    Quotient,
    /// No algebraic meaning: an uninterpreted function in the field (a fresh variable of degree
    /// 1); the graph is verified probabilistically, outside LAX.
    Uninterpreted,
}

/// How the CUDA emitter writes a binary op on fp32 values `a` and `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryCuda {
    /// A C++ operator: `(a op b)`.
    Infix(&'static str),
    /// A device function of the runtime header: `f(a, b)`.
    Call(&'static str),
}

impl BinaryCuda {
    /// The C++ expression applying the op to the expressions `a` and `b`.
    pub fn expr(&self, a: &str, b: &str) -> String {
        match self {
            BinaryCuda::Infix(op) => format!("({a} {op} {b})"),
            BinaryCuda::Call(f) => format!("{f}({a}, {b})"),
        }
    }
}

/// Where the kernel-level search tries a binary op between two tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSearch {
    /// Always (commutative ops once per unordered pair, others once per ordered pair of
    /// distinct tensors).
    Always,
    /// Only in the search's second pass (when the first finds no µGraph), where every op of
    /// the program may run as a predefined kernel of its own.
    SecondPass,
}

/// One binary registry entry (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BinaryDef {
    /// The op.
    pub op: BinaryOp,
    /// Name in the Python API (`g.<name>(A, B)`) and in JSON (`{"op": name}`).
    pub name: &'static str,
    /// Number of operands.
    pub arity: usize,
    /// The verifier's reading.
    pub lax: BinaryLax,
    /// Operator of its abstract-expression term (`(term a b)`).
    pub term: &'static str,
    /// Whether `a op b == b op a`: the search then tries one operand order only.
    pub commutative: bool,
    /// The CUDA expression.
    pub cuda: BinaryCuda,
    /// Where the kernel-level search tries it.
    pub kernel_search: KernelSearch,
    /// Whether the block-graph generator tries it.
    pub block_search: bool,
    /// The scalar meaning in words (docs).
    pub doc: &'static str,
}

macro_rules! binary_registry {
    ( $( $var:ident {
        name: $name:literal,
        meaning: |$a:ident, $b:ident| $meaning:expr,
        lax: $lax:expr,
        term: $term:literal,
        commutative: $comm:literal,
        cuda: $cuda:expr,
        kernel_search: $ks:expr,
        block_search: $bs:literal,
        doc: $doc:literal $(,)?
    } ),* $(,)? ) => {
        /// Element-wise op with two operands; shapes broadcast where a dim is 1 (its meaning:
        /// [`BINARY_OPS`] and the variants' docs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum BinaryOp {
            $( #[doc = $doc] $var, )*
        }

        /// The element-wise binary ops, in the order the searches enumerate them (the order of
        /// [`BinaryOp`]'s variants: `BINARY_OPS[op as usize].op == op`).
        pub static BINARY_OPS: &[BinaryDef] = &[
            $( BinaryDef {
                op: BinaryOp::$var, name: $name, arity: 2, lax: $lax, term: $term, commutative: $comm,
                cuda: $cuda, kernel_search: $ks, block_search: $bs, doc: $doc,
            }, )*
        ];

        impl BinaryOp {
            /// Applies the op to two values of a scalar domain.
            #[inline(always)]
            pub fn apply<S: Scalar>(&self, lhs: S, rhs: S) -> S {
                match *self {
                    $( BinaryOp::$var => { let ($a, $b) = (lhs, rhs); $meaning } )*
                }
            }
        }
    };
}

binary_registry! {
    Add { name: "add", meaning: |a, b| a.add(b), lax: BinaryLax::Sum, term: "+", commutative: true,
          cuda: BinaryCuda::Infix("+"), kernel_search: KernelSearch::Always, block_search: true, doc: "`a + b`." },
    Sub { name: "sub", meaning: |a, b| a.sub(b), lax: BinaryLax::Sum, term: "-", commutative: false,
          cuda: BinaryCuda::Infix("-"), kernel_search: KernelSearch::SecondPass, block_search: false, doc: "`a - b`." },
    Mul { name: "mul", meaning: |a, b| a.mul(b), lax: BinaryLax::Product, term: "*", commutative: true,
          cuda: BinaryCuda::Infix("*"), kernel_search: KernelSearch::Always, block_search: true, doc: "`a * b`." },
    Div { name: "div", meaning: |a, b| a.div(b), lax: BinaryLax::Quotient, term: "/", commutative: false,
          cuda: BinaryCuda::Infix("/"), kernel_search: KernelSearch::Always, block_search: true,
          doc: "`a / b` (the field: `a` times the inverse of `b`)." },
    Pow { name: "pow", meaning: |a, b| a.pow(b), lax: BinaryLax::Uninterpreted, term: "pow", commutative: false,
          cuda: BinaryCuda::Call("mi::op_pow"), kernel_search: KernelSearch::SecondPass, block_search: false,
          doc: "`a ^ b` (`powf`; uninterpreted in the field)." },
}

impl BinaryOp {
    /// The op's registry entry.
    pub fn def(&self) -> &'static BinaryDef {
        &BINARY_OPS[*self as usize]
    }

    /// The op's name in the Python API (and in JSON).
    pub fn name(&self) -> &'static str {
        self.def().name
    }

    /// How the verifier's LAX check reads the op.
    pub fn lax(&self) -> BinaryLax {
        self.def().lax
    }

    /// Whether `a op b == b op a`.
    pub fn is_commutative(&self) -> bool {
        self.def().commutative
    }

    /// The op named `name`.
    pub fn from_name(name: &str) -> Option<BinaryOp> {
        BINARY_OPS.iter().find(|d| d.name == name).map(|d| d.op)
    }
}

/// `docs/ops.md`: the op tables, rendered from [`UNARY_OPS`], [`BINARY_OPS`] and
/// [`STRUCTURAL_OPS`].
pub fn ops_markdown() -> String {
    let mut s = String::from(
        "# Ops\n\n\
         Generated from the registry (`crates/ugraph/src/registry.rs`) by\n\
         `MIRAGE_BLESS=1 cargo test -p mirage-ugraph registry`; a test checks it matches.\n\n\
         ## Unary ops\n\n\
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
    s.push_str(
        "\n## Binary ops\n\n\
         Each op is `g.<name>(A, B)` on a kernel graph and `tb.<name>(A, B)` on a block graph;\n\
         operands have equal ranks and a dim broadcasts where it is 1 on one side. \"Searched\"\n\
         says where the search tries the op: between kernel-graph tensors (always, or only in the\n\
         second pass, when the first finds no µGraph) and between block-graph tiles; a\n\
         commutative op is tried in one operand order.\n\n\
         | name | meaning | verifier (LAX) | term | commutative | CUDA | searched |\n\
         |------|---------|----------------|------|-------------|------|----------|\n",
    );
    for d in BINARY_OPS {
        let lax = match d.lax {
            BinaryLax::Sum => "rational (sum)",
            BinaryLax::Product => "rational (product)",
            BinaryLax::Quotient => "rational (quotient)",
            BinaryLax::Uninterpreted => "uninterpreted (probabilistic)",
        };
        let searched = match (d.kernel_search, d.block_search) {
            (KernelSearch::Always, true) => "kernel, block",
            (KernelSearch::Always, false) => "kernel",
            (KernelSearch::SecondPass, true) => "kernel (second pass), block",
            (KernelSearch::SecondPass, false) => "kernel (second pass)",
        };
        s.push_str(&format!(
            "| `{}` | {} | {lax} | `({} a b)` | {} | `{}` | {searched} |\n",
            d.name,
            d.doc,
            d.term,
            if d.commutative { "yes" } else { "no" },
            d.cuda.expr("a", "b"),
        ));
    }
    s.push_str(
        "\n## Structural ops\n\n\
         The ops that are not element-wise (`crates/ugraph/src/structural.rs`): kernel-graph ops\n\
         are `g.<name>(..)`, block-graph ops `tb.<name>(..)`. Their interpreter, verifier rule and\n\
         code generator stay with each op.\n\n\
         | name | operands | results | shape |\n\
         |------|----------|---------|-------|\n",
    );
    for d in STRUCTURAL_OPS {
        let count = |n: usize| if n == usize::MAX { "any".to_string() } else { n.to_string() };
        let operands = match (d.min_operands, d.max_operands) {
            (lo, hi) if lo == hi => count(lo),
            (0, usize::MAX) => "any".to_string(),
            (lo, hi) => format!("{lo} or {hi}"),
        };
        let results = if d.results == usize::MAX { "one per output".to_string() } else { count(d.results) };
        s.push_str(&format!("| `{}` | {operands} | {results} | {} |\n", d.name, d.shape));
    }
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
    fn binary_names_are_unique_and_are_the_json_names() {
        for (i, d) in BINARY_OPS.iter().enumerate() {
            assert_eq!(d.op as usize, i, "{}: the table is in variant order", d.name);
            assert_eq!(d.op.def(), d);
            assert_eq!(d.op.name(), d.name);
            assert_eq!(BinaryOp::from_name(d.name), Some(d.op));
            assert_eq!(d.arity, 2);
            assert!(BINARY_OPS[..i].iter().all(|e| e.name != d.name && e.term != d.term), "{} twice", d.name);
            assert!(UNARY_OPS.iter().all(|u| u.name != d.name), "{} is also a unary op", d.name);
            let json = serde_json::to_string(&d.op).expect("serializes");
            assert_eq!(json, format!("\"{}\"", d.name));
            let back: BinaryOp = serde_json::from_str(&json).expect("parses");
            assert_eq!(back, d.op);
        }
        assert_eq!(BinaryOp::from_name("max"), None);
    }

    #[test]
    fn binary_meanings_and_commutativity() {
        let xs = [-3.0f64, -0.5, 0.0, 0.25, 2.0, 7.5];
        for d in BINARY_OPS {
            for a in xs {
                for b in xs {
                    let want = match d.name {
                        "add" => a + b,
                        "sub" => a - b,
                        "mul" => a * b,
                        "div" => a / b,
                        "pow" => a.powf(b),
                        other => panic!("no reference meaning for {other}"),
                    };
                    let got = d.op.apply(a, b);
                    assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{}({a}, {b})", d.name);
                    let (x, y) = (a as f32, b as f32);
                    let want32 = match d.name {
                        "add" => x + y,
                        "sub" => x - y,
                        "mul" => x * y,
                        "div" => x / y,
                        _ => x.powf(y),
                    };
                    let got32 = d.op.apply(x, y);
                    assert!(got32.to_bits() == want32.to_bits() || (got32.is_nan() && want32.is_nan()), "{}", d.name);
                    if d.commutative {
                        assert_eq!(got.to_bits(), d.op.apply(b, a).to_bits(), "{} commutes", d.name);
                    }
                }
            }
            if !d.commutative {
                assert!(xs.iter().any(|&a| xs.iter().any(|&b| d.op.apply(a, b) != d.op.apply(b, a))), "{}", d.name);
            }
        }
    }

    #[test]
    fn binary_cuda_expressions() {
        assert_eq!(BinaryOp::Add.def().cuda.expr("x", "y"), "(x + y)");
        assert_eq!(BinaryOp::Pow.def().cuda.expr("x", "y"), "mi::op_pow(x, y)");
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
        let structural = STRUCTURAL_OPS.iter().map(|d| d.name);
        for name in UNARY_OPS.iter().map(|d| d.name).chain(BINARY_OPS.iter().map(|d| d.name)).chain(structural) {
            assert!(have.contains(&format!("| `{name}` |")), "docs/ops.md lacks {name}");
        }
    }
}
