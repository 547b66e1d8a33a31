//! The MSCCL lowering's per-event passes (see `choreo/msccl/lower.py` for the design): data
//! hazards in the global event order, threadblocks per channel plan, fusion of a receive with
//! the send of the same value, dependencies reduced to one per threadblock, and the `<gpu>`
//! elements as text. Python prepares the arrays (event order, atoms and their buffer offsets,
//! channels, own-data copies) and turns errors into messages.

use rayon::prelude::*;
use rustc_hash::{FxHashMap as HashMap, FxHashSet};
use std::fmt::Write;

/// A buffer location: buffer (`i`, `o` or `s`) and offset in chunk units (-1: unnamed).
type Loc = (u8, i64);

/// Atom offset markers Python uses: not in that buffer, and a range split in that buffer.
pub const ABSENT: i64 = -1;
pub const SPLIT: i64 = -2;

pub struct Input<'a> {
    pub n: usize,
    pub src: &'a [i64],
    pub dst: &'a [i64],
    pub reduce: &'a [bool],
    pub count: &'a [i64],
    pub chunk: &'a [i64],
    /// Event ids (sends `0..T`, receives `T..2T`) in the global order L, and each one's place.
    pub order: &'a [i64],
    pub pos: &'a [i64],
    pub base: &'a [i64],
    pub base_channels: i64,
    pub reads_ptr: &'a [i64],
    pub reads_atom: &'a [i64],
    pub writes_ptr: &'a [i64],
    pub writes_atom: &'a [i64],
    pub atom_size: &'a [i64],
    /// Per atom, where its chunks start in its node's input / output (or ABSENT / SPLIT).
    pub atom_in: &'a [i64],
    pub atom_out: &'a [i64],
    pub combining: bool,
    /// Own-data copies (rank, input offset, output offset), in the order they are emitted.
    pub copies: &'a [(i64, i64, i64)],
    pub first_epochs: i64,
    pub instances: i64,
    pub max_steps: i64,
    pub max_channels: i64,
    pub max_tbs: usize,
    /// XML nodes the runtime's parser stores per rank (the `<algo>`, every `<gpu>` of the
    /// file, and the rank's threadblocks and steps); 0: no limit
    pub max_nodes: usize,
    /// Threadblocks a `depid` can name (it is stored in an `int8_t`)
    pub max_dep_targets: usize,
    pub fifo_chunks: usize,
    pub max_cnt: i64,
    pub in_units: i64,
    pub out_units: i64,
}

/// Why a schedule cannot be lowered; Python words the message.
#[derive(Debug, PartialEq, Eq)]
pub enum LowerError {
    /// (transfer, rank, atom): a rank sends data it does not hold yet.
    NotHeld(usize, i64, usize),
    /// (atom, rank): a range's chunks are not contiguous in the rank's buffer.
    Split(usize, i64),
    /// transfer: its atoms lie in different places on one rank.
    Scattered(usize),
    /// channels needed to spill the steps
    Channels(i64),
    /// (rank, threadblocks)
    Threadblocks(i64, usize),
    /// (rank, XML nodes)
    Nodes(i64, usize),
    /// (rank, threadblocks other threadblocks wait on)
    DepTargets(i64, usize),
    /// channels used after instances
    TooManyChannels(i64),
    /// the packing's part ends, or the compressor's own error
    Pack(String),
}

/// The `<gpu>` elements as the emission hands them over.
pub enum Elements {
    /// Runs of consecutive elements, their newlines included; the file's elements are these
    /// in order (kept apart, so they are copied once, side by side, into their bytes). One
    /// run per rank where no `Packing` asked for frames.
    Plain(Vec<String>),
    /// One zstd frame (with its checksum) per part of the `Packing`, written as each part's
    /// elements were: a 1,024-GPU file's 68 MB of text never exist at once.
    Frames(Vec<Vec<u8>>),
}

/// Frames of the elements wanted: part `k` holds ranks `ends[k - 1]..ends[k]` (from 0; no
/// `ends`: a part per rank), compressed at `level`, where the elements come to `from` bytes
/// or more (smaller ones stay plain). The emission writes frames straight away where its
/// estimate of the size reaches `from`, and mends a wrong guess either way.
pub struct Packing<'a> {
    pub ends: &'a [usize],
    pub level: i32,
    pub from: usize,
}

pub struct Output {
    pub elements: Elements,
    /// Where each rank's `<gpu>` element ends in the elements joined
    pub gpu_ends: Vec<usize>,
    pub epochs: i64,
    pub fused: usize,
    pub max_steps: i64,
    pub nchannels: i64,
    /// The largest `s_chunks` of any rank
    pub scratch: i64,
}

#[derive(Clone, Copy)]
struct Op {
    kind: &'static str,
    src: Loc,
    dst: Loc,
    events: (usize, usize), // usize::MAX: none
    cnt: i64,
}

impl Op {
    /// The events this op waits for: its first event's, and a fused send's less the receive
    /// it carries on (read from the hazards, not copied into every op).
    fn deps<'a>(&self, h: &'a Hazards) -> impl Iterator<Item = usize> + 'a {
        let (first, second) = self.events;
        let of = |e: usize| if e == NONE { &[][..] } else { &h.deps[e][..] };
        of(first).iter().copied().chain(of(second).iter().copied().filter(move |&w| w != first))
    }
}

struct TbPlan {
    send: i64,
    recv: i64,
    chan: i64,
    ops: Vec<Op>,
}

const NONE: usize = usize::MAX;

/// A few indices, inline: most events wait on one or two others, and a heap allocation
/// per event was most of the hazard pass.
type Few = smallvec::SmallVec<[usize; 2]>;

