//! `mirage._core.KernelGraph`: the kernel-graph builder, serialization and the CPU interpreter.

use mirage::{KernelOpKind, Tensor, TensorId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::block::BlockGraph;
use crate::convert::{parse_binary, parse_dtype, parse_unary, OrPyErr};
use crate::interrupt::interruptible;

/// A kernel graph; tensors are referred to by integer ids.
#[pyclass(module = "mirage._core")]
pub struct KernelGraph {
    pub(crate) inner: mirage::KernelGraph,
}

#[pymethods]
impl KernelGraph {
    #[new]
    fn new() -> Self {
        KernelGraph { inner: mirage::KernelGraph::new() }
    }

    /// Adds an input of `dims` and `dtype`; `strides` default to row-major.
    #[pyo3(signature = (dims, dtype, strides=None))]
    fn new_input(&mut self, dims: Vec<usize>, dtype: &str, strides: Option<Vec<usize>>) -> PyResult<TensorId> {
        let dtype = parse_dtype("new_input", dtype)?;
        self.inner.new_input(&dims, dtype, strides.as_deref()).py_err()
    }

    fn matmul(&mut self, a: TensorId, b: TensorId) -> PyResult<TensorId> {
        self.inner.matmul(a, b).py_err()
    }

    /// Element-wise unary op by name; `clamp` takes `min`/`max`, `mul_scalar` takes `scalar`.
    #[pyo3(signature = (name, a, *, min=None, max=None, scalar=None))]
    fn unary(
        &mut self,
        name: &str,
        a: TensorId,
        min: Option<f64>,
        max: Option<f64>,
        scalar: Option<f64>,
    ) -> PyResult<TensorId> {
        let op = parse_unary(name, min, max, scalar)?;
        self.inner.unary(op, a).py_err()
    }

    /// Element-wise binary op by its registry name (`add`, `sub`, `mul`, `div`, `pow`).
    fn binary(&mut self, name: &str, a: TensorId, b: TensorId) -> PyResult<TensorId> {
        let op = parse_binary(name)?;
        self.inner.binary(op, a, b).py_err()
    }

    fn reduction(&mut self, a: TensorId, dim: i64) -> PyResult<TensorId> {
        self.inner.reduction(a, dim).py_err()
    }

    #[pyo3(signature = (a, normalized_shape, weight=None, eps=0.0))]
    fn rms_norm(
        &mut self,
        a: TensorId,
        normalized_shape: Vec<usize>,
        weight: Option<TensorId>,
        eps: f64,
    ) -> PyResult<TensorId> {
        let eps = crate::convert::parse_eps("rms_norm", eps)?;
        self.inner.rms_norm_eps(a, &normalized_shape, weight, eps).py_err()
    }

    fn softmax(&mut self, a: TensorId, dim: i64) -> PyResult<TensorId> {
        self.inner.softmax(a, dim).py_err()
    }

    /// Adds a customized op running a copy of `tb` on `inputs`; returns its output ids.
    fn customized(&mut self, inputs: Vec<TensorId>, tb: PyRef<'_, BlockGraph>) -> PyResult<Vec<TensorId>> {
        self.inner.customized(&inputs, tb.inner.clone()).py_err()
    }

    #[pyo3(signature = (t, strides=None))]
    fn mark_output(&mut self, t: TensorId, strides: Option<Vec<usize>>) -> PyResult<()> {
        self.inner.mark_output(t, strides.as_deref()).py_err()
    }

    fn tensor_dims(&self, t: TensorId) -> PyResult<Vec<usize>> {
        Ok(self.inner.tensor(t).py_err()?.dims.clone())
    }

    fn tensor_dtype(&self, t: TensorId) -> PyResult<&'static str> {
        Ok(self.inner.tensor(t).py_err()?.dtype.name())
    }

    /// Layout (in elements) declared for input `t`.
    fn input_strides(&self, t: TensorId) -> PyResult<Vec<usize>> {
        self.inner
            .ops
            .iter()
            .find_map(|o| match &o.kind {
                KernelOpKind::Input { strides, .. } if o.outputs.first() == Some(&t) => Some(strides.clone()),
                _ => None,
            })
            .ok_or_else(|| PyValueError::new_err(format!("input_strides: tensor #{t} is not a graph input")))
    }

    /// Layouts (in elements) of the outputs, in `output_ids` order (row-major unless marked).
    fn output_strides(&self) -> Vec<Vec<usize>> {
        self.inner
            .output_ids()
            .into_iter()
            .map(|t| match self.inner.outputs.iter().find(|o| o.tensor == t) {
                Some(o) => o.strides.clone(),
                None => mirage::types::row_major_strides(&self.inner.tensors[t].dims),
            })
            .collect()
    }

    fn input_ids(&self) -> Vec<TensorId> {
        self.inner.input_ids()
    }

    /// Marked outputs, or every tensor no op consumes when none is marked.
    fn output_ids(&self) -> Vec<TensorId> {
        self.inner.output_ids()
    }

    #[getter]
    fn num_ops(&self) -> usize {
        self.inner.ops.len()
    }

    #[getter]
    fn num_tensors(&self) -> usize {
        self.inner.tensors.len()
    }

    fn to_json(&self) -> String {
        mirage::json::to_json(&self.inner)
    }

    #[staticmethod]
    fn from_json(s: &str) -> PyResult<Self> {
        Ok(KernelGraph { inner: mirage::json::from_json(s).py_err()? })
    }

    fn hash(&self) -> String {
        mirage::hash::graph_hash(&self.inner)
    }

    fn to_dot(&self) -> String {
        mirage::dot::to_dot(&self.inner)
    }

    /// The search's cost model (default model, `sm_90` target) of each op but the inputs, in
    /// graph order: `[{"op", "est_us", "dram_bytes", "l2_bytes", "flops", "launches",
    /// "shared_memory"}]`; their `est_us` sum to the graph's modelled time.
    fn op_costs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let cfg = mirage::search::SearchConfig::default();
        let costs = mirage::search::cost::kernel_op_costs(&self.inner, &cfg.cost_model, &cfg.target);
        costs
            .into_iter()
            .map(|(op, c)| {
                let d = PyDict::new(py);
                d.set_item("op", op)?;
                d.set_item("est_us", c.est_us)?;
                d.set_item("dram_bytes", c.dram_bytes)?;
                d.set_item("l2_bytes", c.l2_bytes)?;
                d.set_item("flops", c.flops)?;
                d.set_item("launches", c.launches)?;
                d.set_item("shared_memory", c.shared_memory)?;
                Ok(d)
            })
            .collect()
    }

    /// Runs the CPU interpreter. `inputs`: one `bytes` per graph input, float32 little-endian,
    /// row-major. Returns one `bytes` per output, same encoding. The GIL is released while
    /// the interpreter runs; Ctrl-C stops it and raises `KeyboardInterrupt`.
    fn run<'py>(&self, py: Python<'py>, inputs: Vec<Bound<'py, PyBytes>>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let ids = self.inner.input_ids();
        if ids.len() != inputs.len() {
            return Err(PyValueError::new_err(format!(
                "run: the graph has {} inputs but {} were given",
                ids.len(),
                inputs.len()
            )));
        }
        let mut tensors = Vec::with_capacity(inputs.len());
        for (i, (&id, b)) in ids.iter().zip(&inputs).enumerate() {
            let dims = self.inner.tensors[id].dims.clone();
            let bytes = b.as_bytes();
            let want = dims.iter().product::<usize>() * 4;
            if bytes.len() != want {
                return Err(PyValueError::new_err(format!(
                    "run: input {i} has {} bytes but dims {dims:?} need {want} (float32 little-endian)",
                    bytes.len()
                )));
            }
            let data = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            tensors.push(Tensor::new(dims, data).py_err()?);
        }
        let graph = &self.inner;
        let outs = interruptible(py, "run", |c| mirage::run_with(graph, &tensors, c))?.py_err()?;
        outs.iter()
            .map(|t| {
                PyBytes::new_with(py, t.data.len() * 4, |buf| {
                    for (dst, v) in buf.chunks_exact_mut(4).zip(&t.data) {
                        dst.copy_from_slice(&v.to_le_bytes());
                    }
                    Ok(())
                })
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "KernelGraph({} ops, {} inputs, {} outputs)",
            self.inner.ops.len(),
            self.inner.input_ids().len(),
            self.inner.output_ids().len()
        )
    }
}
