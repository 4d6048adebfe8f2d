"""Constrained decoding: output that matches a JSON schema, a regular expression or a Lark
grammar, on the grammar engine llguidance (why llguidance: ``docs/structured.md``).

A :class:`Grammar` says what the output must match; each sequence decoding under it holds a
:class:`GrammarState` (llguidance's matcher over the tokens accepted so far), which the decoding
loop uses at three points of every step:

- *draft* (:meth:`GrammarState.draft`): the tokens the grammar forces next (keys, braces,
  quotes; llguidance's fast-forward tokens) are drafted without any drafter, then the
  drafter's draft after them; the whole is cut at the first token the grammar forbids. A draft
  that starts with forced tokens counts them in its ``forced`` field and has the policy's
  source :data:`GRAMMAR` (its ``match_length`` the same count), so the policy learns their
  acceptance like any other source's.
- *verify* (:meth:`GrammarState.mask_`, :meth:`GrammarState.advance`): at every verified
  position the target's distribution is masked to the tokens the grammar allows, before the
  token is chosen (greedy or sampled); the chosen token then advances the matcher. Only
  chosen tokens ever enter the matcher, so a rejected draft leaves nothing to undo.
- *forget* (:meth:`GrammarState.rollback`): tokens dropped after a stop string leave it.

Exactness: the mask at a position depends only on the tokens before it, and the target's
choice is made over the masked distribution exactly as plain constrained decoding
(``drafter="none"`` with the same grammar) makes it, so the output is the same token for
token, greedy or seeded sampling.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from .drafters.base import Draft, Drafter, NoDrafter
from .errors import GrammarError, GrammarFailed, InvalidParameterError
from .json_schemas import closed, satisfiable

if TYPE_CHECKING:  # torch loads on first use (`promptlookup --help` does not need it)
    import torch

#: The policy's source of drafts that start with tokens the grammar forces.
GRAMMAR = "grammar"

#: The most characters of the grammar engine's own words in an error message.
MESSAGE_CHARS = 160

#: How JSON is laid out under a schema: one space after ``:`` and ``,`` and no other
#: whitespace (as Python's ``json.dumps`` writes it), so every separator is forced. And
#: ``oneOf`` is read as ``anyOf`` (as llama.cpp's grammars read it): exact where the
#: branches exclude each other, as Pydantic's discriminated unions do; elsewhere an answer
#: may match more than one.
JSON_LAYOUT = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}


@dataclass(frozen=True)
class Grammar:
    """What the output must match, compiled by llguidance (``text``: its grammar) and checked
    when built: an invalid schema, expression or grammar raises
    :class:`~promptlookup.errors.GrammarError` with one line that says what is wrong.

    >>> Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})  # doctest: +SKIP
    >>> Grammar.regex(r"\\d{3}-\\d{4}"), Grammar.lark('start: "yes" | "no"')  # doctest: +SKIP
    """

    text: str
    what: str

    def __post_init__(self) -> None:
        error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.text)
        if error:
            raise GrammarError(f"invalid {self.what}: {_first_line(messages[0])}")

    @classmethod
    def json_schema(cls, schema: Mapping | bool | None = None) -> Grammar:
        """JSON valid against ``schema`` (None: any JSON object), laid out as
        :data:`JSON_LAYOUT`; an object that lists ``properties`` takes only those keys unless
        the schema opens it (:func:`~promptlookup.json_schemas.closed`), and a schema that no
        finite value matches is a :class:`~promptlookup.errors.GrammarError`."""
        schema = {"type": "object"} if schema is None else schema
        if not isinstance(schema, (Mapping, bool)):
            raise GrammarError(f"invalid JSON schema: an object expected, got {schema!r:.60}")
        return cls(_json_grammar(prepared_schema(schema)), "JSON schema")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Text matching the regular expression ``pattern`` (whole)."""
        return cls(llguidance.LLMatcher.grammar_from_regex(_text(pattern, "regex")), "regex")

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        """Text in the language of a Lark grammar (llguidance's dialect: ``start`` is the
        start rule; ``%json {...}`` embeds a JSON schema)."""
        text = llguidance.LLMatcher.grammar_from_lark(_text(grammar, "Lark grammar"))
        return cls(text, "Lark grammar")

    @classmethod
    def of_response_format(cls, response_format: Mapping | None) -> Grammar | None:
        """OpenAI's ``response_format``: ``{"type": "text"}`` (None: unconstrained),
        ``{"type": "json_object"}`` (with llama-server's ``"schema": {...}``, an object in that
        schema) or ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
        "strict": true}}``."""
        if response_format is None:
            return None
        kind = response_format.get("type") if isinstance(response_format, Mapping) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_schema(response_format.get("schema"))
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping):
                raise GrammarError("response_format json_schema needs a 'json_schema' object")
            return cls.json_schema(spec.get("schema"))
        raise GrammarError(
            "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
            f"{{'type': 'json_schema', 'json_schema': {{...}}}}, got {response_format!r:.80}"
        )

    def start(self, tokenizer: llguidance.LLTokenizer) -> GrammarState:
        """A new sequence's state, before its first generated token (``tokenizer``: from
        :func:`engine_tokenizer`)."""
        matcher = llguidance.LLMatcher(tokenizer, self.text, log_level=0)
        if matcher.is_error():
            reason = _first_line(matcher.get_error())[:MESSAGE_CHARS]
            raise GrammarError(f"invalid {self.what}: {reason}")
        return GrammarState(matcher, tokenizer.eos_token)


