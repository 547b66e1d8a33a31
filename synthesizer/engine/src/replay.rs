//! The congestion simulator's one sequential pass (``choreo.simulate``), compiled.
//!
//! Python cuts every node's chunk space into atoms and lists what each transfer reads and
//! writes (`ranged_atoms` does that here for ranged transfers), and gives per model row the
//! slots a transfer waits for and advances. Here the transfers go in planned start order,
//! each atom's arrivals in planned end order (counting sorts), and then the inherently
//! sequential part: a transfer starts when its data has arrived and its resources are free,
//! and its end frees them for the next.

use crate::radix;
use rayon::prelude::*;

/// Read and write rows of the planned schedule (see `choreo.simulate.Atoms`): per read row
/// the transfer and the atom it reads, per write row the transfer and the atom it writes.
pub struct Rows<'a> {
    /// Per transfer: planned start and end.
    pub start: &'a [f64],
    pub end: &'a [f64],
    pub read_transfer: &'a [i64],
    pub read_atom: &'a [i64],
    pub write_transfer: &'a [i64],
    pub write_atom: &'a [i64],
    pub atoms: usize,
    /// A read sees an arrival planned to end by its transfer's planned start plus this.
    pub eps: f64,
}

/// What a transfer costs: its duration, and the slots its model row waits for and advances.
pub struct Costs<'a> {
    /// Per transfer: its duration and its model row.
    pub duration: &'a [f64],
    pub row: &'a [i64],
    /// Per model row (CSR): slots to wait for and slots to advance.
    pub wait_ptr: &'a [i64],
    pub wait_slot: &'a [i64],
    pub update_ptr: &'a [i64],
    pub update_slot: &'a [i64],
    pub slots: usize,
}

fn index(x: i64, len: usize, what: &str) -> Result<usize, String> {
    usize::try_from(x)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| format!("replay: {what} {x} out of range 0..{len}"))
}

fn check_csr(ptr: &[i64], items: &[i64], rows: usize, slots: usize, what: &str) -> Result<(), String> {
    if ptr.len() != rows + 1 {
        return Err(format!("replay: {what} pointers: {} for {rows} rows", ptr.len()));
    }
    let mut prev = 0i64;
    for &p in ptr {
        if p < prev || p as usize > items.len() {
            return Err(format!("replay: {what} pointers are not a CSR over {} items", items.len()));
        }
        prev = p;
    }
    for &s in items {
        index(s, slots, what)?;
    }
    Ok(())
}

/// Reject anything that would index out of bounds, so the pass itself cannot panic.
fn check(rows: &Rows, costs: &Costs) -> Result<(), String> {
    let m = rows.start.len();
    if rows.end.len() != m
        || rows.read_atom.len() != rows.read_transfer.len()
        || rows.write_atom.len() != rows.write_transfer.len()
    {
        return Err("replay: row columns differ in length".into());
    }
    if costs.duration.len() != m || costs.row.len() != m {
        return Err("replay: transfer columns differ in length".into());
    }
    for (ts, what) in [(rows.read_transfer, "read transfer"), (rows.write_transfer, "write transfer")] {
        for &t in ts {
            index(t, m, what)?;
        }
    }
    for (ks, what) in [(rows.read_atom, "read atom"), (rows.write_atom, "write atom")] {
        for &k in ks {
            index(k, rows.atoms, what)?;
        }
    }
    let model_rows = costs.wait_ptr.len().saturating_sub(1);
    check_csr(costs.wait_ptr, costs.wait_slot, model_rows, costs.slots, "wait slot")?;
    check_csr(costs.update_ptr, costs.update_slot, model_rows, costs.slots, "update slot")?;
    for &r in costs.row {
        index(r, model_rows, "model row")?;
    }
    Ok(())
}

