"""Read MSCCL XML into the model, keeping line numbers, never raising on bad input.

expat reports the line of every start tag, which ElementTree drops. Anything the runtimes'
parsers would reject at this level (declaration, unknown elements, missing or non-integer
attributes, the attribute count and length limits) becomes a ``Violation`` with rule ``xml``,
``structure``, ``attr`` or ``limit``; the model is still built as far as it can be.

The runtimes read XML with a hand-written tokenizer, not a conforming parser: only space,
newline and carriage return separate nodes, one space separates attributes, a value is
double-quoted right after ``=``, a tag ends on the line it starts, and a comment's first word
is read as a tag name. What expat accepts but that tokenizer does not becomes rule ``token``.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from choreo.collector import collector_paused
from choreo.msccl.layout import MAX_ATTR_LEN, MAX_ATTRS, RUNTIMES
from choreo.msccl.violation import Violation
from choreo.msccl.xmlmodel import BUFFERS, STEP_ATTRS, STEP_TYPES, Algo, Gpu, Step, Tb

PARSE_RULES = frozenset({"xml", "structure", "attr"})
# (a quick test true wherever the pattern could match, the pattern, what is wrong): substring
# counts keep the scan of a 17 MB file to milliseconds, as choreo's own files match none.
_TOKEN_PROBLEMS: tuple[tuple[Callable[[str], bool], re.Pattern[str], str], ...] = (
    (lambda t: "\t" in t, re.compile(r"\t"), "a tab: the runtimes' tokenizer separates only by "
     "space, newline and carriage return"),
    (lambda t: "<!--" in t, re.compile(r"<!--(?! )"), "'<!--' not followed by a space: the "
     "runtimes read the comment's first word as a tag name"),
    (lambda t: t.count("\n") != t.count(">\n") or "\r" in t, re.compile(r"<(?!!--)[^>]*[\r\n]"),
     "a tag split across lines: the runtimes' tokenizer expects every attribute and the "
     "closing '>' on the tag's own line"),
    (lambda t: "'" in t, re.compile(r"<(?!!--)[^>]*=\s*'"), "a single-quoted attribute value: "
     "the runtimes read a value up to the next double quote"),
    (lambda t: " =" in t or "= " in t or "\n=" in t or "=\n" in t,
     re.compile(r"<(?!!--)[^>]*?(?:\s=|=\s)"), "spaces around '=': the runtimes expect "
     "name=\"value\" with nothing between"),
)
MAX_TOKEN_REPORTS = 5  # per problem: one is enough to fix, a few show it is systematic
_INT = re.compile(r"-?[0-9]+\Z")
_CHILD = {"algo": "gpu", "gpu": "tb", "tb": "step"}
_STEP_INTS = ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep")
_STEP_ATTR_SET = frozenset(STEP_ATTRS)


@lru_cache(maxsize=1 << 16)
def _integer(raw: str) -> int | None:
    """``raw`` as the runtimes read an integer attribute, or None; a file repeats a few
    thousand distinct values across its steps, so each is checked once."""
    return int(raw) if _INT.match(raw.strip()) else None


class _Plain(dict[str, int]):
    """A short plain integer as written (``-?[0-9]{1,18}``, nothing around it) -> its value;
    any other text is missing. A step whose every attribute is plain can break no reading rule
    (no strip, no length limit, no bad integer), so it skips the per-attribute checks."""

    def __missing__(self, raw: str) -> int:
        if not _PLAIN_INT.match(raw):
            raise KeyError(raw)
        self[raw] = value = int(raw)
        return value


_PLAIN_INT = re.compile(r"-?[0-9]{1,18}\Z")
_PLAIN_TYPES = {t: t for t in STEP_TYPES}
_PLAIN_BUFFERS = {b: b for b in BUFFERS}


@dataclass
class Parsed:
    algo: Algo | None
    violations: list[Violation] = field(default_factory=list)
    declaration: bool = False

    @property
    def usable(self) -> bool:
        """True if the model is complete enough to execute."""
        return self.algo is not None and not any(v.rule in PARSE_RULES for v in self.violations)


class _Reader:
    def __init__(self) -> None:
        self.out = Parsed(None)
        self.stack: list[str] = []
        self.gpu: Gpu | None = None
        self.tb: Tb | None = None
        self.comment = ""
        self.seen_root = False
        self.plain = _Plain()
        self.parser = xml.parsers.expat.ParserCreate()
        self.parser.StartElementHandler = self.start
        self.parser.EndElementHandler = self.end
        self.parser.CommentHandler = self.on_comment
        self.parser.XmlDeclHandler = self.on_decl

    def bad(self, rule: str, msg: str, tb: int | None = None, step: int | None = None) -> None:
        gpu = self.gpu.id if self.gpu is not None else None
        if tb is None and self.tb is not None:
            tb = self.tb.id
        self.out.violations.append(
            Violation(self.parser.CurrentLineNumber, gpu, tb, step, rule, msg))

    def on_decl(self, version: str | None, encoding: str | None, standalone: int) -> None:
        self.out.declaration = True
        self.bad("xml", "an <?xml ...?> declaration: the executor's parser fails on '?>'; "
                 "remove it (a leading comment is fine)")

    def on_comment(self, text: str) -> None:
        if not self.seen_root and not self.comment:
            self.comment = text.strip()

    def ints(self, tag: str, attrs: dict[str, str], names: tuple[str, ...],
             step: int | None = None) -> dict[str, int]:
        values: dict[str, int] = {}
        for name in names:
            raw = attrs.get(name)
            value = None if raw is None else _integer(raw)
            if value is not None:
                values[name] = value
                continue
            values[name] = -1
            if raw is None:
                self.bad("attr", f"<{tag}> lacks required attribute {name!r}", step=step)
            else:
                self.bad("attr", f"<{tag}> attribute {name}={raw!r} is not an integer", step=step)
        return values

    def limits(self, tag: str, attrs: dict[str, str], step: int | None = None) -> None:
        if len(attrs) <= MAX_ATTRS and max(map(len, attrs.values()), default=0) <= MAX_ATTR_LEN:
            return
        if len(attrs) > MAX_ATTRS:
            self.bad("limit", f"<{tag}> has {len(attrs)} attributes; the executor's parser "
                     f"keeps at most {MAX_ATTRS}", step=step)
        for key, value in attrs.items():
            if len(value) > MAX_ATTR_LEN:
                self.bad("limit", f"<{tag}> attribute {key} is {len(value)} characters; "
                         f"at most {MAX_ATTR_LEN} are kept", step=step)

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if (tag == "step" and len(attrs) == len(STEP_ATTRS) and self.stack
                and self.stack[-1] == "tb"):
            try:  # ten attributes, each one of the ten names: nothing else to check
                k, b = self.plain, _PLAIN_BUFFERS
                step = Step(k[attrs["s"]], _PLAIN_TYPES[attrs["type"]], b[attrs["srcbuf"]],
                            k[attrs["srcoff"]], b[attrs["dstbuf"]], k[attrs["dstoff"]],
                            k[attrs["cnt"]], k[attrs["depid"]], k[attrs["deps"]],
                            k[attrs["hasdep"]], self.parser.CurrentLineNumber)
            except KeyError:
                pass
            else:
                self.stack.append(tag)
                assert self.tb is not None
                self.tb.steps.append(step)
                return
        parent = self.stack[-1] if self.stack else None
        self.stack.append(tag)
        line = self.parser.CurrentLineNumber
        expected = _CHILD.get(parent, "") if parent else "algo"
        if tag != expected:
            where = f"inside <{parent}>" if parent else "as the document element"
            self.bad("structure", f"unexpected <{tag}> {where} (expected <{expected or 'none'}>)")
            self.stack[-1] = "?"
            return
        if tag == "algo":
            self.seen_root = True
            self.limits(tag, attrs)
            self.out.algo = Algo(dict(attrs), comment=self.comment, line=line)
        elif tag == "gpu":
            v = self.ints(tag, attrs, ("id", "i_chunks", "o_chunks", "s_chunks"))
            self.gpu = Gpu(v["id"], v["i_chunks"], v["o_chunks"], v["s_chunks"], line=line)
            self.limits(tag, attrs)
            assert self.out.algo is not None
            self.out.algo.gpus.append(self.gpu)
        elif tag == "tb":
            v = self.ints(tag, attrs, ("id", "send", "recv", "chan"))
            self.tb = Tb(v["id"], v["send"], v["recv"], v["chan"], line=line)
            self.limits(tag, attrs)
            assert self.gpu is not None
            self.gpu.tbs.append(self.tb)
        else:
            assert self.tb is not None
            pos = len(self.tb.steps)
            v = self.ints(tag, attrs, _STEP_INTS, step=pos)
            for name in ("type", "srcbuf", "dstbuf"):
                if name not in attrs:
                    self.bad("attr", f"<step> lacks required attribute {name!r}", step=pos)
            extra = sorted(attrs.keys() - _STEP_ATTR_SET)
            if extra:
                self.bad("attr", f"<step> has unknown attribute(s) {', '.join(extra)}", step=pos)
            self.limits(tag, attrs, step=pos)
            self.tb.steps.append(Step(
                v["s"], attrs.get("type", "?"), attrs.get("srcbuf", "?"), v["srcoff"],
                attrs.get("dstbuf", "?"), v["dstoff"], v["cnt"], v["depid"], v["deps"],
                v["hasdep"], line=line))

    def end(self, tag: str) -> None:
        # What closes is what the stack says opened: an unexpected <tb> inside a <tb> was
        # kept as "?", and its </tb> must not end the <tb> around it.
        closed = self.stack.pop()
        if closed == "gpu":
            self.gpu = None
        elif closed == "tb":
            self.tb = None


def token_violations(text: str) -> list[Violation]:
    """What the runtimes' hand-written tokenizer rejects although the text is valid XML."""
    out = []
    if text.startswith("\ufeff"):
        out.append(Violation(1, None, None, None, "token", "a UTF-8 byte order mark: the "
                             "runtimes expect '<' as the first character"))
    for candidate, pattern, message in _TOKEN_PROBLEMS:
        if not candidate(text):
            continue
        for k, found in enumerate(pattern.finditer(text)):
            if k == MAX_TOKEN_REPORTS:
                break
            line = text.count("\n", 0, found.end() - 1) + 1
            out.append(Violation(line, None, None, None, "token", message))
    return out