def prepared_schema(schema: Mapping | bool) -> Mapping | bool:
    """``schema`` as the grammar reads it: its objects closed, and its parts of no finite
    value left out (:mod:`~promptlookup.json_schemas`); a
    :class:`~promptlookup.errors.GrammarError` where no finite value matches it. For a schema
    embedded in another, or in a Lark grammar (``%json``)."""
    try:
        return satisfiable(closed(schema))
    except RecursionError:
        raise GrammarError("invalid JSON schema: nested too deep") from None


def _json_grammar(schema: Mapping | bool) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults=JSON_LAYOUT
        )
    except (ValueError, TypeError, RecursionError) as exc:
        raise GrammarError(f"invalid JSON schema: {_first_line(str(exc))}") from None


def grammar_state(
    grammar: Grammar | None, response_format: Mapping | None, tokenizer, eos_token_ids
) -> GrammarState | None:
    """A new generation's state of ``grammar``, or of OpenAI's ``response_format`` when it is
    None (both None: unconstrained), over ``tokenizer`` (:func:`engine_tokenizer`)."""
    if grammar is None:
        grammar = Grammar.of_response_format(response_format)
        if grammar is None:
            return None
    if not isinstance(grammar, Grammar):
        raise InvalidParameterError(
            "grammar must be a promptlookup.Grammar (Grammar.regex(...), Grammar.lark(...), "
            f"Grammar.json_schema(...)), got {type(grammar).__name__}"
        )
    return grammar.start(engine_tokenizer(tokenizer, eos_token_ids))


#: Each tokenizer's engine view, built once (:func:`engine_tokenizer`).
_ENGINE_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_tokenizer(tokenizer, eos_token_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a tokenizer, whose end of sequence is the model's first EOS token;
    built once per tokenizer and EOS (about half a second for a Hugging Face one). A tokenizer
    without a fast (Rust) backend is read token by token: each id's decoded text."""
    import llguidance.hf

    eos = list(eos_token_ids) or [tokenizer.eos_token_id]
    built = _ENGINE_TOKENIZERS.get(tokenizer)
    if built is None or built[0] != eos:
        if hasattr(tokenizer, "backend_tokenizer"):
            view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=eos)
        else:
            view = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTable(tokenizer, eos)))
        built = _ENGINE_TOKENIZERS[tokenizer] = (eos, view)
    return built[1]


