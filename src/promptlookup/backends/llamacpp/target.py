"""Target backend over llama.cpp (``llama-cpp-python``): GGUF models at llama.cpp's CPU speed.

The model, context and KV cache come from a ``llama_cpp.Llama`` object; forward passes use
llama.cpp's low-level batch API directly, asking for logits only at the positions of the new
tokens (never the whole prompt), and a rejected draft is removed from the KV cache with
``llama_memory_seq_rm``. The prompt's cache is kept across steps.

Numerics: llama.cpp computes a pass over one token with other kernels than a pass over several
(ggml-org/llama.cpp#4479); on the default model the logits of the two differ by up to ~1 (their
scale is ~40), while passes over 2, 3, ... tokens agree bit for bit with each other. The prompt
is fed in the same chunks as llama.cpp's own ``Llama.generate``, so plain decoding
(``drafter="none"``) reproduces llama.cpp's greedy output token for token; with drafts the
output equals it except where two tokens nearly tie. ``batch_invariant=True`` runs every pass
over at least two tokens (a single token is padded with a copy of itself, removed from the cache
afterwards): the output is then identical with and without drafting, and plain steps are slower.

Tokens are the GGUF's own vocabulary: the tokenizer is ``transformers``' reading of the same GGUF
(its ids agree with llama.cpp's tokenizer; a test checks this), so drafters, chat templates and
detokenization work exactly as with the torch backend.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ...errors import ModelLoadError, PromptTooLongError, UnsupportedModelError
from ...machine import default_threads

#: Context length used when the caller gives none: the model's training context, capped here
#: (the KV cache is allocated up front).
DEFAULT_MAX_CONTEXT = 8192
#: Tokens per llama.cpp batch; prompts are prefilled in chunks of this size.
DEFAULT_BATCH = 512


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelLoadError(
            "the llama.cpp backend needs llama-cpp-python: pip install llama-cpp-python==0.3.36"
        ) from exc
    return llama_cpp


class LlamaCppTarget:
    """A ``llama_cpp.Llama`` model as a :class:`~promptlookup.backends.base.Target`.

    The target owns the context's KV cache (sequence 0) between :meth:`reset` calls. It leaves
    ``llama.n_tokens`` at 0, so the ``Llama`` object's own methods (``generate``,
    ``create_completion``) clear the cache before they use it and never see stale state.
    ``batch_invariant``: see the module docstring.
    """

    def __init__(self, llama, batch_invariant: bool = False) -> None:
        llama_cpp = _import_llama_cpp()
        self._lib = llama_cpp
        self.llama = llama
        self.max_context = int(llama.n_ctx())
        self.n_batch = int(llama.n_batch)
        self.vocab_size = int(llama.n_vocab())
        self._ctx = llama.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        # Recurrent state cannot be rolled back to an earlier position.
        self.can_crop = not (
            llama_cpp.llama_model_is_recurrent(llama.model)
            or llama_cpp.llama_model_is_hybrid(llama.model)
        )
        # One batch of n_batch slots, reused by every forward pass; freed with the target.
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, llama_cpp.llama_batch_free, self._batch)
        # numpy views on the batch's C arrays: filling a pass is a few vector writes.
        self._token = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._wants_logits = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            self._batch.seq_id[i][0] = 0
        #: Fewest tokens one llama_decode call holds (2 = always the multi-token kernels).
        self.min_pass_tokens = 2 if batch_invariant else 1
        self.reset()

    # -- Target protocol ---------------------------------------------------------------------

    @property
    def cache_length(self) -> int:
        return self._length + len(self._pending)

    def reset(self) -> None:
        self._lib.llama_memory_clear(self._memory, True)
        self.llama.reset()  # the Llama object's own record: nothing cached
        self._length = 0
        #: Prompt tokens past the last whole n_batch chunk, decoded with the next pass.
        self._pending: list[int] = []

    def prefill(self, token_ids: Sequence[int]) -> None:
        # Chunks of n_batch from position 0, like llama.cpp's own prompt evaluation; the rest
        # waits so that the first forward pass completes the prompt's last chunk exactly as
        # llama.cpp would (the same batch, hence the same kernels and the same numbers).
        self._pending.extend(token_ids)
        while len(self._pending) >= self.n_batch:
            chunk, self._pending = self._pending[: self.n_batch], self._pending[self.n_batch :]
            self._decode(chunk, first_output=self.n_batch - 1)

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        fed = [*self._pending, *token_ids]
        first = len(self._pending)  # rows before this are prompt tokens: no logits wanted
        self._pending = []
        rows = []
        for start in range(0, len(fed), self.n_batch):  # one chunk unless a huge draft
            chunk = fed[start : start + self.n_batch]
            outputs_from = min(max(first - start, 0), len(chunk) - 1)
            self._decode(chunk, first_output=outputs_from)
            if start + len(chunk) > first:
                # llama.cpp keeps the requested rows contiguously, in batch order.
                logits = np.ctypeslib.as_array(
                    self._lib.llama_get_logits(self._ctx),
                    shape=(len(chunk) - outputs_from, self.vocab_size),
                )
                rows.append(torch.from_numpy(logits.copy()))
        if not rows:
            return torch.empty(0, self.vocab_size)
        return rows[0] if len(rows) == 1 else torch.cat(rows)  # (len(token_ids), vocab) float32

    def prepare(self, sizes: Sequence[int]) -> None:
        """Nothing to set up: llama.cpp chooses its kernels itself."""

    def crop(self, length: int) -> None:
        if length >= self.cache_length:
            return
        if length >= self._length:
            del self._pending[length - self._length :]
            return
        self._pending = []
        if not self._lib.llama_memory_seq_rm(self._memory, 0, length, -1):
            raise UnsupportedModelError(
                "this model's llama.cpp cache cannot drop positions; "
                "use drafter='none' (plain decoding)"
            )
        self._length = length

    # -- internals ---------------------------------------------------------------------------

    def _decode(self, token_ids: Sequence[int], first_output: int) -> None:
        """One llama_decode call over ``token_ids`` (at most n_batch), asking for the logits of
        rows ``first_output`` onwards."""
        n = len(token_ids)
        if self._length + n > self.max_context:
            raise PromptTooLongError(
                f"the sequence would exceed the llama.cpp context of {self.max_context} tokens"
            )
        # Padding (batch_invariant): copies of the last token, fed but dropped afterwards.
        padded = max(n, min(self.min_pass_tokens, self.max_context - self._length))
        self._token[:n] = token_ids
        self._token[n:padded] = token_ids[-1]
        self._pos[:padded] = np.arange(self._length, self._length + padded, dtype=np.int32)
        self._wants_logits[:padded] = 0
        self._wants_logits[first_output:n] = 1
        self._batch.n_tokens = padded
        status = self._lib.llama_decode(self._ctx, self._batch)
        if status != 0:
            # Failed decodes may leave part of the batch cached: drop it, keep positions valid.
            self._lib.llama_memory_seq_rm(self._memory, 0, self._length, -1)
            raise RuntimeError(
                f"llama_decode returned {status} (context {self.max_context}, "
                f"cache {self._length}, batch {n})"
            )
        if padded > n:
            self._lib.llama_memory_seq_rm(self._memory, 0, self._length + n, -1)
        self._length += n


# -- opening a GGUF -----------------------------------------------------------------------------


def open_llama(
    path: str | os.PathLike,
    *,
    n_ctx: int | None = None,
    n_batch: int = DEFAULT_BATCH,
    n_threads: int | None = None,
    **llama_options,
):
    """A ``llama_cpp.Llama`` over a GGUF file, quiet, on ``n_threads`` threads for both single
    tokens and batches; ``n_ctx`` None means the model's training context, at most
    :data:`DEFAULT_MAX_CONTEXT`. Errors: :class:`ModelLoadError` for an unreadable file."""
    llama_cpp = _import_llama_cpp()
    path = Path(path)
    threads = n_threads or default_threads()
    if n_ctx is None:
        n_ctx = min(_gguf_context_length(path) or DEFAULT_MAX_CONTEXT, DEFAULT_MAX_CONTEXT)
    try:
        return llama_cpp.Llama(
            str(path),
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            **{"logits_all": False, **llama_options},
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(
            f"{path}: llama.cpp cannot load this GGUF "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from exc


def _gguf_context_length(path: Path) -> int | None:
    """The GGUF's ``<arch>.context_length`` read from its header, or None."""
    try:
        from gguf import GGUFReader  # ships with transformers' GGUF support
    except ImportError:
        return None
    try:
        reader = GGUFReader(str(path))
        for name, field in reader.fields.items():
            if name.endswith(".context_length"):
                return int(field.parts[field.data[0]][0])
    except Exception:  # unreadable header: llama.cpp will report it
        return None
    return None


__all__ = ["LlamaCppTarget", "open_llama"]
