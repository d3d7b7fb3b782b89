//! The structural op registry: every op that is not element-wise (inputs, outputs, `matmul`,
//! reductions, `rms_norm`, `softmax`, `concat`, `customized` and the block graph's for-loop
//! accumulators) with its Python name, level, operand and result counts and shape rule.
//!
//! [`KernelOpKind::name`](crate::KernelOpKind::name), [`BlockOpKind::name`](crate::BlockOpKind::name)
//! and [`BlockOpKind::arity`](crate::BlockOpKind::arity) read it, as do the operand-count checks of
//! graph revalidation (JSON) and `docs/ops.md`. Each op's interpreter, verifier rule and code
//! generator stay with the op; the element-wise ops are in [`crate::registry`].

use crate::error::{invalid, Result};

/// The graph level an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A kernel graph (`g.<name>`).
    Kernel,
    /// A block graph (`tb.<name>`).
    Block,
}

/// One structural registry entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructuralDef {
    /// Name in the Python API and error messages (`tb.`-prefixed at the block level).
    pub name: &'static str,
    /// The graph level.
    pub level: Level,
    /// Fewest operands.
    pub min_operands: usize,
    /// Most operands (`usize::MAX`: any number).
    pub max_operands: usize,
    /// Results (`usize::MAX`: as many as the op's block graph has outputs).
    pub results: usize,
    /// The shape rule in words.
    pub shape: &'static str,
}

impl StructuralDef {
    /// Checks an operand count, with the op's name in the error.
    pub fn check_operands(&self, n: usize) -> Result<()> {
        let (lo, hi) = (self.min_operands, self.max_operands);
        if (lo..=hi).contains(&n) {
            return Ok(());
        }
        let want = if lo == hi { lo.to_string() } else { format!("{lo} or {hi}") };
        invalid(self.name, format!("expects {want} operands, got {n}"))
    }
}

macro_rules! structural_registry {
    ( $( $konst:ident = $name:literal, $level:ident, operands $lo:literal $(..= $hi:expr)?, results $res:expr,
         shape $shape:literal; )* ) => {
        $(
            #[doc = concat!("`", $name, "`: ", $shape)]
            pub const $konst: StructuralDef = StructuralDef {
                name: $name,
                level: Level::$level,
                min_operands: $lo,
                max_operands: structural_registry!(@hi $lo $(, $hi)?),
                results: $res,
                shape: $shape,
            };
        )*
        /// Every structural op, kernel level first, in the order of the op enums.
        pub static STRUCTURAL_OPS: &[StructuralDef] = &[ $( $konst, )* ];
    };
    (@hi $lo:literal) => { $lo };
    (@hi $lo:literal, $hi:expr) => { $hi };
}

structural_registry! {
    INPUT = "new_input", Kernel, operands 0, results 1,
        shape "`dims` as given; `strides` (elements) default to row-major.";
    MATMUL = "matmul", Kernel, operands 2, results 1,
        shape "`[.., m, k] x [.., k, n] -> [.., m, n]`: equal ranks >= 2, equal batch dims.";
    REDUCTION = "reduction", Kernel, operands 1, results 1,
        shape "Sum over `dim`, kept with size 1.";
    RMS_NORM = "rms_norm", Kernel, operands 1..=2, results 1,
        shape "Same as the input; `normalized_shape` is its trailing dims, the optional weight has them.";
    SOFTMAX = "softmax", Kernel, operands 1, results 1,
        shape "Same as the input.";
    CUSTOMIZED = "customized", Kernel, operands 0..=usize::MAX, results usize::MAX,
        shape "Each operand matches the block graph's input of its position; one result per output saver.";
    TB_INPUT = "tb.new_input", Block, operands 0, results 1,
        shape "The device tensor's dims, each divided by the grid axis (`input_map`) and the for-loop (`forloop_dim`) that split it.";
    TB_OUTPUT = "tb.new_output", Block, operands 1, results 0,
        shape "The tile times the grid axes of `output_map` (and the loop range along `forloop_dim`).";
    TB_MATMUL = "tb.matmul", Block, operands 2, results 1,
        shape "As `matmul`, on tiles.";
    TB_REDUCTION = "tb.reduction", Block, operands 1, results 1,
        shape "Sum over `dim`, kept with size 1.";
    TB_REDUCTION_MAX = "tb.reduction_max", Block, operands 1, results 2,
        shape "Running max over `dim` (kept with size 1) and the iterations so far, and its change.";
    TB_RMS_NORM = "tb.rms_norm", Block, operands 1, results 1,
        shape "Same as the input (normalized over the last dim).";
    TB_CONCAT = "tb.concat", Block, operands 2, results 1,
        shape "Equal ranks, all dims but `dim` equal; `dim` adds up.";
    TB_FORLOOP_ACCUM = "tb.forloop_accum", Block, operands 1, results 1,
        shape "The input's, or with `acc` `sum`/`mean`/`rms` last dim 1, `sum_todimx` last dim `reduction_dimx`.";
    TB_FORLOOP_ACCUM_RESCALE = "tb.forloop_accum_rescale", Block, operands 2, results 1,
        shape "`acc * scale + x` over iterations: x's dims (last dim 1 with `acc=\"sum\"`).";
    TB_FORLOOP_ACCUM_MAX = "tb.forloop_accum_max", Block, operands 1, results 1,
        shape "Same as the input (element-wise max over iterations).";
}

