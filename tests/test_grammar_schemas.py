"""JSON schemas as the grammar reads them (promptlookup.json_schemas; docs/structured.md,
"Closed objects, references and failures"): an object that lists ``properties`` takes only
those keys at every level unless the schema opens it, a tool without parameters takes ``{}``,
Pydantic's ``$defs``/``$ref`` (nested and recursive models) work in tools and response
formats, a schema that no finite value matches is a named error at compile time, and a grammar
that fails while a sequence is generated raises :class:`GrammarFailed` with one line. Outputs
are checked with ``jsonschema`` against the schema the client sent, on a tiny seeded model."""

from __future__ import annotations

import functools
import json

import jsonschema
import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import AsciiTokenizer
from pydantic import BaseModel, Field
from test_server_tools import ascii_lm

from promptlookup import Grammar, GrammarError, GrammarFailed, json_schemas
from promptlookup.grammar import engine_tokenizer
from promptlookup.json_schemas import closed, satisfiable
from promptlookup.server.reading import parse
from promptlookup.server.tool_schemas import Tool
from promptlookup.server.tool_template import CLOSE_TAG, OPEN_TAG, TemplateFormat
from promptlookup.server.tools import NO_PARAMETERS, ToolPlan

lm = functools.cache(ascii_lm)
#: The Hermes format without newlines (the tiny tokenizer has none).
TEMPLATE = TemplateFormat(OPEN_TAG, CLOSE_TAG, " ")
#: A prompt that shows the model other keys to copy.
PROMPT = 'JSON: {"a": 12, "zz": true, "b": {"c": false, "d": 1}, "extra": "x"} and more: '
SEEDS = range(16)
OPEN = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "maximum": 99},
        "b": {"type": "object", "properties": {"c": {"type": "boolean"}}},
    },
}


def sampled(grammar: Grammar, seeds=SEEDS, n: int = 60) -> list[str]:
    """The texts of the seeds' samples that ended where the grammar let them (not at
    ``max_new_tokens``)."""
    out = []
    for seed in seeds:
        result = lm().generate(
            PROMPT, grammar=grammar, max_new_tokens=n, temperature=1.5, seed=seed
        )
        if result.finish_reason == "stop":
            out.append(result.text)
    return out


def keys(value, found=None) -> set[str]:
    """Every key of every object in ``value``."""
    found = set() if found is None else found
    if isinstance(value, dict):
        found.update(value)
        for item in value.values():
            keys(item, found)
    elif isinstance(value, list):
        for item in value:
            keys(item, found)
    return found


