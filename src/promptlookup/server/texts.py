"""Tokenizing a request's long texts without holding up other requests.

Request threads share the tokenizer, one encoding at a time (``ServerState.tokenizer_lock``),
and a long text takes seconds to tokenize (650 KB: about 2 s on the project's 2-core CPU), in
which every other request waited. So a text over :data:`CHUNK` characters is tokenized a chunk
at a time, the lock released between chunks (other requests take their turns), and only until
it has more tokens than the context can hold: a prediction is bounded in tokens by the
context (a 400 beyond it), and a prompt that cannot fit is refused before the rest of it is
read. Work and memory per request are then bounded by the context, not by the body's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

#: Characters tokenized under the lock at a time.
CHUNK = 16_384


def chunks(text: str, size: int = CHUNK) -> Iterator[str]:
    """``text`` in pieces of at most ``size`` characters, each cut before a space where one
    is in its second half (where pre-tokenizers split the text anyway)."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            space = text.rfind(" ", start + size // 2, end)
            end = space if space > start else end
        yield text[start:end]
        start = end


def bounded_ids(tokenizer, lock, texts: Iterable[str], limit: int) -> list[int] | None:
    """The token ids of ``texts`` (no special tokens), tokenized chunk by chunk under
    ``lock``; None as soon as they are more than ``limit`` beyond what the cuts could have
    added (one token per cut), without tokenizing the rest."""
    ids: list[int] = []
    for cuts, piece in enumerate(piece for text in texts for piece in chunks(text)):
        with lock:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
        if len(ids) - cuts > limit:
            return None
    return ids
