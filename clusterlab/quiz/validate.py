"""Check a topic file against the bank's JSON Schema (clusterlab/quiz/schema.json).

`jsonschema` does the work when it is installed (it comes with JupyterLab). A bare install
of clusterlab may lack it, so a small validator covering exactly the keywords our schema
uses takes over then: the quiz must not stop working because an optional package is absent.
Both return a list of messages, each naming the JSON path of the problem; empty means valid.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("schema.json")


@cache
def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def schema_errors(
    doc: object, schema: dict[str, Any] | None = None, *, engine: str = "auto"
) -> list[str]:
    """Messages for every place `doc` violates the schema.

    engine: "jsonschema", "builtin" (the small validator below), or "auto" (jsonschema when
    it is installed). Importing jsonschema costs about a second (its format checkers compile
    a grammar), so the terminal mode uses "builtin"; the tests check that both agree.
    """
    schema = load_schema() if schema is None else schema
    if engine not in ("auto", "jsonschema", "builtin"):
        raise ValueError(f"unknown engine {engine!r}")
    if engine == "builtin":
        return mini_schema_errors(doc, schema)
    try:
        import jsonschema
    except ImportError:
        if engine == "jsonschema":
            raise
        return mini_schema_errors(doc, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{_path(e.absolute_path)}: {e.message}" for e in errors]


def _path(parts: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def _is_type(value: object, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def mini_schema_errors(doc: object, schema: dict[str, Any]) -> list[str]:
    """A minimal JSON Schema (2020-12 subset) validator for the keywords schema.json uses."""
    errors: list[str] = []
    _check(doc, schema, schema, (), errors)
    return errors


def _check(value: Any, sub: Any, root: dict, path: tuple, errors: list[str]) -> None:  # noqa: C901
    where = _path(path)
    if sub is True:
        return
    if sub is False:
        errors.append(f"{where}: not allowed here")
        return
    if "$ref" in sub:
        target: Any = root
        for part in sub["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        _check(value, target, root, path, errors)
    if "type" in sub:
        names = sub["type"] if isinstance(sub["type"], list) else [sub["type"]]
        if not any(_is_type(value, t) for t in names):
            errors.append(f"{where}: {value!r} is not of type {' or '.join(names)}")
            return
    if "enum" in sub and value not in sub["enum"]:
        errors.append(f"{where}: {value!r} is not one of {sub['enum']}")
    if "const" in sub and value != sub["const"]:
        errors.append(f"{where}: {value!r} is not {sub['const']!r}")
    if isinstance(value, str):
        if len(value) < sub.get("minLength", 0):
            errors.append(f"{where}: {value!r} is too short")
        if "pattern" in sub and not re.search(sub["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {sub['pattern']!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in sub and value < sub["minimum"]:
            errors.append(f"{where}: {value!r} is less than {sub['minimum']}")
        if "maximum" in sub and value > sub["maximum"]:
            errors.append(f"{where}: {value!r} is greater than {sub['maximum']}")
        if "exclusiveMinimum" in sub and value <= sub["exclusiveMinimum"]:
            errors.append(f"{where}: {value!r} is not greater than {sub['exclusiveMinimum']}")
    if isinstance(value, list):
        if len(value) < sub.get("minItems", 0):
            errors.append(f"{where}: expected at least {sub['minItems']} items")
        if "items" in sub:
            for i, item in enumerate(value):
                _check(item, sub["items"], root, (*path, i), errors)
    if isinstance(value, dict):
        for key in sub.get("required", []):
            if key not in value:
                errors.append(f"{where}: {key!r} is a required property")
        if len(value) < sub.get("minProperties", 0):
            errors.append(f"{where}: expected at least {sub['minProperties']} properties")
        props = sub.get("properties", {})
        for key, item in value.items():
            if "propertyNames" in sub:
                _check(key, sub["propertyNames"], root, (*path, key), errors)
            if key in props:
                _check(item, props[key], root, (*path, key), errors)
            elif "additionalProperties" in sub:
                _check(item, sub["additionalProperties"], root, (*path, key), errors)
    for part in sub.get("allOf", []):
        _check(value, part, root, path, errors)
    if "oneOf" in sub:
        matches = sum(1 for part in sub["oneOf"] if not mini_schema_errors_at(value, part, root))
        if matches != 1:
            errors.append(f"{where}: must match exactly one alternative, matches {matches}")
    if "if" in sub and not mini_schema_errors_at(value, sub["if"], root):
        _check(value, sub.get("then", True), root, path, errors)


def mini_schema_errors_at(value: Any, sub: Any, root: dict) -> list[str]:
    errors: list[str] = []
    _check(value, sub, root, (), errors)
    return errors