def test_closing_adds_additional_properties_false_only_where_nothing_opens_the_object():
    schema = {
        "type": "object",
        "properties": {
            "open": {"type": "object", "properties": {"x": {}}, "additionalProperties": True},
            "typed": {"properties": {"y": {}}, "additionalProperties": {"type": "integer"}},
            "pattern": {"type": "object", "properties": {}, "patternProperties": {"^p": {}}},
            "free": {"type": "object"},  # lists no keys: any object, as in llama.cpp
            "list": {"type": "array", "items": {"type": "object", "properties": {"z": {}}}},
            "values": {"const": {"properties": {"k": 1}}, "enum": [{"properties": {}}]},
            "both": {"allOf": [{"properties": {"u": {}}}, {"properties": {"v": {}}}]},
            "not": {"not": {"properties": {"w": {}}}},
            "unlisted": {"properties": {"r": {}}, "required": ["r", "s"]},
        },
        "$defs": {"D": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
    before = json.dumps(schema)
    out = closed(schema)
    assert json.dumps(schema) == before  # a new structure
    inner = out["properties"]
    assert out["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert inner["list"]["items"]["additionalProperties"] is False
    assert inner["open"]["additionalProperties"] is True
    assert inner["typed"]["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in inner["pattern"]
    assert inner["free"] == {"type": "object"}
    assert inner["values"] == schema["properties"]["values"]  # values, not schemas
    assert inner["both"] == schema["properties"]["both"]  # closing each part contradicts
    assert inner["not"] == schema["properties"]["not"]  # closing under not widens
    assert inner["unlisted"]["properties"] == {"r": {}, "s": {}}  # required counts as listed
    assert closed(out) == out  # once is enough


def test_an_object_that_lists_properties_never_gets_another_key_at_any_level():
    texts = sampled(Grammar.json_schema(OPEN))
    assert len(texts) >= len(SEEDS) // 2
    for text in texts:
        value = json.loads(text)
        jsonschema.validate(value, OPEN)
        assert keys(value) <= {"a", "b", "c"}, text
    assert {"a", "b", "c"} & set().union(*(keys(json.loads(t)) for t in texts))
    # The same model takes other keys where the schema opens the objects: the grammar is
    # what kept them out.
    opened = {**OPEN, "additionalProperties": True}
    extra = set().union(*(keys(json.loads(t)) for t in sampled(Grammar.json_schema(opened))))
    assert extra - {"a", "b", "c"}


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 3}])
def test_output_under_a_closed_schema_equals_plain_constrained_decoding(sampling):
    grammar = Grammar.json_schema(OPEN)
    options = dict(max_new_tokens=60, grammar=grammar, **sampling)
    plain = lm().generate(PROMPT, drafter="none", **options)
    fast = lm().generate(PROMPT, drafter="prompt-lookup", **options)
    assert fast.token_ids == plain.token_ids
    assert fast.stats.forced_tokens > 0
    batch = lm().generate_batch([PROMPT, PROMPT[10:]], drafter="prompt-lookup", **options)
    assert batch[0].token_ids == plain.token_ids
    assert batch[1].token_ids == lm().generate(PROMPT[10:], drafter="none", **options).token_ids


def test_a_tool_without_parameters_takes_an_empty_object_only():
    tool = Tool.model_validate({"type": "function", "function": {"name": "now"}}).plain()
    assert tool["parameters"] == NO_PARAMETERS
    for template in (None, TEMPLATE):
        plan = ToolPlan([tool], "required", parallel=False, template=template)
        texts = sampled(plan.grammar(), seeds=range(4))
        assert texts
        for text in texts:
            content, calls = parse(text, template)
            assert [call["function"]["arguments"] for call in calls] == ["{}"], text


class Address(BaseModel):
    city: str = Field(max_length=6)
    zip: int = Field(ge=0, le=999)


class Node(BaseModel):
    value: int = Field(ge=0, le=9)
    children: list[Node] = Field(default_factory=list, max_length=2)


class Person(BaseModel):
    name: str = Field(max_length=6)
    address: Address
    tree: Node | None = None


class Other(BaseModel):  # its own "Address" def, not Person's
    class Address(BaseModel):
        street: bool

    where: Address


PYDANTIC = [("person", Person.model_json_schema()), ("other", Other.model_json_schema())]


def test_pydantic_defs_and_refs_nested_and_recursive_work_in_a_response_format():
    schema = Person.model_json_schema()
    assert "$defs" in schema and "Node" in schema["$defs"]  # nested and recursive
    form = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    texts = sampled(Grammar.of_response_format(form), n=120)
    assert texts
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
        Person.model_validate_json(text)


@pytest.mark.parametrize("template", [None, TEMPLATE], ids=["generic", "template"])
def test_pydantic_defs_and_refs_work_in_tools_each_tool_its_own(template):
    tools = [{"name": name, "description": "", "parameters": schema} for name, schema in PYDANTIC]
    plan = ToolPlan(tools, "required", parallel=False, template=template)
    texts = sampled(plan.grammar(), n=120)
    assert texts
    for text in texts:
        _, calls = parse(text, template)
        assert len(calls) == 1, text
        function = calls[0]["function"]
        jsonschema.validate(json.loads(function["arguments"]), dict(PYDANTIC)[function["name"]])


BAD = {"$ref": "#/$defs/B"}
#: Schemas that no finite JSON value matches.
UNSATISFIABLE = [
    {"$ref": "#"},
    {"anyOf": [{"$ref": "#"}]},
    {"allOf": [{"$ref": "#"}], "description": "x"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {
        "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}, "required": ["n"]}},
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/N"}},
        "required": ["root"],
    },
]  # fmt: skip


def one_line(message: str) -> None:
    assert "\n" not in message and "<state>" not in message and len(message) < 300, message


@pytest.mark.parametrize("schema", UNSATISFIABLE, ids=range(len(UNSATISFIABLE)))
def test_a_schema_no_finite_value_matches_is_a_named_error_at_compile_time(schema):
    with pytest.raises(GrammarError) as info:
        Grammar.json_schema(schema)
    one_line(str(info.value))
    assert str(info.value).startswith("invalid JSON schema: no finite value matches it")
    tools = [{"name": "f", "description": "", "parameters": schema}]
    for template in (None, TEMPLATE):  # a tool's parameters, even where it need not be called
        with pytest.raises(GrammarError, match="^tool 'f': invalid JSON schema: no finite"):
            ToolPlan(tools, "auto", template=template).grammar()


def chain(length: int, ends: bool) -> dict:
    """References D0 -> D1 -> ... each requiring the next, in that order (the worst for the
    check: one more reference found finite per pass, from the end); the last ends or not."""
    last = {"type": "integer"} if ends else {"$ref": "#/$defs/D0"}
    defs = {f"D{i}": _requires(f"#/$defs/D{i + 1}") for i in range(length - 1)}
    return {"$defs": {**defs, f"D{length - 1}": last}, "$ref": "#/$defs/D0"}


def _requires(ref: str) -> dict:
    return {"type": "object", "properties": {"n": {"$ref": ref}}, "required": ["n"]}


def test_the_reference_check_is_bounded_and_then_leaves_the_schema_to_the_engine(monkeypatch):
    with pytest.raises(GrammarError, match="no finite value"):
        satisfiable(chain(40, ends=False))
    assert satisfiable(chain(40, ends=True)) == chain(40, ends=True)
    # A chain that ends (about 40 passes of 40 references) beside one that does not.
    defs = {**chain(40, ends=True)["$defs"], "E": _requires("#/$defs/E")}
    properties = {"a": {"$ref": "#/$defs/D0"}, "b": {"$ref": "#/$defs/E"}}
    schema = {"$defs": defs, "type": "object", "properties": properties, "required": ["a", "b"]}
    with pytest.raises(GrammarError, match="no finite value"):
        satisfiable(schema)
    visits = []
    real = json_schemas._finite
    monkeypatch.setattr(json_schemas, "_finite", lambda *a: visits.append(1) or real(*a))
    monkeypatch.setattr(json_schemas, "MAX_VISITS", 300)
    assert satisfiable(schema) == schema  # not judged: left to the grammar engine
    assert len(visits) < 2 * 300


def test_what_would_crash_or_fail_the_engine_at_once_is_a_named_error():
    """950 references of objects that each require the next (94 KB) overflowed llguidance's
    stack while compiling: a segmentation fault, the whole server; 500 properties in one
    object failed at the first token."""
    with pytest.raises(GrammarError, match="deeper than 512 levels, its references followed"):
        Grammar.json_schema(chain(1000, ends=True))
    Grammar.json_schema(chain(150, ends=True))  # 450 levels
    many = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(401)}}
    with pytest.raises(GrammarError, match="an object of 401 properties"):
        Grammar.json_schema(many)


