"""The MSCCL XML document as plain dataclasses, and its writer.

One model serves the lowering (which builds it), the writer (no XML declaration:
the executor's hand-written parser fails on ``?>``) and the reader (``parse.py``, which keeps
line numbers so every violation can point into the file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDS = frozenset({"s", "rcs", "rrs", "rrcs"})
RECVS = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
REDUCES = frozenset({"rrs", "rrc", "rrcs", "re"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
BUFFERS = ("i", "o", "s")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
              "hasdep")


@dataclass
class Step:
    s: int
    type: str
    srcbuf: str = "i"
    srcoff: int = -1
    dstbuf: str = "o"
    dstoff: int = -1
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: int = 0
    line: int = 0


@dataclass
class Tb:
    id: int
    send: int = -1
    recv: int = -1
    chan: int = 0
    steps: list[Step] = field(default_factory=list)
    line: int = 0


@dataclass
class Gpu:
    id: int
    i_chunks: int = 0
    o_chunks: int = 0
    s_chunks: int = 0
    tbs: list[Tb] = field(default_factory=list)
    line: int = 0

    def size(self, buf: str) -> int:
        return {"i": self.i_chunks, "o": self.o_chunks, "s": self.s_chunks}.get(buf, 0)


@dataclass
class Algo:
    """``attrs`` keeps the header as written (strings) so unknown or optional ones survive."""

    attrs: dict[str, str]
    gpus: list[Gpu] = field(default_factory=list)
    comment: str = ""
    line: int = 0

    def int_attr(self, key: str, default: int = 0) -> int:
        try:
            return int(self.attrs.get(key, default))
        except ValueError:
            return default

    @property
    def ngpus(self) -> int:
        return self.int_attr("ngpus")

    @property
    def nchunksperloop(self) -> int:
        return self.int_attr("nchunksperloop")

    @property
    def coll(self) -> str:
        return self.attrs.get("coll", "")


def to_text(algo: Algo) -> str:
    """Serialize: an optional leading comment, then ``<algo>``, two-space indented.

    Written directly rather than through ElementTree: files for 64+ GPUs hold tens of
    thousands of steps and a string template is several times faster.
    """
    out = [head_text(algo.attrs, algo.comment)]
    for g in algo.gpus:
        out.append(f'  <gpu id="{g.id}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" '
                   f's_chunks="{g.s_chunks}">')
        for tb in g.tbs:
            out.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            out.extend(
                f'      <step s="{st.s}" type="{st.type}" srcbuf="{st.srcbuf}" '
                f'srcoff="{st.srcoff}" dstbuf="{st.dstbuf}" dstoff="{st.dstoff}" cnt="{st.cnt}" '
                f'depid="{st.depid}" deps="{st.deps}" hasdep="{st.hasdep}"/>'
                for st in tb.steps
            )
            out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def head_text(attrs: dict[str, str], comment: str = "") -> str:
    """The optional leading comment and the ``<algo>`` start tag (no trailing newline)."""
    tag = "<algo " + " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items()) + ">"
    return f"<!-- {comment} -->\n{tag}" if comment else tag
