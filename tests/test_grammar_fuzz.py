"""A fuzz of grammars (hypothesis): random and pathological JSON schemas, and tool lists built
of them, compiled and then sampled on a tiny seeded model. Each ends one of three ways, never
another: a :class:`GrammarError` when it is built, with one readable line; a
:class:`GrammarFailed` from the sequence's state (one line), which ends that sequence alone;
or an answer that, where the grammar ended it, is JSON valid against the schema the client
sent (checked with ``jsonschema``) and has no key its objects do not list."""

from __future__ import annotations

import functools
import json

import jsonschema
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grammar_schemas import TEMPLATE, keys, one_line
from test_server_tools import ascii_lm

from promptlookup import Grammar, GrammarError, GrammarFailed
from promptlookup.server.reading import parse
from promptlookup.server.tools import NO_PARAMETERS, ToolPlan

lm = functools.cache(ascii_lm)
FUZZ = settings(
    max_examples=20,
    deadline=None,  # a tiny model's step varies with the shared machine's load
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAMES = st.sampled_from(["a", "b", "c", "d"])
REFS = st.sampled_from(["#", "#/$defs/D0", "#/$defs/D1"])

#: Schemas that used to fail at the first token, or at a later one, or that need references.
PATHOLOGICAL = [
    {"$ref": "#"},
    {"anyOf": [{"$ref": "#"}, {"$ref": "#/$defs/D0"}], "$defs": {"D0": {"$ref": "#"}}},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 2},
    {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}},
    {"allOf": [{"$ref": "#"}]},
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"type": "integer", "minimum": 5, "maximum": 3},
    {"enum": []},
    {"not": {"type": "string"}},
    {"$ref": "#/$defs/missing"},
    {"$ref": "https://example.com/schema.json"},
    False,
]


def leaves() -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(
            [
                {"type": "integer", "minimum": -9, "maximum": 99},
                {"type": "boolean"},
                {"type": "null"},
                {"type": "string", "maxLength": 4},
                {"enum": ["x", 1, None]},
                {"const": "k"},
                {"type": "object"},
                {},
                True,
                False,
            ]
        ),
        REFS.map(lambda ref: {"$ref": ref}),
    )


def objects(children: st.SearchStrategy) -> st.SearchStrategy:
    extra = st.one_of(st.just(None), st.booleans(), children)

    def build(properties, required, additional, typed):
        schema = {"type": "object"} if typed else {}
        schema["properties"] = properties
        if required:
            schema["required"] = required
        if additional is not None:
            schema["additionalProperties"] = additional
        return schema

    return st.builds(
        build,
        st.dictionaries(NAMES, children, max_size=3),
        st.lists(NAMES, max_size=2, unique=True),
        extra,
        st.booleans(),
    )


def composites(children: st.SearchStrategy) -> st.SearchStrategy:
    arrays = st.builds(
        lambda items, least: {"type": "array", "items": items, "minItems": least, "maxItems": 3},
        children,
        st.integers(0, 2),
    )
    unions = st.builds(
        lambda key, branches: {key: branches},
        st.sampled_from(["anyOf", "oneOf", "allOf"]),
        st.lists(children, min_size=1, max_size=3),
    )
    return st.one_of(objects(children), arrays, unions)


SCHEMAS = st.recursive(leaves(), composites, max_leaves=8)
ROOTS = st.one_of(
    st.builds(
        lambda root, d0, d1: {**root, "$defs": {"D0": d0, "D1": d1}},
        composites(SCHEMAS),
        SCHEMAS,
        SCHEMAS,
    ),
    st.sampled_from(PATHOLOGICAL),
)


def validate(value, schema) -> None:
    """``jsonschema``'s check of ``value``, ``oneOf`` read as ``anyOf`` as the grammar reads it
    (docs/structured.md); a schema that refers to itself before anything else (``{"anyOf":
    [{"$ref": "#"}, ...]}``) sends ``jsonschema`` round in circles, and goes unchecked."""
    try:
        jsonschema.validate(value, as_checked(schema))
    except RecursionError:
        pass


def as_checked(schema):
    """``schema`` as ``jsonschema`` checks the answer: ``oneOf`` read as ``anyOf``, as the
    grammar reads it (docs/structured.md)."""
    return json.loads(json.dumps(schema).replace('"oneOf"', '"anyOf"'))


def listed_keys(schema) -> set[str]:
    """The property names (the fuzz's a..d) the schema lists anywhere."""
    return {name for name in "abcd" if f'"{name}": ' in json.dumps(schema)}


def generated(grammar: Grammar, seed: int, n: int = 48):
    """The sample's text where the grammar ended it; None where ``max_new_tokens`` did, or
    the grammar failed (:class:`GrammarFailed`, one line) in the sequence."""
    try:
        result = lm().generate(
            'JSON {"a": [1, {"b": null}], "e": "x"}: ',
            grammar=grammar,
            max_new_tokens=n,
            temperature=1.3,
            seed=seed,
        )
    except GrammarFailed as exc:
        one_line(str(exc))
        return None
    return result.text if result.finish_reason == "stop" else None


def opens_objects(schema) -> bool:
    """Whether some object of the schema may take keys it does not list: it says so, it
    takes any value (``true``, ``{}``), it is any object, or closing was left to ``allOf``
    or ``not``."""
    text = json.dumps(schema)
    marks = ("true", "{}", '"type": "object"}', '"additionalProperties": {', "allOf", "not")
    return any(mark in text for mark in marks)


@FUZZ
@given(schema=ROOTS, seed=st.integers(0, 2**16))
def test_a_schema_is_refused_whole_or_its_answers_are_valid(schema, seed):
    try:
        grammar = Grammar.json_schema(schema)
    except GrammarError as exc:
        one_line(str(exc))
        assert str(exc).startswith("invalid JSON schema: ")
        return
    text = generated(grammar, seed)
    if text is None:
        return
    value = json.loads(text)
    validate(value, schema)
    if not opens_objects(schema):
        assert keys(value) <= listed_keys(schema), (text, schema)


def tool_lists() -> st.SearchStrategy:
    parameters = st.one_of(st.none(), objects(SCHEMAS), st.sampled_from(PATHOLOGICAL))
    tool = st.builds(lambda p: {"description": "", "parameters": p}, parameters)
    return st.dictionaries(
        st.sampled_from(["f", "g", "run.x", "h-1"]), tool, min_size=1, max_size=3
    )


@FUZZ
@given(
    tools=tool_lists(),
    choice=st.sampled_from(["auto", "required", "first"]),
    parallel=st.booleans(),
    template=st.sampled_from([None, TEMPLATE]),
    seed=st.integers(0, 2**16),
)
def test_a_tool_list_is_refused_whole_or_its_calls_are_valid(
    tools, choice, parallel, template, seed
):
    listed = [{"name": name, **tool} for name, tool in tools.items()]
    choice = listed[0]["name"] if choice == "first" else choice
    try:
        grammar = ToolPlan(listed, choice, parallel, template).grammar()
    except GrammarError as exc:
        one_line(str(exc))
        assert str(exc).startswith("tool '"), exc  # each tool's schema is checked alone
        return
    text = generated(grammar, seed, n=80)
    if text is None:
        return
    content, calls = parse(text, template)
    assert calls or choice == "auto", text
    for call in calls:
        function = call["function"]
        schema = tools[function["name"]]["parameters"] or NO_PARAMETERS
        validate(json.loads(function["arguments"]), schema)
