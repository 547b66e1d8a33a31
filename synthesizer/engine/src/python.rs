//! PyO3 binding: numpy columns in, numpy columns out, the GIL released while synthesizing.

use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arborescence;
use crate::greedy::{synthesize_best, Options, Problem};
use crate::lowering::{self, LowerError};
use crate::paths::{self, Graph};
use crate::radix;
use crate::rangeflow::{self, Demand, Flow};
use crate::replay as sim;

fn vec<T: numpy::Element + Copy>(a: &PyReadonlyArray1<T>) -> Vec<T> {
    a.as_array().to_vec()
}

/// Greedy link-chunk matching over several seeds; returns the best plan as numpy columns, or
/// None when no seed's plan ends by `cutoff` seconds (the seeds stop once they cannot).
///
/// Raises ValueError when the problem is malformed or some chunk can never reach a
/// destination (the message names the chunk and node).
#[pyfunction]
#[pyo3(signature = (
    num_nodes, link_src, link_dst, link_alpha, link_bandwidth, link_free_at,
    tenant_bytes, tenant_class, chunk_tenant,
    holder_ptr, holder_node, holder_time, target_ptr, target_node,
    seeds, replacement = true, exclusive = true, member_ptr = None, member_node = None,
    cutoff = f64::INFINITY
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
    cutoff: f64,
) -> PyResult<Option<Bound<'py, PyDict>>> {
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
    let best = py
        .detach(|| synthesize_best(&problem, &seeds, Options { seed: 0, replacement, exclusive },
                                   cutoff))
        .map_err(PyValueError::new_err)?;
    let Some((plan, makespans, seed)) = best else { return Ok(None) };
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
    Ok(Some(out))
}