struct Hazards {
    deps: Vec<Few>,
    read_loc: Vec<Loc>,
    home: Vec<Loc>,
    operand: Vec<Loc>,
    readers: Vec<Few>, // per transfer: sends that read what its receive wrote
    next_reduce: Vec<bool>,   // per transfer: a later write to its atoms reduces
    final_write: Vec<bool>,   // per transfer: its receive is an atom's last write
    scratch: Vec<i64>,
}

fn buf(c: u8) -> char {
    c as char
}

fn joined(x: usize, locs: &[Loc], atoms: &[i64], size: &[i64]) -> Result<Loc, LowerError> {
    let first = locs[0];
    if locs.len() == 1 {
        return Ok(first);
    }
    let (b0, mut off) = first;
    for (&(b, o), &a) in locs.iter().zip(atoms) {
        if b != b0 || o != off {
            return Err(LowerError::Scattered(x));
        }
        off += size[a as usize];
    }
    Ok(first)
}

fn hazards(inp: &Input) -> Result<Hazards, LowerError> {
    let t = inp.src.len();
    let atoms = inp.atom_size.len();
    let mut h = Hazards {
        deps: vec![Few::new(); 2 * t],
        read_loc: vec![(b'i', -1); t],
        home: vec![(b'o', -1); t],
        operand: vec![(b'i', -1); t],
        readers: vec![Few::new(); t],
        next_reduce: vec![false; t],
        final_write: vec![false; t],
        scratch: vec![0; inp.n],
    };
    let mut homes: Vec<Option<Loc>> = vec![None; atoms];
    // Atoms one transfer moves together lie side by side (ids follow a node's chunks), and
    // so must their homes in scratch: a run's atoms get theirs at once, at its first write,
    // even where pieces of it arrive apart with other data in between.
    let mut with_next = vec![false; atoms];
    for (ptr, list) in [(inp.reads_ptr, inp.reads_atom), (inp.writes_ptr, inp.writes_atom)] {
        for x in 0..t {
            let run = &list[ptr[x] as usize..ptr[x + 1] as usize];
            for pair in run.windows(2) {
                with_next[pair[0] as usize] = true;
            }
        }
    }
    let mut last: Vec<usize> = vec![NONE; atoms];
    let mut reads: Vec<Vec<usize>> = vec![Vec::new(); atoms];
    let initial = |x: usize, g: i64, a: usize| -> Result<Loc, LowerError> {
        match inp.atom_in[a] {
            ABSENT => Err(LowerError::NotHeld(x, g, a)),
            SPLIT => Err(LowerError::Split(a, g)),
            idx => Ok((b'i', idx)),
        }
    };
    let mut locs: Vec<Loc> = Vec::new();
    let mut waits: Vec<usize> = Vec::new();
    for &e in inp.order {
        let e = e as usize;
        if e < t {
            let g = inp.src[e];
            let mine = &inp.reads_atom[inp.reads_ptr[e] as usize..inp.reads_ptr[e + 1] as usize];
            locs.clear();
            for &a in mine {
                let a = a as usize;
                let w = last[a];
                if w == NONE {
                    locs.push(initial(e, g, a)?);
                } else {
                    locs.push(homes[a].expect("a written atom has a home"));
                    if !h.deps[e].contains(&w) {
                        h.deps[e].push(w);
                        h.readers[w - t].push(e);
                    }
                }
                reads[a].push(e);
            }
            h.read_loc[e] = joined(e, &locs, mine, inp.atom_size)?;
            continue;
        }
        let x = e - t;
        let g = inp.dst[x];
        let mine = &inp.writes_atom[inp.writes_ptr[x] as usize..inp.writes_ptr[x + 1] as usize];
        locs.clear();
        for &a in mine {
            let a = a as usize;
            if homes[a].is_none() {
                match inp.atom_out[a] {
                    SPLIT => return Err(LowerError::Split(a, g)),
                    ABSENT => {
                        let (mut lo, mut hi) = (a, a);
                        while lo > 0 && with_next[lo - 1] {
                            lo -= 1;
                        }
                        while with_next[hi] {
                            hi += 1;
                        }
                        let run = inp.atom_out[lo..=hi].iter().zip(&inp.atom_size[lo..=hi]);
                        for (home, (&out, &size)) in homes[lo..=hi].iter_mut().zip(run) {
                            if home.is_none() && out == ABSENT {
                                *home = Some((b's', h.scratch[g as usize]));
                                h.scratch[g as usize] += size;
                            }
                        }
                    }
                    out => homes[a] = Some((b'o', out)),
                }
            }
            locs.push(homes[a].unwrap());
        }
        h.home[x] = joined(x, &locs, mine, inp.atom_size)?;
        if inp.reduce[x] {
            locs.clear();
            for &a in mine {
                let a = a as usize;
                locs.push(if last[a] == NONE { initial(x, g, a)? } else { homes[a].unwrap() });
            }
            h.operand[x] = joined(x, &locs, mine, inp.atom_size)?;
        }
        waits.clear();
        for &a in mine {
            let a = a as usize;
            let w = last[a];
            if w != NONE {
                if inp.combining {
                    waits.push(w);
                }
                h.next_reduce[w - t] |= inp.reduce[x];
            }
            if inp.combining {
                waits.append(&mut reads[a]);
            }
            reads[a].clear();
            last[a] = e;
        }
        let deps = &mut h.deps[e];
        for &w in &waits {
            if !deps.contains(&w) {
                deps.push(w);
            }
        }
    }
    for w in last.into_iter().filter(|&w| w != NONE) {
        h.final_write[w - t] = true;
    }
    Ok(h)
}

