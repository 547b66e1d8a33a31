//! Time-expanded greedy link-chunk matching (TACOS), event-driven over heterogeneous links.
//!
//! Every directed link is a server that carries one chunk at a time. Time advances from
//! event to event (a chunk arrives, a link becomes free). At each instant every free link
//! `u -> v` is matched with a chunk that `u` holds and `v` still needs, cheaper links first
//! and at random among equals; a link with nothing to send sleeps until `u` gains a chunk.
//! Two refinements from the paper handle heterogeneous links:
//! * lower-link-cost-first: free links are matched in order of their cost;
//! * chunk replacement: if a link could deliver a chunk to `v` earlier than a transfer that
//!   is already carrying it, it takes that chunk over and the slower transfer is given
//!   another chunk its source held when it started (or is cancelled, freeing its link).
//!
//! Relays: an NPU that is not a destination of a chunk receives it only when it is strictly
//! closer (in hops) to a destination that still lacks it; relay transfers whose chunk is never
//! forwarded are pruned at the end so that every transfer is useful.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use rustc_hash::FxHashMap;

use crate::bitset::{cyclic_find, BitMatrix};

/// One synthesis problem: a graph of usable links and a set of chunks to move.
#[derive(Clone, Debug, Default)]
pub struct Problem {
    pub num_nodes: usize,
    pub link_src: Vec<u32>,
    pub link_dst: Vec<u32>,
    pub link_alpha: Vec<f64>,
    pub link_bandwidth: Vec<f64>,
    /// When each link first becomes free (seconds): lets a phase start after an earlier one.
    pub link_free_at: Vec<f64>,
    /// Bytes of one chunk, per tenant.
    pub tenant_bytes: Vec<f64>,
    /// Priority class per tenant (0 is matched first); chunks of a class must be contiguous.
    pub tenant_class: Vec<u32>,
    pub chunk_tenant: Vec<u32>,
    /// CSR: the nodes holding each chunk at the start, and when it becomes available there.
    pub holder_ptr: Vec<usize>,
    pub holder_node: Vec<u32>,
    pub holder_time: Vec<f64>,
    /// CSR: the nodes that must hold each chunk at the end.
    pub target_ptr: Vec<usize>,
    pub target_node: Vec<u32>,
    /// CSR per tenant: the only nodes that may relay the tenant's chunks. Empty: any node.
    pub member_ptr: Vec<usize>,
    pub member_node: Vec<u32>,
}

/// The transfers of one synthesized schedule, as columns.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub chunk: Vec<u32>,
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    pub link: Vec<u32>,
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    pub makespan: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub seed: u64,
    pub replacement: bool,
    pub exclusive: bool,
}

/// The earliest makespan any run sharing it has reached (or was given to beat). A run whose
/// clock passes it still has chunks to deliver, so it can only end later: it stops there.
pub struct Bar(AtomicU64);

impl Bar {
    pub fn new(seconds: f64) -> Self {
        Bar(AtomicU64::new(seconds.to_bits()))
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(AtomicOrdering::Relaxed))
    }

    fn lower(&self, seconds: f64) {
        let _ = self.0.fetch_update(AtomicOrdering::Relaxed, AtomicOrdering::Relaxed, |bits| {
            (seconds < f64::from_bits(bits)).then_some(seconds.to_bits())
        });
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Arrival = 0,
    Available = 1,
    LinkFree = 2,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    time: f64,
    kind: Kind,
    id: u32,
    epoch: u32,
}

/// `t` as an integer in the same order as `f64::total_cmp`.
fn time_key(t: f64) -> u64 {
    let bits = t.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

fn key_time(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 { key & !(1 << 63) } else { !key })
}

/// Pending events grouped by instant: a heap of distinct instants over per-instant lists.
/// On uniform fabrics thousands of events share an instant (every link frees at once), so
/// the heap orders instants, not events, and each instant's list is sorted once, when due.
#[derive(Default)]
struct Agenda {
    instants: BinaryHeap<Reverse<u64>>,
    at: FxHashMap<u64, Vec<Event>>,
    spare: Vec<Vec<Event>>,
}

impl Agenda {
    fn push(&mut self, e: Event) {
        let key = time_key(e.time);
        match self.at.entry(key) {
            Entry::Occupied(mut list) => list.get_mut().push(e),
            Entry::Vacant(slot) => {
                let mut list = self.spare.pop().unwrap_or_default();
                list.push(e);
                slot.insert(list);
                self.instants.push(Reverse(key));
            }
        }
    }

    fn next_time(&self) -> Option<f64> {
        self.instants.peek().map(|&Reverse(key)| key_time(key))
    }

