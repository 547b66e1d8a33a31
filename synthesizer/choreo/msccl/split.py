"""Per-node files: a rank reads only its own ``<gpu>``, so a file too large for one ConfigMap
(1 MiB) can be cut into one file per node, each with that node's ranks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from xml.parsers import expat

from choreo.errors import InputError

MAX_CONFIGMAP_BYTES = 1 << 20
_LEADING_COMMENT = re.compile(r"\A\s*<!--(.*?)-->", re.S)
_ALGO = re.compile(r"<algo\b[^>]*>")
_GPU = re.compile(r"<gpu\b[^>]*>")
_MARKUP = ("<!", "<?")  # comments, CDATA and DOCTYPE; processing instructions


def rank_nodes(names: Sequence[str], ranks: Sequence[int]) -> list[str]:
    """Each rank's node, as the per-node files are cut: its NPU's ``host/`` name prefix
    (``names``: the fabric's node names)."""
    return [names[v].split("/", 1)[0] for v in ranks]


def fits_configmap(text: str) -> bool:
    return len(text.encode()) <= MAX_CONFIGMAP_BYTES


def split_per_node(xml: str, node_of_rank: Sequence[str], *,
                   check_xml: bool = True) -> dict[str, str]:
    """node name -> the file with only that node's ``<gpu>`` elements (header unchanged, so
    ``ngpus`` still equals the communicator size). The leading comment gains ``node=NAME``,
    which tells ``validate`` the file is partial.

    The ``<gpu>`` elements are cut out of the text as they are, not parsed into a tree and
    written again: a 1024-GPU file is up to 68 MB, and a tree round trip costs seconds. The cut
    checks what it relies on: each ``<gpu>`` closes before the next opens, and only
    whitespace lies between them and around ``</algo>``, so the pieces are the file. With
    ``check_xml`` expat first checks the whole file is well-formed; the operator skips that
    for choreo's own lowering, whose files it ships unparsed when they fit one ConfigMap."""
    if check_xml:
        try:
            expat.ParserCreate().Parse(xml, True)
        except expat.ExpatError as err:
            raise InputError(f"split: not well-formed XML: {err}") from None
    match = _LEADING_COMMENT.match(xml)
    comment = match.group(1).strip() if match else ""
    body_at = match.end() if match else 0
    algo = _ALGO.search(xml, body_at)
    if algo is None or xml[body_at:algo.start()].strip():
        raise InputError("split: the document element is not <algo>")
    if any(xml.find(m, body_at) >= 0 for m in _MARKUP):
        raise InputError("split: only plain MSCCL files can be split (no comments, CDATA or "
                         "processing instructions after the leading comment)")
    ngpus = _attr(algo.group(0), "ngpus")
    if not ngpus.isdigit() or int(ngpus) != len(node_of_rank):
        raise InputError(f"split: node_of_rank names {len(node_of_rank)} ranks but the file has "
                         f"ngpus={ngpus!r}")
    by_node: dict[str, list[str]] = {name: [] for name in node_of_rank}
    ids: dict[str, list[str]] = {name: [] for name in node_of_rank}
    at = algo.end()
    # str.find, not a regular expression, walks the text: a 1024-GPU file is 68 MB.
    while (start := xml.find("<gpu", at)) >= 0:
        gap = xml[at:start]
        if gap and not gap.isspace():
            raise InputError("split: something other than <gpu> elements inside <algo>")
        tag_end = xml.find(">", start) + 1
        tag = xml[start:tag_end]
        if not _GPU.fullmatch(tag):
            raise InputError(f"split: {tag[:40]!r} is not a <gpu> start tag")
        end = tag_end
        if not tag.endswith("/>"):
            close = xml.find("</gpu>", end)
            if close < 0:
                raise InputError(f"split: <gpu id={_attr(tag, 'id')!r}> is never closed")
            if xml.find("<gpu", end, close) >= 0:
                raise InputError("split: a <gpu> element is nested in another")
            end = close + len("</gpu>")
        rank = _attr(tag, "id")
        if not rank.isdigit() or int(rank) >= len(node_of_rank):
            raise InputError(f"split: <gpu id={rank!r}> is not a rank in "
                             f"0..{len(node_of_rank) - 1}")
        name = node_of_rank[int(rank)]
        by_node[name].append(xml[start:end])
        ids[name].append(rank)
        at = end
    if xml[at:].strip() != "</algo>":
        raise InputError("split: the file does not end with </algo> after its <gpu> elements")
    out: dict[str, str] = {}
    # Each node's slices are let go once joined: of a 68 MB file, the text, its slices and
    # the files would otherwise all be held at the end.
    for name in list(by_node):
        members = by_node.pop(name)
        inner = "".join(f"  {m}\n" for m in members)
        out[name] = node_head(comment, algo.group(0), name, ids[name]) + inner + TAIL
    return out


TAIL = "</algo>\n"


def node_head(comment: str, algo_tag: str, name: str, ranks: Sequence[str]) -> str:
    """A node's file up to its first ``<gpu>``: the leading comment with ``node=NAME`` and
    its ranks (which tell ``validate`` the file is partial), and the ``<algo>`` start tag."""
    if "--" in name or not name.strip():
        raise InputError(f"split: node name {name!r} cannot be written into an XML comment")
    head = f"<!-- {comment} node={name} gpus={','.join(ranks)} -->\n"
    return head.replace("<!--  ", "<!-- ") + algo_tag + "\n"


def head_parts(head: str) -> tuple[str, str]:
    """The leading comment's text and the ``<algo>`` start tag of a file's head (its text up
    to the first ``<gpu>``)."""
    match = _LEADING_COMMENT.match(head)
    at = match.end() if match else 0
    algo = _ALGO.search(head, at)
    if algo is None or head[at:algo.start()].strip() or head[algo.end():].strip():
        raise InputError("split: the file's head is not a comment and an <algo> start tag")
    return (match.group(1).strip() if match else ""), algo.group(0)


def _attr(tag: str, key: str) -> str:
    found = re.search(rf"""\s{key}\s*=\s*(["'])(.*?)\1""", tag)
    return found.group(2) if found else ""