fn pieces(cnt: i64, max_cnt: i64) -> i64 {
    (cnt + max_cnt - 1) / max_cnt
}

/// Per op of a threadblock, the (threadblock, op) it waits for.
type Waits = Vec<Vec<(usize, usize)>>;

struct Plan {
    tbs: Vec<Vec<TbPlan>>,
    waits: Vec<Vec<Waits>>, // per rank, per threadblock
    fused: usize,
    max_steps: i64,
    /// steps of every threadblock of every rank, one instance's
    steps: i64,
}

/// (channel, 'S'end or 'R'eceive, peer) -> a rank's threadblock for that connection.
type TbIndex = HashMap<(i64, u8, i64), usize>;

fn new_tb(list: &mut Vec<TbPlan>, tb_of: &mut TbIndex, send: i64, recv: i64, ch: i64) {
    list.push(TbPlan { send, recv, chan: ch, ops: Vec::new() });
    let idx = list.len() - 1;
    if send >= 0 {
        tb_of.insert((ch, b'S', send), idx);
    }
    if recv >= 0 {
        tb_of.insert((ch, b'R', recv), idx);
    }
}

/// One rank's threadblocks, its events (sends `0..T`, receives `T..2T`, in L order) in
/// them, and its own-data copies (input, output offsets) in a threadblock of their own.
fn rank_tbs(
    inp: &Input,
    h: &Hazards,
    chan: &[i64],
    events: &[usize],
    copies: &[(i64, i64)],
) -> Vec<TbPlan> {
    let t = inp.src.len();
    let (src, dst) = (inp.src, inp.dst);
    // Pair the receive peer with the send peer it forwards most to, per channel.
    let mut weight: HashMap<(i64, i64, i64), i64> = HashMap::default();
    let mut sends: Vec<(i64, i64)> = Vec::new();
    let mut recvs: Vec<(i64, i64)> = Vec::new();
    for &e in events {
        if e >= t {
            let x = e - t;
            recvs.push((chan[x], src[x]));
            continue;
        }
        sends.push((chan[e], dst[e]));
        for &w in &h.deps[e] {
            let x = w - t;
            if chan[x] == chan[e] {
                *weight.entry((chan[e], src[x], dst[e])).or_insert(0) += 1;
            }
        }
    }
    let mut tbs: Vec<TbPlan> = Vec::new();
    let mut tb_of: TbIndex = HashMap::default();
    let mut ranked: Vec<((i64, i64, i64), i64)> = weight.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for ((ch, q, p), _) in ranked {
        if !tb_of.contains_key(&(ch, b'S', p)) && !tb_of.contains_key(&(ch, b'R', q)) {
            new_tb(&mut tbs, &mut tb_of, p, q, ch);
        }
    }
    sends.sort_unstable();
    sends.dedup();
    for (ch, p) in sends {
        if !tb_of.contains_key(&(ch, b'S', p)) {
            new_tb(&mut tbs, &mut tb_of, p, -1, ch);
        }
    }
    recvs.sort_unstable();
    recvs.dedup();
    for (ch, q) in recvs {
        if !tb_of.contains_key(&(ch, b'R', q)) {
            new_tb(&mut tbs, &mut tb_of, -1, q, ch);
        }
    }
    // Copies of consecutive chunks to consecutive places become one ranged copy (cut into
    // steps of at most `max_cnt` when emitted), where an instance's chunk units are
    // consecutive too.
    if !copies.is_empty() {
        let mut ops: Vec<Op> = Vec::new();
        for &(i, o) in copies {
            if let Some(last) = ops.last_mut() {
                if inp.instances == 1 && last.src.1 + last.cnt == i && last.dst.1 + last.cnt == o {
                    last.cnt += 1;
                    continue;
                }
            }
            let (src, dst) = ((b'i', i), (b'o', o));
            ops.push(Op { kind: "cpy", src, dst, events: (NONE, NONE), cnt: 1 });
        }
        tbs.push(TbPlan { send: -1, recv: -1, chan: 0, ops });
    }
    // Events into their threadblocks in L order.
    for &e in events {
        let (idx, op) = if e < t {
            let (from, to) = (h.read_loc[e], h.home[e]);
            let op = Op { kind: "s", src: from, dst: to, events: (e, NONE), cnt: inp.count[e] };
            (tb_of[&(chan[e], b'S', dst[e])], op)
        } else {
            let x = e - t;
            let (kind, from) = if inp.reduce[x] { ("rrc", h.operand[x]) } else { ("r", h.home[x]) };
            let (to, cnt) = (h.home[x], inp.count[x]);
            let op = Op { kind, src: from, dst: to, events: (e, NONE), cnt };
            (tb_of[&(chan[x], b'R', src[x])], op)
        };
        tbs[idx].ops.push(op);
    }
    tbs
}