    /// Moves every event due at or before `horizon` into `out`, earliest first, then by
    /// kind (arrivals first) and id: the order a heap of single events would pop them in.
    fn take_until(&mut self, horizon: f64, out: &mut Vec<Event>) {
        let mut instants = 0;
        while let Some(&Reverse(key)) = self.instants.peek() {
            if key_time(key) > horizon {
                break;
            }
            self.instants.pop();
            let mut list = self.at.remove(&key).unwrap_or_default();
            if out.is_empty() {
                std::mem::swap(out, &mut list);
            } else {
                out.append(&mut list);
            }
            self.spare.push(list);
            instants += 1;
        }
        let kind_id = |e: &Event| (e.kind as u64) << 32 | u64::from(e.id);
        if instants == 1 {
            out.sort_unstable_by_key(kind_id);
        } else {
            out.sort_unstable_by_key(|e| (time_key(e.time), kind_id(e)));
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    chunk: u32,
    link: u32,
    start: f64,
    end: f64,
    cancelled: bool,
}

/// Per node, the chunks its in-neighbours cover, counted up to two, and those it needs that
/// at most one covers (`need & !twice`: what the sending one alone can bring).
struct Rivals {
    out_nodes: Vec<Vec<u32>>,
    once: BitMatrix,
    twice: BitMatrix,
    open: BitMatrix,
}

const NONE: u32 = u32::MAX;
/// Candidates a fast link compares when looking for the rarest chunk.
const RAREST_SAMPLE: usize = 8;

struct State<'a> {
    p: &'a Problem,
    k: usize,
    rng: fastrand::Rng,
    replacement: bool,
    exclusive: bool,
    in_nodes: Vec<Vec<u32>>,
    faster_in: Vec<Vec<u32>>,
    have: BitMatrix,
    need: BitMatrix,
    want: BitMatrix,
    inflight: BitMatrix,
    /// `have | inflight`: a node holds the chunk or has it on the way.
    covered: BitMatrix,
    /// Where `covered` only grows (no chunk replacement): per node, the chunks that one /
    /// two or more of its in-neighbours cover, so the exclusive test reads one row.
    rivals: Option<Rivals>,
    have_time: Vec<f64>,
    inflight_tx: Vec<u32>,
    holders: Vec<u32>,
    transfers: Vec<Transfer>,
    link_free_at: Vec<f64>,
    link_epoch: Vec<u32>,
    link_idle: Vec<bool>,
    link_order_key: Vec<f64>,
    out_links: Vec<Vec<u32>>,
    classes: Vec<(usize, usize)>,
    events: Agenda,
    remaining: usize,
    relays: bool,
    hops: Vec<HopTable>,
}

impl<'a> State<'a> {
    fn cost(&self, link: usize, chunk: usize) -> f64 {
        let bytes = self.p.tenant_bytes[self.p.chunk_tenant[chunk] as usize];
        self.p.link_alpha[link] + bytes / self.p.link_bandwidth[link]
    }

    fn targets(&self, chunk: usize) -> &[u32] {
        &self.p.target_node[self.p.target_ptr[chunk]..self.p.target_ptr[chunk + 1]]
    }

    /// Hops from `a` to `b` within the nodes allowed to carry `chunk` (u16::MAX: not allowed).
    fn hop(&self, chunk: usize, a: usize, b: usize) -> u16 {
        let table = if self.hops.len() == 1 { &self.hops[0] } else {
            &self.hops[self.p.chunk_tenant[chunk] as usize]
        };
        table.get(a, b)
    }

    fn gain(&mut self, node: usize, chunk: usize, time: f64) -> bool {
        if self.have.get(node, chunk) {
            return false;
        }
        self.have.set(node, chunk);
        self.cover(node, chunk);
        self.holders[chunk] += 1;
        if self.replacement {
            self.have_time[node * self.k + chunk] = time;
        }
        if self.inflight.get(node, chunk) {
            self.inflight.clear(node, chunk);
            if self.replacement {
                self.inflight_tx[node * self.k + chunk] = NONE;
            }
        }
        if self.want.get(node, chunk) {
            if self.need.get(node, chunk) {
                self.need.clear(node, chunk);
                if let Some(r) = &mut self.rivals {
                    r.open.clear(node, chunk);
                }
            }
            self.remaining -= 1;
        }
        true
    }

    fn cover(&mut self, node: usize, chunk: usize) {
        if self.covered.get(node, chunk) {
            return;
        }
        self.covered.set(node, chunk);
        if let Some(r) = &mut self.rivals {
            for &v in &r.out_nodes[node] {
                let v = v as usize;
                if r.once.get(v, chunk) {
                    r.twice.set(v, chunk);
                    r.open.clear(v, chunk);
                } else {
                    r.once.set(v, chunk);
                }
            }
        }
    }

    /// A chunk `u` holds that `v` needs, from the highest priority class that has one.
    ///
    /// Two preferences, both about not wasting a link on data `v` will get anyway:
    /// first, chunks that no other in-neighbour of `v` nor `v`'s fast island holds or is
    /// receiving (only this link can bring them soon); then, chunks absent from the fast
    /// island. A link with neither stays idle until `u` gains a chunk.
    fn primary(&mut self, link: usize, u: usize, v: usize) -> Option<usize> {
        let passes = if self.exclusive { 2 } else { 1 };
        for ci in 0..self.classes.len() {
            let (lo, hi) = self.classes[ci];
            if lo >= hi {
                continue;
            }
            for pass in 0..passes {
                let from = self.rng.usize(lo..hi);
                // Masks are computed word by word during the scan: the scan usually stops
                // after a few words, so most of a large row is never touched.
                let (have, need, covered) = (&self.have, &self.need, &self.covered);
                let island = &self.faster_in[link];
                let near: &[u32] = if self.exclusive && pass == 0 { &self.in_nodes[v] } else { &[] };
                let exclusive = self.exclusive;
                // `u` covers every chunk it offers, so "no other in-neighbour covers it" is
                // "fewer than two do": the receiver's open row (`Rivals`).
                let counted = match &self.rivals {
                    Some(r) if island.is_empty() && !near.is_empty() => Some(&r.open),
                    _ => None,
                };
                let word = |x: usize| {
                    if let Some(open) = counted {
                        return have.word(u, x) & open.word(v, x);
                    }
                    let mut candidates = have.word(u, x) & need.word(v, x);
                    if !exclusive {
                        return candidates;
                    }
                    for rivals in [island, near] {
                        for &w in rivals {
                            if candidates == 0 {
                                return 0;
                            }
                            if w as usize != u {
                                candidates &= !covered.word(w as usize, x);
                            }
                        }
                    }
                    candidates
                };
                // Prefer the chunk held by the fewest nodes: it has the most destinations left,
                // so sending it first keeps the pipeline of far-travelling chunks full. A slow
                // link (one with a fast island) is scarce and compares every candidate; other
                // links compare the first few, which keeps large fabrics fast.
                let budget = if exclusive && !island.is_empty() { usize::MAX } else { RAREST_SAMPLE };
                let holders = &self.holders;
                let mut best: Option<usize> = None;
                let mut seen = 0usize;
                cyclic_find(lo, hi, from, word, |c| {
                    if best.is_none_or(|b| holders[c] < holders[b]) {
                        best = Some(c);
                    }
                    seen += 1;
                    seen >= budget
                });
                let found = best;
                if found.is_some() {
                    return found;
                }
            }
        }
        None
    }

