//! The verifier's data replay on runs of chunks (``choreo.rangeflow``), compiled.
//!
//! Python orders the events (a read at start + eps after every write that ends by then) and
//! states each tenant's demand; this pass replays them. Each node's chunks of a tenant are a
//! short list of runs with one value each: a set of contributions (combining collectives) or
//! held/absent, kept as an id into the tenant's arena of bit sets. A transfer reads its
//! source's runs at its read event and, at its write event, COPY overwrites the destination's
//! runs with them while REDUCE adds them, which must not repeat a contribution.
//!
//! Nothing here is shared with the synthesizer: it checks schedules, whoever made them.

use std::collections::HashMap;

/// One tenant's demand: its ranks (rank -> node), whether it combines, how many chunks each
/// rank holds, and where every chunk must end.
pub struct Demand<'a> {
    pub ranks: &'a [i64],
    pub combining: bool,
    pub num_chunks: usize,
    /// Non-combining: chunks per origin piece, and the origin rank of each piece.
    pub piece: usize,
    pub origin: &'a [i64],
    /// The spans every destination must end up holding in full: (rank, first, end).
    pub span_rank: &'a [i64],
    pub span_lo: &'a [i64],
    pub span_hi: &'a [i64],
}

/// The transfers (schedule rows) and the events to replay, in order.
pub struct Flow<'a> {
    pub tenant: &'a [i64],
    pub chunk: &'a [i64],
    pub count: &'a [i64],
    pub src: &'a [i64],
    pub dst: &'a [i64],
    pub reduce: &'a [bool],
    pub event_read: &'a [bool],
    pub event_transfer: &'a [i64],
}

/// What the replay found, counted in chunks; the first `keep` of each kind listed, values
/// as little-endian 64-bit words (`words` per tenant).
#[derive(Default, Debug)]
pub struct Findings {
    pub causality: Vec<(i64, i64)>, // (transfer, first missing chunk)
    pub causality_chunks: i64,
    pub doubles: Vec<(i64, Vec<u64>)>, // (transfer, contributions held twice)
    pub double_chunks: i64,
    pub postcondition: Vec<(i64, i64, i64, Vec<u64>)>, // (tenant, rank, first chunk, value)
    pub postcondition_chunks: i64,
}

/// Bit sets of one width, by id; id 0 is the empty set. Values never change once made, so
/// a snapshot of runs stays valid whatever happens after it.
struct Arena {
    width: usize,
    words: Vec<u64>,
}

impl Arena {
    fn new(bits: usize) -> Self {
        let width = bits.div_ceil(64).max(1);
        Arena { width, words: vec![0; width] }
    }
    fn get(&self, id: u32) -> &[u64] {
        let at = id as usize * self.width;
        &self.words[at..at + self.width]
    }
    fn push(&mut self, value: &[u64]) -> u32 {
        let id = self.words.len() / self.width;
        self.words.extend_from_slice(value);
        u32::try_from(id).expect("fewer than 2^32 values")
    }
    fn bit(&mut self, b: usize) -> u32 {
        let mut v = vec![0u64; self.width];
        v[b / 64] |= 1 << (b % 64);
        self.push(&v)
    }
    fn full(&mut self, bits: usize) -> u32 {
        let mut v = vec![0u64; self.width];
        for b in 0..bits {
            v[b / 64] |= 1 << (b % 64);
        }
        self.push(&v)
    }
    fn same(&self, a: u32, b: u32) -> bool {
        a == b || self.get(a) == self.get(b)
    }
}

type Piece = (usize, usize, u32); // (first chunk, end chunk, value)

/// One node's chunks of one tenant: `vals[i]` on chunks `bounds[i]..bounds[i+1]`.
struct Runs {
    bounds: Vec<usize>,
    vals: Vec<u32>,
}

impl Runs {
    fn read(&self, lo: usize, hi: usize, out: &mut Vec<Piece>) {
        let b = &self.bounds;
        let mut i = b.partition_point(|&x| x <= lo) - 1;
        while b[i] < hi {
            out.push((b[i].max(lo), b[i + 1].min(hi), self.vals[i]));
            i += 1;
        }
    }

    /// Index of the run starting at chunk `c`, splitting the run that holds it.
    fn cut(&mut self, c: usize) -> usize {
        let i = self.bounds.partition_point(|&x| x < c);
        if self.bounds[i] != c {
            self.bounds.insert(i, c);
            self.vals.insert(i, self.vals[i - 1]);
        }
        i
    }

    fn copy(&mut self, lo: usize, hi: usize, pieces: &[Piece], arena: &Arena) {
        let i = self.cut(lo);
        let j = self.cut(hi);
        self.bounds.splice(i..j, pieces.iter().map(|p| p.0));
        self.vals.splice(i..j, pieces.iter().map(|p| p.2));
        self.merge(i as isize - 1, i + pieces.len() + 1, arena);
    }