fn assemble(inp: &Input, h: &Hazards, epochs: i64) -> Plan {
    let t = inp.src.len();
    let two_t = 2 * t as i64;
    let chan: Vec<i64> = (0..t)
        .map(|x| {
            let epoch = (epochs - 1).min(inp.pos[x] * epochs / two_t);
            epoch * inp.base_channels + inp.base[x]
        })
        .collect();
    // Each rank's events in L order and its copies, then its threadblocks on their own.
    let mut events: Vec<Vec<usize>> = vec![Vec::new(); inp.n];
    for &e in inp.order {
        let e = e as usize;
        let g = if e < t { inp.src[e] } else { inp.dst[e - t] };
        events[g as usize].push(e);
    }
    let mut copies: Vec<Vec<(i64, i64)>> = vec![Vec::new(); inp.n];
    for &(g, i, o) in inp.copies {
        copies[g as usize].push((i, o));
    }
    let mut tbs: Vec<Vec<TbPlan>> = (0..inp.n)
        .into_par_iter()
        .map(|g| rank_tbs(inp, h, &chan, &events[g], &copies[g]))
        .collect();
    let fused = fuse(inp, h, &mut tbs, &chan);
    let mut where_: Vec<(usize, usize)> = vec![(0, 0); 2 * t];
    for plans in &tbs {
        for (ti, plan) in plans.iter().enumerate() {
            for (k, o) in plan.ops.iter().enumerate() {
                for e in [o.events.0, o.events.1] {
                    if e != NONE {
                        where_[e] = (ti, k);
                    }
                }
            }
        }
    }
    let (waits, max_steps, steps) = dependencies(inp, h, &tbs, &where_);
    Plan { tbs, waits, fused, max_steps, steps }
}

/// Merge a receive with the next step of its threadblock when that sends the value, unless
/// something else waits on the receive before that send would run.
fn fuse(inp: &Input, h: &Hazards, tbs: &mut [Vec<TbPlan>], chan: &[i64]) -> usize {
    let t = inp.src.len();
    let pos = inp.pos;
    // the two earliest waiters of each event, as (position, waiter), earliest first
    let mut firsts: Vec<[(i64, usize); 2]> = vec![[(i64::MAX, NONE); 2]; 2 * t];
    let mut waits_on = |target: usize, waiter: usize| {
        let new = (pos[waiter], waiter);
        let best = &mut firsts[target];
        if new < best[0] {
            best[1] = best[0];
            best[0] = new;
        } else if new < best[1] {
            best[1] = new;
        }
    };
    for (e, deps) in h.deps.iter().enumerate() {
        for &w in deps {
            waits_on(w, e);
        }
    }
    let mut conns: HashMap<(i64, i64, i64), Vec<usize>> = HashMap::default();
    for &e in inp.order {
        let x = e as usize;
        if x < t {
            conns.entry((inp.src[x], inp.dst[x], chan[x])).or_default().push(x);
        }
    }
    // A send waits for room: the chunks still on its connection and its own may not pass
    // the FIFO's, except that one message of any size may enter an empty FIFO. So it waits
    // for the receive of the latest earlier message that would leave too little room.
    let room = inp.fifo_chunks as i64;
    for seq in conns.values() {
        for (j, &x) in seq.iter().enumerate() {
            let mut held = inp.count[x];
            for &before in seq[..j].iter().rev() {
                held += inp.count[before];
                if held > room {
                    waits_on(t + before, x);
                    break;
                }
            }
        }
    }
    // Each rank's threadblocks on their own: the waits above are read only.
    tbs.par_iter_mut()
        .map(|plans| {
            let mut fused = 0;
            for plan in plans.iter_mut() {
                if plan.send < 0 || plan.recv < 0 {
                    continue;
                }
                let old = std::mem::take(&mut plan.ops);
                let mut ops = Vec::with_capacity(old.len());
                let mut k = 0;
                while k < old.len() {
                    let a = &old[k];
                    if let Some(b) = old.get(k + 1) {
                        let r_ev = a.events.0;
                        let s_ev = b.events.0;
                        if (a.kind == "r" || a.kind == "rrc")
                            && b.kind == "s"
                            && h.deps[s_ev].contains(&r_ev)
                            && inp.chunk[r_ev - t] == inp.chunk[s_ev]
                            && inp.count[r_ev - t] == inp.count[s_ev]
                        {
                            let other = firsts[r_ev]
                                .iter()
                                .find(|&&(_, w)| w != NONE && w != s_ev)
                                .map_or(i64::MAX, |&(p, _)| p);
                            if other > pos[s_ev] {
                                ops.push(fused_op(h, a, r_ev, s_ev, t));
                                fused += 1;
                                k += 2;
                                continue;
                            }
                        }
                    }
                    ops.push(*a);
                    k += 1;
                }
                plan.ops = ops;
            }
            fused
        })
        .sum()
}

fn fused_op(h: &Hazards, a: &Op, r_ev: usize, s_ev: usize, t: usize) -> Op {
    let x = r_ev - t;
    let kind = if a.kind == "r" {
        "rcs"
    } else if h.readers[x].iter().any(|&e| e != s_ev)
        || h.next_reduce[x]
        || (h.final_write[x] && h.home[x].0 == b'o')
    {
        "rrcs"
    } else {
        "rrs"
    };
    let src = if a.kind == "r" { a.dst } else { a.src };
    Op { kind, src, dst: a.dst, events: (r_ev, s_ev), cnt: a.cnt }
}