    fn schedule(&mut self, link: usize, chunk: usize, now: f64) {
        let (v, end) = (self.p.link_dst[link] as usize, now + self.cost(link, chunk));
        let tx = self.transfers.len() as u32;
        self.transfers.push(Transfer { chunk: chunk as u32, link: link as u32, start: now, end, cancelled: false });
        if self.need.get(v, chunk) {
            self.need.clear(v, chunk);
            if let Some(r) = &mut self.rivals {
                r.open.clear(v, chunk);
            }
        }
        self.inflight.set(v, chunk);
        self.cover(v, chunk);
        if self.replacement {
            self.inflight_tx[v * self.k + chunk] = tx;
        }
        self.occupy(link, end);
        self.events.push(Event { time: end, kind: Kind::Arrival, id: tx, epoch: 0 });
    }

    fn occupy(&mut self, link: usize, until: f64) {
        self.link_free_at[link] = until;
        self.link_epoch[link] = self.link_epoch[link].wrapping_add(1);
        self.link_idle[link] = false;
        let epoch = self.link_epoch[link];
        self.events.push(Event { time: until, kind: Kind::LinkFree, id: link as u32, epoch });
    }

    /// Take over a chunk that a slower transfer is carrying to `v`, if this link is faster.
    fn steal(&mut self, link: usize, now: f64, ready: &mut Vec<u32>) -> bool {
        let (u, v) = (self.p.link_src[link] as usize, self.p.link_dst[link] as usize);
        let mut best: Option<(usize, f64)> = None;
        for x in 0..self.have.words_per_row() {
            let mut bits = self.have.word(u, x) & self.inflight.word(v, x);
            while bits != 0 {
                let chunk = x * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let tx = self.inflight_tx[v * self.k + chunk];
                if tx == NONE {
                    continue;
                }
                let gain = self.transfers[tx as usize].end - (now + self.cost(link, chunk));
                if gain > 1e-9 * self.cost(link, chunk) && best.is_none_or(|(_, g)| gain > g) {
                    best = Some((chunk, gain));
                }
            }
        }
        let Some((chunk, _)) = best else { return false };
        let old = self.inflight_tx[v * self.k + chunk] as usize;
        self.reassign(old, v, ready, now);
        self.schedule(link, chunk, now);
        true
    }

    /// Give transfer `old` (to `v`) another chunk its source held when it started, or cancel it.
    fn reassign(&mut self, old: usize, v: usize, ready: &mut Vec<u32>, now: f64) {
        let t = self.transfers[old];
        let link = t.link as usize;
        let u = self.p.link_src[link] as usize;
        let old_chunk = t.chunk as usize;
        // Rival counts assume `covered` only grows: they exist only without replacement.
        debug_assert!(self.rivals.is_none());
        self.inflight.clear(v, old_chunk);
        if !self.have.get(v, old_chunk) {
            self.covered.clear(v, old_chunk);
        }
        self.inflight_tx[v * self.k + old_chunk] = NONE;
        if self.want.get(v, old_chunk) {
            self.need.set(v, old_chunk);
        }
        let tenant = self.p.chunk_tenant[old_chunk];
        let from = self.rng.usize(0..self.k);
        let (have, need, p, k, have_time) = (&self.have, &self.need, self.p, self.k, &self.have_time);
        let pick = cyclic_find(
            0,
            k,
            from,
            |x| have.word(u, x) & need.word(v, x),
            |c| c != old_chunk && p.chunk_tenant[c] == tenant && have_time[u * k + c] <= t.start,
        );
        match pick {
            Some(c) => {
                self.transfers[old].chunk = c as u32;
                self.need.clear(v, c);
                self.inflight.set(v, c);
                self.cover(v, c);
                self.inflight_tx[v * self.k + c] = old as u32;
            }
            None => {
                self.transfers[old].cancelled = true;
                if self.link_free_at[link] > now {
                    self.link_free_at[link] = now;
                    self.link_epoch[link] = self.link_epoch[link].wrapping_add(1);
                    ready.push(link as u32);
                }
            }
        }
    }

    /// A chunk `v` does not need itself but brings closer to a destination that lacks it.
    fn relay(&mut self, u: usize, v: usize) -> Option<usize> {
        let from = self.rng.usize(0..self.k);
        let (have, covered, want) = (&self.have, &self.covered, &self.want);
        let word = |x| have.word(u, x) & !covered.word(v, x) & !want.word(v, x);
        cyclic_find(0, self.k, from, word, |c| self.useful_relay(u, v, c))
    }