/// The MSCCL lowering of one tenant (see `lowering.rs`): a dict with the `<gpu>` elements as
/// `text` (ASCII bytes) and the plan's facts, or with `error` (its kind) and `at` (up to three
/// indices). With `pack_level` (a zstd level; 0: none) and elements of `pack_from` bytes or
/// more, they come as `members` instead: one zstd frame per run of ranks ending at
/// `pack_ends` (none: per rank), compressed side by side where they were written.
#[pyfunction]
#[pyo3(signature = (
    n, src, dst, reduce, count, chunk, order, pos, base, base_channels,
    reads_ptr, reads_atom, writes_ptr, writes_atom, atom_size, atom_in, atom_out, combining,
    copy_rank, copy_in, copy_out, first_epochs, instances, max_steps, max_channels, max_tbs,
    max_nodes, max_dep_targets, fifo_chunks, max_cnt, in_units, out_units,
    pack_ends=Vec::new(), pack_level=0, pack_from=0
))]
#[allow(clippy::too_many_arguments)]
fn lower_tenant<'py>(
    py: Python<'py>,
    n: usize,
    src: PyReadonlyArray1<'py, i64>,
    dst: PyReadonlyArray1<'py, i64>,
    reduce: PyReadonlyArray1<'py, bool>,
    count: PyReadonlyArray1<'py, i64>,
    chunk: PyReadonlyArray1<'py, i64>,
    order: PyReadonlyArray1<'py, i64>,
    pos: PyReadonlyArray1<'py, i64>,
    base: PyReadonlyArray1<'py, i64>,
    base_channels: i64,
    reads_ptr: PyReadonlyArray1<'py, i64>,
    reads_atom: PyReadonlyArray1<'py, i64>,
    writes_ptr: PyReadonlyArray1<'py, i64>,
    writes_atom: PyReadonlyArray1<'py, i64>,
    atom_size: PyReadonlyArray1<'py, i64>,
    atom_in: PyReadonlyArray1<'py, i64>,
    atom_out: PyReadonlyArray1<'py, i64>,
    combining: bool,
    copy_rank: PyReadonlyArray1<'py, i64>,
    copy_in: PyReadonlyArray1<'py, i64>,
    copy_out: PyReadonlyArray1<'py, i64>,
    first_epochs: i64,
    instances: i64,
    max_steps: i64,
    max_channels: i64,
    max_tbs: usize,
    max_nodes: usize,
    max_dep_targets: usize,
    fifo_chunks: usize,
    max_cnt: i64,
    in_units: i64,
    out_units: i64,
    pack_ends: Vec<usize>,
    pack_level: i32,
    pack_from: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let (src, dst, reduce, count, chunk) = (vec(&src), vec(&dst), vec(&reduce), vec(&count), vec(&chunk));
    let (order, pos, base) = (vec(&order), vec(&pos), vec(&base));
    let (reads_ptr, reads_atom) = (vec(&reads_ptr), vec(&reads_atom));
    let (writes_ptr, writes_atom) = (vec(&writes_ptr), vec(&writes_atom));
    let (atom_size, atom_in, atom_out) = (vec(&atom_size), vec(&atom_in), vec(&atom_out));
    let copies: Vec<(i64, i64, i64)> = copy_rank
        .as_array()
        .iter()
        .zip(copy_in.as_array().iter())
        .zip(copy_out.as_array().iter())
        .map(|((&g, &i), &o)| (g, i, o))
        .collect();
    if src.len() != dst.len() || reads_ptr.len() != src.len() + 1 || writes_ptr.len() != src.len() + 1
        || order.len() != 2 * src.len()
    {
        return Err(PyValueError::new_err("lower_tenant: inconsistent column lengths"));
    }
    let input = lowering::Input {
        n, src: &src, dst: &dst, reduce: &reduce, count: &count, chunk: &chunk, order: &order,
        pos: &pos, base: &base, base_channels, reads_ptr: &reads_ptr, reads_atom: &reads_atom,
        writes_ptr: &writes_ptr, writes_atom: &writes_atom, atom_size: &atom_size,
        atom_in: &atom_in, atom_out: &atom_out, combining, copies: &copies, first_epochs,
        instances, max_steps, max_channels, max_tbs, max_nodes, max_dep_targets, fifo_chunks,
        max_cnt, in_units, out_units,
    };
    let packing = lowering::Packing { ends: &pack_ends, level: pack_level, from: pack_from };
    let packing = (pack_level != 0).then_some(&packing);
    let result = py.detach(|| lowering::lower(&input, packing));
    let out = PyDict::new(py);
    match result {
        Ok(o) => {
            match o.elements {
                lowering::Elements::Frames(frames) => {
                    let members: Vec<Bound<'py, PyBytes>> =
                        frames.iter().map(|m| PyBytes::new(py, m)).collect();
                    out.set_item("members", members)?;
                }
                // ASCII bytes: a 1,024-GPU tenant's elements are 60 MB, which a str would
                // decode; each run is copied once, side by side, into the object.
                lowering::Elements::Plain(gpus) => {
                    let total = o.gpu_ends.last().copied().unwrap_or(0);
                    let text = PyBytes::new_with(py, total, |buf| {
                        lowering::join_into(&gpus, buf);
                        Ok(())
                    })?;
                    out.set_item("text", text)?;
                }
            }
            out.set_item("gpu_ends", o.gpu_ends)?;
            out.set_item("epochs", o.epochs)?;
            out.set_item("fused", o.fused)?;
            out.set_item("max_steps", o.max_steps)?;
            out.set_item("nchannels", o.nchannels)?;
            out.set_item("scratch", o.scratch)?;
        }
        Err(e) => {
            let (kind, at): (&str, Vec<i64>) = match e {
                LowerError::NotHeld(x, g, a) => ("not_held", vec![x as i64, g, a as i64]),
                LowerError::Split(a, g) => ("split", vec![a as i64, g]),
                LowerError::Scattered(x) => ("scattered", vec![x as i64]),
                LowerError::Channels(c) => ("channels", vec![c]),
                LowerError::Threadblocks(g, k) => ("threadblocks", vec![g, k as i64]),
                LowerError::Nodes(g, k) => ("nodes", vec![g, k as i64]),
                LowerError::DepTargets(g, k) => ("dep_targets", vec![g, k as i64]),
                LowerError::TooManyChannels(c) => ("too_many_channels", vec![c]),
                LowerError::Pack(why) => return Err(PyValueError::new_err(format!("lower_tenant: {why}"))),
            };
            out.set_item("error", kind)?;
            out.set_item("at", at)?;
        }
    }
    Ok(out)
}

type Times<'py> = Bound<'py, numpy::PyArray1<f64>>;