/// Each op's waits reduced to one per other threadblock, minus those already implied; the
/// longest threadblock in steps (each extra dependency costs a `nop`) and all their steps.
fn dependencies(
    inp: &Input,
    h: &Hazards,
    tbs: &[Vec<TbPlan>],
    where_: &[(usize, usize)],
) -> (Vec<Vec<Waits>>, i64, i64) {
    // Each rank on its own (a wait names a threadblock of the same rank).
    let per_rank: Vec<(Vec<Waits>, i64, i64)> = tbs
        .par_iter()
        .map(|plans| {
            let mut longest = 0;
            let mut total = 0;
            let mut per_tb = Vec::with_capacity(plans.len());
            let mut need: Vec<(usize, usize)> = Vec::new();
            // per threadblock of the rank: the latest step of it already waited for
            let mut seen: Vec<usize> = vec![NONE; plans.len()];
            for (ti, plan) in plans.iter().enumerate() {
                seen.fill(NONE);
                let mut per_op: Vec<Vec<(usize, usize)>> = Vec::with_capacity(plan.ops.len());
                let mut steps = 0;
                for op in &plan.ops {
                    need.clear();
                    for e in op.deps(h) {
                        let (tt, kk) = where_[e];
                        if tt == ti {
                            continue;
                        }
                        match need.iter_mut().find(|(u, _)| *u == tt) {
                            Some(slot) => slot.1 = slot.1.max(kk),
                            None => need.push((tt, kk)),
                        }
                    }
                    need.sort_unstable();
                    let mut keep = Vec::with_capacity(need.len());
                    for &(tt, kk) in &need {
                        if seen[tt] == NONE || seen[tt] < kk {
                            keep.push((tt, kk));
                        }
                    }
                    for &(tt, kk) in &keep {
                        seen[tt] = kk;
                    }
                    steps += op_steps(keep.len(), op.cnt, inp.max_cnt);
                    per_op.push(keep);
                }
                longest = longest.max(steps);
                total += steps;
                per_tb.push(per_op);
            }
            (per_tb, longest, total)
        })
        .collect();
    let longest = per_rank.iter().map(|(_, l, _)| *l).max().unwrap_or(0);
    let total = per_rank.iter().map(|(_, _, t)| *t).sum();
    (per_rank.into_iter().map(|(w, _, _)| w).collect(), longest, total)
}

/// The MSCCL steps an op becomes: a `nop` per wait beyond its first, and its pieces.
fn op_steps(waits: usize, cnt: i64, max_cnt: i64) -> i64 {
    (waits as i64 - 1).max(0) + pieces(cnt, max_cnt)
}

fn moved(off: i64, by: i64) -> i64 {
    if off >= 0 {
        off + by
    } else {
        off
    }
}

fn inst(off: i64, instances: i64, u: i64) -> i64 {
    if off >= 0 {
        off * instances + u
    } else {
        off
    }
}

struct Step {
    kind: &'static str,
    src: Loc,
    dst: Loc,
    cnt: i64,
    depid: i64,
    deps: i64,
    hasdep: u8,
}

/// `v` in decimal, appended without `core::fmt`: a 1,024-GPU file holds about 5.6 M numbers,
/// and `write!` made its lowering an eighth slower (0.49 s against 0.43 s).
fn push_int(out: &mut String, v: i64) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// One rank's `<gpu>` element, its newline included, appended to `body`; the channels it uses.
fn emit_rank(inp: &Input, h: &Hazards, plan: &Plan, g: usize, body: &mut String) -> Result<i64, LowerError> {
    let i_n = inp.instances;
    let mut nchannels = 1;
    let plans = &plan.tbs[g];
    let waits = &plan.waits[g];
    // step index of each op's last piece, after its nops: what others wait for
    let mut s_of: Vec<Vec<i64>> = Vec::with_capacity(plans.len());
    let mut hasdep: FxHashSet<(usize, usize)> = Default::default();
    for (ti, p) in plans.iter().enumerate() {
        let mut cur = 0;
        let mut idx = Vec::with_capacity(p.ops.len());
        for (keep, op) in waits[ti].iter().zip(&p.ops) {
            cur += op_steps(keep.len(), op.cnt, inp.max_cnt);
            idx.push(cur - 1);
            hasdep.extend(keep.iter().copied());
        }
        s_of.push(idx);
    }
    // Threadblocks others wait on come first, so every depid stays below the runtimes'
    // int8_t limit as long as there are few enough of them.
    let mut target = vec![false; plans.len()];
    for &(tt, _) in &hasdep {
        target[tt] = true;
    }
    let targets = target.iter().filter(|&&x| x).count() * i_n as usize;
    if targets > inp.max_dep_targets {
        return Err(LowerError::DepTargets(g as i64, targets));
    }
    let mut order: Vec<usize> = (0..plans.len()).filter(|&ti| target[ti]).collect();
    order.extend((0..plans.len()).filter(|&ti| !target[ti]));
    let mut first_id = vec![0i64; plans.len()];
    for (k, &ti) in order.iter().enumerate() {
        first_id[ti] = k as i64 * i_n;
    }
    // A step is about 120 bytes: the body is written once, not regrown and copied as it fills
    // (a 1,024-GPU file's elements: 0.09 s, was 0.09-0.12 s).
    let steps: usize = s_of.iter().map(|idx| idx.last().map_or(0, |&v| v as usize + 1)).sum();
    body.reserve((steps * 128 + plans.len() * 64) * i_n as usize + 96);
    let _ = write!(
        body,
        "  <gpu id=\"{}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">",
        g,
        inp.in_units,
        inp.out_units,
        h.scratch[g] * inp.instances
    );
    let mut tb_count = 0;
    let mut step_count = 0;
    let mut steps: Vec<Step> = Vec::new();
    for &ti in &order {
        let p = &plans[ti];
        steps.clear();
        for (k, op) in p.ops.iter().enumerate() {
            let keep = &waits[ti][k];
            for &(tt, kk) in keep.iter().take(keep.len().saturating_sub(1)) {
                steps.push(Step {
                    kind: "nop",
                    src: (b'i', -1),
                    dst: (b'o', -1),
                    cnt: 0,
                    depid: tt as i64,
                    deps: s_of[tt][kk],
                    hasdep: 0,
                });
            }
            let (dep, deps) = match keep.last() {
                Some(&(tt, kk)) => (tt as i64, s_of[tt][kk]),
                None => (-1, -1),
            };
            let n = pieces(op.cnt, inp.max_cnt);
            for j in 0..n {
                let done = j * inp.max_cnt;
                let last = j == n - 1;
                let mut dst = (op.dst.0, moved(op.dst.1, done));
                if op.kind == "s" && dst.0 == b's' && dst.1 >= h.scratch[g] {
                    // The runtime ignores where a send's data lands; name the receiver's
                    // slot only where this rank's parser accepts the offset (each piece of
                    // a cut send: a later piece may pass the end where the first did not).
                    dst = (b's', -1);
                }
                steps.push(Step {
                    kind: op.kind,
                    src: (op.src.0, moved(op.src.1, done)),
                    dst,
                    cnt: inp.max_cnt.min(op.cnt - done),
                    depid: if j == 0 { dep } else { -1 },
                    deps: if j == 0 { deps } else { -1 },
                    hasdep: u8::from(last && hasdep.contains(&(ti, k))),
                });
            }
        }
        for u in 0..i_n {
            let chan = p.chan * i_n + u;
            nchannels = nchannels.max(chan + 1);
            tb_count += 1;
            step_count += steps.len();
            body.push_str("\n    <tb id=\"");
            push_int(body, first_id[ti] + u);
            body.push_str("\" send=\"");
            push_int(body, p.send);
            body.push_str("\" recv=\"");
            push_int(body, p.recv);
            body.push_str("\" chan=\"");
            push_int(body, chan);
            body.push_str("\">");
            for (s, st) in steps.iter().enumerate() {
                let depid = if st.depid >= 0 { first_id[st.depid as usize] + u } else { -1 };
                body.push_str("\n      <step s=\"");
                push_int(body, s as i64);
                body.push_str("\" type=\"");
                body.push_str(st.kind);
                body.push_str("\" srcbuf=\"");
                body.push(buf(st.src.0));
                body.push_str("\" srcoff=\"");
                push_int(body, inst(st.src.1, i_n, u));
                body.push_str("\" dstbuf=\"");
                body.push(buf(st.dst.0));
                body.push_str("\" dstoff=\"");
                push_int(body, inst(st.dst.1, i_n, u));
                body.push_str("\" cnt=\"");
                push_int(body, st.cnt);
                body.push_str("\" depid=\"");
                push_int(body, depid);
                body.push_str("\" deps=\"");
                push_int(body, st.deps);
                body.push_str("\" hasdep=\"");
                push_int(body, i64::from(st.hasdep));
                body.push_str("\"/>");
            }
            body.push_str("\n    </tb>");
        }
    }
    if tb_count > inp.max_tbs {
        return Err(LowerError::Threadblocks(g as i64, tb_count));
    }
    let nodes = 1 + inp.n + tb_count + step_count;
    if inp.max_nodes > 0 && nodes > inp.max_nodes {
        return Err(LowerError::Nodes(g as i64, nodes));
    }
    body.push_str("\n  </gpu>\n");
    Ok(nchannels)
}