/// Actual (start, end) of every transfer. Transfers go in planned start order (ties by
/// index); a read waits for the arrivals into its atom planned to end by its transfer's
/// planned start, which only grow in that order, so each atom keeps a cursor and the
/// latest actual end before it, and every arrival is looked at once.
pub fn replay(rows: &Rows, costs: &Costs) -> Result<(Vec<f64>, Vec<f64>), String> {
    check(rows, costs)?;
    let m = rows.start.len();
    // arrivals: by atom, then by planned end (ties by write row, as a stable sort leaves
    // them); an atom has a few writers, so each atom's run is sorted on its own
    let (by_atom, first) = radix::by_bucket(rows.write_atom.iter().map(|&k| k as usize), rows.atoms);
    let mut writer: Vec<(u64, u32)> = by_atom
        .iter()
        .map(|&j| {
            let w = rows.write_transfer[j as usize] as usize;
            (radix::time_key(rows.end[w]), w as u32)
        })
        .collect();
    for a in 0..rows.atoms {
        writer[first[a] as usize..first[a + 1] as usize].sort_by_key(|&(key, _)| key);
    }
    let by_start =
        radix::argsort(&rows.start.iter().map(|&x| radix::time_key(x)).collect::<Vec<_>>());
    let (by_transfer, first_read) =
        radix::by_bucket(rows.read_transfer.iter().map(|&t| t as usize), m);
    let mut cursor: Vec<usize> = first[..rows.atoms].iter().map(|&p| p as usize).collect();
    let mut arrived = vec![0.0f64; rows.atoms];
    let mut free = vec![0.0f64; costs.slots];
    let mut start = vec![0.0f64; m];
    let mut end = vec![0.0f64; m];
    for &t in &by_start {
        let t = t as usize;
        let seen = radix::time_key(rows.start[t] + rows.eps);
        let mut ready = 0.0f64;
        for &i in &by_transfer[first_read[t] as usize..first_read[t + 1] as usize] {
            let a = rows.read_atom[i as usize] as usize;
            let run = &writer[cursor[a]..first[a + 1] as usize];
            let due = run.partition_point(|&(key, _)| key <= seen);
            let mut got = arrived[a];
            for &(_, w) in &run[..due] {
                got = got.max(end[w as usize]);
            }
            cursor[a] += due;
            arrived[a] = got;
            ready = ready.max(got);
        }
        let r = costs.row[t] as usize;
        for &w in &costs.wait_slot[costs.wait_ptr[r] as usize..costs.wait_ptr[r + 1] as usize] {
            ready = ready.max(free[w as usize]);
        }
        let e = ready + costs.duration[t];
        for &u in &costs.update_slot[costs.update_ptr[r] as usize..costs.update_ptr[r + 1] as usize] {
            let f = &mut free[u as usize];
            *f = f.max(e);
        }
        start[t] = ready;
        end[t] = e;
    }
    Ok((start, end))
}

/// The atoms of ranged transfers (see `choreo.simulate.Atoms`): a node's chunk space cut at
/// every range end read from or written to it, and per transfer the atoms it reads at its
/// source and writes at its destination, in chunk order.
pub struct RangedAtoms {
    /// Per atom, its first chunk as `node * span + chunk`, ascending.
    pub cuts: Vec<i64>,
    pub read_transfer: Vec<i64>,
    pub read_atom: Vec<i64>,
    pub write_transfer: Vec<i64>,
    pub write_atom: Vec<i64>,
}