class _TokenTable:
    """A tokenizer as llguidance's ``TokenizerWrapper`` reads it: each token's bytes (the EOS
    tokens special and empty) and an encoder."""

    def __init__(self, tokenizer, eos_token_ids: Sequence[int]) -> None:
        size = getattr(tokenizer, "vocab_size", None) or len(tokenizer)
        self.eos_token_id, self.bos_token_id = eos_token_ids[0], None
        self.special_token_ids = list(eos_token_ids)
        self.tokens = [
            b"" if i in eos_token_ids else tokenizer.decode([i]).encode() for i in range(size)
        ]
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class GrammarState:
    """One sequence's position in its grammar: the matcher over its accepted tokens (see the
    module doc for how the loop uses it). Where the grammar engine fails (an error, a token
    refused, nothing allowed), each method raises
    :class:`~promptlookup.errors.GrammarFailed`: the sequence cannot go on, and only it ends."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token: int) -> None:
        self.matcher = matcher
        self.eos_token = eos_token
        self.taken = 0  # tokens consumed, as the error message counts them

    def mask_(self, row: torch.Tensor) -> torch.Tensor:
        """Set ``row`` (the target's logits, (vocab,)) to -inf, in place, wherever the grammar
        forbids the next token; tokens past the tokenizer's vocabulary are forbidden."""
        import torch

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._check("allows no next token")
        if not bits.any():
            raise GrammarFailed(f"the grammar allows no token after {self.taken} tokens")
        forbidden = torch.from_numpy(np.unpackbits(~bits, bitorder="little").view(np.bool_))
        width = min(row.shape[-1], forbidden.shape[0])
        with torch.inference_mode():  # a target's logits may be inference tensors
            row[:width].masked_fill_(forbidden[:width].to(row.device), float("-inf"))
            row[width:] = float("-inf")
        return row

    def advance(self, token: int) -> None:
        """The sequence took ``token`` (chosen over a masked row, so the grammar allows it)."""
        if not self.matcher.consume_token(token):
            self._check(f"refused token {token}")
            raise GrammarFailed(f"the grammar refused token {token} after {self.taken} tokens")
        self.taken += 1

    def rollback(self, count: int) -> None:
        """Forget the last ``count`` tokens taken."""
        if count > 0:
            if not self.matcher.rollback(count):
                self._check(f"cannot forget {count} tokens")
            self.taken -= count

    def forced(self) -> list[int]:
        """The tokens the grammar forces next: llguidance's fast-forward tokens, or the end of
        sequence once the grammar is complete and allows nothing else."""
        if self.matcher.is_stopped():
            return [self.eos_token]
        forced = list(self.matcher.compute_ff_tokens())
        self._check("failed while finding the forced tokens")
        return forced

    def _check(self, what: str) -> None:
        """:class:`GrammarFailed` (one line: the engine's first, no parser state) where the
        engine is in error."""
        if self.matcher.is_error():
            reason = _first_line(self.matcher.get_error())[:MESSAGE_CHARS]
            raise GrammarFailed(f"the grammar {what} after {self.taken} tokens: {reason}")

    def draft(self, drafter: Drafter, tokens: list[int], room: int, forced_only=False) -> Draft:
        """This step's draft, at most ``room`` tokens after ``tokens``: the forced tokens, then
        (unless ``forced_only``) ``drafter``'s draft after them, cut at the first token the
        grammar forbids (see the module doc). ``drafter="none"`` drafts nothing here either:
        plain constrained decoding. The draft carries no draft probabilities: a sampled draft
        token is kept only if the target's own sample equals it (still exact, see
        :mod:`promptlookup.loop`)."""
        if isinstance(drafter, NoDrafter) or room <= 0:
            return Draft()
        forced = self.forced()[:room]
        ahead = [*tokens, *forced] if forced else tokens
        proposed = Draft()
        if room > len(forced) and not forced_only:
            proposed = Draft.of(drafter.propose(ahead, room - len(forced)))
        candidate = [*forced, *proposed[: room - len(forced)]]
        valid = self.matcher.validate_tokens(candidate)
        self._check("failed while checking a draft")
        if forced:
            count = len(forced)  # also the policy's evidence, as a match length
            return Draft(candidate[:valid], None, count, GRAMMAR, forced=count)
        return Draft(candidate[:valid], None, proposed.match_length, proposed.source)


class GrammarLogitsProcessor:
    """A ``transformers`` logits processor that constrains ``model.generate`` (one sequence)
    with a grammar state: plain constrained decoding in transformers (the bench's ``plain``
    on the structured task). ``prompt_length``: the tokens before the first generated one."""

    def __init__(self, state: GrammarState, prompt_length: int) -> None:
        self.state, self.seen = state, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for token in input_ids[0, self.seen :].tolist():  # the tokens generated since
            self.state.advance(token)
        self.seen = input_ids.shape[1]
        scores = scores.clone()  # (1, vocab)
        self.state.mask_(scores[0])
        return scores


def forced_count(draft: Draft) -> int:
    """How many leading tokens of ``draft`` the grammar forced (see :meth:`GrammarState.draft`)."""
    return draft.forced


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise GrammarError(f"invalid {what}: a non-empty string expected, got {value!r:.60}")
    return value


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "rejected by llguidance"