/// The congestion simulator's pass (see `replay.rs`) over a schedule's read and write rows:
/// actual (start, end) of every transfer.
///
/// Raises ValueError when an index is out of range.
#[pyfunction]
#[pyo3(signature = (
    start, end, read_transfer, read_atom, write_transfer, write_atom, atoms, eps,
    duration, row, wait_ptr, wait_slot, update_ptr, update_slot, slots
))]
#[allow(clippy::too_many_arguments)]
fn replay<'py>(
    py: Python<'py>,
    start: PyReadonlyArray1<'py, f64>,
    end: PyReadonlyArray1<'py, f64>,
    read_transfer: PyReadonlyArray1<'py, i64>,
    read_atom: PyReadonlyArray1<'py, i64>,
    write_transfer: PyReadonlyArray1<'py, i64>,
    write_atom: PyReadonlyArray1<'py, i64>,
    atoms: usize,
    eps: f64,
    duration: PyReadonlyArray1<'py, f64>,
    row: PyReadonlyArray1<'py, i64>,
    wait_ptr: PyReadonlyArray1<'py, i64>,
    wait_slot: PyReadonlyArray1<'py, i64>,
    update_ptr: PyReadonlyArray1<'py, i64>,
    update_slot: PyReadonlyArray1<'py, i64>,
    slots: usize,
) -> PyResult<(Times<'py>, Times<'py>)> {
    let rows = sim::Rows {
        start: start.as_slice()?,
        end: end.as_slice()?,
        read_transfer: read_transfer.as_slice()?,
        read_atom: read_atom.as_slice()?,
        write_transfer: write_transfer.as_slice()?,
        write_atom: write_atom.as_slice()?,
        atoms,
        eps,
    };
    let costs = sim::Costs {
        duration: duration.as_slice()?,
        row: row.as_slice()?,
        wait_ptr: wait_ptr.as_slice()?,
        wait_slot: wait_slot.as_slice()?,
        update_ptr: update_ptr.as_slice()?,
        update_slot: update_slot.as_slice()?,
        slots,
    };
    let (start, end) = py.detach(|| sim::replay(&rows, &costs)).map_err(PyValueError::new_err)?;
    Ok((start.into_pyarray(py), end.into_pyarray(py)))
}

/// The atoms of ranged transfers (see `replay::ranged_atoms`): (cuts, read_transfer,
/// read_atom, write_transfer, write_atom).
///
/// Raises ValueError when a range or node is out of range.
#[pyfunction]
fn ranged_atoms<'py>(
    py: Python<'py>,
    lo: PyReadonlyArray1<'py, i64>,
    count: PyReadonlyArray1<'py, i64>,
    src: PyReadonlyArray1<'py, i64>,
    dst: PyReadonlyArray1<'py, i64>,
    span: i64,
) -> PyResult<(Ids<'py>, Ids<'py>, Ids<'py>, Ids<'py>, Ids<'py>)> {
    let (lo, count, src, dst) = (lo.as_slice()?, count.as_slice()?, src.as_slice()?, dst.as_slice()?);
    let a = py.detach(|| sim::ranged_atoms(lo, count, src, dst, span)).map_err(PyValueError::new_err)?;
    Ok((
        a.cuts.into_pyarray(py),
        a.read_transfer.into_pyarray(py),
        a.read_atom.into_pyarray(py),
        a.write_transfer.into_pyarray(py),
        a.write_atom.into_pyarray(py),
    ))
}

/// Distinct integers ascending and each value's index among them (``np.unique`` with
/// ``return_inverse``), by a radix sort.
#[pyfunction]
fn unique_inverse<'py>(py: Python<'py>, values: PyReadonlyArray1<'py, i64>) -> PyResult<(Ids<'py>, Ids<'py>)> {
    let values = values.as_slice()?;
    let (distinct, inverse) = py.detach(|| radix::unique_inverse(values));
    Ok((distinct.into_pyarray(py), inverse.into_pyarray(py)))
}

type Ids<'py> = Bound<'py, numpy::PyArray1<i64>>;