    /// Adds `pieces`; calls `double` with (overlap, chunks) for every contribution repeated.
    fn reduce(&mut self, lo: usize, hi: usize, pieces: &[Piece], arena: &mut Arena,
              mut double: impl FnMut(&[u64], usize)) {
        for p in &pieces[1..] {
            self.cut(p.0);
        }
        let i = self.cut(lo);
        let j = self.cut(hi);
        let mut k = 0;
        let mut both = vec![0u64; arena.width];
        let mut sum = vec![0u64; arena.width];
        for r in i..j {
            while pieces[k].1 <= self.bounds[r] {
                k += 1;
            }
            let (mine, theirs) = (arena.get(self.vals[r]), arena.get(pieces[k].2));
            let mut overlap = false;
            for w in 0..arena.width {
                both[w] = mine[w] & theirs[w];
                sum[w] = mine[w] | theirs[w];
                overlap |= both[w] != 0;
            }
            if overlap {
                double(&both, self.bounds[r + 1] - self.bounds[r]);
            }
            if sum.as_slice() != arena.get(self.vals[r]) {
                self.vals[r] = arena.push(&sum);
            }
        }
        self.merge(i as isize - 1, j + 1, arena);
    }

    /// Joins equal neighbours among runs `i..j` (clipped).
    fn merge(&mut self, i: isize, j: usize, arena: &Arena) {
        let mut r = j.min(self.vals.len() - 1);
        let stop = i.max(0) as usize;
        while r > stop {
            if arena.same(self.vals[r], self.vals[r - 1]) {
                self.vals.remove(r);
                self.bounds.remove(r);
            }
            r -= 1;
        }
    }
}

fn index(x: i64, len: usize, what: &str) -> Result<usize, String> {
    usize::try_from(x)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| format!("rangeflow: {what} {x} out of range 0..{len}"))
}

struct Tenant<'a> {
    d: &'a Demand<'a>,
    arena: Arena,
    rank_of: HashMap<i64, usize>,
    bits: Vec<u32>, // per rank, its own contribution (combining)
    full: u32,      // what every destination must end with: all ranks, or held
    runs: HashMap<i64, Runs>,
}

impl<'a> Tenant<'a> {
    fn new(d: &'a Demand<'a>) -> Result<Self, String> {
        let n = d.ranks.len();
        let mut arena = Arena::new(if d.combining { n } else { 1 });
        let bits = if d.combining { (0..n).map(|r| arena.bit(r)).collect() } else { vec![] };
        let full = if d.combining { arena.full(n) } else { arena.bit(0) };
        if !d.combining && d.origin.len() * d.piece.max(1) < d.num_chunks {
            return Err(format!("rangeflow: {} origins of {} chunks for {} chunks",
                               d.origin.len(), d.piece, d.num_chunks));
        }
        let rank_of = d.ranks.iter().enumerate().map(|(r, &v)| (v, r)).collect();
        Ok(Tenant { d, arena, rank_of, bits, full, runs: HashMap::new() })
    }

    /// The node's runs, made as they stand before anything moves on first use.
    fn runs(&mut self, v: i64) -> &mut Runs {
        let Tenant { d, arena, rank_of, bits, full, runs } = self;
        runs.entry(v).or_insert_with(|| {
            let nc = d.num_chunks;
            let rank = rank_of.get(&v).copied();
            if d.combining {
                return Runs { bounds: vec![0, nc], vals: vec![rank.map_or(0, |r| bits[r])] };
            }
            let held = *full;
            let mut out = Runs { bounds: vec![0], vals: vec![0] };
            for (p, &o) in d.origin.iter().enumerate() {
                let c = p * d.piece;
                if c >= nc {
                    break;
                }
                let value = if rank.is_some_and(|r| r as i64 == o) { held } else { 0 };
                if value != *out.vals.last().expect("one run at least") {
                    if *out.bounds.last().expect("one bound at least") == c {
                        *out.vals.last_mut().expect("one run at least") = value;
                    } else {
                        out.bounds.push(c);
                        out.vals.push(value);
                    }
                }
            }
            out.bounds.push(nc);
            let len = out.vals.len();
            out.merge(0, len, arena);
            out
        })
    }
}