/// The structural op named `name` (`tb.`-prefixed at the block level).
pub fn structural(name: &str) -> Option<&'static StructuralDef> {
    STRUCTURAL_OPS.iter().find(|d| d.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_levels_match_prefixes() {
        for (i, d) in STRUCTURAL_OPS.iter().enumerate() {
            assert!(STRUCTURAL_OPS[..i].iter().all(|e| e.name != d.name), "{} twice", d.name);
            assert_eq!(d.name.starts_with("tb."), d.level == Level::Block, "{}", d.name);
            assert!(d.min_operands <= d.max_operands, "{}", d.name);
            assert_eq!(structural(d.name), Some(d));
            assert!(!d.shape.is_empty());
        }
    }

    #[test]
    fn every_op_kind_names_its_entry_and_every_entry_has_a_kind() {
        use crate::{Accum, BinaryOp, BlockGraph, BlockOpKind, DType, KernelOpKind, UnaryOp};
        let bg = BlockGraph::new([1, 1, 1], [128, 1, 1], 1, 64).expect("block graph");
        let kernel = [
            KernelOpKind::Input { dims: vec![2], dtype: DType::Float16, strides: vec![1] },
            KernelOpKind::Matmul,
            KernelOpKind::Reduction { dim: 0 },
            KernelOpKind::RmsNorm { normalized_ndims: 1, eps: 0.0 },
            KernelOpKind::Softmax { dim: 0 },
            KernelOpKind::Customized { graph: bg },
        ];
        let block = [
            BlockOpKind::Input { dims: vec![2], dtype: DType::Float16, imap: [-1; 3], forloop_dim: -1 },
            BlockOpKind::Output { omap: [-1; 3], forloop_dim: -1 },
            BlockOpKind::Matmul,
            BlockOpKind::Reduction { dim: 0 },
            BlockOpKind::ReductionMax { dim: 0 },
            BlockOpKind::RmsNorm { eps: 0.0 },
            BlockOpKind::Concat { dim: 0 },
            BlockOpKind::ForloopAccum { acc: Accum::None, eps: 0.0 },
            BlockOpKind::ForloopAccumRescale { acc: Accum::None },
            BlockOpKind::ForloopAccumMax,
        ];
        let mut reached: Vec<&str> = Vec::new();
        for k in &kernel {
            let d = k.def().expect("structural");
            assert_eq!((k.name(), d.level), (d.name, Level::Kernel));
            reached.push(d.name);
        }
        for k in &block {
            let d = k.def().expect("structural");
            assert_eq!((k.name(), d.level), (d.name, Level::Block));
            assert_eq!(k.arity(), d.min_operands, "{}", d.name);
            assert_eq!(d.min_operands, d.max_operands, "{}: block ops take a fixed count", d.name);
            reached.push(d.name);
        }
        let all: Vec<&str> = STRUCTURAL_OPS.iter().map(|d| d.name).collect();
        assert_eq!(reached, all, "the table lists every structural op kind once, in enum order");
        // The element-wise ops are the other registry's.
        assert_eq!(KernelOpKind::Unary { op: UnaryOp::Exp }.def(), None);
        assert_eq!(BlockOpKind::Binary { op: BinaryOp::Div }.arity(), 2);
        assert_eq!(BlockOpKind::Unary { op: UnaryOp::Exp }.arity(), 1);
        assert!(KernelOpKind::Binary { op: BinaryOp::Add }.check_operands(1).is_err());
    }

    #[test]
    fn operand_counts_are_checked_with_the_op_name() {
        assert!(MATMUL.check_operands(2).is_ok());
        let e = MATMUL.check_operands(3).expect_err("3 operands").to_string();
        assert!(e.contains("matmul") && e.contains("expects 2 operands, got 3"), "{e}");
        assert!(RMS_NORM.check_operands(1).is_ok() && RMS_NORM.check_operands(2).is_ok());
        let e = RMS_NORM.check_operands(0).expect_err("no operand").to_string();
        assert!(e.contains("expects 1 or 2 operands, got 0"), "{e}");
        assert!(CUSTOMIZED.check_operands(7).is_ok());
    }
}
