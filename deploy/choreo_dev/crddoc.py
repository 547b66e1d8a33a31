"""Render the CRD reference (docs/crds.md) from the schemas in crds/, so it never drifts.

``python -m choreo_dev.crddoc`` rewrites the file; a unit test fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
DOC = ROOT / "docs" / "crds.md"

HEADER = """# CRD reference (choreo.dev/v1alpha1)

Generated from the schemas in `crds/` by `python -m choreo_dev.crddoc`; do not edit by hand.
Every field below is validated by the API server: types, enums, ranges and the CEL rules
listed under each kind, so an invalid object is rejected with a message naming the field.
"""


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "object")
    if kind == "array":
        return f"[]{_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map[string]{_type(schema['additionalProperties'])}"
    return str(kind)


def _limits(schema: dict[str, Any]) -> str:
    parts = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<="), ("minLength", "length >="),
                      ("maxLength", "length <="), ("minItems", "items >="),
                      ("maxItems", "items <="), ("pattern", "matches")):
        if key in schema:
            op = ">" if key == "minimum" and schema.get("exclusiveMinimum") else word
            parts.append(f"{op} `{schema[key]}`")
    if "default" in schema:
        parts.append(f"default `{schema['default']}`")
    return "; ".join(parts)


def _rows(schema: dict[str, Any], path: str, required: set[str], out: list[str],
          rules: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        rules.append(f"- `{path or '.'}`: {rule['message']} (`{rule['rule']}`)")
    props = schema.get("properties", {})
    for name, sub in props.items():
        here = f"{path}.{name}" if path else name
        desc = " ".join(str(sub.get("description", "")).split())
        req = "yes" if name in required else ""
        desc = desc.replace("|", "\\|")
        out.append(f"| `{here}` | {_type(sub)} | {req} | {_limits(sub)} | {desc} |")
        target = sub.get("items", {}) if sub.get("type") == "array" else sub
        if "properties" in target or "x-kubernetes-validations" in target:
            _rows(target, here + ("[]" if sub.get("type") == "array" else ""),
                  set(target.get("required", [])), out, rules)


def render() -> str:
    parts = [HEADER]
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        names = spec["names"]
        version = spec["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        parts.append(f"## {names['kind']}\n")
        parts.append(" ".join(str(schema.get("description", "")).split()) + "\n")
        short = ", ".join(f"`{s}`" for s in names.get("shortNames", []))
        parts.append(f"- scope: {spec['scope']}; plural `{names['plural']}`; short names {short}")
        columns = ", ".join(c["name"] for c in version.get("additionalPrinterColumns", []))
        parts.append(f"- `kubectl get` columns: {columns}")
        status = "yes" if "status" in version.get("subresources", {}) else "no"
        parts.append(f"- status subresource: {status}\n")
        rows: list[str] = []
        rules: list[str] = []
        _rows(schema, "", set(schema.get("required", [])), rows, rules)
        parts.append("| field | type | required | limits | description |")
        parts.append("| --- | --- | --- | --- | --- |")
        parts.extend(rows)
        if rules:
            parts.append("\nCross-field rules (CEL):\n")
            parts.extend(rules)
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
