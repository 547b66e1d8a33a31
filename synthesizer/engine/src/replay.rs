//! The congestion simulator's one sequential pass (``choreo.simulate``), compiled.
//!
//! Python prepares everything that vectorizes: the read rows of every transfer in planned
//! start order, the arrivals of each atom sorted by planned end, and per model row the slots a
//! transfer waits for and advances. What is left is inherently sequential: a transfer starts
//! when its data has arrived and its resources are free, and its end frees them for the next.

/// The inputs of one pass, indices as numpy gives them (int64).
pub struct Pass<'a> {
    /// Per read row, in processing order: the transfer reading, the atom read, and the end
    /// (exclusive) of the arrivals into that atom it waits for, in `writer` positions.
    pub read_transfer: &'a [i64],
    pub read_atom: &'a [i64],
    pub read_hi: &'a [i64],
    /// Per atom: the first of its arrivals in `writer`.
    pub atom_first: &'a [i64],
    /// Arrivals (transfers writing an atom), grouped by atom, by planned end within one.
    pub writer: &'a [i64],
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

impl Pass<'_> {
    /// Reject anything that would index out of bounds, so the pass itself cannot panic.
    fn check(&self, transfers: usize) -> Result<(), String> {
        let reads = self.read_transfer.len();
        if self.read_atom.len() != reads || self.read_hi.len() != reads {
            return Err("replay: read columns differ in length".into());
        }
        if self.duration.len() != transfers || self.row.len() != transfers {
            return Err("replay: transfer columns differ in length".into());
        }
        let rows = self.wait_ptr.len().saturating_sub(1);
        check_csr(self.wait_ptr, self.wait_slot, rows, self.slots, "wait slot")?;
        check_csr(self.update_ptr, self.update_slot, rows, self.slots, "update slot")?;
        for &r in self.row {
            index(r, rows, "model row")?;
        }
        for &w in self.writer {
            index(w, transfers, "writer")?;
        }
        let atoms = self.atom_first.len();
        for &f in self.atom_first {
            if f < 0 || f as usize > self.writer.len() {
                return Err(format!("replay: atom start {f} out of range"));
            }
        }
        for i in 0..reads {
            index(self.read_transfer[i], transfers, "read transfer")?;
            index(self.read_atom[i], atoms, "read atom")?;
            if self.read_hi[i] < 0 || self.read_hi[i] as usize > self.writer.len() {
                return Err(format!("replay: read end {} out of range", self.read_hi[i]));
            }
        }
        Ok(())
    }
}

/// Actual (start, end) of every transfer. Dependencies are prefix maxima over each atom's
/// arrivals, so every arrival is looked at once; a transfer is timed at its last read row.
pub fn replay(pass: &Pass, transfers: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    pass.check(transfers)?;
    let mut ptr: Vec<usize> = pass.atom_first.iter().map(|&p| p as usize).collect();
    let mut rmax = vec![0.0f64; ptr.len()];
    let mut free = vec![0.0f64; pass.slots];
    let mut start = vec![0.0f64; transfers];
    let mut end = vec![0.0f64; transfers];
    let reads = pass.read_transfer.len();
    let mut ready = 0.0f64;
    for i in 0..reads {
        let t = pass.read_transfer[i] as usize;
        let key = pass.read_atom[i] as usize;
        let hi = pass.read_hi[i] as usize;
        let mut got = rmax[key];
        let mut p = ptr[key];
        if p < hi {
            while p < hi {
                let e = end[pass.writer[p] as usize];
                if e > got {
                    got = e;
                }
                p += 1;
            }
            ptr[key] = p;
            rmax[key] = got;
        }
        if got > ready {
            ready = got;
        }
        if i + 1 < reads && pass.read_transfer[i + 1] as usize == t {
            continue;
        }
        let r = pass.row[t] as usize;
        for &w in &pass.wait_slot[pass.wait_ptr[r] as usize..pass.wait_ptr[r + 1] as usize] {
            let f = free[w as usize];
            if f > ready {
                ready = f;
            }
        }
        let e = ready + pass.duration[t];
        for &u in &pass.update_slot[pass.update_ptr[r] as usize..pass.update_ptr[r + 1] as usize] {
            if e > free[u as usize] {
                free[u as usize] = e;
            }
        }
        start[t] = ready;
        end[t] = e;
        ready = 0.0;
    }
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two transfers on one link (row 0, slot 0) and a second hop that needs the first
    /// transfer's chunk (atom 0, written by transfer 0).
    #[test]
    fn link_fifo_and_store_and_forward() {
        let pass = Pass {
            read_transfer: &[0, 1, 2],
            read_atom: &[1, 2, 0],
            read_hi: &[0, 0, 1],
            atom_first: &[0, 1, 1],
            writer: &[0],
            duration: &[1.0, 2.0, 0.5],
            row: &[0, 0, 1],
            wait_ptr: &[0, 1, 2],
            wait_slot: &[0, 1],
            update_ptr: &[0, 1, 2],
            update_slot: &[0, 1],
            slots: 2,
        };
        let (start, end) = replay(&pass, 3).unwrap();
        assert_eq!(start, vec![0.0, 1.0, 1.0]);
        assert_eq!(end, vec![1.0, 3.0, 1.5]);
    }

    #[test]
    fn out_of_range_is_an_error_not_a_panic() {
        let pass = Pass {
            read_transfer: &[0],
            read_atom: &[0],
            read_hi: &[0],
            atom_first: &[0],
            writer: &[],
            duration: &[1.0],
            row: &[3],
            wait_ptr: &[0, 0],
            wait_slot: &[],
            update_ptr: &[0, 0],
            update_slot: &[],
            slots: 0,
        };
        assert!(replay(&pass, 1).unwrap_err().contains("model row"));
    }
}