/// Replays `flow`'s events over the tenants' demands and checks every destination ends with
/// what its demand asks for.
pub fn replay(flow: &Flow, demands: &[Demand], keep: usize) -> Result<Findings, String> {
    let n = flow.tenant.len();
    for (what, col) in [("chunk", flow.chunk), ("count", flow.count), ("src", flow.src),
                        ("dst", flow.dst)] {
        if col.len() != n {
            return Err(format!("rangeflow: {what} has {} rows for {n} transfers", col.len()));
        }
    }
    if flow.reduce.len() != n || flow.event_read.len() != flow.event_transfer.len() {
        return Err("rangeflow: columns of different lengths".into());
    }
    let mut tenants = demands.iter().map(Tenant::new).collect::<Result<Vec<_>, _>>()?;
    let mut found = Findings::default();
    let mut snaps: HashMap<usize, Vec<Piece>> = HashMap::new();
    for (&read, &who) in flow.event_read.iter().zip(flow.event_transfer) {
        let i = index(who, n, "transfer")?;
        let t = &mut tenants[index(flow.tenant[i], demands.len(), "tenant")?];
        let nc = t.d.num_chunks;
        let lo = index(flow.chunk[i], nc, "chunk")?;
        let hi = lo + usize::try_from(flow.count[i]).ok().filter(|&c| c >= 1 && lo + c <= nc)
            .ok_or_else(|| format!("rangeflow: transfer {i} moves {} chunks from chunk {lo} \
                                    of {nc}", flow.count[i]))?;
        if read {
            let mut pieces = Vec::new();
            t.runs(flow.src[i]).read(lo, hi, &mut pieces);
            let mut missing = pieces.iter().filter(|p| p.2 == 0).peekable();
            if let Some(first) = missing.peek() {
                if found.causality.len() < keep {
                    found.causality.push((i as i64, first.0 as i64));
                }
                found.causality_chunks += missing.map(|p| (p.1 - p.0) as i64).sum::<i64>();
            }
            snaps.insert(i, pieces);
            continue;
        }
        let pieces = snaps.remove(&i).ok_or_else(|| format!("rangeflow: transfer {i} written before it was read"))?;
        t.runs(flow.dst[i]);
        let Tenant { arena, runs, .. } = t;
        let target = runs.get_mut(&flow.dst[i]).expect("made just above");
        if flow.reduce[i] {
            let (doubles, double_chunks) = (&mut found.doubles, &mut found.double_chunks);
            target.reduce(lo, hi, &pieces, arena, |both, chunks| {
                if doubles.len() < keep {
                    doubles.push((i as i64, both.to_vec()));
                }
                *double_chunks += chunks as i64;
            });
        } else {
            target.copy(lo, hi, &pieces, arena);
        }
    }
    for (ti, t) in tenants.iter_mut().enumerate() {
        let d = t.d;
        let full = t.full;
        if d.span_lo.len() != d.span_rank.len() || d.span_hi.len() != d.span_rank.len() {
            return Err("rangeflow: span columns of different lengths".into());
        }
        let mut held = Vec::new();
        for ((&r, &lo), &hi) in d.span_rank.iter().zip(d.span_lo).zip(d.span_hi) {
            let node = d.ranks[index(r, d.ranks.len(), "rank")?];
            let (lo, hi) = (index(lo, d.num_chunks, "span")?, index(hi - 1, d.num_chunks, "span")? + 1);
            held.clear();
            t.runs(node).read(lo, hi, &mut held);
            for &(a, b, v) in &held {
                if !t.arena.same(v, full) {
                    if found.postcondition.len() < keep {
                        found.postcondition.push((ti as i64, r, a as i64, t.arena.get(v).to_vec()));
                    }
                    found.postcondition_chunks += (b - a) as i64;
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks reduce-then-broadcast one chunk each: every destination ends full.
    #[test]
    fn a_two_rank_allreduce_checks_clean_and_a_repeat_is_a_double() {
        let ranks = [10, 11];
        let spans = ([0, 1], [0, 0], [2, 2]);
        let d = Demand { ranks: &ranks, combining: true, num_chunks: 2, piece: 1, origin: &[],
                         span_rank: &spans.0, span_lo: &spans.1, span_hi: &spans.2 };
        // 0: 10 -> 11 chunk 0 reduce; 1: 11 -> 10 chunk 1 reduce; 2: 11 -> 10 chunk 0 copy;
        // 3: 10 -> 11 chunk 1 copy; 4: 10 -> 11 chunk 0 reduce again (a double).
        let flow = |n: usize| Flow {
            tenant: &[0, 0, 0, 0, 0][..n], chunk: &[0, 1, 0, 1, 0][..n],
            count: &[1, 1, 1, 1, 1][..n], src: &[10, 11, 11, 10, 10][..n],
            dst: &[11, 10, 10, 11, 11][..n], reduce: &[true, true, false, false, true][..n],
            event_read: &[true, true, false, false, true, true, false, false, true, false][..2 * n],
            event_transfer: &[0, 1, 0, 1, 2, 3, 2, 3, 4, 4][..2 * n],
        };
        let clean = replay(&flow(4), std::slice::from_ref(&d), 10).unwrap();
        assert_eq!((clean.causality_chunks, clean.double_chunks, clean.postcondition_chunks),
                   (0, 0, 0));
        let twice = replay(&flow(5), std::slice::from_ref(&d), 10).unwrap();
        assert_eq!(twice.double_chunks, 1);
        assert_eq!(twice.doubles[0], (4, vec![0b11]));
        let half = replay(&flow(2), std::slice::from_ref(&d), 10).unwrap();
        assert_eq!(half.postcondition_chunks, 2);
    }
}
