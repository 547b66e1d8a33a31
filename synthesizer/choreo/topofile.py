"""Topology files (YAML or JSON) and the one entry point that resolves ``--topology``.

The format is ``Topology.to_dict()`` plus conveniences for hand-written files, all described in
``schemas/topology.schema.json``: ``npus``/``switches`` counts instead of a ``nodes`` list,
top-level ``defaults`` for link fields, ``bidirectional`` and ``count`` on a link, and unit
strings (``'25GB/s'``, ``'0.5us'``). Unit strings also rescue a YAML quirk: PyYAML reads
``25e9`` (no dot) as a string, which we accept as a plain number.

Every problem is an ``InputError`` of the form ``fab.yaml: links[3].bandwidth: -5 is not
positive``, naming the file and the JSON path as written (before conveniences expand).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from choreo.errors import InputError
from choreo.generators import build, is_builtin_name
from choreo.topology import MAX_LINKS, MAX_NPUS, Link, NodeKind, Topology

FILE_SUFFIXES = (".yaml", ".yml", ".json")

_NUMBER = r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*"
_BANDWIDTH = re.compile(rf"^{_NUMBER}((?:[KMGT]i?)?B/s|[KMGT]b/s|[KMGT]bps)?\s*$")
_DURATION = re.compile(rf"^{_NUMBER}(s|ms|us|µs|ns)?\s*$")
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@cache
def topology_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of topology files."""
    text = resources.files("choreo").joinpath("schemas/topology.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def parse_bandwidth(value: Any) -> float:
    """Bytes per second from a number or a unit string ('25GB/s', '400Gbps', '1GiB/s')."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = _BANDWIDTH.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a bandwidth like 25e9, '25GB/s' or '400Gbps'")
    number, unit = float(m.group(1)), m.group(2) or "B/s"
    if unit.endswith("B/s"):
        prefix = unit[:-3]
        return number * (_BINARY[prefix] if "i" in prefix else _PREFIX[prefix])
    return number * _PREFIX[unit[0]] / 8  # bits per second


def parse_duration(value: Any) -> float:
    """Seconds from a number or a unit string ('0.5us', '700 ns', '1.7e-6')."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a latency like 5e-7, '0.5us' or '700ns'")
    return float(m.group(1)) * _TIME[m.group(2)]