/// Every rank's `<gpu>` element, written side by side (each is independent of the others),
/// plain or, where `packing` asks and they are large enough, compressed part by part as they
/// are written; with the channels used and where each element ends in the elements joined.
/// The error is the first rank's, as a rank-by-rank pass would find it.
fn emit(inp: &Input, h: &Hazards, plan: &Plan, packing: Option<&Packing>)
    -> Result<(Elements, i64, Vec<usize>), LowerError> {
    let framed = packing.filter(|p| estimated_bytes(inp, plan) >= p.from);
    let (elements, chans, lens) = match framed {
        Some(p) => emit_frames(inp, h, plan, p)?,
        None => {
            let ranks: Vec<Result<(String, i64), LowerError>> = (0..inp.n)
                .into_par_iter()
                .map(|g| {
                    let mut body = String::new();
                    emit_rank(inp, h, plan, g, &mut body).map(|c| (body, c))
                })
                .collect();
            let mut gpus = Vec::with_capacity(inp.n);
            let mut chans = Vec::with_capacity(inp.n);
            let mut lens = Vec::with_capacity(inp.n);
            for rank in ranks {
                let (element, c) = rank?;
                lens.push(element.len());
                chans.push(c);
                gpus.push(element);
            }
            (Elements::Plain(gpus), chans, lens)
        }
    };
    let nchannels = chans.into_iter().max().unwrap_or(1).max(1);
    if nchannels > inp.max_channels {
        return Err(LowerError::TooManyChannels(nchannels));
    }
    let ends: Vec<usize> = lens.iter().scan(0, |end, &len| { *end += len; Some(*end) }).collect();
    let total = ends.last().copied().unwrap_or(0);
    // The estimate chose the form; the count decides it.
    let elements = match (elements, packing) {
        (Elements::Frames(frames), Some(p)) if total < p.from => Elements::Plain(
            frames.par_iter().map(|f| inflated(f)).collect::<Result<Vec<String>, LowerError>>()?,
        ),
        (Elements::Plain(gpus), Some(p)) if total >= p.from => {
            Elements::Frames(pack_parts(&gpus, p.ends, p.level)?)
        }
        (elements, _) => elements,
    };
    Ok((elements, nchannels, ends))
}

/// Bytes the elements will take, near enough to choose between plain and framed: a step is
/// written in 110-125 bytes.
fn estimated_bytes(inp: &Input, plan: &Plan) -> usize {
    (plan.steps * inp.instances) as usize * 118
}

