"""Prompts as token ids: plain text, chat messages through the tokenizer's chat template, or
token ids as they are."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Union

from .errors import EmptyPromptError, InvalidParameterError

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
        ids = tokenizer.apply_chat_template(items, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    raise InvalidParameterError(
        "a prompt must be text, token ids, or messages with role and content"
    )


def _without_template(lm, messages: Sequence[dict]) -> list[int]:
    """Messages for a model without a chat template (a base model, e.g. a GGUF file that
    stores none): their contents as plain text, a blank line apart (said once per model)."""
    if not getattr(lm, "_told_no_template", False):
        lm._told_no_template = True
        warnings.warn(
            f"{lm.name} has no chat template (a base model?): "
            "the messages' contents are joined as plain text",
            RuntimeWarning,
            stacklevel=4,
        )
    parts = []
    for message in messages:
        content = message["content"]
        if not isinstance(content, str):  # OpenAI content parts
            content = "".join(part.get("text", "") for part in content or ())
        parts.append(content)
    return encode_prompt(lm, "\n\n".join(parts))