# ---- schema errors as one readable line ------------------------------------------------------
def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _pick(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For oneOf/anyOf failures, the branch error that explains the value best (not 'type')."""
    while error.context:
        specific = [e for e in error.context if e.validator != "type"]
        if not specific:
            break
        error = min(specific, key=lambda e: len(e.relative_path))
    return error


def _describe(error: jsonschema.ValidationError) -> str:
    v, what = error.instance, error.validator
    if what == "exclusiveMinimum" and error.validator_value == 0:
        return f"{v!r} is not positive"
    if what == "minimum" and error.validator_value == 0:
        return f"{v!r} is negative"
    if what == "minimum":
        return f"{v!r} is less than {error.validator_value}"
    if what == "required":
        return error.message.replace(" is a required property", " is required")
    if what == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(v) - set(allowed)) if isinstance(v, dict) else []
        return f"unknown field(s) {', '.join(map(repr, extra))} (allowed: {', '.join(allowed)})"
    if what == "type":
        return f"expected {error.validator_value}, got {v!r}"
    if what == "pattern":
        return f"{v!r} is not {error.schema.get('x-expected', 'valid')}"
    if what in ("oneOf", "anyOf"):
        return f"{v!r} is not valid here"
    return error.message


def _check_schema(doc: Any, where: str) -> None:
    validator = jsonschema.Draft202012Validator(topology_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.path)), e.validator))
    if errors:
        first = _pick(errors[0])
        at = _path(first.absolute_path)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise InputError(f"{where}: {at + ': ' if at else ''}{_describe(first)}{more}")


# ---- document -> Topology ---------------------------------------------------------------------
def topology_from_doc(doc: Any, where: str = "topology") -> Topology:
    """Validate a parsed document against the schema and build the fabric it describes."""
    _check_schema(doc, where)
    kinds, names = _nodes(doc, where)
    n = len(kinds)
    defaults = doc.get("defaults", {})
    links: list[Link] = []
    expanded = 0
    for i, raw in enumerate(doc["links"]):
        at = f"{where}: links[{i}]"
        merged = {**defaults, **raw}
        for end in ("src", "dst"):
            if merged[end] >= n:
                raise InputError(f"{at}.{end}: node {merged[end]} does not exist (0..{n - 1})")
        if merged["src"] == merged["dst"]:
            raise InputError(f"{at}: a link from node {merged['src']} to itself")
        if "bandwidth" not in merged:
            raise InputError(f"{at}.bandwidth: is required (or set defaults.bandwidth)")
        bandwidth = _convert(parse_bandwidth, merged["bandwidth"], f"{at}.bandwidth")
        if not bandwidth > 0:
            raise InputError(f"{at}.bandwidth: {merged['bandwidth']!r} is not positive")
        alpha = _convert(parse_duration, merged.get("alpha", 0.0), f"{at}.alpha")
        link = Link(
            src=merged["src"],
            dst=merged["dst"],
            alpha=alpha,
            bandwidth=bandwidth,
            kind=merged.get("kind", "generic"),
            healthy=merged.get("healthy", True),
            via=tuple(merged.get("via", ())),
        )
        expanded += merged.get("count", 1) * (2 if merged.get("bidirectional", False) else 1)
        if expanded > MAX_LINKS:
            raise InputError(f"{at}.count: the links expand to {expanded:,} or more, more than "
                             f"the {MAX_LINKS:,} a fabric may have")
        for _ in range(merged.get("count", 1)):
            links.append(link)
            if merged.get("bidirectional", False):
                links.append(Link(link.dst, link.src, alpha, bandwidth, link.kind, link.healthy))
    for j, v in enumerate(doc.get("failed", ())):
        if v >= n:
            raise InputError(f"{where}: failed[{j}]: node {v} does not exist (0..{n - 1})")
    for j, v in enumerate(doc.get("reducing", ())):
        if v >= n or kinds[v] is not NodeKind.SWITCH:
            what = "does not exist" if v >= n else "is not a switch"
            raise InputError(f"{where}: reducing[{j}]: node {v} {what}")
    topo = Topology(
        name=doc.get("name", Path(where).stem if where != "topology" else "custom"),
        kinds=kinds,
        links=tuple(links),
        failed=frozenset(doc.get("failed", ())),
        names=names,
        dims=tuple(doc.get("dims", ())),
        reducing=frozenset(doc.get("reducing", ())),
    )
    topo.validate(where)
    return topo


def _convert(parse: Any, value: Any, at: str) -> float:
    try:
        result: float = parse(value)
    except ValueError as exc:
        raise InputError(f"{at}: {exc}") from None
    return result


def _nodes(doc: dict[str, Any], where: str) -> tuple[tuple[NodeKind, ...], tuple[str, ...]]:
    if "nodes" in doc and ("npus" in doc or "switches" in doc):
        raise InputError(f"{where}: give either 'nodes' or 'npus'/'switches', not both")
    if "nodes" not in doc:
        if "npus" not in doc:
            raise InputError(f"{where}: 'nodes' or 'npus' is required")
        n = doc["npus"] + doc.get("switches", 0)
        if n > MAX_NPUS:
            raise InputError(f"{where}: npus: {n:,} nodes, more than the {MAX_NPUS:,} a fabric "
                             "may have")
        kinds = (NodeKind.NPU,) * doc["npus"] + (NodeKind.SWITCH,) * doc.get("switches", 0)
        return kinds, ()
    nodes = doc["nodes"]
    kinds = tuple(NodeKind(x.get("kind", "npu")) for x in nodes)
    named = [i for i, x in enumerate(nodes) if "name" in x]
    if not named:
        return kinds, ()
    if len(named) != len(nodes):
        missing = next(i for i, x in enumerate(nodes) if "name" not in x)
        raise InputError(f"{where}: nodes[{missing}].name: name every node or none")
    seen: dict[str, int] = {}
    for i, x in enumerate(nodes):
        if x["name"] in seen:
            raise InputError(
                f"{where}: nodes[{i}].name: {x['name']!r} is already nodes[{seen[x['name']]}]"
            )
        seen[x["name"]] = i
    return kinds, tuple(x["name"] for x in nodes)


# ---- files ------------------------------------------------------------------------------------
def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file; syntax errors name the file, line and column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{path}{pos}: invalid YAML: {problem}") from None


def load_topology_file(path: str | Path) -> Topology:
    doc = read_document(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping with 'nodes' and 'links' at the top level")
    return topology_from_doc(doc, str(path))


def load_topology(spec: str) -> Topology:
    """Resolve ``--topology``: an existing file, or a built-in name such as ``torus-8x8``."""
    text = spec.strip()
    if not text:
        raise InputError("topology: empty name")
    path = Path(text)
    if path.suffix.lower() in FILE_SUFFIXES or path.is_file():
        return load_topology_file(path)
    if not is_builtin_name(text) and (os.sep in text or "/" in text):
        raise InputError(f"{text}: no such file")
    return build(text)


def save_topology(topo: Topology, path: str | Path) -> None:
    """Write ``topo`` as YAML or JSON (by suffix), atomically: no partial file on failure."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise InputError(f"{path}: unknown topology file type (use {', '.join(FILE_SUFFIXES)})")
    doc = topo.to_dict()
    if suffix == ".json":
        text = _json_text(doc)
    else:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    fd, tmp = tempfile.mkstemp(dir=p.parent or Path("."), prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_text(doc: dict[str, Any]) -> str:
    """Pretty JSON with one node or link per line: diffable and still small."""
    parts = []
    for key, value in doc.items():
        if key in ("nodes", "links") and value:
            rows = ",\n    ".join(json.dumps(x, separators=(", ", ": ")) for x in value)
            parts.append(f'  "{key}": [\n    {rows}\n  ]')
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"
