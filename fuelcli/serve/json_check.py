"""Whether a JSON value satisfies a tool's parameter schema: the JSON Schema keywords tool
definitions use (type, enum, const, properties, required, additionalProperties, items, the
length and range bounds, pattern, anyOf/oneOf/allOf, local $ref). It decides whether a reply that
is bare JSON is a call (reply.py), so a keyword it does not know never makes a value fail.
"""

from __future__ import annotations

import re

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


def satisfies(value, schema) -> bool:
    return _ok(value, schema, schema)


def _resolve(ref: str, root):
    node = root
    for part in ref.removeprefix("#").strip("/").split("/") if ref != "#" else []:
        if not isinstance(node, dict) or part not in node:
            return True  # a reference fuel cannot follow constrains nothing here
        node = node[part]
    return node


def _ok(v, s, root) -> bool:
    if isinstance(s, bool):
        return s
    if not isinstance(s, dict):
        return True
    if isinstance(s.get("$ref"), str) and s["$ref"].startswith("#") and not _ok(v, _resolve(s["$ref"], root), root):
        return False
    types = s.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES.get(t, lambda _: True)(v) for t in types):
            return False
    if "enum" in s and v not in s["enum"]:
        return False
    if "const" in s and v != s["const"]:
        return False
    if any(not _ok(v, sub, root) for sub in s.get("allOf", [])):
        return False
    if "anyOf" in s and not any(_ok(v, sub, root) for sub in s["anyOf"]):
        return False
    if "oneOf" in s and sum(_ok(v, sub, root) for sub in s["oneOf"]) != 1:
        return False
    if isinstance(v, dict):
        return _object_ok(v, s, root)
    if isinstance(v, list):
        return (len(v) >= s.get("minItems", 0) and len(v) <= s.get("maxItems", len(v))
                and all(_ok(x, s.get("items", True), root) for x in v))
    if isinstance(v, str):
        return (s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v))
                and ("pattern" not in s or _matches(s["pattern"], v)))
    if _TYPES["number"](v):
        return (v >= s.get("minimum", v) and v <= s.get("maximum", v)
                and ("exclusiveMinimum" not in s or v > s["exclusiveMinimum"])
                and ("exclusiveMaximum" not in s or v < s["exclusiveMaximum"]))
    return True


def _object_ok(v: dict, s: dict, root) -> bool:
    props = s.get("properties", {})
    if any(k not in v for k in s.get("required", [])):
        return False
    extra = s.get("additionalProperties", True)
    for k, x in v.items():
        if not _ok(x, props[k] if k in props else extra, root):
            return False
    return True


def _matches(pattern, v: str) -> bool:
    try:
        return re.search(pattern, v) is not None
    except (re.error, TypeError):  # a pattern Python's re cannot read constrains nothing here
        return True