    fn useful_relay(&self, u: usize, v: usize, chunk: usize) -> bool {
        self.targets(chunk).iter().any(|&d| {
            let d = d as usize;
            let closer = self.hop(chunk, v, d) < self.hop(chunk, u, d);
            closer && !self.covered.get(d, chunk)
        })
    }

    fn try_match(&mut self, link: usize, now: f64, ready: &mut Vec<u32>) -> bool {
        let (u, v) = (self.p.link_src[link] as usize, self.p.link_dst[link] as usize);
        if let Some(chunk) = self.primary(link, u, v) {
            self.schedule(link, chunk, now);
            return true;
        }
        if self.replacement && self.steal(link, now, ready) {
            return true;
        }
        if self.relays {
            if let Some(chunk) = self.relay(u, v) {
                self.schedule(link, chunk, now);
                return true;
            }
        }
        false
    }
}

/// Largest fast island tracked per link.
const MAX_ISLAND: usize = 256;
/// An island counts only if its direct links into `v` carry this many times the link's
/// bandwidth: then waiting for the island beats spending this link on the same chunk.
const ISLAND_FEED_RATIO: f64 = 3.0;

/// For each link `u -> v`, the nodes other than `v` that reach `v` over strictly faster links
/// (its *fast island*: a node's NVLink domain seen from an inter-node link, say). A chunk
/// already held or arriving there reaches `v` sooner than over this link. Islands that feed
/// `v` less than `ISLAND_FEED_RATIO` times this link's bandwidth are dropped (empty).
fn fast_islands(p: &Problem, key: &[f64]) -> Vec<Vec<u32>> {
    let n = p.num_nodes;
    let mut in_links: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &d) in p.link_dst.iter().enumerate() {
        in_links[d as usize].push(i);
    }
    let mut memo: HashMap<(u32, u64), Vec<u32>> = HashMap::new();
    let mut seen = vec![u32::MAX; n];
    let mut stamp = 0u32;
    (0..p.link_src.len())
        .map(|l| {
            let v = p.link_dst[l];
            let limit = key[l] * (1.0 - 1e-9);
            memo.entry((v, limit.to_bits()))
                .or_insert_with(|| {
                    stamp += 1;
                    seen[v as usize] = stamp;
                    let (mut island, mut queue, mut head) = (Vec::new(), vec![v], 0);
                    while head < queue.len() && island.len() < MAX_ISLAND {
                        let x = queue[head] as usize;
                        head += 1;
                        for &j in &in_links[x] {
                            let w = p.link_src[j];
                            if key[j] < limit && seen[w as usize] != stamp {
                                seen[w as usize] = stamp;
                                island.push(w);
                                queue.push(w);
                            }
                        }
                    }
                    island.sort_unstable();
                    let feed: f64 = in_links[v as usize]
                        .iter()
                        .filter(|&&j| key[j] < limit)
                        .map(|&j| p.link_bandwidth[j])
                        .sum();
                    if feed < ISLAND_FEED_RATIO * p.link_bandwidth[l] {
                        island.clear();
                    }
                    island
                })
                .clone()
        })
        .collect()
}

/// Hop distances among a set of nodes, over the links joining two of them.
struct HopTable {
    local: Vec<u32>,
    size: usize,
    hops: Vec<u16>,
}

impl HopTable {
    /// BFS from every node of `nodes` (all nodes when None) over links inside the set.
    fn new(p: &Problem, nodes: Option<&[u32]>) -> Self {
        let n = p.num_nodes;
        let mut local = vec![NONE; n];
        let size = match nodes {
            Some(list) => {
                for (i, &x) in list.iter().enumerate() {
                    local[x as usize] = i as u32;
                }
                list.len()
            }
            None => {
                for (i, x) in local.iter_mut().enumerate() {
                    *x = i as u32;
                }
                n
            }
        };
        // reversed adjacency in local ids, so a BFS from a target gives distances *to* it
        let mut inc: Vec<Vec<u32>> = vec![Vec::new(); size];
        for (s, d) in p.link_src.iter().zip(&p.link_dst) {
            let (ls, ld) = (local[*s as usize], local[*d as usize]);
            if ls != NONE && ld != NONE {
                inc[ld as usize].push(ls);
            }
        }
        let mut hops = vec![u16::MAX; size * size];
        let mut queue = Vec::with_capacity(size);
        for target in 0..size {
            hops[target * size + target] = 0;
            queue.clear();
            queue.push(target as u32);
            let mut head = 0;
            while head < queue.len() {
                let x = queue[head] as usize;
                head += 1;
                let dx = hops[x * size + target];
                for &s in &inc[x] {
                    let cell = s as usize * size + target;
                    if hops[cell] == u16::MAX {
                        hops[cell] = dx + 1;
                        queue.push(s);
                    }
                }
            }
        }
        HopTable { local, size, hops }
    }

    fn get(&self, a: usize, b: usize) -> u16 {
        let (la, lb) = (self.local[a], self.local[b]);
        if la == NONE || lb == NONE {
            return u16::MAX;
        }
        self.hops[la as usize * self.size + lb as usize]
    }
}

/// One table over all nodes, or one per tenant when relays are limited to its members.
fn hop_tables(p: &Problem) -> Vec<HopTable> {
    if p.member_ptr.is_empty() {
        return vec![HopTable::new(p, None)];
    }
    (0..p.tenant_bytes.len())
        .map(|t| HopTable::new(p, Some(&p.member_node[p.member_ptr[t]..p.member_ptr[t + 1]])))
        .collect()
}

