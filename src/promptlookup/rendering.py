"""A chat's rendered text as token ids in segments, so that a conversation's next turn starts
with the token ids of the turn before it, its answer included (and the prefix cache finds
them: :mod:`promptlookup.prefix_cache`).

*The rule.* The text the chat template renders is cut where each assistant message's content
begins (the end of what the template renders for the messages before it with the assistant's
turn opened, where the whole text starts with that) and each piece is tokenized on its own;
the prompt's ids are the pieces' ids one after another. A turn's prompt ends where its
answer's content begins, so the next turn's prompt holds the same pieces up to there, then
the answer's content tokenized alone: the answer's own ids wherever the model's tokenization
is canonical (``tokenize(decode(ids)) == ids``, as it is for most answers), since the end
marker after it is a special token, which tokenizers split out first.

The rule depends on the request only (never on what is cached), so a fresh server and a warm
one send the model the same ids and the cache never changes a token. For an ordinary prompt
it changes nothing: the opened turn's text ends in a newline or a special token, which a
byte-level BPE tokenizer's pre-tokenizer splits off anyway; only content that begins with
whitespace may be split differently (as the model generated it). A tokenizer for which a
cut there would change a probe's tokens (one that adds a prefix space to every text it
tokenizes) keeps the whole text in one piece, as does a template whose text for the earlier
messages is not a prefix of the whole (one that drops earlier turns' reasoning, say).

A thinking model's answer begins with its reasoning: a client sends it back apart, and the
server puts it where the template renders it, or back between its markers in the content
(:mod:`promptlookup.server.reasoning`), so the answer's piece is again the text generated.
It cannot be where the template drops earlier turns' reasoning (Qwen3's before the last
user message, DeepSeek-R1's always): the next turn's ids then match up to that answer's start.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

#: The probe of :func:`cuts_safely`: a turn opened, then an answer.
_PROBE = ("<|probe|>assistant\n", "Hello there, how are you? 42")

#: Each tokenizer's answer to :func:`cuts_safely`, found once.
_SAFE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ids_of(tokenizer, text: str) -> list[int]:
    """``text``'s token ids, without the special tokens a tokenizer adds (the template wrote
    those it wants), as transformers tokenizes a rendered chat."""
    encoded = tokenizer(text, add_special_tokens=False)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def cuts_safely(tokenizer) -> bool:
    """Whether cutting a probe at an answer's start leaves its token ids as they were."""
    try:
        return _SAFE[tokenizer]
    except (KeyError, TypeError):
        pass
    opened, answer = _PROBE
    safe = ids_of(tokenizer, opened) + ids_of(tokenizer, answer) == ids_of(
        tokenizer, opened + answer
    )
    try:
        _SAFE[tokenizer] = safe
    except TypeError:  # not weakly referable: probed again next time
        pass
    return safe


def answer_starts(text: str, messages: Sequence[dict], render: Callable[[list], str]) -> list[int]:
    """Where each assistant message's content begins in ``text`` (the whole conversation
    rendered): the length of ``render(messages[:i])`` (the turn opened), where ``text`` starts
    with it."""
    starts = []
    for i, message in enumerate(messages):
        if i == 0 or message.get("role") != "assistant":
            continue
        opened = render(list(messages[:i]))
        if isinstance(opened, str) and 0 < len(opened) < len(text) and text.startswith(opened):
            if not starts or len(opened) > starts[-1]:
                starts.append(len(opened))
    return starts


def segmented_ids(tokenizer, text: str, starts: Sequence[int]) -> list[int]:
    """``text``'s token ids, cut at ``starts`` (see the module doc), each piece tokenized
    alone; in one piece where the tokenizer does not cut safely."""
    if not starts or not cuts_safely(tokenizer):
        return ids_of(tokenizer, text)
    bounds = [0, *starts, len(text)]
    return [t for a, b in zip(bounds, bounds[1:]) if b > a for t in ids_of(tokenizer, text[a:b])]
