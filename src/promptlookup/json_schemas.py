"""JSON schemas as the grammar reads them (see ``docs/structured.md``, "Closed objects"):

- :func:`closed`: an object schema that lists ``properties`` and says nothing of other keys
  takes only the listed keys (``additionalProperties: false`` is added), at every level, as
  llama.cpp's grammars read such schemas; ``additionalProperties`` (true or a schema) or
  ``patternProperties`` keeps it open. Closing only narrows a schema, so what matches the
  closed schema matches the one the client sent.
- :func:`satisfiable`: a schema no finite JSON value can match (a ``$ref`` to itself, an
  object that requires a property of its own kind) is a :class:`GrammarError` before anything
  is generated, not a grammar that fails at its first token; the parts of a schema that no
  finite value can take (a union's branch that recurses without end) are left out.
- :func:`embedded`: schemas placed inside another (a tool's parameters inside a call object)
  keep their references: each goes to the outer schema's ``$defs``, its local references
  rebased there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import unquote

from .errors import GrammarError

#: Deeper schemas are refused (what clients write is a few levels: Pydantic's nested models
#: are references, not nesting).
MAX_DEPTH = 64
#: The most properties one object may list: llguidance fails at the first token past about 500
#: (its parser's row of 2,000 items), open or closed.
MAX_PROPERTIES = 400
#: Keywords whose value is a map of names to schemas of values inside the instance.
_VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")
#: Keywords whose value is a schema (or a list of schemas) of values inside the instance.
_VALUE_SCHEMAS = ("additionalProperties", "items", "prefixItems", "additionalItems")
_VALUE_SCHEMAS += ("contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
#: Keywords whose schemas apply to the instance itself, beside the schema that holds them.
_UNIONS = ("anyOf", "oneOf")
_INTERSECTIONS = ("allOf", "dependentSchemas")


def closed(schema, *, depth: int = 0, close: bool = True):
    """``schema`` with every object that lists ``properties`` closed (see the module doc; a
    key it requires counts as listed), a new structure (``schema`` is not changed). Objects whose keys an intersection decides
    (``allOf``, a ``$ref`` beside ``properties``, ``dependentSchemas``) and what sits under
    ``not``, ``if``, ``then``, ``else`` stay as written: closing there could contradict or
    widen the schema."""
    if depth > MAX_DEPTH:
        raise GrammarError(f"invalid JSON schema: nested more than {MAX_DEPTH} levels deep")
    if isinstance(schema, list):  # a list of schemas (``items`` of draft 4, ``prefixItems``)
        return [closed(item, depth=depth + 1) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _VALUE_MAPS and isinstance(value, Mapping):
            out[key] = {name: closed(sub, depth=depth + 1) for name, sub in value.items()}
        elif key in _VALUE_SCHEMAS:
            out[key] = closed(value, depth=depth + 1)
        elif key in _UNIONS and isinstance(value, list):  # each branch as this level
            out[key] = [closed(sub, depth=depth + 1, close=close) for sub in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [closed(sub, depth=depth + 1, close=False) for sub in value]
        elif key == "dependentSchemas" and isinstance(value, Mapping):
            out[key] = {n: closed(s, depth=depth + 1, close=False) for n, s in value.items()}
        else:  # values (const, enum, default, examples), not, if/then/else: as written
            out[key] = value
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and len(properties) > MAX_PROPERTIES:
        raise GrammarError(
            f"invalid JSON schema: an object of {len(properties)} properties (at most "
            f"{MAX_PROPERTIES})"
        )
    if close and _closable(schema):
        out["additionalProperties"] = False
        # A required key the properties do not list is listed too (any value): closing must
        # not make the schema unsatisfiable.
        unlisted = [k for k in _list(schema, "required") if isinstance(k, str)]
        unlisted = [k for k in unlisted if k not in out["properties"]]
        if unlisted:
            out["properties"] = {**out["properties"], **{key: {} for key in unlisted}}
    return out


def _closable(schema: Mapping) -> bool:
    kind = schema.get("type")
    return (
        isinstance(schema.get("properties"), Mapping)
        and (kind is None or kind == "object" or (isinstance(kind, list) and "object" in kind))
        and not any(key in schema for key in ("additionalProperties", "patternProperties"))
        and not any(key in schema for key in ("allOf", "$ref", "unevaluatedProperties"))
        and not any(key in schema for key in ("dependentSchemas", "if"))
    )


def embedded(schemas: Mapping[str, object]) -> tuple[dict[str, dict], dict[str, object]]:
    """Schemas to place inside an outer schema, by a name each: ``(references, defs)``, where
    ``references[name]`` (``{"$ref": "#/$defs/name"}``) stands where the schema goes and
    ``defs`` goes to the outer schema's ``$defs``, each schema with its local references
    (``#``, ``#/$defs/X``, ``#/properties/a``...) rebased under ``#/$defs/name``."""
    references, defs = {}, {}
    for name, schema in schemas.items():
        pointer = "#/$defs/" + name.replace("~", "~0").replace("/", "~1")
        if isinstance(schema, Mapping):  # its own $id or $schema would move its base
            schema = {k: v for k, v in schema.items() if k not in ("$id", "$schema")}
        defs[name] = _rebased(schema, pointer, 0)
        references[name] = {"$ref": pointer}
    return references, defs


def _rebased(schema, pointer: str, depth: int):
    if depth > MAX_DEPTH:
        raise GrammarError(f"invalid JSON schema: nested more than {MAX_DEPTH} levels deep")
    if isinstance(schema, list):
        return [_rebased(item, pointer, depth + 1) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = pointer + value[1:]
        elif key in ("const", "enum", "default", "examples"):  # values, not schemas
            out[key] = value
        else:
            out[key] = _rebased(value, pointer, depth + 1)
    return out


# -- depth ------------------------------------------------------------------------------------

#: The most levels a path from a schema's root may go down, references followed (each once per
#: path). llguidance compiles a schema by recursion on the thread's stack and overflows it
#: (a segmentation fault: the whole server) at about 2,800 such levels (950 references of
#: objects that require the next, a 94 KB schema); the limit keeps 5x from that.
MAX_LEVELS = 512


def _depth_below(node, depth: int, root, heights: dict[str, int], open_refs: set[str]) -> int:
    """How many levels lie below ``node`` (at ``depth``), references followed; a
    :class:`GrammarError` past :data:`MAX_LEVELS`. ``heights``: each reference's, once known;
    a reference already open on the path is not followed again (a cycle)."""
    if depth > MAX_LEVELS:
        raise GrammarError(
            f"invalid JSON schema: deeper than {MAX_LEVELS} levels, its references followed"
        )
    below = 0
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and ref not in open_refs:
            if ref not in heights:
                target = _resolve(root, ref)
                open_refs.add(ref)
                heights[ref] = 1 + _depth_below(target, depth + 1, root, heights, open_refs)
                open_refs.discard(ref)
            below = heights[ref]
        children = [v for k, v in node.items() if k not in ("const", "enum", "default", "examples")]
    elif isinstance(node, list):
        children = node
    else:
        return 0
    for child in children:
        below = max(below, 1 + _depth_below(child, depth + 1, root, heights, open_refs))
    if depth + below > MAX_LEVELS:
        raise GrammarError(
            f"invalid JSON schema: deeper than {MAX_LEVELS} levels, its references followed"
        )
    return below


# -- satisfiability ---------------------------------------------------------------------------


def satisfiable(schema):
    """``schema`` without the parts no finite JSON value can take (a union's branch, an
    optional property, array items), so that no sequence can walk into them; a
    :class:`GrammarError` where no finite value matches the schema at all: a ``$ref`` that
    comes back to itself before any value is written, an object (array) that requires a
    property (item) with no finite value. Found as the least fixed point of "this reference
    has a finite value" over the local references; what it cannot judge (a reference it
    cannot resolve, other keywords) counts as finite, and the grammar engine judges the rest.
    The finite values matched are the same: the parts left out match none."""
    _depth_below(schema, 0, schema, {}, set())
    targets = {ref: _resolve(schema, ref) for ref in _local_refs(schema, 0)}
    finite = _Judged({ref: target is _MISSING for ref, target in targets.items()})
    finite.visits_left = MAX_VISITS
    changed = True
    while changed:
        changed = False
        for ref, target in targets.items():
            if not finite[ref] and _finite(target, finite, 0):
                finite[ref] = changed = True
    if finite.visits_left <= 0:  # too large to judge here: the grammar engine judges it
        return schema
    if not _finite(schema, finite, 0):
        stuck = sorted(ref for ref, ok in finite.items() if not ok)
        why = f"{', '.join(stuck[:3])} comes back to itself with no way to end" if stuck else ""
        raise GrammarError(
            "invalid JSON schema: no finite value matches it"
            + (f" ({why})" if why else " (it requires a part that nothing matches)")
        )
    return _pruned(schema, finite, 0) if not all(finite.values()) else schema


def _pruned(schema, finite: Mapping[str, bool], depth: int):
    """``schema`` with the parts of no finite value left out (see :func:`satisfiable`)."""
    if depth > MAX_DEPTH or not isinstance(schema, Mapping):
        return schema
    required = set(_list(schema, "required"))
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {
                name: _pruned(sub, finite, depth + 1)
                if name in required or _finite(sub, finite, depth + 1)
                else False  # the key may not appear
                for name, sub in value.items()
            }
        elif key in _VALUE_MAPS and isinstance(value, Mapping):
            out[key] = {name: _pruned(sub, finite, depth + 1) for name, sub in value.items()}
        elif key in ("additionalProperties", "items") and isinstance(value, Mapping):
            out[key] = (
                _pruned(value, finite, depth + 1) if _finite(value, finite, depth + 1) else False
            )
        elif key in _UNIONS and isinstance(value, list):
            kept = [sub for sub in value if _finite(sub, finite, depth + 1)] or value
            out[key] = [_pruned(sub, finite, depth + 1) for sub in kept]
        elif key in ("allOf", "prefixItems") and isinstance(value, list):
            out[key] = [_pruned(sub, finite, depth + 1) for sub in value]
        else:
            out[key] = value
    return out


_MISSING = object()
#: Schema nodes the reference check visits at most, so that no schema keeps a request's thread
#: busy (references chained in the worst order take a pass each); past it, the check gives up
#: and leaves the schema to the grammar engine.
MAX_VISITS = 100_000


class _Judged(dict):
    """Whether each reference has a finite value so far, and the visits left to find out."""

    visits_left = 0


def _local_refs(schema, depth: int) -> Iterator[str]:
    if depth > MAX_DEPTH:
        return
    if isinstance(schema, list):
        for item in schema:
            yield from _local_refs(item, depth + 1)
    elif isinstance(schema, Mapping):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                yield value
            elif key not in ("const", "enum", "default", "examples"):
                yield from _local_refs(value, depth + 1)


def _resolve(schema, ref: str):
    """The part of ``schema`` that the JSON pointer in ``ref`` (``#/a/b``) names."""
    node = schema
    for part in filter(None, unquote(ref[1:]).split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _finite(schema, finite: Mapping[str, bool], depth: int) -> bool:
    """Whether some finite value matches ``schema``, references judged by ``finite`` (True
    once the visits are spent: not judged)."""
    if isinstance(finite, _Judged):
        finite.visits_left -= 1
        if finite.visits_left < 0:
            return True
    if schema is False or depth > MAX_DEPTH:
        return schema is not False
    if not isinstance(schema, Mapping):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and not finite.get(ref, True):
        return False
    if not all(_finite(sub, finite, depth + 1) for sub in _list(schema, "allOf")):
        return False
    for key in _UNIONS:
        branches = _list(schema, key)
        if branches and not any(_finite(sub, finite, depth + 1) for sub in branches):
            return False
    if "const" in schema or "enum" in schema:
        return True
    kind = schema.get("type")
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    if kinds is None or kinds - {"object", "array"}:
        return True  # a string, number, boolean or null value ends at once
    return ("object" in kinds and _object_finite(schema, finite, depth)) or (
        "array" in kinds and _array_finite(schema, finite, depth)
    )


def _object_finite(schema: Mapping, finite, depth: int) -> bool:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    for name in _list(schema, "required"):
        if isinstance(name, str) and name in properties:
            sub = properties[name]
        elif "patternProperties" in schema:
            continue  # a pattern may take it: not judged here
        else:
            sub = schema.get("additionalProperties", True)
        if not _finite(sub, finite, depth + 1):
            return False
    return True


def _array_finite(schema: Mapping, finite, depth: int) -> bool:
    least = schema.get("minItems", 0)
    if not isinstance(least, int) or least <= 0:
        return True
    items, prefix = schema.get("items", True), _list(schema, "prefixItems")
    if isinstance(items, list):  # draft 4's tuple
        prefix, items = items, schema.get("additionalItems", True)
    needed = [*prefix[:least], *([items] if least > len(prefix) else [])]
    return all(_finite(sub, finite, depth + 1) for sub in needed)


def _list(schema: Mapping, key: str) -> list:
    value = schema.get(key)
    return value if isinstance(value, list) else []
