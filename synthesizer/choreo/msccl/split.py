"""Per-node files: a rank reads only its own ``<gpu>``, so a file too large for one ConfigMap
(1 MiB) can be cut into one file per node, each with that node's ranks."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from choreo.errors import InputError

MAX_CONFIGMAP_BYTES = 1 << 20
_LEADING_COMMENT = re.compile(r"\A\s*<!--(.*?)-->", re.S)


def fits_configmap(text: str) -> bool:
    return len(text.encode()) <= MAX_CONFIGMAP_BYTES


def split_per_node(xml: str, node_of_rank: Sequence[str]) -> dict[str, str]:
    """node name -> the file with only that node's ``<gpu>`` elements (header unchanged, so
    ``ngpus`` still equals the communicator size). The leading comment gains ``node=NAME``,
    which tells ``validate`` the file is partial."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as err:
        raise InputError(f"split: not well-formed XML: {err}") from None
    if root.tag != "algo":
        raise InputError(f"split: the document element is <{root.tag}>, not <algo>")
    gpus = root.findall("gpu")
    ngpus = root.get("ngpus", "")
    if not ngpus.isdigit() or int(ngpus) != len(node_of_rank):
        raise InputError(f"split: node_of_rank names {len(node_of_rank)} ranks but the file has "
                         f"ngpus={ngpus!r}")
    match = _LEADING_COMMENT.match(xml)
    comment = match.group(1).strip() if match else ""
    by_node: dict[str, list[ET.Element]] = {}
    for name in node_of_rank:
        by_node.setdefault(name, [])
    for gpu in gpus:
        rank = gpu.get("id", "")
        if not rank.isdigit() or int(rank) >= len(node_of_rank):
            raise InputError(f"split: <gpu id={rank!r}> is not a rank in "
                             f"0..{len(node_of_rank) - 1}")
        by_node[node_of_rank[int(rank)]].append(gpu)
    out: dict[str, str] = {}
    for name, members in by_node.items():
        if "--" in name or not name.strip():
            raise InputError(f"split: node name {name!r} cannot be written into an XML comment")
        part = ET.Element("algo", dict(root.attrib))
        part.text = "\n  "
        part.extend(members)
        ids = ",".join(g.get("id", "?") for g in members)
        body = ET.tostring(part, encoding="unicode", short_empty_elements=True)
        head = f"<!-- {comment} node={name} gpus={ids} -->\n".replace("<!--  ", "<!-- ")
        out[name] = head + body + "\n"
    return out