fn check(p: &Problem) -> Result<(), String> {
    let l = p.link_src.len();
    let k = p.chunk_tenant.len();
    if [p.link_dst.len(), p.link_alpha.len(), p.link_bandwidth.len(), p.link_free_at.len()]
        .iter()
        .any(|&x| x != l)
    {
        return Err("link columns differ in length".into());
    }
    if p.holder_ptr.len() != k + 1 || p.target_ptr.len() != k + 1 {
        return Err("holder/target pointers must have one entry per chunk plus one".into());
    }
    if p.holder_node.len() != p.holder_time.len() || *p.holder_ptr.last().unwrap() != p.holder_node.len() {
        return Err("holder columns are inconsistent".into());
    }
    if *p.target_ptr.last().unwrap() != p.target_node.len() {
        return Err("target columns are inconsistent".into());
    }
    if !p.member_ptr.is_empty()
        && (p.member_ptr.len() != p.tenant_bytes.len() + 1
            || *p.member_ptr.last().unwrap() != p.member_node.len())
    {
        return Err("member pointers must have one entry per tenant plus one".into());
    }
    if p.tenant_class.len() != p.tenant_bytes.len() {
        return Err("tenant columns differ in length".into());
    }
    let n = p.num_nodes as u32;
    let nodes = [&p.link_src, &p.link_dst, &p.holder_node, &p.target_node, &p.member_node];
    if nodes.iter().any(|column| column.iter().any(|&x| x >= n)) {
        return Err("a node id is out of range".into());
    }
    if p.chunk_tenant.iter().any(|&t| t as usize >= p.tenant_bytes.len()) {
        return Err("a chunk names an unknown tenant".into());
    }
    // written so that NaN fails too
    let positive = |x: f64| x > 0.0;
    let non_negative = |x: f64| x >= 0.0;
    if !p.link_bandwidth.iter().all(|&b| positive(b)) || !p.link_alpha.iter().all(|&a| non_negative(a)) {
        return Err("link bandwidth must be positive and alpha non-negative".into());
    }
    Ok(())
}

fn uniform_links(p: &Problem) -> bool {
    let same = |v: &[f64]| v.iter().all(|&x| x == v[0]);
    p.link_src.is_empty() || (same(&p.link_alpha) && same(&p.link_bandwidth) && p.tenant_bytes.len() == 1)
}

/// Contiguous chunk ranges per priority class, in class order.
fn class_ranges(p: &Problem) -> Result<Vec<(usize, usize)>, String> {
    let mut ranges: Vec<(u32, usize, usize)> = Vec::new();
    for (c, &t) in p.chunk_tenant.iter().enumerate() {
        let class = p.tenant_class[t as usize];
        match ranges.last_mut() {
            Some((cl, _, hi)) if *cl == class => *hi = c + 1,
            _ => ranges.push((class, c, c + 1)),
        }
    }
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| r.0);
    if sorted.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err("chunks of one priority class must be contiguous".into());
    }
    Ok(sorted.into_iter().map(|(_, lo, hi)| (lo, hi)).collect())
}

/// Synthesize one schedule with the given seed.
pub fn synthesize(p: &Problem, opt: Options) -> Result<Plan, String> {
    synthesize_within(p, opt, &Bar::new(f64::INFINITY)).map(|plan| plan.expect("no bar to pass"))
}