/// Cheapest paths (see `paths.rs`): for each source and each of its targets, the fabric
/// links of the path in order, as (path_ptr, path_links).
///
/// Raises ValueError when a target cannot be reached or an index is out of range.
#[pyfunction]
#[pyo3(signature = (adj_ptr, adj_link, adj_head, adj_cost, link_src, sources, target_ptr, targets))]
#[allow(clippy::too_many_arguments)]
fn shortest_paths<'py>(
    py: Python<'py>,
    adj_ptr: PyReadonlyArray1<'py, i64>,
    adj_link: PyReadonlyArray1<'py, i64>,
    adj_head: PyReadonlyArray1<'py, i64>,
    adj_cost: PyReadonlyArray1<'py, f64>,
    link_src: PyReadonlyArray1<'py, i64>,
    sources: PyReadonlyArray1<'py, i64>,
    target_ptr: PyReadonlyArray1<'py, i64>,
    targets: PyReadonlyArray1<'py, i64>,
) -> PyResult<(Ids<'py>, Ids<'py>)> {
    let graph = Graph {
        adj_ptr: adj_ptr.as_slice()?,
        adj_link: adj_link.as_slice()?,
        adj_head: adj_head.as_slice()?,
        adj_cost: adj_cost.as_slice()?,
        link_src: link_src.as_slice()?,
    };
    let (sources, target_ptr, targets) =
        (sources.as_slice()?, target_ptr.as_slice()?, targets.as_slice()?);
    let (ptr, links) = py
        .detach(|| paths::paths(&graph, sources, target_ptr, targets))
        .map_err(PyValueError::new_err)?;
    Ok((ptr.into_pyarray(py), links.into_pyarray(py)))
}

/// What ``rangeflow.replay`` returns: causality (transfer, chunk) and chunks, doubles
/// (transfer, words) and chunks, postcondition (tenant, rank, chunk, words) and chunks.
type Found = (Vec<(i64, i64)>, i64, Vec<(i64, Vec<u64>)>, i64, Vec<(i64, i64, i64, Vec<u64>)>, i64);

/// The verifier's run-based data replay (see `rangeflow.rs`). Tenants' columns are CSR:
/// `*_ptr[t]..*_ptr[t+1]` are tenant t's ranks, origins and spans.
///
/// Raises ValueError when an index is out of range.
#[pyfunction]
#[pyo3(signature = (
    tenant, chunk, count, src, dst, reduce, event_read, event_transfer,
    rank_ptr, rank_node, combining, num_chunks, piece, origin_ptr, origin,
    span_ptr, span_rank, span_lo, span_hi, keep
))]
#[allow(clippy::too_many_arguments)]
fn rangeflow_replay<'py>(
    py: Python<'py>,
    tenant: PyReadonlyArray1<'py, i64>,
    chunk: PyReadonlyArray1<'py, i64>,
    count: PyReadonlyArray1<'py, i64>,
    src: PyReadonlyArray1<'py, i64>,
    dst: PyReadonlyArray1<'py, i64>,
    reduce: PyReadonlyArray1<'py, bool>,
    event_read: PyReadonlyArray1<'py, bool>,
    event_transfer: PyReadonlyArray1<'py, i64>,
    rank_ptr: PyReadonlyArray1<'py, i64>,
    rank_node: PyReadonlyArray1<'py, i64>,
    combining: PyReadonlyArray1<'py, bool>,
    num_chunks: PyReadonlyArray1<'py, i64>,
    piece: PyReadonlyArray1<'py, i64>,
    origin_ptr: PyReadonlyArray1<'py, i64>,
    origin: PyReadonlyArray1<'py, i64>,
    span_ptr: PyReadonlyArray1<'py, i64>,
    span_rank: PyReadonlyArray1<'py, i64>,
    span_lo: PyReadonlyArray1<'py, i64>,
    span_hi: PyReadonlyArray1<'py, i64>,
    keep: usize,
) -> PyResult<Found> {
    let (rank_ptr, rank_node) = (rank_ptr.as_slice()?, rank_node.as_slice()?);
    let (origin_ptr, origin) = (origin_ptr.as_slice()?, origin.as_slice()?);
    let (span_ptr, span_rank) = (span_ptr.as_slice()?, span_rank.as_slice()?);
    let (span_lo, span_hi) = (span_lo.as_slice()?, span_hi.as_slice()?);
    let (combining, num_chunks, piece) = (combining.as_slice()?, num_chunks.as_slice()?, piece.as_slice()?);
    let tenants = combining.len();
    let range = |ptr: &[i64], t: usize, len: usize| -> PyResult<std::ops::Range<usize>> {
        let (a, b) = (ptr.get(t).copied().unwrap_or(-1), ptr.get(t + 1).copied().unwrap_or(-1));
        usize::try_from(a).ok().zip(usize::try_from(b).ok()).filter(|&(a, b)| a <= b && b <= len)
            .map(|(a, b)| a..b)
            .ok_or_else(|| PyValueError::new_err(format!("rangeflow: tenant {t}: bad pointers")))
    };
    let mut demands = Vec::with_capacity(tenants);
    for t in 0..tenants {
        let spans = range(span_ptr, t, span_rank.len())?;
        let as_count = |x: Option<&i64>, what: &str| usize::try_from(x.copied().unwrap_or(-1))
            .map_err(|_| PyValueError::new_err(format!("rangeflow: tenant {t}: bad {what}")));
        demands.push(Demand {
            ranks: &rank_node[range(rank_ptr, t, rank_node.len())?],
            combining: combining[t],
            num_chunks: as_count(num_chunks.get(t), "chunk count")?,
            piece: as_count(piece.get(t), "piece size")?,
            origin: &origin[range(origin_ptr, t, origin.len())?],
            span_rank: &span_rank[spans.clone()],
            span_lo: &span_lo[spans.clone()],
            span_hi: &span_hi[spans],
        });
    }
    let flow = Flow {
        tenant: tenant.as_slice()?,
        chunk: chunk.as_slice()?,
        count: count.as_slice()?,
        src: src.as_slice()?,
        dst: dst.as_slice()?,
        reduce: reduce.as_slice()?,
        event_read: event_read.as_slice()?,
        event_transfer: event_transfer.as_slice()?,
    };
    let f = py.detach(|| rangeflow::replay(&flow, &demands, keep)).map_err(PyValueError::new_err)?;
    Ok((f.causality, f.causality_chunks, f.doubles, f.double_chunks, f.postcondition,
        f.postcondition_chunks))
}