/// Parts of consecutive ranks' elements, each written into one buffer a thread keeps and
/// compressed from there while it is in cache; per rank, its element's length and channels.
fn emit_frames(inp: &Input, h: &Hazards, plan: &Plan, p: &Packing)
    -> Result<(Elements, Vec<i64>, Vec<usize>), LowerError> {
    let ends = part_ends(p.ends, inp.n)?;
    let starts: Vec<usize> = std::iter::once(0).chain(ends[..ends.len() - 1].iter().copied()).collect();
    type Part = Result<(Vec<u8>, Vec<i64>, Vec<usize>), LowerError>;
    let parts: Vec<Part> = starts
        .par_iter()
        .zip(ends.par_iter())
        .map_init(|| (String::new(), compressor(p.level)), |(body, z), (&a, &b)| {
            let z = z.as_mut().map_err(|e| LowerError::Pack(e.to_string()))?;
            body.clear();
            let mut chans = Vec::with_capacity(b - a);
            let mut lens = Vec::with_capacity(b - a);
            for g in a..b {
                let before = body.len();
                chans.push(emit_rank(inp, h, plan, g, body)?);
                lens.push(body.len() - before);
            }
            let frame = z.compress(body.as_bytes()).map_err(|e| LowerError::Pack(e.to_string()))?;
            Ok((frame, chans, lens))
        })
        .collect();
    let mut frames = Vec::with_capacity(parts.len());
    let mut chans = Vec::with_capacity(inp.n);
    let mut lens = Vec::with_capacity(inp.n);
    for part in parts {
        let (f, c, l) = part?;
        frames.push(f);
        chans.extend(c);
        lens.extend(l);
    }
    Ok((Elements::Frames(frames), chans, lens))
}

/// Part ends as given, or one part per rank; they must rise to the number of ranks.
fn part_ends(ends: &[usize], n: usize) -> Result<Vec<usize>, LowerError> {
    if ends.is_empty() {
        return Ok((1..=n).collect());
    }
    if ends.windows(2).any(|w| w[0] > w[1]) || ends.last() != Some(&n) {
        return Err(LowerError::Pack("part ends must rise to the number of ranks".into()));
    }
    Ok(ends.to_vec())
}

/// A zstd compressor writing frames with their checksums; one serves a thread's parts.
fn compressor(level: i32) -> std::io::Result<zstd::bulk::Compressor<'static>> {
    let mut z = zstd::bulk::Compressor::new(level)?;
    z.include_checksum(true)?;
    Ok(z)
}

fn frame(text: &[u8], level: i32) -> Result<Vec<u8>, LowerError> {
    compressor(level).and_then(|mut z| z.compress(text)).map_err(|e| LowerError::Pack(e.to_string()))
}

fn inflated(frame: &[u8]) -> Result<String, LowerError> {
    let fail = |e: std::io::Error| LowerError::Pack(e.to_string());
    let size = zstd::zstd_safe::get_frame_content_size(frame).ok().flatten().unwrap_or(0) as usize;
    let text = zstd::bulk::decompress(frame, size).map_err(fail)?;
    String::from_utf8(text).map_err(|e| LowerError::Pack(e.to_string()))
}

/// Runs of consecutive elements compressed, one zstd frame (with its checksum) per run,
/// side by side: run `k` holds the elements of ranks `ends[k - 1]..ends[k]` (from 0; no
/// `ends`: a run per rank). A frame's text is what the elements joined would hold there, so
/// the frames in order inflate to the whole, and any run of them to its ranks' part.
pub fn pack_parts(gpus: &[String], ends: &[usize], level: i32) -> Result<Vec<Vec<u8>>, LowerError> {
    let ends = part_ends(ends, gpus.len())?;
    let starts: Vec<usize> = std::iter::once(0).chain(ends[..ends.len() - 1].iter().copied()).collect();
    starts
        .par_iter()
        .zip(ends.par_iter())
        .map(|(&a, &b)| {
            let mut text = Vec::with_capacity(gpus[a..b].iter().map(String::len).sum());
            for element in &gpus[a..b] {
                text.extend_from_slice(element.as_bytes());
            }
            frame(&text, level)
        })
        .collect()
}

/// The elements joined into `out` (exactly as long as all of them), each copied into its
/// place side by side.
pub fn join_into(gpus: &[String], out: &mut [u8]) {
    let mut rest = out;
    let mut slices = Vec::with_capacity(gpus.len());
    for element in gpus {
        let (head, tail) = rest.split_at_mut(element.len());
        slices.push(head);
        rest = tail;
    }
    assert!(rest.is_empty(), "join_into: the buffer is longer than the elements");
    slices
        .into_par_iter()
        .zip(gpus.par_iter())
        .for_each(|(dst, src)| dst.copy_from_slice(src.as_bytes()));
}

/// The largest scratch buffer of any rank, in the file's units.
fn max_scratch(inp: &Input, h: &Hazards) -> i64 {
    h.scratch.iter().max().copied().unwrap_or(0) * inp.instances
}