/// Synthesize one schedule with the given seed, or None once its clock passes `bar` (it would
/// end later than a schedule already found); a finished schedule lowers the bar.
pub fn synthesize_within(p: &Problem, opt: Options, bar: &Bar) -> Result<Option<Plan>, String> {
    check(p)?;
    let (n, k, l) = (p.num_nodes, p.chunk_tenant.len(), p.link_src.len());
    let mut out_links = vec![Vec::new(); n];
    let mut in_nodes: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut out_nodes: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, &s) in p.link_src.iter().enumerate() {
        out_links[s as usize].push(i as u32);
        let d = p.link_dst[i] as usize;
        if !in_nodes[d].contains(&s) {
            in_nodes[d].push(s);
            out_nodes[s as usize].push(d as u32);
        }
    }
    let mean_bytes = p.tenant_bytes.iter().sum::<f64>() / p.tenant_bytes.len().max(1) as f64;
    let link_order_key: Vec<f64> =
        (0..l).map(|i| p.link_alpha[i] + mean_bytes / p.link_bandwidth[i]).collect();
    let mut want = BitMatrix::new(n, k);
    for c in 0..k {
        for &d in &p.target_node[p.target_ptr[c]..p.target_ptr[c + 1]] {
            want.set(d as usize, c);
        }
    }
    // Relaying is needed when a node with links is not a destination of every chunk.
    let mut target_count = vec![0usize; n];
    for &d in &p.target_node {
        target_count[d as usize] += 1;
    }
    let relays = (0..l).any(|i| target_count[p.link_dst[i] as usize] < k);
    // With every link equally fast a transfer already under way can never be beaten.
    let replacement = opt.replacement && !uniform_links(p);
    let faster_in = fast_islands(p, &link_order_key);
    let rivals = (!replacement).then(|| Rivals {
        out_nodes,
        once: BitMatrix::new(n, k),
        twice: BitMatrix::new(n, k),
        open: want.clone(),
    });
    let mut st = State {
        p,
        k,
        rng: fastrand::Rng::with_seed(opt.seed),
        replacement,
        exclusive: opt.exclusive,
        faster_in,
        in_nodes,
        have: BitMatrix::new(n, k),
        need: want.clone(),
        want,
        inflight: BitMatrix::new(n, k),
        covered: BitMatrix::new(n, k),
        rivals,
        // Per (node, chunk) arrival times and carriers matter only for chunk replacement.
        have_time: vec![f64::INFINITY; if replacement { n * k } else { 0 }],
        inflight_tx: vec![NONE; if replacement { n * k } else { 0 }],
        holders: vec![0; k],
        // Every delivery is one transfer at least: no doubling copies of a long list.
        transfers: Vec::with_capacity(p.target_node.len()),
        link_free_at: p.link_free_at.clone(),
        link_epoch: vec![0; l],
        link_idle: vec![false; l],
        link_order_key,
        out_links,
        classes: class_ranges(p)?,
        events: Agenda::default(),
        remaining: 0,
        relays,
        hops: if relays { hop_tables(p) } else { Vec::new() },
    };
    st.remaining = p.target_node.len();
    for c in 0..k {
        for h in p.holder_ptr[c]..p.holder_ptr[c + 1] {
            let (node, time) = (p.holder_node[h] as usize, p.holder_time[h]);
            if time <= 0.0 {
                st.gain(node, c, 0.0);
            } else {
                st.events.push(Event { time, kind: Kind::Available, id: h as u32, epoch: 0 });
            }
        }
    }
    let mut ready: Vec<u32> = Vec::new();
    for i in 0..l {
        if st.link_free_at[i] <= 0.0 {
            ready.push(i as u32);
        } else {
            st.occupy(i, st.link_free_at[i]);
        }
    }
    // A stable sort by equal costs keeps the shuffled order: skip it on uniform fabrics.
    let costs_differ = st.link_order_key.iter().any(|&c| c != st.link_order_key[0]);
    let mut now = 0.0f64;
    let mut arrivals: Vec<u32> = Vec::new();
    let mut due: Vec<Event> = Vec::new();
    while st.remaining > 0 {
        // Match every ready link at `now`, cheapest first, random among equals.
        st.rng.shuffle(&mut ready);
        if costs_differ {
            ready.sort_by(|a, b| st.link_order_key[*a as usize].total_cmp(&st.link_order_key[*b as usize]));
        }
        let mut i = 0;
        while i < ready.len() {
            let link = ready[i] as usize;
            i += 1;
            if st.link_free_at[link] > now {
                continue;
            }
            if !st.try_match(link, now, &mut ready) {
                st.link_idle[link] = true;
            }
        }
        ready.clear();
        if st.remaining == 0 {
            break;
        }
        // Advance to the next instant and apply everything that happens then.
        let Some(first_time) = st.events.next_time() else {
            // Nothing in flight and chunks still missing: the preferences (exclusivity, fast
            // islands) held every link back. Drop them and match the idle links again; plain
            // matching with hop-wise relays always progresses on a connected graph.
            if st.exclusive {
                st.exclusive = false;
                ready.extend((0..l as u32).filter(|&i| st.link_idle[i as usize]));
                for &i in &ready {
                    st.link_idle[i as usize] = false;
                }
                continue;
            }
            return Err(unreachable_report(&st));
        };
        now = first_time;
        if now > bar.get() {
            return Ok(None);
        }
        let horizon = now + 1e-12 * now.abs().max(1e-9);
        st.events.take_until(horizon, &mut due);
        arrivals.clear();
        for e in due.drain(..) {
            now = now.max(e.time);
            match e.kind {
                Kind::Arrival => {
                    let t = st.transfers[e.id as usize];
                    if !t.cancelled {
                        let v = p.link_dst[t.link as usize] as usize;
                        if st.gain(v, t.chunk as usize, e.time) {
                            arrivals.push(v as u32);
                        }
                    }
                }
                Kind::Available => {
                    let h = e.id as usize;
                    let c = p.holder_ptr.partition_point(|&x| x <= h) - 1;
                    let node = p.holder_node[h] as usize;
                    if st.gain(node, c, e.time) {
                        arrivals.push(node as u32);
                    }
                }
                Kind::LinkFree => {
                    let link = e.id as usize;
                    if st.link_epoch[link] == e.epoch {
                        ready.push(e.id);
                    }
                }
            }
        }
        for &v in &arrivals {
            for &link in &st.out_links[v as usize] {
                if st.link_idle[link as usize] && st.link_free_at[link as usize] <= now {
                    st.link_idle[link as usize] = false;
                    ready.push(link);
                }
            }
        }
    }
    let plan = finish(&st);
    bar.lower(plan.makespan);
    Ok(Some(plan))
}

fn unreachable_report(st: &State) -> String {
    for v in 0..st.p.num_nodes {
        for c in 0..st.k {
            if st.want.get(v, c) && !st.have.get(v, c) {
                return format!("chunk {c} can never reach node {v}: no usable path from its holders");
            }
        }
    }
    "no progress possible".into()
}

