//! `mirage._core.BlockGraph`: the threadblock-graph builder of customized ops.

use mirage::STensorId;
use pyo3::prelude::*;

use crate::convert::{parse_accum, parse_binary, parse_dtype, parse_unary, OrPyErr};

/// A threadblock graph; tile tensors are referred to by integer ids.
#[pyclass(module = "mirage._core")]
pub struct BlockGraph {
    pub(crate) inner: mirage::BlockGraph,
}

#[pymethods]
impl BlockGraph {
    #[new]
    fn new(grid_dim: [usize; 3], block_dim: [usize; 3], forloop_range: usize, reduction_dimx: usize) -> PyResult<Self> {
        Ok(BlockGraph { inner: mirage::BlockGraph::new(grid_dim, block_dim, forloop_range, reduction_dimx).py_err()? })
    }

    /// Adds an input iterator over a device tensor of `dims`/`dtype`; returns its tile id.
    fn new_input(&mut self, dims: Vec<usize>, dtype: &str, imap: [i64; 3], forloop_dim: i64) -> PyResult<STensorId> {
        let dtype = parse_dtype("tb.new_input", dtype)?;
        self.inner.new_input(&dims, dtype, imap, forloop_dim).py_err()
    }

    /// Adds an output saver; returns the output's position.
    #[pyo3(signature = (t, omap, forloop_dim=-1))]
    fn new_output(&mut self, t: STensorId, omap: [i64; 3], forloop_dim: i64) -> PyResult<usize> {
        self.inner.new_output(t, omap, forloop_dim).py_err()
    }

    fn matmul(&mut self, a: STensorId, b: STensorId) -> PyResult<STensorId> {
        self.inner.matmul(a, b).py_err()
    }

    /// Element-wise unary op by name; `clamp` takes `min`/`max`, `mul_scalar` takes `scalar`.
    #[pyo3(signature = (name, a, *, min=None, max=None, scalar=None))]
    fn unary(
        &mut self,
        name: &str,
        a: STensorId,
        min: Option<f64>,
        max: Option<f64>,
        scalar: Option<f64>,
    ) -> PyResult<STensorId> {
        let op = parse_unary(name, min, max, scalar)?;
        self.inner.unary(op, a).py_err()
    }

    fn binary(&mut self, name: &str, a: STensorId, b: STensorId) -> PyResult<STensorId> {
        let op = parse_binary(name)?;
        self.inner.binary(op, a, b).py_err()
    }

    fn reduction(&mut self, a: STensorId, dim: i64) -> PyResult<STensorId> {
        self.inner.reduction(a, dim).py_err()
    }

    /// Running max over `dim` and iterations, and its change: `(max, diff)`.
    fn reduction_max(&mut self, a: STensorId, dim: i64) -> PyResult<(STensorId, STensorId)> {
        self.inner.reduction_max(a, dim).py_err()
    }

    #[pyo3(signature = (a, eps=0.0))]
    fn rms_norm(&mut self, a: STensorId, eps: f64) -> PyResult<STensorId> {
        let eps = crate::convert::parse_eps("tb.rms_norm", eps)?;
        self.inner.rms_norm_eps(a, eps).py_err()
    }

    fn concat(&mut self, a: STensorId, b: STensorId, dim: i64) -> PyResult<STensorId> {
        self.inner.concat(a, b, dim).py_err()
    }

    #[pyo3(signature = (a, acc=None, eps=0.0))]
    fn forloop_accum(&mut self, a: STensorId, acc: Option<&str>, eps: f64) -> PyResult<STensorId> {
        let acc = parse_accum("tb.forloop_accum", acc)?;
        let eps = crate::convert::parse_eps("tb.forloop_accum", eps)?;
        self.inner.forloop_accum_eps(a, acc, eps).py_err()
    }

    #[pyo3(signature = (a, scale, acc=None))]
    fn forloop_accum_rescale(&mut self, a: STensorId, scale: STensorId, acc: Option<&str>) -> PyResult<STensorId> {
        let acc = parse_accum("tb.forloop_accum_rescale", acc)?;
        self.inner.forloop_accum_rescale(a, scale, acc).py_err()
    }

    fn forloop_accum_max(&mut self, a: STensorId) -> PyResult<STensorId> {
        self.inner.forloop_accum_max(a).py_err()
    }

    fn tensor_dims(&self, t: STensorId) -> PyResult<Vec<usize>> {
        Ok(self.inner.tensor(t).py_err()?.dims.clone())
    }

    fn tensor_dtype(&self, t: STensorId) -> PyResult<&'static str> {
        Ok(self.inner.tensor(t).py_err()?.dtype.name())
    }

    #[getter]
    fn num_inputs(&self) -> usize {
        self.inner.input_ops().count()
    }

    #[getter]
    fn num_outputs(&self) -> usize {
        self.inner.output_ops().count()
    }

    #[getter]
    fn num_ops(&self) -> usize {
        self.inner.ops.len()
    }

    #[getter]
    fn grid_dim(&self) -> [usize; 3] {
        self.inner.grid_dim
    }

    #[getter]
    fn block_dim(&self) -> [usize; 3] {
        self.inner.block_dim
    }

    #[getter]
    fn forloop_range(&self) -> usize {
        self.inner.forloop_range
    }

    #[getter]
    fn reduction_dimx(&self) -> usize {
        self.inner.reduction_dimx
    }

    fn __repr__(&self) -> String {
        let b = &self.inner;
        format!(
            "BlockGraph(grid_dim={:?}, block_dim={:?}, forloop_range={}, {} ops)",
            b.grid_dim,
            b.block_dim,
            b.forloop_range,
            b.ops.len()
        )
    }
}