/// Transfer `t` moves chunks `lo[t]..lo[t] + count[t]` (tenant-wide, below `span`) from node
/// `src[t]` to `dst[t]`.
pub fn ranged_atoms(
    lo: &[i64],
    count: &[i64],
    src: &[i64],
    dst: &[i64],
    span: i64,
) -> Result<RangedAtoms, String> {
    let m = lo.len();
    if count.len() != m || src.len() != m || dst.len() != m {
        return Err("atoms: columns differ in length".into());
    }
    for t in 0..m {
        let hi = lo[t].checked_add(count[t]).unwrap_or(i64::MAX);
        if lo[t] < 0 || count[t] < 0 || hi >= span || src[t] < 0 || dst[t] < 0 {
            return Err(format!("atoms: transfer {t}'s range or nodes out of range"));
        }
    }
    let key = |node: i64, chunk: i64| node.checked_mul(span).and_then(|x| x.checked_add(chunk));
    // four runs of m keys: ranges' first chunks at the source, then at the destination,
    // then their ends at each, as `node * span + chunk`
    let keys: Vec<u64> = (0..4 * m)
        .into_par_iter()
        .with_min_len(1 << 16)
        .map(|j| {
            let (t, run) = (j % m, j / m);
            let node = if run % 2 == 0 { src[t] } else { dst[t] };
            let chunk = if run >= 2 { lo[t] + count[t] } else { lo[t] };
            key(node, chunk).map(|k| k as u64).ok_or("atoms: node * span beyond int64")
        })
        .collect::<Result<_, _>>()?;
    let (cuts, at) = radix::distinct_inverse(&keys);
    drop(keys);
    let cuts = cuts.into_par_iter().map(|k| k as i64).collect();
    // per transfer, its atoms first[t]..end[t], one (transfer, atom) row each
    let rows = |first: &[i64], end: &[i64]| {
        let mut ptr = Vec::with_capacity(m + 1);
        ptr.push(0usize);
        for t in 0..m {
            ptr.push(ptr[t] + (end[t] - first[t]) as usize);
        }
        let total = ptr[m];
        let (mut ts, mut ks) = (vec![0i64; total], vec![0i64; total]);
        let (out_t, out_k) = (radix::SharedSlice::new(&mut ts), radix::SharedSlice::new(&mut ks));
        (0..m).into_par_iter().with_min_len(1 << 14).for_each(|t| {
            for (j, k) in (ptr[t]..ptr[t + 1]).zip(first[t]..end[t]) {
                // SAFETY: transfer t alone writes rows ptr[t]..ptr[t + 1]
                unsafe {
                    out_t.write(j, t as i64);
                    out_k.write(j, k);
                }
            }
        });
        (ts, ks)
    };
    let (read_transfer, read_atom) = rows(&at[..m], &at[2 * m..3 * m]);
    let (write_transfer, write_atom) = rows(&at[m..2 * m], &at[3 * m..]);
    Ok(RangedAtoms { cuts, read_transfer, read_atom, write_transfer, write_atom })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_ROWS: Rows = Rows {
        start: &[],
        end: &[],
        read_transfer: &[],
        read_atom: &[],
        write_transfer: &[],
        write_atom: &[],
        atoms: 0,
        eps: 1e-12,
    };

    /// Two transfers on one link (row 0, slot 0) and a second hop that needs the first
    /// transfer's chunk (atom 0, written by transfer 0).
    #[test]
    fn link_fifo_and_store_and_forward() {
        let rows = Rows {
            start: &[0.0, 1.0, 2.0],
            end: &[0.5, 1.5, 2.5],
            read_transfer: &[0, 1, 2],
            read_atom: &[1, 2, 0],
            write_transfer: &[0],
            write_atom: &[0],
            atoms: 3,
            ..NO_ROWS
        };
        let costs = Costs {
            duration: &[1.0, 2.0, 0.5],
            row: &[0, 0, 1],
            wait_ptr: &[0, 1, 2],
            wait_slot: &[0, 1],
            update_ptr: &[0, 1, 2],
            update_slot: &[0, 1],
            slots: 2,
        };
        let (start, end) = replay(&rows, &costs).unwrap();
        assert_eq!(start, vec![0.0, 1.0, 1.0]);
        assert_eq!(end, vec![1.0, 3.0, 1.5]);
    }

    /// Transfer 2 (planned at 1) reads atom 0, written by transfer 0 (planned to end at 0.5)
    /// and transfer 1 (at 2.5): it waits for 0 only, though rows and writers come in another
    /// order; transfer 1 then waits for 2 on their shared slot.
    #[test]
    fn a_read_waits_for_the_arrivals_planned_before_it() {
        let rows = Rows {
            start: &[0.0, 2.0, 1.0],
            end: &[0.5, 2.5, 1.5],
            read_transfer: &[2, 1, 0, 2],
            read_atom: &[0, 1, 1, 1],
            write_transfer: &[1, 0, 2],
            write_atom: &[0, 0, 1],
            atoms: 2,
            ..NO_ROWS
        };
        let costs = Costs {
            duration: &[3.0, 1.0, 1.0],
            row: &[0, 1, 1],
            wait_ptr: &[0, 0, 1],
            wait_slot: &[0],
            update_ptr: &[0, 0, 1],
            update_slot: &[0],
            slots: 1,
        };
        let (start, end) = replay(&rows, &costs).unwrap();
        assert_eq!(start, vec![0.0, 4.0, 3.0]);
        assert_eq!(end, vec![3.0, 5.0, 4.0]);
    }

    #[test]
    fn out_of_range_is_an_error_not_a_panic() {
        let rows = Rows { start: &[0.0], end: &[0.5], read_transfer: &[0], read_atom: &[0], atoms: 1, ..NO_ROWS };
        let costs = Costs {
            duration: &[1.0],
            row: &[3],
            wait_ptr: &[0, 0],
            wait_slot: &[],
            update_ptr: &[0, 0],
            update_slot: &[],
            slots: 0,
        };
        assert!(replay(&rows, &costs).unwrap_err().contains("model row"));
        let bad = Rows { read_atom: &[1], ..rows };
        assert!(replay(&bad, &Costs { row: &[0], ..costs }).unwrap_err().contains("read atom"));
    }

    /// Node 0 sends chunks 0..4 to node 1, which sends chunks 2..3 on to node 2: node 1's
    /// space is cut at 0, 2, 3 and 4, so the first transfer writes three atoms there.
    #[test]
    fn a_node_is_cut_at_every_range_end() {
        let got = ranged_atoms(&[0, 2], &[4, 1], &[0, 1], &[1, 2], 10).unwrap();
        assert_eq!(got.cuts, vec![0, 4, 10, 12, 13, 14, 22, 23]);
        assert_eq!((got.read_transfer, got.read_atom), (vec![0, 1], vec![0, 3]));
        assert_eq!((got.write_transfer, got.write_atom), (vec![0, 0, 0, 1], vec![2, 3, 4, 6]));
        assert!(ranged_atoms(&[8], &[3], &[0], &[1], 10).is_err());
    }
}