/// Drop cancelled transfers and relay deliveries that were never forwarded.
fn finish(st: &State) -> Plan {
    let p = st.p;
    let txs = &st.transfers;
    let mut keep: Vec<bool> = txs.iter().map(|t| !t.cancelled).collect();
    if st.relays {
        // forwarded[(node, chunk)] = number of kept transfers leaving node with chunk
        let mut forwarded: HashMap<(u32, u32), u32> = HashMap::new();
        let mut into: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        for (i, t) in txs.iter().enumerate() {
            if keep[i] {
                let (s, d) = (p.link_src[t.link as usize], p.link_dst[t.link as usize]);
                *forwarded.entry((s, t.chunk)).or_default() += 1;
                into.entry((d, t.chunk)).or_default().push(i);
            }
        }
        let mut stack: Vec<(u32, u32)> = into
            .keys()
            .filter(|&&(d, c)| !st.want.get(d as usize, c as usize))
            .copied()
            .collect();
        while let Some((d, c)) = stack.pop() {
            if forwarded.get(&(d, c)).copied().unwrap_or(0) > 0 || st.want.get(d as usize, c as usize) {
                continue;
            }
            if let Some(list) = into.remove(&(d, c)) {
                for i in list {
                    keep[i] = false;
                    let s = p.link_src[txs[i].link as usize];
                    if let Some(f) = forwarded.get_mut(&(s, c)) {
                        *f -= 1;
                        if *f == 0 {
                            stack.push((s, c));
                        }
                    }
                }
            }
        }
    }
    let mut plan = Plan::default();
    for (i, t) in txs.iter().enumerate() {
        if !keep[i] {
            continue;
        }
        let link = t.link as usize;
        plan.chunk.push(t.chunk);
        plan.src.push(p.link_src[link]);
        plan.dst.push(p.link_dst[link]);
        plan.link.push(t.link);
        plan.start.push(t.start);
        plan.end.push(t.end);
        plan.makespan = plan.makespan.max(t.end);
    }
    plan
}

