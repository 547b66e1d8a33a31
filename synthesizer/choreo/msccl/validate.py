"""Check an MSCCL XML file against every parser and structural rule of the two runtimes.

Each broken rule is one ``Violation`` with the line, gpu, threadblock and step it concerns.
Rules (``Violation.rule``): xml, structure, attr, limit, token (reading); algo, range,
scratch, gpu, buffer, nchunksperloop (header and buffers); tb, peer, chan (threadblocks); step,
type, cnt, offset, send, recv, dep, hasdep, nop, input (steps); match, order (the two ends of
each connection); cycle (a wait cycle: the file hangs). Limits are those of the runtime the
dialect names (``layout.RUNTIMES``), counted as its loader counts them.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable

from choreo.collector import collector_paused
from choreo.msccl import layout
from choreo.msccl.parse import detect_dialect, parse, token_violations
from choreo.msccl.violation import Violation
from choreo.msccl.xmlmodel import (
    READS_SRC,
    RECVS,
    SENDS,
    STEP_TYPES,
    WRITES_DST,
    Algo,
    Gpu,
    Step,
    Tb,
)

_INT = re.compile(r"-?[0-9]+\Z")
_REQUIRED = {  # per XML format
    "executor": ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                 "outofplace", "minBytes", "maxBytes"),
    "legacy": ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
}
_STORES = frozenset({"r", "rcs", "rrc", "rrcs"})


def validate(xml_text: str, dialect: str | None = None, *,
             partial: bool | None = None) -> list[Violation]:
    """All violations, sorted by line. ``partial``: a per-node split file holding only some
    ``<gpu>`` elements (default: detected from choreo's comment)."""
    parsed = parse(xml_text)
    out = list(parsed.violations) + token_violations(xml_text)
    algo = parsed.algo
    if algo is not None:
        if dialect is not None and dialect not in layout.DIALECTS:
            out.append(Violation(algo.line, None, None, None, "algo",
                                 f"unknown dialect {dialect!r}"))
            dialect = None
        which = detect_dialect(algo, dialect)
        part = partial if partial is not None else "node=" in algo.comment
        with collector_paused():
            _Checker(algo, which, part, out).check()
    out.sort(key=lambda v: (v.line, v.rule))
    return out


class _Checker:
    def __init__(self, algo: Algo, dialect: str, partial: bool, out: list[Violation]) -> None:
        self.algo, self.dialect, self.partial, self.out = algo, dialect, partial, out
        self.rt = layout.runtime(dialect)
        self.n = algo.ngpus
        self.coll = layout.parse_coll(algo.coll)

    def bad(self, line: int, rule: str, msg: str, gpu: int | None = None, tb: int | None = None,
            step: int | None = None) -> None:
        self.out.append(Violation(line, gpu, tb, step, rule, msg))

    def check(self) -> None:
        self.header()
        self.gpus()
        self.connections()
        self.cycles()

    # ---- <algo> -------------------------------------------------------------------------
    def header(self) -> None:
        a, line, d = self.algo.attrs, self.algo.line, self.dialect
        for key in _REQUIRED[self.rt.format]:
            if key not in a:
                self.bad(line, "algo", f"<algo> lacks {key!r}, which the {d} parser requires")
        for key in ("nchannels", "nchunksperloop", "ngpus", "minBytes", "maxBytes", "inplace",
                    "outofplace", "nthreads"):
            if key in a and not _INT.match(a[key].strip()):
                self.bad(line, "attr", f"<algo> {key}={a[key]!r} is not an integer")
        if "proto" in a and a["proto"] not in layout.PROTOCOLS:
            self.bad(line, "algo", f"proto={a['proto']!r} is not one of "
                     f"{', '.join(layout.PROTOCOLS)}")
        spellings = layout.LEGACY_SPELLINGS if self.rt.legacy else layout.EXECUTOR_SPELLINGS
        if "coll" in a and a["coll"] not in spellings:
            hint = {"reduce_scatter": " (the executor spells it reducescatter)",
                    "reducescatter": " (legacy spells it reduce_scatter)"}.get(a["coll"], "")
            self.bad(line, "algo", f"coll={a['coll']!r} is not a {d} collective{hint}")
        for key in ("inplace", "outofplace"):
            if key in a and a[key] not in ("0", "1"):
                self.bad(line, "algo", f"{key}={a[key]!r} must be 0 or 1")
        if self.rt.legacy and len(a.get("name", "")) > layout.MAX_LEGACY_NAME:
            self.bad(line, "algo", f"name is {len(a['name'])} characters; legacy keeps at most "
                     f"{layout.MAX_LEGACY_NAME}")
        if "nthreads" in a and _INT.match(a["nthreads"]) and int(a["nthreads"]) % 32:
            self.bad(line, "algo", f"nthreads={a['nthreads']} is not a multiple of 32")
        nch = self.algo.int_attr("nchannels")
        if not 1 <= nch <= self.rt.max_channels:
            self.bad(line, "algo", f"nchannels={nch} must be in 1..{self.rt.max_channels} "
                     f"({d} runtime)")
        if self.n < 1:
            self.bad(line, "algo", f"ngpus={self.n} must be positive")
        L = self.algo.nchunksperloop
        if L < 1:
            self.bad(line, "nchunksperloop", f"nchunksperloop={L} must be positive")
        elif self.coll is not None and self.n > 0:
            units = layout.Units(self.coll, self.n, L)
            if units.needs_piece_divisible and L % self.n:
                self.bad(line, "nchunksperloop", f"nchunksperloop={L} is not a multiple of "
                         f"ngpus={self.n}, as {a.get('coll')} needs (one piece per rank)")
        self.byte_range(a, line)
        self.scratch()
        # The parser stores the file's <gpu> elements as the <algo>'s children: a per-node
        # file of a larger communicator holds only its node's.
        if len(self.algo.gpus) > layout.MAX_CHILDREN:
            self.bad(line, "limit", f"{len(self.algo.gpus)} <gpu> children; the parser keeps "
                     f"{layout.MAX_CHILDREN}")

    def byte_range(self, a: dict[str, str], line: int) -> None:
        lo = self.algo.int_attr("minBytes", 0)
        hi = self.algo.int_attr("maxBytes", layout.LEGACY_DEFAULT_MAX_BYTES
                                if self.rt.legacy else 0)
        if lo < 0 or hi < 0:
            self.bad(line, "range", "minBytes and maxBytes must not be negative")
        elif not self.rt.legacy:
            if hi and hi < lo:
                self.bad(line, "range", f"maxBytes={hi} < minBytes={lo}: no size selects this "
                         "algorithm (executor ranges are inclusive; 0 means unlimited)")
        elif hi == 0:
            self.bad(line, "range", "maxBytes=0 means never for the legacy runtime; write the "
                     "exclusive upper bound")
        elif hi <= lo:
            self.bad(line, "range", f"maxBytes={hi} <= minBytes={lo}: no size selects this "
                     "algorithm (legacy maxBytes is exclusive)")

    def scratch(self) -> None:
        """Legacy allocates ``maxBytes * s_chunks / nchunksperloop`` bytes of scratch per rank
        when the communicator is created, whatever the calls' sizes."""
        L = self.algo.nchunksperloop
        if not self.rt.legacy or L < 1:
            return
        hi = self.algo.int_attr("maxBytes", layout.LEGACY_DEFAULT_MAX_BYTES)
        for g in self.algo.gpus:
            need = hi * g.s_chunks // L
            if need > layout.LEGACY_SCRATCH_CAP:
                self.bad(g.line, "scratch", f"maxBytes={hi} with s_chunks={g.s_chunks} of "
                         f"nchunksperloop={L}: the legacy runtime allocates {need / 2**30:.1f} "
                         f"GiB of scratch on this rank at communicator creation (choreo's "
                         f"limit {layout.LEGACY_SCRATCH_CAP >> 20} MiB; beyond the GPU's "
                         "memory creation fails); lower maxBytes", g.id)
                return

    # ---- <gpu>, <tb>, <step> ----------------------------------------------------------------
    def gpus(self) -> None:
        seen: set[int] = set()
        L, n = self.algo.nchunksperloop, self.n
        units = layout.Units(self.coll, n, L) if self.coll and n > 0 and L > 0 else None
        for g in self.algo.gpus:
            if not 0 <= g.id < max(n, 1) or g.id in seen:
                self.bad(g.line, "gpu", f"gpu id {g.id} is out of 0..{n - 1} or repeated", g.id)
            seen.add(g.id)
            for name in ("i_chunks", "o_chunks", "s_chunks"):
                if g.size(name[0]) < 0:
                    self.bad(g.line, "gpu", f"{name}={g.size(name[0])} is negative", g.id)
            if units is not None:
                self.buffers(g.id, g.line, g.i_chunks, g.o_chunks, units)
            self.threadblocks(g)
        if not self.partial and n > 0 and seen != set(range(n)):
            missing = sorted(set(range(n)) - seen)
            self.bad(self.algo.line, "gpu", f"ngpus={n} but gpu id(s) {_short(missing)} are "
                     "missing (a rank without its <gpu> cannot run the algorithm)")

    def buffers(self, gid: int, line: int, i_chunks: int, o_chunks: int,
                units: layout.Units) -> None:
        coll = self.algo.coll
        for buf, have, want in (("i", i_chunks, units.in_units), ("o", o_chunks, units.out_units)):
            if self.rt.legacy and have != want:
                m = units.n if want != units.L else 1
                self.bad(line, "buffer", f"{buf}_chunks={have}: legacy requires {buf}_chunks * "
                         f"{m} == nchunksperloop ({units.L}) for {coll}", gid)
            elif have > want:
                self.bad(line, "buffer", f"{buf}_chunks={have} exceeds the {want} chunk(s) a "
                         f"{coll} {'input' if buf == 'i' else 'output'} holds per rank "
                         f"(nchunksperloop={units.L})", gid)

    def threadblocks(self, g: Gpu) -> None:
        d, n, rt = self.dialect, self.n, self.rt
        if len(g.tbs) > rt.max_tbs:
            self.bad(g.line, "tb", f"{len(g.tbs)} threadblocks; the {d} runtime allows "
                     f"{rt.max_tbs}", g.id)
        # The parser stores the <algo>, every <gpu> of the file and this rank's elements.
        nodes = 1 + len(self.algo.gpus) + len(g.tbs) + sum(len(tb.steps) for tb in g.tbs)
        if nodes > rt.max_nodes:
            self.bad(g.line, "limit", f"{nodes} XML nodes for this rank (the <algo>, "
                     f"{len(self.algo.gpus)} <gpu>, its threadblocks and steps); the {d} "
                     f"runtime's parser stores {rt.max_nodes}", g.id)
        owners: dict[tuple[str, int, int], int] = {}
        peers: dict[tuple[str, int], set[int]] = defaultdict(set)
        nch = self.algo.int_attr("nchannels")
        by_id = {tb.id: tb for tb in g.tbs}
        depended: dict[tuple[int, int], int] = {}
        for pos, tb in enumerate(g.tbs):
            if tb.id != pos:
                self.bad(tb.line, "tb", f"tb id {tb.id} at position {pos}: ids must be "
                         "0..n-1 in order, without gaps or duplicates", g.id, tb.id)
            for kind, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer == -1:
                    continue
                if not 0 <= peer < n or peer == g.id:
                    self.bad(tb.line, "peer", f"{kind}={peer} must be -1 or a rank in "
                             f"0..{n - 1} other than {g.id}", g.id, tb.id)
                    continue
                key = (kind, peer, tb.chan)
                if key in owners:
                    self.bad(tb.line, "peer", f"{kind} peer {peer} on channel {tb.chan} already "
                             f"belongs to tb {owners[key]}; each (peer, channel, direction) "
                             "needs exactly one threadblock", g.id, tb.id)
                owners[key] = tb.id
                peers[(kind, tb.chan)].add(peer)
            if not 0 <= tb.chan < min(max(nch, 1), rt.max_channels):
                self.bad(tb.line, "chan", f"chan={tb.chan} must be in "
                         f"0..{min(nch, rt.max_channels) - 1} (nchannels={nch})", g.id, tb.id)
            if len(tb.steps) > layout.MAX_CHILDREN:
                self.bad(tb.line, "limit", f"{len(tb.steps)} steps; the parser keeps "
                         f"{layout.MAX_CHILDREN} children", g.id, tb.id)
            self.steps(g, tb, by_id, depended)
        for (kind, chan), ps in peers.items():
            if len(ps) > layout.MAX_PEERS_PER_CHANNEL:
                self.bad(g.line, "chan", f"{len(ps)} {kind} peers on channel {chan}; at most "
                         f"{layout.MAX_PEERS_PER_CHANNEL}", g.id)
        for (t, s), line in depended.items():
            target = by_id.get(t)
            if target is None or not 0 <= s < len(target.steps):
                continue
            st = target.steps[s]
            if st.hasdep != 1:
                self.bad(st.line, "hasdep", f"step {s} of tb {t} is a dependency (of the step at "
                         f"line {line}) but has hasdep={st.hasdep}; its threadblock never "
                         "publishes it and the waiter hangs", g.id, t, s)
            if st.type == "nop":
                self.bad(line, "dep", f"depends on tb {t} step {s}, a nop (nops are folded into "
                         "the next step and never complete on their own)", g.id)

    def steps(self, g: Gpu, tb: Tb, by_id: dict[int, Tb],
              depended: dict[tuple[int, int], int]) -> None:
        d, limit, max_cnt = self.dialect, self.rt.max_steps, layout.MAX_CNT
        writes_input_bad = (self.algo.attrs.get("inplace", "0") == "0" if self.rt.legacy
                            else self.algo.attrs.get("outofplace") == "1")
        sizes = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}
        steps = tb.steps
        last = len(steps) - 1

        def bad(st: Step, rule: str, msg: str) -> None:
            self.bad(st.line, rule, msg, g.id, tb.id, st.s)

        for pos, st in enumerate(steps):
            t = st.type
            if st.s != pos:
                bad(st, "step", f"s={st.s} but this is step {pos} of the threadblock (s counts "
                    "every step, nops included, in document order)")
            if pos >= limit:
                bad(st, "step", f"step {pos}: the {d} runtime allows {limit} steps per "
                    "threadblock")
            if t not in STEP_TYPES:
                bad(st, "type", f"type={t!r} is not one of {', '.join(STEP_TYPES)}")
                continue
            if t == "nop":
                if not 0 <= st.cnt <= max_cnt:
                    bad(st, "cnt", f"cnt={st.cnt} must be in 0..{max_cnt}")
            elif not 1 <= st.cnt <= max_cnt:
                bad(st, "cnt", f"cnt={st.cnt} must be in 1..{max_cnt}")
            for buf, off, used in ((st.srcbuf, st.srcoff, t in READS_SRC),
                                   (st.dstbuf, st.dstoff, t in WRITES_DST)):
                size = sizes.get(buf)
                if size is None or not ((off == -1 or 0 <= off < size)
                                        and (not used or 0 <= off <= size - st.cnt)):
                    self.offset(st, buf, off, used, sizes, bad)
            if t in WRITES_DST and st.dstbuf == "i" and writes_input_bad:
                bad(st, "input", f"{t} writes the input buffer i, which an out-of-place call "
                    "must leave intact")
            if t in SENDS and tb.send < 0:
                bad(st, "send", f"{t} sends but the threadblock has send=-1")
            if t in RECVS and tb.recv < 0:
                bad(st, "recv", f"{t} receives but the threadblock has recv=-1")
            if st.hasdep != 0 and st.hasdep != 1:
                bad(st, "hasdep", f"hasdep={st.hasdep} must be 0 or 1")
            if st.depid != -1 or st.deps != -1 or t == "nop":
                self.dependency(g, tb, st, by_id, depended, bad)
            if t == "nop":
                nxt = steps[pos + 1] if pos < last else None
                if nxt is None:
                    bad(st, "nop", "a nop ends the threadblock; a nop chain must end in a real "
                        "step")
                elif nxt.type != "nop" and nxt.depid < 0:
                    self.bad(nxt.line, "nop", "a real step after nop(s) must itself have a "
                             "dependency (the parser folds the nops into it)", g.id, tb.id, nxt.s)

    @staticmethod
    def offset(st: Step, buf: str, off: int, used: bool, sizes: dict[str, int],
               bad: Callable[[Step, str, str], None]) -> None:
        size = sizes.get(buf)
        if size is None:
            bad(st, "offset", f"buffer {buf!r} is not one of i, o, s")
        elif off < -1 or (off >= max(size, 0) and off != -1):
            bad(st, "offset", f"offset {off} into {buf} must be in -1..{size - 1}")
        elif used and (off < 0 or off + st.cnt > size):
            bad(st, "offset", f"{st.type} uses {buf}[{off}..{off + st.cnt - 1}] outside the "
                f"{size} chunk(s) of {buf}")

    def dependency(self, g: Gpu, tb: Tb, st: Step, by_id: dict[int, Tb],
                   depended: dict[tuple[int, int], int],
                   bad: Callable[[Step, str, str], None]) -> None:
        if st.depid == -1 and st.deps == -1:
            if st.type == "nop":
                bad(st, "nop", "a nop without a dependency does nothing")
            return
        if st.depid < 0 or st.deps < 0:
            bad(st, "dep", f"depid={st.depid} deps={st.deps}: both must be -1 or both >= 0")
            return
        target = by_id.get(st.depid)
        if st.depid > self.rt.max_depid:
            bad(st, "dep", f"depid={st.depid}: the runtimes store depid in an int8_t, so it "
                f"wraps to {layout.stored_depid(st.depid)} and the step waits on the wrong "
                f"threadblock (at most {self.rt.max_depid})")
        elif target is None:
            bad(st, "dep", f"depid={st.depid} is not a threadblock of gpu {g.id}")
        elif st.depid == tb.id:
            bad(st, "dep", "depends on its own threadblock (steps already run in order; a "
                "later step would hang)")
        elif st.deps >= len(target.steps):
            bad(st, "dep", f"deps={st.deps} but tb {st.depid} has {len(target.steps)} steps")
        else:
            depended.setdefault((st.depid, st.deps), st.line)

    # ---- both ends of each connection ---------------------------------------------------------
    def connections(self) -> None:
        gpus = {g.id: g for g in self.algo.gpus}
        ends: dict[tuple[int, int, int, str], list] = {}
        for g in self.algo.gpus:
            for tb in g.tbs:
                if tb.send >= 0:
                    ends[(g.id, tb.send, tb.chan, "s")] = [
                        (g.id, tb, st) for st in tb.steps if st.type in SENDS]
                if tb.recv >= 0:
                    ends[(tb.recv, g.id, tb.chan, "r")] = [
                        (g.id, tb, st) for st in tb.steps if st.type in RECVS]
        for (src, dst, chan, kind), seq in ends.items():
            other_kind = "r" if kind == "s" else "s"
            other = ends.get((src, dst, chan, other_kind))
            peer = dst if kind == "s" else src
            me = src if kind == "s" else dst
            if other is None:
                if peer in gpus or not self.partial:
                    owner: Tb | None = seq[0][1] if seq else None
                    line = owner.line if owner is not None else self.algo.line
                    self.bad(line, "match", f"{'send' if kind == 's' else 'recv'} peer {peer} on "
                             f"channel {chan} has no threadblock on gpu {peer} with "
                             f"{'recv' if kind == 's' else 'send'}={me} chan={chan}", me,
                             owner.id if owner is not None else None)
                continue
            if kind == "s":
                self.pair(src, dst, chan, seq, other)

    def pair(self, src: int, dst: int, chan: int, sends: list, recvs: list) -> None:
        if len(sends) != len(recvs):
            g, tb, _st = (sends or recvs)[0]
            self.bad(tb.line, "match", f"gpu {src} sends {len(sends)} message(s) to gpu {dst} on "
                     f"channel {chan} but gpu {dst} receives {len(recvs)}", g, tb.id)
        for k, ((_gs, ts, ss), (gr, tr, sr)) in enumerate(zip(sends, recvs, strict=False)):
            if ss.cnt == sr.cnt and (ss.type != "s" or sr.type not in _STORES or ss.dstoff < 0
                                     or (ss.dstbuf == sr.dstbuf and ss.dstoff == sr.dstoff)):
                continue
            here = f"gpu {gr} tb {tr.id} step {sr.s} (line {sr.line})"
            if ss.cnt != sr.cnt:
                self.bad(ss.line, "match", f"message #{k} to gpu {dst} on channel {chan} has "
                         f"cnt={ss.cnt} but its receive {here} has cnt={sr.cnt}", src, ts.id,
                         ss.s)
            if (ss.type == "s" and sr.type in _STORES and ss.dstoff >= 0
                    and (ss.dstbuf, ss.dstoff) != (sr.dstbuf, sr.dstoff)):
                self.bad(ss.line, "order", f"message #{k} to gpu {dst} on channel {chan} is "
                         f"meant for {ss.dstbuf}[{ss.dstoff}] but its receive {here} stores at "
                         f"{sr.dstbuf}[{sr.dstoff}]: sends and receives are out of order",
                         src, ts.id, ss.s)

    # ---- wait cycles -------------------------------------------------------------------------
    def cycles(self) -> None:
        """Steps wait for their predecessor, their dependency and (receives) their send.

        Nodes are steps numbered in document order, so a step's predecessor is the node
        before it unless it opens its threadblock; only the other waits are stored."""
        ranges: list[tuple[int, Gpu, Tb]] = []  # (first node, gpu, tb) in document order
        base: dict[tuple[int, int], tuple[int, int]] = {}  # (gpu, tb id) -> first node, steps
        total = 0
        for g in self.algo.gpus:
            for tb in g.tbs:
                ranges.append((total, g, tb))
                base[(g.id, tb.id)] = (total, len(tb.steps))
                total += len(tb.steps)
        opens = bytearray(total + 1)  # 1 where a node has no predecessor in its threadblock
        waits: defaultdict[int, list[int]] = defaultdict(list)  # node -> nodes waiting on it
        indeg = [1] * total
        sends: defaultdict[tuple[int, int, int], list[int]] = defaultdict(list)
        recvs: defaultdict[tuple[int, int, int], list[int]] = defaultdict(list)
        for first, g, tb in ranges:
            if tb.steps:
                opens[first] = 1
                indeg[first] = 0
            sending, receiving = tb.send >= 0, tb.recv >= 0
            for me, st in enumerate(tb.steps, first):
                if st.depid >= 0:
                    dep_first, dep_len = base.get((g.id, st.depid), (0, 0))
                    if 0 <= st.deps < dep_len:
                        waits[dep_first + st.deps].append(me)
                        indeg[me] += 1
                if sending and st.type in SENDS:
                    sends[(g.id, tb.send, tb.chan)].append(me)
                if receiving and st.type in RECVS:
                    recvs[(tb.recv, g.id, tb.chan)].append(me)
        for key, rs in recvs.items():
            for s, r in zip(sends.get(key, ()), rs, strict=False):
                waits[s].append(r)
                indeg[r] += 1
        opens[total] = 1
        ready = [v for v, d in enumerate(indeg) if d == 0]
        done = 0
        while ready:
            v = ready.pop()
            done += 1
            if not opens[v + 1]:
                indeg[v + 1] -= 1
                if not indeg[v + 1]:
                    ready.append(v + 1)
            for w in waits.get(v, ()):
                indeg[w] -= 1
                if not indeg[w]:
                    ready.append(w)
        if done == total:
            return
        left = {v for v, d in enumerate(indeg) if d > 0}
        preds: defaultdict[int, list[int]] = defaultdict(list)
        for v, ws in waits.items():
            for w in ws:
                preds[w].append(v)
        for v in left:
            if not opens[v]:
                preds[v].append(v - 1)
            preds[v].sort()
        cycle = _find_cycle(left, preds)
        starts = [first for first, _g, _tb in ranges]

        def where(v: int) -> tuple[int, Tb, Step]:
            first, g, tb = ranges[bisect_right(starts, v) - 1]
            return g.id, tb, tb.steps[v - first]

        shown = " <- ".join(f"gpu {gid} tb {tb.id} step {st.s}"
                            for gid, tb, st in map(where, cycle[:8]))
        gid, tb, st = where(cycle[0])
        self.bad(st.line, "cycle", f"{len(left)} step(s) wait on each other in a cycle and never "
                 f"run: {shown}{' ...' if len(cycle) > 8 else ''}", gid, tb.id, st.s)


def _find_cycle(left: set[int], preds: dict[int, list[int]]) -> list[int]:
    """Walk predecessors inside the stuck set until a node repeats."""
    v = min(left)
    seen: dict[int, int] = {}
    path: list[int] = []
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = next(p for p in preds[v] if p in left)
    return path[seen[v]:]


def _short(items: list[int]) -> str:
    return ", ".join(map(str, items[:10])) + (" ..." if len(items) > 10 else "")
