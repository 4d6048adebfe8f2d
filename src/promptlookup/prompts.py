"""Prompts as token ids: plain text, chat messages through the tokenizer's chat template, or
token ids as they are. :func:`apply_chat_template` is the one caller of a tokenizer's chat
template (the server's tools and the tokenizer cache's check go through it too), whose text
is tokenized in pieces cut where each answer begins (:mod:`.rendering`)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Union

from .errors import EmptyPromptError, InvalidParameterError
from .rendering import answer_starts, ids_of, segmented_ids

#: A prompt: plain text, chat messages ``[{"role": ..., "content": ...}]``, or token ids.
Prompt = Union[str, Sequence[dict], Sequence[int]]


def encode_prompt(lm, prompt: Prompt, chat: bool = False) -> list[int]:
    """Token ids for ``prompt`` with ``lm``'s tokenizer (see
    :meth:`~promptlookup.generation.LanguageModel.encode`)."""
    tokenizer = lm.tokenizer
    if isinstance(prompt, str):
        if not prompt.strip():
            raise EmptyPromptError("the prompt is empty")
        if chat:
            return encode_prompt(lm, [{"role": "user", "content": prompt}])
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    items = list(prompt)
    if not items:
        raise EmptyPromptError("the prompt is empty")
    if all(isinstance(t, int) for t in items):
        return items
    if all(isinstance(m, dict) and "role" in m and "content" in m for m in items):
        if not getattr(tokenizer, "chat_template", None):
            return _without_template(lm, items)
        return apply_chat_template(tokenizer, items)
    raise InvalidParameterError(
        "a prompt must be text, token ids, or messages with role and content"
    )


def apply_chat_template(
    tokenizer,
    messages: Sequence[dict],
    *,
    tools: Sequence[dict] | None = None,
    tokenize: bool = True,
    add_generation_prompt: bool = True,
) -> list[int] | str:
    """``messages`` (and ``tools``, where given) through ``tokenizer``'s chat template: their
    token ids, or the text with ``tokenize=False``; ``add_generation_prompt`` opens the
    assistant's turn. The ids are the text's, cut where each assistant message's content
    begins (:mod:`.rendering`: a next turn starts with the ids of the turn and answer before)."""
    options = {} if tools is None else {"tools": list(tools)}

    def render(items: list, opened: bool = True, tokenize: bool = False):
        return tokenizer.apply_chat_template(
            items, add_generation_prompt=opened, tokenize=tokenize, **options
        )

    if not tokenize:
        return render(list(messages), add_generation_prompt)
    text = render(list(messages), add_generation_prompt)
    if isinstance(text, str):  # in pieces (a tokenizer that renders no text: its own ids)
        return segmented_ids(tokenizer, text, answer_starts(text, messages, render))
    rendered = render(list(messages), add_generation_prompt, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


#: The tokenizers without a chat template whose model has said so (once each), held weakly.
_TOLD: weakref.WeakSet = weakref.WeakSet()


def _without_template(lm, messages: Sequence[dict]) -> list[int]:
    """Messages for a model without a chat template (a base model, e.g. a GGUF file that
    stores none): their contents as plain text, a blank line apart, but an assistant's
    content right after what it answered (the model's continuation, as it wrote it), the text
    cut where each answer begins (:mod:`.rendering`); said once per tokenizer, that is per
    model."""
    try:
        told = lm.tokenizer in _TOLD
        _TOLD.add(lm.tokenizer)
    except TypeError:  # not weakly referable: said every time
        told = False
    if not told:
        warnings.warn(
            f"{lm.name} has no chat template (a base model?): "
            "the messages' contents are joined as plain text",
            RuntimeWarning,
            stacklevel=4,
        )
    text, starts = "", []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):  # OpenAI content parts
            content = "".join(part.get("text", "") for part in content or ())
        if message.get("role") == "assistant":  # the model's continuation, as it wrote it
            starts.append(len(text))
        elif text:
            text += "\n\n"
        text += content
    if not text.strip():
        raise EmptyPromptError("the prompt is empty")
    tokenizer = lm.tokenizer
    whole = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    bare = ids_of(tokenizer, text)
    if not starts or whole[len(whole) - len(bare) :] != bare:  # special tokens after it
        return whole
    return whole[: len(whole) - len(bare)] + segmented_ids(tokenizer, text, starts)