def test_recursion_with_a_way_to_end_compiles():
    for schema in [
        {"type": "object", "properties": {"a": {"$ref": "#"}}},  # a optional
        {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # any type: a number ends it
        {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]},
        Node.model_json_schema(),
    ]:
        Grammar.json_schema(schema)


#: Satisfiable, yet one branch of ``y`` (an object) has no end.
ENDLESS_BRANCH = {
    "type": "object",
    "properties": {"x": {"type": "integer", "maximum": 9}, "y": {"anyOf": [{"type": "null"}, BAD]}},
    "required": ["x", "y"],
    "$defs": {"B": {"type": "object", "properties": {"z": BAD}, "required": ["z"]}},
}


def test_a_branch_no_finite_value_takes_is_left_out_of_the_grammar():
    """llguidance would let a sequence begin ``y``'s object, then fail a token later
    (``Too many items``); the branch is left out, so ``y`` is always null."""
    texts = sampled(Grammar.json_schema(ENDLESS_BRANCH), n=30)
    assert texts
    for text in texts:
        jsonschema.validate(json.loads(text), ENDLESS_BRANCH)
        assert json.loads(text)["y"] is None


@pytest.mark.parametrize(
    "lark", ['start: "a" | "b" c\nc: "x" c', 'start: "a" | "b" %json {"$ref": "#"}']
)
def test_a_grammar_that_fails_while_generating_raises_grammar_failed_with_one_line(lark):
    """A Lark grammar (a library user's) whose ``"b"`` branch has no end: its first token
    compiles and is allowed, the engine fails a token later, and only the sequence's state
    raises, one line without the engine's state."""
    tokenizer = AsciiTokenizer()
    state = Grammar.lark(lark).start(engine_tokenizer(tokenizer, [0]))
    with pytest.raises(GrammarFailed) as info:
        for token in tokenizer("bxxx")["input_ids"]:
            state.mask_(torch.zeros(tokenizer.vocab_size))
            state.advance(token)
    one_line(str(info.value))
    assert str(info.value).startswith("the grammar ") and "after 1 tokens" in str(info.value)
    assert Grammar.lark(lark).start(engine_tokenizer(tokenizer, [0])).forced() == []
