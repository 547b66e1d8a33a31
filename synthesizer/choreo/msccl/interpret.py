"""Execute an MSCCL XML file the way the runtime does, on symbolic buffers.

Every threadblock of every rank runs its steps in order. A step first waits for its
dependency (the runtime's per-threadblock flag holds the index of the last completed step with
``hasdep="1"``; ``depid``/``deps`` waits until it reaches ``deps``), then for a message from its
receive peer on its channel (connections are FIFOs per sender, receiver and channel, matched in
order), then for room on its send connection (``FIFO_CHUNKS`` chunk messages in flight). Values
are symbolic: a data chunk is (origin rank, input unit); a partial reduction is (unit, set of
contributing ranks), and adding a rank twice or mixing units is an error. At the end every
output must hold exactly what the collective promises, in each call mode the file declares
(in-place aliases input and output).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from choreo.errors import InputError
from choreo.msccl import layout
from choreo.msccl.parse import comment_fields, detect_dialect, parse
from choreo.msccl.xmlmodel import READS_SRC, RECVS, SENDS, WRITES_DST, Algo, Step, Tb

MAX_MESSAGES = 30
# Ranks x chunks of one loop the interpreter follows (a 1024-GPU AllReduce file has 6.3 M); a
# file claiming more is refused, not followed until memory runs out.
MAX_CELLS = 1 << 24

# Values: ("d", origin rank, input unit) or ("r", unit, contributor bitmask, problem text).
Value = tuple


@dataclass(frozen=True)
class Stall:
    """Where a deadlocked threadblock stopped, and what it waits for."""

    gpu: int
    tb: int
    step: int
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: gpu {self.gpu} tb {self.tb} step {self.step}: {self.reason}"


@dataclass
class RunResult:
    coll: str
    ngpus: int
    modes: list[str]
    steps: int = 0
    errors: list[str] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.stalls

    def __str__(self) -> str:
        if self.ok:
            return (f"{self.coll} on {self.ngpus} GPUs: completes and computes the collective "
                    f"({', '.join(self.modes)}; {self.steps} steps executed)")
        lines = []
        if self.stalls:
            lines.append(f"DEADLOCK: {len(self.stalls)} threadblock(s) never finish")
            lines += [f"  {s}" for s in self.stalls[:MAX_MESSAGES]]
        lines += [f"  {e}" for e in self.errors[:MAX_MESSAGES]]
        if len(self.errors) > MAX_MESSAGES:
            lines.append(f"  ... and {len(self.errors) - MAX_MESSAGES} more")
        return "\n".join(lines)


def run(xml_text: str, *, capacity: int = layout.FIFO_CHUNKS, root: int | None = None,
        dialect: str | None = None) -> RunResult:
    """Interpret ``xml_text``; InputError if it cannot even be read (with line and place)."""
    parsed = parse(xml_text)
    if not parsed.usable or parsed.algo is None:
        shown = "; ".join(str(v) for v in parsed.violations[:5])
        raise InputError(f"cannot interpret the file: {shown}")
    algo = parsed.algo
    coll = layout.parse_coll(algo.coll)
    if coll is None:
        raise InputError(f"line {algo.line}: cannot interpret coll={algo.coll!r} "
                         "(no fixed postcondition)")
    n, L = algo.ngpus, algo.nchunksperloop
    if n < 1 or L < 1 or len(algo.gpus) != n or sorted(g.id for g in algo.gpus) != list(range(n)):
        raise InputError(f"line {algo.line}: ngpus={n} must be positive and match the <gpu> ids "
                         f"0..{n - 1} (found {len(algo.gpus)} <gpu>); a per-node split file "
                         "cannot be run alone")
    if n * L > MAX_CELLS:
        raise InputError(f"line {algo.line}: ngpus={n} x nchunksperloop={L} is {n * L:,} "
                         f"chunks, more than the interpreter follows ({MAX_CELLS:,})")
    for g in algo.gpus:
        for tb in g.tbs:
            for st in tb.steps:
                if not 0 <= st.cnt <= layout.MAX_CNT:
                    raise InputError(f"line {st.line}: cnt={st.cnt} must be in "
                                     f"0..{layout.MAX_CNT}")
    units = layout.Units(coll, n, L)
    if units.needs_piece_divisible and L % n:
        raise InputError(f"line {algo.line}: nchunksperloop={L} is not a multiple of "
                         f"ngpus={n}, which {algo.coll} needs")
    rt = layout.runtime(detect_dialect(algo, dialect))
    modes = []
    if rt.legacy:  # ``inplace`` is compared with the call's kind; ``outofplace`` is not read
        modes.append("in-place" if algo.attrs.get("inplace") == "1" else "out-of-place")
    else:
        if algo.attrs.get("outofplace") == "1":
            modes.append("out-of-place")
        if algo.attrs.get("inplace") == "1":
            modes.append("in-place")
    the_root = root if root is not None else _root(algo, coll)
    result = RunResult(algo.coll, n, modes)
    result.errors.extend(_mis_stored(algo, rt))
    if result.errors:  # the runtime would not run what the file says: nothing to compute
        return result
    for mode in modes:
        _Machine(algo, units, the_root, mode == "in-place", capacity, result).execute()
    return result


def _mis_stored(algo: Algo, rt: layout.Runtime) -> list[str]:
    """Steps the runtime would store differently from what they say: a ``depid`` past its
    int8_t wraps to another threadblock."""
    return [f"line {st.line}: gpu {g.id} tb {tb.id} step {st.s}: depid={st.depid} does not fit "
            f"the runtime's int8_t (at most {rt.max_depid}); it would wait on tb "
            f"{layout.stored_depid(st.depid)}"
            for g in algo.gpus for tb in g.tbs for st in tb.steps if st.depid > rt.max_depid]


def _root(algo: Algo, coll: layout.Collective) -> int:
    """The root is not in the XML: choreo's comment says it, else the lone rank that never
    receives (broadcast, scatter) or never sends (reduce, gather)."""
    hinted = comment_fields(algo).get("root", "")
    if hinted.isdigit():
        return int(hinted)
    if coll in (layout.Collective.BROADCAST, layout.Collective.SCATTER):
        lone = [g.id for g in algo.gpus if all(tb.recv < 0 for tb in g.tbs)]
    elif coll in (layout.Collective.REDUCE, layout.Collective.GATHER):
        lone = [g.id for g in algo.gpus if all(tb.send < 0 for tb in g.tbs)]
    else:
        return 0
    return lone[0] if len(lone) == 1 else 0


class _Machine:
    def __init__(self, algo: Algo, units: layout.Units, root: int, inplace: bool, capacity: int,
                 result: RunResult) -> None:
        self.algo, self.units, self.root, self.inplace = algo, units, root, inplace
        self.capacity = max(1, capacity)
        self.result = result
        self.mode = "in-place" if inplace else "out-of-place"
        self.combining = units.coll.combining
        self.full = (1 << units.n) - 1
        self.mem: dict[tuple[int, str, int], Value] = {}
        self.alias = {g.id: units.inplace_alias(g.id, root) if inplace else {}
                      for g in algo.gpus}
        self.initial: dict[tuple[int, int], Value] = {}
        for g in algo.gpus:
            if not units.has_input(g.id, root):
                continue
            for k in range(units.in_units):
                v: Value = ("r", k, 1 << g.id, "") if self.combining else ("d", g.id, k)
                self.initial[(g.id, k)] = v
                self.mem[self._cell(g.id, "i", k)] = v
        self.fifo: dict[tuple[int, int, int], deque] = {}
        self.sizes = {g.id: g for g in algo.gpus}
        self.errors = 0

    def error(self, text: str) -> None:
        self.result.errors.append(f"{self.mode}: {text}")

    def _cell(self, gpu: int, buf: str, k: int) -> tuple[int, str, int]:
        if buf == "i":
            alias = self.alias[gpu].get(k)
            if alias is not None:
                return (gpu, "o", alias)
        return (gpu, buf, k)

    def _where(self, g: int, tb: Tb, st: Step) -> str:
        return f"line {st.line}: gpu {g} tb {tb.id} step {st.s} ({st.type})"

    def _read(self, g: int, tb: Tb, st: Step, buf: str, off: int) -> list[Value]:
        gpu = self.sizes[g]
        if off < 0 or off + st.cnt > gpu.size(buf):
            self.error(f"{self._where(g, tb, st)}: reads {buf}[{off}..{off + st.cnt - 1}] "
                       f"outside the {gpu.size(buf)} chunk(s) of {buf}")
            return [("x", "out of bounds")] * st.cnt
        out = []
        for k in range(off, off + st.cnt):
            v = self.mem.get(self._cell(g, buf, k))
            if v is None:
                self.error(f"{self._where(g, tb, st)}: reads {buf}[{k}] before anything was "
                           "written there")
                v = ("x", f"uninitialized {buf}[{k}] of gpu {g}")
            out.append(v)
        return out

    def _write(self, g: int, tb: Tb, st: Step, buf: str, off: int, values: list[Value]) -> None:
        gpu = self.sizes[g]
        if off < 0 or off + len(values) > gpu.size(buf):
            self.error(f"{self._where(g, tb, st)}: writes {buf}[{off}..{off + len(values) - 1}] "
                       f"outside the {gpu.size(buf)} chunk(s) of {buf}")
            return
        for k, v in enumerate(values):
            self.mem[self._cell(g, buf, off + k)] = v

    def _add(self, a: Value, b: Value) -> Value:
        if a[0] == "x" or b[0] == "x":
            return a if a[0] == "x" else b
        if a[0] != "r" or b[0] != "r":
            return ("x", "reduction of data that a non-combining collective never reduces")
        if a[1] != b[1]:
            return ("x", f"sums unit {a[1]} with unit {b[1]}")
        twice = a[2] & b[2]
        problem = a[3] or b[3] or (
            f"counts rank(s) {_ranks(twice)} twice" if twice else "")
        return ("r", a[1], a[2] | b[2], problem)

    def execute(self) -> None:
        tbs = [(g.id, tb) for g in self.algo.gpus for tb in g.tbs]
        index = {(g, tb.id): tb for g, tb in tbs}
        pc = dict.fromkeys(index, 0)
        flag = dict.fromkeys(index, -1)
        senders: dict[tuple[int, int, int], tuple[int, Tb]] = {}
        for g, tb in tbs:
            if tb.send >= 0:
                senders[(g, tb.send, tb.chan)] = (g, tb)
        progress = True
        while progress:
            progress = False
            for g, tb in tbs:
                key = (g, tb.id)
                k = pc[key]
                steps = tb.steps
                while k < len(steps):
                    st = steps[k]
                    if self._blocked(g, tb, st, index, flag) is not None:
                        break
                    self._step(g, tb, st)
                    if st.hasdep == 1:
                        flag[key] = st.s
                    k += 1
                    self.result.steps += 1
                    progress = True
                pc[key] = k
        for g, tb in tbs:
            k = pc[(g, tb.id)]
            if k < len(tb.steps):
                st = tb.steps[k]
                reason = self._blocked(g, tb, st, index, flag) or "blocked"
                self.result.stalls.append(Stall(g, tb.id, st.s, st.line,
                                                f"{self.mode}: {reason}"))
        if self.result.stalls:
            return
        for (src, dst, chan), q in self.fifo.items():
            if q:
                self.error(f"{len(q)} message(s) sent from gpu {src} to gpu {dst} on channel "
                           f"{chan} were never received (first by {q[0][1]})")
        self._check_outputs()

    def _blocked(self, g: int, tb: Tb, st: Step, index: dict, flag: dict) -> str | None:
        """None if ``st`` can run now, else what it waits for."""
        if st.depid >= 0:
            target = index.get((g, st.depid))
            if target is None:
                return f"depends on tb {st.depid}, which does not exist"
            have = flag[(g, st.depid)]
            if have < st.deps:
                unpublished = (st.deps < len(target.steps)
                               and target.steps[st.deps].hasdep != 1)
                return (f"waits for tb {st.depid} step {st.deps} (tb {st.depid} has published "
                        f"step {have})" + ("; that step has hasdep=0, so it is never published"
                                           if unpublished else ""))
        if st.type in RECVS:
            if tb.recv < 0:
                return "receives but the threadblock has recv=-1"
            q = self.fifo.get((tb.recv, g, tb.chan))
            if not q:
                return f"waits for a message from gpu {tb.recv} on channel {tb.chan}"
        if st.type in SENDS:
            if tb.send < 0:
                return "sends but the threadblock has send=-1"
            q = self.fifo.get((g, tb.send, tb.chan))
            if q and sum(len(m[0]) for m in q) + st.cnt > self.capacity:
                return (f"waits for room on the connection to gpu {tb.send} channel {tb.chan} "
                        f"({len(q)} message(s) not yet received)")
        return None

    def _step(self, g: int, tb: Tb, st: Step) -> None:
        t = st.type
        if t == "nop":
            return
        incoming: list[Value] = []
        if t in RECVS:
            values, origin = self.fifo[(tb.recv, g, tb.chan)].popleft()
            if len(values) != st.cnt:
                self.error(f"{self._where(g, tb, st)}: receives cnt={st.cnt} but the matching "
                           f"send ({origin}) sent {len(values)}")
                values = (values + [("x", "count mismatch")] * st.cnt)[: st.cnt]
            incoming = values
        src = self._read(g, tb, st, st.srcbuf, st.srcoff) if t in READS_SRC else []
        if t in ("rrs", "rrc", "rrcs"):
            result = [self._add(a, b) for a, b in zip(incoming, src, strict=True)]
        elif t == "re":
            dst = self._read(g, tb, st, st.dstbuf, st.dstoff)
            result = [self._add(a, b) for a, b in zip(dst, src, strict=True)]
        elif t in ("r", "rcs"):
            result = incoming
        else:  # s, cpy
            result = src
        if t in WRITES_DST:
            self._write(g, tb, st, st.dstbuf, st.dstoff, result)
        if t in SENDS:
            q = self.fifo.setdefault((g, tb.send, tb.chan), deque())
            q.append((result, f"gpu {g} tb {tb.id} step {st.s}"))

    def _check_outputs(self) -> None:
        units = self.units
        for gpu in self.algo.gpus:
            for k, (origin, unit) in units.expected(gpu.id, self.root).items():
                v = self.mem.get(self._cell(gpu.id, "o", k))
                where = f"gpu {gpu.id} o[{k}]"
                if v is None:
                    self.error(f"{where}: never written")
                elif v[0] == "x":
                    self.error(f"{where}: {v[1]}")
                elif origin < 0:
                    if v[0] != "r" or v[1] != unit:
                        self.error(f"{where}: holds {_show(v)}, expected the sum of unit {unit}")
                    elif v[3]:
                        self.error(f"{where}: {v[3]}")
                    elif v[2] != self.full:
                        self.error(f"{where}: lacks the contribution(s) of rank(s) "
                                   f"{_ranks(self.full & ~v[2])}")
                elif v != ("d", origin, unit):
                    self.error(f"{where}: holds {_show(v)}, expected input unit {unit} of "
                               f"rank {origin}")
        if not self.inplace:
            for (g, k), v in self.initial.items():
                if self.mem.get((g, "i", k)) != v:
                    self.error(f"gpu {g} i[{k}]: the input was overwritten (an out-of-place "
                               "call's send buffer must stay intact)")


def _ranks(mask: int) -> str:
    return ",".join(str(r) for r in range(mask.bit_length()) if mask >> r & 1)


def _show(v: Value) -> str:
    if v[0] == "d":
        return f"input unit {v[2]} of rank {v[1]}"
    if v[0] == "r":
        return f"a sum of unit {v[1]} over rank(s) {_ranks(v[2])}"
    return str(v[1])