/// For each root, the edges of a minimum-cost arborescence spanning all `num_nodes` nodes:
/// a `(len(roots), num_nodes - 1)` array of edge indices, a row of -1 where some node cannot
/// be reached from that root.
#[pyfunction]
fn min_arborescences<'py>(
    py: Python<'py>,
    num_nodes: usize,
    src: PyReadonlyArray1<'py, u32>,
    dst: PyReadonlyArray1<'py, u32>,
    cost: PyReadonlyArray1<'py, f64>,
    roots: PyReadonlyArray1<'py, u32>,
) -> PyResult<Bound<'py, numpy::PyArray2<i64>>> {
    let (src, dst, cost, roots) = (vec(&src), vec(&dst), vec(&cost), vec(&roots));
    if dst.len() != src.len() || cost.len() != src.len() {
        return Err(PyValueError::new_err("min_arborescences: edge columns differ in length"));
    }
    if src.iter().chain(&dst).chain(&roots).any(|&v| v as usize >= num_nodes) {
        return Err(PyValueError::new_err("min_arborescences: a node id is out of range"));
    }
    let width = num_nodes.saturating_sub(1);
    let trees = py.detach(|| arborescence::min_arborescences(num_nodes, &src, &dst, &cost, &roots));
    let mut flat = Vec::with_capacity(trees.len() * width);
    for tree in trees {
        match tree {
            Some(t) => flat.extend(t.into_iter().map(|i| i as i64)),
            None => flat.extend(std::iter::repeat_n(-1i64, width)),
        }
    }
    let rows = roots.len();
    numpy::ndarray::Array2::from_shape_vec((rows, width), flat)
        .map(|a| a.into_pyarray(py))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn choreo_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(greedy, m)?)?;
    m.add_function(wrap_pyfunction!(lower_tenant, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(shortest_paths, m)?)?;
    m.add_function(wrap_pyfunction!(unique_inverse, m)?)?;
    m.add_function(wrap_pyfunction!(ranged_atoms, m)?)?;
    m.add_function(wrap_pyfunction!(rangeflow_replay, m)?)?;
    m.add_function(wrap_pyfunction!(min_arborescences, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
