"""values.schema.json is strict and complete, values.yaml obeys it, and the values table in
docs/operations.md is the one generated from the schema's descriptions.

Regenerate the table with ``python tests/unit/test_chart_values.py`` and paste it between
the markers in docs/operations.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/choreo"
DOC = ROOT / "docs/operations.md"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
# Kubernetes-shaped values documented as one row each rather than key by key.
OPAQUE = {"resources", "tolerations", "affinity", "stringMap"}


def schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def resolve(node: dict[str, Any], root: dict[str, Any]) -> tuple[dict[str, Any], str]:
    ref = node.get("$ref", "")
    if not ref:
        return node, ""
    name = ref.rsplit("/", 1)[-1]
    return {**root["definitions"][name], **{k: v for k, v in node.items() if k != "$ref"}}, name


def rows(node: dict[str, Any], root: dict[str, Any], prefix: str = ""
         ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted key, resolved schema) of every documented value, in schema order."""
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        resolved, name = resolve(child, root)
        if resolved.get("properties") and name not in OPAQUE:
            yield from rows(resolved, root, f"{path}.")
        else:
            yield path, resolved


def default(path: str) -> Any:
    node: Any = values()
    for part in path.split("."):
        node = node[part]
    return node


def type_of(s: dict[str, Any]) -> str:
    t = s.get("type", "")
    if "enum" in s:
        return " \\| ".join(f"`{v}`" for v in s["enum"] if v != "")
    return "/".join(t) if isinstance(t, list) else str(t)


def table() -> str:
    root = schema()
    lines = ["| value | type | default | description |", "| --- | --- | --- | --- |"]
    for path, s in rows(root, root):
        shown = json.dumps(default(path), separators=(", ", ": "))
        lines.append(f"| `{path}` | {type_of(s)} | `{shown}` | {s['description']} |")
    return "\n".join(lines)


def test_values_yaml_obeys_the_schema() -> None:
    jsonschema.Draft7Validator(schema()).validate(values())


def walk(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for k, v in node.items():
            yield from walk(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{where}/{i}")


def test_every_object_rejects_unknown_keys() -> None:
    for where, node in walk(schema()):
        if node.get("type") != "object":
            continue
        extra = node.get("additionalProperties")
        if "properties" in node:
            assert extra is False, f"{where}: additionalProperties must be false"
        elif where.endswith(("/nodeAffinity", "/podAffinity", "/podAntiAffinity")):
            continue  # Kubernetes affinity terms: validated by the API server
        else:
            assert extra == {"type": "string"}, f"{where}: a free-form map must be string->string"


def test_every_value_is_described_and_has_a_default() -> None:
    root = schema()
    documented = [path for path, _ in rows(root, root)]
    assert len(documented) > 40
    for path, s in rows(root, root):
        assert s.get("description"), path
        default(path)  # raises KeyError when values.yaml lacks it


def leaf_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaf_paths(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip(".")


def test_every_default_is_documented() -> None:
    root = schema()
    documented = {path for path, _ in rows(root, root)}
    for path in leaf_paths(values()):
        assert any(path == d or path.startswith(f"{d}.") for d in documented), path


@pytest.mark.parametrize(
    ("patch", "where"),
    [({"agent": {"nodeSelector": {"x": 1}}}, "agent/nodeSelector/x"),
     ({"operator": {"image": {"tag": "1", "registry": "r"}}}, "operator/image"),
     ({"synthesizer": {"tolerations": [{"key": "a", "effects": "NoSchedule"}]}},
      "synthesizer/tolerations/0")],
)
def test_schema_names_the_bad_value(patch: dict[str, Any], where: str) -> None:
    merged = values()
    for top, inner in patch.items():
        merged[top] = {**merged[top], **inner}
    errors = list(jsonschema.Draft7Validator(schema()).iter_errors(merged))
    assert errors
    assert any("/".join(str(p) for p in e.absolute_path) == where for e in errors), [
        (list(e.absolute_path), e.message) for e in errors]


def test_operations_doc_has_the_generated_table() -> None:
    text = DOC.read_text()
    assert START in text and END in text
    current = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert current == table(), (
        "docs/operations.md's values table is stale; regenerate it with "
        "`python tests/unit/test_chart_values.py`")


if __name__ == "__main__":
    print(table())