/// Run several seeds in parallel and keep the schedule that finishes first (the first seed's
/// among equals), or None when none ends by `cutoff`. A seed stops once its clock passes the
/// best end so far, so only schedules that cannot win are cut short; their makespans read
/// as infinite.
pub fn synthesize_best(p: &Problem, seeds: &[u64], base: Options, cutoff: f64)
    -> Result<Option<(Plan, Vec<f64>, u64)>, String> {
    use rayon::prelude::*;
    if seeds.is_empty() {
        return Err("no seeds given".into());
    }
    let bar = Bar::new(cutoff);
    let runs: Vec<Result<Option<Plan>, String>> = seeds
        .par_iter()
        .map(|&seed| synthesize_within(p, Options { seed, ..base }, &bar))
        .collect();
    let mut best: Option<(Plan, u64)> = None;
    let mut makespans = Vec::with_capacity(seeds.len());
    for (run, &seed) in runs.into_iter().zip(seeds) {
        let Some(plan) = run? else {
            makespans.push(f64::INFINITY);
            continue;
        };
        makespans.push(plan.makespan);
        if best.as_ref().is_none_or(|(b, _)| plan.makespan < b.makespan) {
            best = Some((plan, seed));
        }
    }
    Ok(best.map(|(plan, seed)| (plan, makespans, seed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPT: Options = Options { seed: 7, replacement: true, exclusive: true };

    #[test]
    fn the_agenda_hands_out_instants_in_time_kind_id_order() {
        let mut rng = fastrand::Rng::with_seed(3);
        let kinds = [Kind::Arrival, Kind::Available, Kind::LinkFree];
        let mut events: Vec<Event> = (0..2000u32)
            .map(|id| Event {
                // few distinct instants, some a hair apart (one batch), some far apart
                time: f64::from(rng.u32(1..20)) * 1e-3 + f64::from(rng.u32(0..2)) * 1e-17,
                kind: kinds[rng.usize(0..3)],
                id,
                epoch: 0,
            })
            .collect();
        let mut agenda = Agenda::default();
        for &e in &events {
            agenda.push(e);
        }
        let mut popped = Vec::new();
        let mut due = Vec::new();
        while let Some(t) = agenda.next_time() {
            agenda.take_until(t + 1e-12 * t, &mut due);
            assert!(due.iter().all(|e| e.time <= t + 1e-12 * t));
            popped.extend(due.drain(..).map(|e| (e.time, e.kind, e.id)));
        }
        events.sort_by(|a, b| {
            a.time.total_cmp(&b.time).then(a.kind.cmp(&b.kind)).then(a.id.cmp(&b.id))
        });
        let expected: Vec<_> = events.iter().map(|e| (e.time, e.kind, e.id)).collect();
        assert_eq!(popped, expected);
    }

    /// AllGather over `links` among all `n` nodes, one chunk per node of `bytes`.
    fn allgather(n: usize, links: &[(u32, u32, f64)], bytes: f64) -> Problem {
        Problem {
            num_nodes: n,
            link_src: links.iter().map(|l| l.0).collect(),
            link_dst: links.iter().map(|l| l.1).collect(),
            link_alpha: vec![0.0; links.len()],
            link_bandwidth: links.iter().map(|l| l.2).collect(),
            link_free_at: vec![0.0; links.len()],
            tenant_bytes: vec![bytes],
            tenant_class: vec![0],
            chunk_tenant: vec![0; n],
            holder_ptr: (0..=n).collect(),
            holder_node: (0..n as u32).collect(),
            holder_time: vec![0.0; n],
            target_ptr: (0..=n).map(|c| c * n).collect(),
            target_node: (0..n).flat_map(|_| 0..n as u32).collect(),
            member_ptr: Vec::new(),
            member_node: Vec::new(),
        }
    }

    fn ring(n: u32) -> Vec<(u32, u32, f64)> {
        (0..n).map(|i| (i, (i + 1) % n, 1.0)).collect()
    }

    #[test]
    fn unidirectional_ring_takes_n_minus_one_link_times() {
        for n in [2usize, 3, 8, 17] {
            let plan = synthesize(&allgather(n, &ring(n as u32), 1.0), OPT).unwrap();
            assert_eq!(plan.makespan, (n - 1) as f64, "n={n}");
            assert_eq!(plan.chunk.len(), n * (n - 1));
        }
    }

    #[test]
    fn fully_connected_takes_one_link_time() {
        let n = 6u32;
        let links: Vec<_> = (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b, 2.0))).collect();
        let plan = synthesize(&allgather(n as usize, &links, 4.0), OPT).unwrap();
        assert_eq!(plan.makespan, 2.0);
    }

    #[test]
    fn same_seed_same_plan() {
        let links: Vec<_> = (0..16u32).flat_map(|i| [(i, (i + 1) % 16, 1.0), ((i + 1) % 16, i, 1.0), (i, (i + 4) % 16, 0.5)]).collect();
        let p = allgather(16, &links, 1.0);
        let a = synthesize(&p, OPT).unwrap();
        let b = synthesize(&p, OPT).unwrap();
        assert_eq!(a.chunk, b.chunk);
        assert_eq!(a.start, b.start);
    }

    #[test]
    fn a_bar_cuts_only_plans_that_cannot_beat_it() {
        let links: Vec<_> = (0..16u32).flat_map(|i| [(i, (i + 1) % 16, 1.0), ((i + 1) % 16, i, 1.0), (i, (i + 4) % 16, 0.5)]).collect();
        let p = allgather(16, &links, 1.0);
        let seeds: Vec<u64> = (0..6).collect();
        let (free, makespans, seed) = synthesize_best(&p, &seeds, OPT, f64::INFINITY).unwrap().unwrap();
        // A bar at the best end keeps the same plan; seeds cut short read as infinite.
        let (kept, cut_makespans, kept_seed) = synthesize_best(&p, &seeds, OPT, free.makespan).unwrap().unwrap();
        assert_eq!((kept.chunk, kept.start, kept_seed), (free.chunk.clone(), free.start.clone(), seed));
        for (m, c) in makespans.iter().zip(&cut_makespans) {
            assert!(c == m || (c.is_infinite() && *m > free.makespan), "{m} vs {c}");
        }
        // Just below it nothing can end in time.
        assert!(synthesize_best(&p, &seeds, OPT, free.makespan * (1.0 - 1e-9)).unwrap().is_none());
        let bar = Bar::new(free.makespan * 0.5);
        assert!(synthesize_within(&p, Options { seed, ..OPT }, &bar).unwrap().is_none());
        assert_eq!(bar.get(), free.makespan * 0.5);
    }

    #[test]
    fn disconnected_node_is_reported() {
        let p = allgather(3, &[(0, 1, 1.0), (1, 0, 1.0)], 1.0);
        let err = synthesize(&p, OPT).unwrap_err();
        assert!(err.contains("can never reach"), "{err}");
    }

    #[test]
    fn slow_link_transfers_are_replaced_when_a_fast_path_delivers_first() {
        // 0 -> 2 is slow; 0 -> 1 -> 2 is fast. Node 2 must get chunk 0 via node 1.
        let links = [(0, 1, 10.0), (1, 2, 10.0), (0, 2, 0.5), (2, 0, 10.0), (1, 0, 10.0), (2, 1, 10.0)];
        let mut p = allgather(3, &links, 1.0);
        p.target_ptr = vec![0, 3, 6, 9];
        let plan = synthesize(&p, OPT).unwrap();
        assert!(plan.makespan <= 0.2 + 1e-9, "makespan {}", plan.makespan);
    }

    #[test]
    fn relays_reach_a_single_destination_and_unused_relays_are_pruned() {
        // Gather to node 3 on a line 0-1-2-3: chunks of 0 and 1 must be relayed.
        let links = [(0, 1, 1.0), (1, 0, 1.0), (1, 2, 1.0), (2, 1, 1.0), (2, 3, 1.0), (3, 2, 1.0)];
        let mut p = allgather(4, &links, 1.0);
        p.target_ptr = vec![0, 1, 2, 3, 4];
        p.target_node = vec![3, 3, 3, 3];
        let plan = synthesize(&p, OPT).unwrap();
        // chunk 0 needs 3 hops, chunk 1 two, chunk 2 one: 6 transfers, none wasted
        assert_eq!(plan.chunk.len(), 6);
        assert_eq!(plan.makespan, 3.0);
    }

    #[test]
    fn relays_stay_inside_the_tenant_when_members_are_given() {
        // Line 0-1-2-3 (the tenant) gathering to node 3, plus a shortcut 0 -> 4 -> 3 through
        // node 4, which belongs to someone else.
        let mut links = vec![(0, 4, 1.0), (4, 3, 1.0)];
        for (a, b) in [(0u32, 1u32), (1, 2), (2, 3)] {
            links.push((a, b, 1.0));
            links.push((b, a, 1.0));
        }
        let mut p = allgather(5, &links, 1.0);
        p.chunk_tenant = vec![0; 4];
        p.holder_ptr = (0..=4).collect();
        p.holder_node = (0..4).collect();
        p.holder_time = vec![0.0; 4];
        p.target_ptr = (0..=4).collect();
        p.target_node = vec![3; 4];
        let free = synthesize(&p, OPT).unwrap();
        assert!(free.src.contains(&4), "the shortcut is used when anyone may relay");
        p.member_ptr = vec![0, 4];
        p.member_node = vec![0, 1, 2, 3];
        let plan = synthesize(&p, OPT).unwrap();
        assert!(plan.src.iter().chain(&plan.dst).all(|&x| x != 4));
        assert_eq!(plan.makespan, 3.0);
    }
}