/// Lower one tenant: the `<gpu>` elements (each line ended by a newline; framed as `packing`
/// asks) and the plan's facts.
pub fn lower(inp: &Input, packing: Option<&Packing>) -> Result<Output, LowerError> {
    let h = hazards(inp)?;
    let mut epochs = inp.first_epochs;
    let plan = loop {
        if epochs > 1 && epochs * inp.base_channels * inp.instances > inp.max_channels {
            return Err(LowerError::Channels(epochs * inp.base_channels * inp.instances));
        }
        let plan = assemble(inp, &h, epochs);
        if plan.max_steps <= inp.max_steps {
            break plan;
        }
        let grown = (epochs as f64 * plan.max_steps as f64 / (0.8 * inp.max_steps as f64)).ceil();
        epochs = (epochs + 1).max(grown as i64);
    };
    let (elements, nchannels, gpu_ends) = emit(inp, &h, &plan, packing)?;
    let scratch = max_scratch(inp, &h);
    Ok(Output { elements, gpu_ends, epochs, fused: plan.fused, max_steps: plan.max_steps, nchannels, scratch })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks swap their chunk (an AllGather): send 0 (0 -> 1, chunk 0), send 1 (1 -> 0,
    /// chunk 1), both at once. Atoms: chunk 0 at 0 and 1, chunk 1 at 0 and 1.
    fn swap(atom_in: &[i64]) -> Result<Output, LowerError> {
        swap_packed(atom_in, None)
    }

    fn swap_packed(atom_in: &[i64], packing: Option<&Packing>) -> Result<Output, LowerError> {
        let input = Input {
            n: 2,
            src: &[0, 1],
            dst: &[1, 0],
            reduce: &[false, false],
            count: &[1, 1],
            chunk: &[0, 1],
            order: &[0, 1, 2, 3],
            pos: &[0, 1, 2, 3],
            base: &[0, 0],
            base_channels: 1,
            reads_ptr: &[0, 1, 2],
            reads_atom: &[0, 3],
            writes_ptr: &[0, 1, 2],
            writes_atom: &[1, 2],
            atom_size: &[1, 1, 1, 1],
            atom_in,
            atom_out: &[0, 0, 1, 1],
            combining: false,
            copies: &[(0, 0, 0), (1, 0, 1)],
            first_epochs: 1,
            instances: 1,
            max_steps: 64,
            max_channels: 32,
            max_tbs: 1024,
            max_nodes: 4095,
            max_dep_targets: 128,
            fifo_chunks: 2,
            max_cnt: 71,
            in_units: 1,
            out_units: 2,
        };
        lower(&input, packing)
    }

    fn plain(out: Output) -> String {
        match out.elements {
            Elements::Plain(gpus) => gpus.concat(),
            Elements::Frames(_) => panic!("frames where plain text was due"),
        }
    }

    #[test]
    fn each_rank_sends_its_chunk_and_receives_the_other() {
        let out = swap(&[0, ABSENT, ABSENT, 0]).expect("lowers");
        assert_eq!((out.epochs, out.nchannels), (1, 1));
        let Elements::Plain(gpus) = &out.elements else { panic!("frames unasked") };
        let text = gpus.concat();
        let mut joined = vec![0u8; *out.gpu_ends.last().unwrap()];
        join_into(gpus, &mut joined);
        assert_eq!(joined, text.as_bytes());
        assert_eq!(text.matches("<gpu ").count(), 2);
        assert!(text.contains(
            "<step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\""
        ));
        assert!(text.contains("type=\"r\" srcbuf=\"o\" srcoff=\"1\" dstbuf=\"o\" dstoff=\"1\""));
        assert_eq!(text.matches("type=\"cpy\"").count(), 2);
        assert!(text.ends_with("  </gpu>\n"));
    }

    #[test]
    fn a_chunk_sent_before_it_is_held_is_named() {
        assert_eq!(swap(&[ABSENT, ABSENT, ABSENT, 0]).err(), Some(LowerError::NotHeld(0, 0, 0)));
        assert_eq!(swap(&[SPLIT, ABSENT, ABSENT, 0]).err(), Some(LowerError::Split(0, 0)));
    }

    #[test]
    fn elements_come_framed_from_the_packings_size_and_plain_below_it() {
        let text = plain(swap(&[0, ABSENT, ABSENT, 0]).expect("lowers"));
        let total = text.len();
        // from 0 and from the exact size: frames whatever the estimate; one byte more: plain
        for (from, framed) in [(0, true), (total, true), (total + 1, false), (usize::MAX, false)] {
            for ends in [&[][..], &[2][..], &[1, 2][..]] {
                let packing = Packing { ends, level: 3, from };
                let out = swap_packed(&[0, ABSENT, ABSENT, 0], Some(&packing)).expect("lowers");
                assert_eq!(*out.gpu_ends.last().unwrap(), total);
                match out.elements {
                    Elements::Frames(frames) => {
                        assert!(framed, "framed below {from} bytes");
                        assert_eq!(frames.len(), if ends.is_empty() { 2 } else { ends.len() });
                        let inflated: Vec<String> =
                            frames.iter().map(|f| inflated(f).expect("a zstd frame")).collect();
                        assert_eq!(inflated.concat(), text);
                    }
                    Elements::Plain(gpus) => {
                        assert!(!framed, "plain from {from} bytes");
                        assert_eq!(gpus.concat(), text);
                    }
                }
            }
        }
        let short = Packing { ends: &[1], level: 3, from: 0 }; // ends short of the ranks
        assert!(matches!(swap_packed(&[0, ABSENT, ABSENT, 0], Some(&short)), Err(LowerError::Pack(_))));
    }

    #[test]
    fn packed_parts_inflate_to_their_ranks_elements() {
        let gpus: Vec<String> = (0..5).map(|g| format!("<gpu id=\"{g}\">{}</gpu>\n", "x".repeat(g * 40))).collect();
        for ends in [vec![], vec![2, 5], vec![1, 1, 5]] {
            let frames = pack_parts(&gpus, &ends, 3).expect("packs");
            let runs: Vec<usize> = if ends.is_empty() { (1..=5).collect() } else { ends.clone() };
            assert_eq!(frames.len(), runs.len());
            let mut from = 0;
            for (frame, &to) in frames.iter().zip(&runs) {
                let text = zstd::bulk::decompress(frame, 1 << 20).expect("a zstd frame");
                assert_eq!(text, gpus[from..to].concat().as_bytes());
                from = to;
            }
        }
        assert!(pack_parts(&gpus, &[2, 4], 3).is_err()); // ends short of the ranks
        assert!(pack_parts(&gpus, &[3, 2, 5], 3).is_err());
    }
}