def parse(text: str) -> Parsed:
    """Parse MSCCL XML text; malformed XML yields a single ``xml`` violation with its line."""
    reader = _Reader()
    try:
        with collector_paused():
            reader.parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as err:
        reader.gpu = reader.tb = None
        reader.out.violations.append(Violation(
            err.lineno, None, None, None, "xml",
            f"not well-formed XML: {xml.parsers.expat.ErrorString(err.code)} "
            f"(column {err.offset + 1})"))
        reader.out.algo = None
        return reader.out
    if reader.out.algo is None:
        reader.out.violations.append(Violation(1, None, None, None, "structure",
                                               "no <algo> element"))
    return reader.out


_COMMENT_KEY = re.compile(r"\b(dialect|root)=(\S+)")


def comment_fields(algo: Algo) -> dict[str, str]:
    """``key=value`` pairs choreo writes in the leading comment (dialect, root, ...)."""
    return dict(_COMMENT_KEY.findall(algo.comment))


def detect_dialect(algo: Algo, given: str | None = None) -> str:
    """The dialect: as given, else from the ``coll`` spelling, else from choreo's comment,
    else the executor's (the stricter step limit)."""
    if given:
        return given
    coll = algo.coll
    if coll in ("reduce_scatter", "custom"):
        return "legacy"
    if coll in ("reducescatter", "gather", "scatter", "send", "recv", "alltoallv"):
        return "executor"
    hinted = comment_fields(algo).get("dialect")
    return hinted if hinted in RUNTIMES else "executor"
