//! PyO3 binding: numpy columns in, numpy columns out, the GIL released while synthesizing.

use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::greedy::{synthesize_best, Options, Problem};

fn vec<T: numpy::Element + Copy>(a: &PyReadonlyArray1<T>) -> Vec<T> {
    a.as_array().to_vec()
}

/// Greedy link-chunk matching over several seeds; returns the best plan as numpy columns.
///
/// Raises ValueError when the problem is malformed or some chunk can never reach a
/// destination (the message names the chunk and node).
#[pyfunction]
#[pyo3(signature = (
    num_nodes, link_src, link_dst, link_alpha, link_bandwidth, link_free_at,
    tenant_bytes, tenant_class, chunk_tenant,
    holder_ptr, holder_node, holder_time, target_ptr, target_node,
    seeds, replacement = true, exclusive = true, member_ptr = None, member_node = None
))]
#[allow(clippy::too_many_arguments)]
fn greedy<'py>(
    py: Python<'py>,
    num_nodes: usize,
    link_src: PyReadonlyArray1<'py, u32>,
    link_dst: PyReadonlyArray1<'py, u32>,
    link_alpha: PyReadonlyArray1<'py, f64>,
    link_bandwidth: PyReadonlyArray1<'py, f64>,
    link_free_at: PyReadonlyArray1<'py, f64>,
    tenant_bytes: PyReadonlyArray1<'py, f64>,
    tenant_class: PyReadonlyArray1<'py, u32>,
    chunk_tenant: PyReadonlyArray1<'py, u32>,
    holder_ptr: PyReadonlyArray1<'py, u64>,
    holder_node: PyReadonlyArray1<'py, u32>,
    holder_time: PyReadonlyArray1<'py, f64>,
    target_ptr: PyReadonlyArray1<'py, u64>,
    target_node: PyReadonlyArray1<'py, u32>,
    seeds: Vec<u64>,
    replacement: bool,
    exclusive: bool,
    member_ptr: Option<PyReadonlyArray1<'py, u64>>,
    member_node: Option<PyReadonlyArray1<'py, u32>>,
) -> PyResult<Bound<'py, PyDict>> {
    let problem = Problem {
        num_nodes,
        link_src: vec(&link_src),
        link_dst: vec(&link_dst),
        link_alpha: vec(&link_alpha),
        link_bandwidth: vec(&link_bandwidth),
        link_free_at: vec(&link_free_at),
        tenant_bytes: vec(&tenant_bytes),
        tenant_class: vec(&tenant_class),
        chunk_tenant: vec(&chunk_tenant),
        holder_ptr: holder_ptr.as_array().iter().map(|&x| x as usize).collect(),
        holder_node: vec(&holder_node),
        holder_time: vec(&holder_time),
        target_ptr: target_ptr.as_array().iter().map(|&x| x as usize).collect(),
        target_node: vec(&target_node),
        member_ptr: member_ptr.map(|a| a.as_array().iter().map(|&x| x as usize).collect()).unwrap_or_default(),
        member_node: member_node.map(|a| vec(&a)).unwrap_or_default(),
    };
    let (plan, makespans, seed) = py
        .detach(|| synthesize_best(&problem, &seeds, Options { seed: 0, replacement, exclusive }))
        .map_err(PyValueError::new_err)?;
    let out = PyDict::new(py);
    out.set_item("chunk", plan.chunk.into_pyarray(py))?;
    out.set_item("src", plan.src.into_pyarray(py))?;
    out.set_item("dst", plan.dst.into_pyarray(py))?;
    out.set_item("link", plan.link.into_pyarray(py))?;
    out.set_item("start", plan.start.into_pyarray(py))?;
    out.set_item("end", plan.end.into_pyarray(py))?;
    out.set_item("makespan", plan.makespan)?;
    out.set_item("makespans", makespans)?;
    out.set_item("seed", seed)?;
    Ok(out)
}

#[pymodule]
fn choreo_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(greedy, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
