"""Target backend over any ``transformers`` causal LM whose cache layers can be cropped, and
over a GGUF's model in our own modules (:mod:`~promptlookup.backends.gguf.modules`), which
looks like one but has no forward of its own.

For plain Llama, Qwen2 and Mistral models and our GGUF modules on the CPU
(:func:`~promptlookup.backends.gguf.decoder_pass.supports`) our
:class:`~promptlookup.backends.gguf.decoder_pass.DecoderPass` runs, and every pass is
row-invariant: each row's logits are bit for bit those of a one-token pass over
the same cache, whatever the number of rows, so no drafter, draft length or policy decision can
change a token (:attr:`TorchTarget.row_invariant`). Other models run through the model's
own forward, whose multi-token passes may round differently from one-token passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from ...errors import UnsupportedModelError
from ..base import PREFILL_CHUNK
from ..gguf.decoder_pass import DecoderPass, kv_dtype_for, supports
from ..gguf.linear import TIMED_ROWS, LinearKernels
from ..inexact.attention import (
    SDPA_MAX_ROWS,
    PromptAttention,
    grouped_sdpa,
    verification_attention,
)
from ..inexact.fastest import FastestKernels
from .cache import GROWTH, GrowingCache, GrowingLayer, growing_cache
from .identity import build_identity, weights_digest
from .window import WindowedCache, WindowedLayer, windowed_cache


class WindowLayer(GrowingLayer):
    """The cache of a sliding-window attention layer (Gemma 2 and 3, Mistral's configs with a
    window), kept whole so that it can be cropped after a rejected draft: transformers'
    ``DynamicSlidingWindowLayer`` drops the keys that leave the window, and a crop would have
    to bring them back. The attention mask keeps each query within its window (transformers
    builds it from the model's layer types over the positions :meth:`get_mask_sizes` gives:
    all of them, from 0), so attention sees the same keys; memory grows with the sequence."""

    is_sliding = True

    def __init__(
        self,
        sliding_window: int,
        transposed_keys: bool = False,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(transposed_keys, kv_dtype)
        self.sliding_window = sliding_window


#: Cache layers that :meth:`TorchTarget.crop` can crop (a windowed one back to where
#: it still holds the window: every crop of a rejected draft).
CROPPABLE = (GrowingLayer, WindowLayer, WindowedLayer)
#: Prompt tokens per pass for a model whose sliding-window layers keep only their window
#: (:class:`~promptlookup.backends.hf.window.WindowedCache`): a windowed layer's buffers hold
#: its window and a whole pass's rows, and a pass's activations grow with its rows: Gemma 3
#: 270M's 4,096-token prefill peaked 76 MiB over idle in 512-token passes, 120 in 2,048-token
#: ones (:data:`~promptlookup.backends.base.PREFILL_CHUNK`; benchmarks/runs/gemma-memory-s4);
#: served, its 24,000-token prompt peaked at 802 MiB in 256-token passes against 815-822 in
#: 512-token ones, in the same time (136-137 s, one run each, the machine loaded alike).
WINDOWED_PREFILL_CHUNK = 256
#: Bytes of float32 logits one sequence's verification pass returns at most: a longer draft
#: is cut to fit (:attr:`TorchTarget.max_draft`). Gemma 3 270M's 262,144-token vocabulary
#: takes 1 MiB a row, so a 63-token draft's pass held 64 MiB of logits at once (the Gemma
#: race's peak, benchmarks/runs/gemma-memory-s4); the default model's (49,152 tokens, 192 KiB a
#: row: 169 tokens) is beyond any draft the policy verifies (63).
LOGITS_BYTES = 32 << 20


class TorchTarget:
    """The torch backend's :class:`~promptlookup.backends.base.Target`: a ``transformers``
    causal LM, or a GGUF file's model in our own modules, run in torch and our C kernels."""

    def __init__(
        self,
        model: torch.nn.Module,
        kernels: LinearKernels | None = None,
        attention: PromptAttention | None = None,
        row_invariant: bool = True,
        layers_in_one_call: bool = True,
        kv_dtype: str = "auto",
    ) -> None:
        """``kernels`` and ``attention``: choices already measured for this model (another
        target's), or None to measure them on first use. ``row_invariant=False`` gives up
        exactness for the fastest kernels by timing (to measure what exactness costs).
        ``layers_in_one_call=False`` runs a quantized model's layers one by one in Python
        (:mod:`~promptlookup.backends.gguf.quantized_layers`: the same products, torch's rounding
        of the norms and SiLU). ``kv_dtype``: how keys and values are cached
        (:func:`~promptlookup.backends.gguf.decoder_pass.kv_dtype_for`)."""
        self.model = model.eval()
        config = model.config.get_text_config(decoder=True)
        self.config = config
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.cache: DynamicCache | None = None
        #: Which kernel each weight's products use in a verification pass (measured).
        if kernels is None:
            kernels = LinearKernels(model) if row_invariant else FastestKernels(model)
        self.kernels = kernels
        #: Whether bfloat16 prompt chunks take blocked attention or ``sdpa`` (measured).
        self.attention = (
            attention if attention is not None else PromptAttention(config, self.dtype, self.device)
        )
        #: Our pass over the model's modules (:mod:`~promptlookup.backends.gguf.decoder_pass`),
        #: or None where it does not reproduce the model. Row-invariant, it runs every pass;
        #: otherwise float32 one-token passes keep the model's own forward (bit-identical to
        #: transformers' plain decoding steps), where the model has one.
        self.decoder_pass = (
            DecoderPass(model, None if row_invariant else grouped_sdpa, layers_in_one_call)
            if supports(model)
            else None
        )
        self._row_invariant = row_invariant  # as asked; see the row_invariant property
        #: The dtype of every sequence's cached keys and values.
        self.kv_dtype = kv_dtype_for(kv_dtype, self.decoder_pass, self.dtype, row_invariant)
        #: Whether the model has a forward of its own: our GGUF modules have none, so our pass
        #: runs all of theirs (and transformers' attention registry is never needed).
        self.model_forward = type(model).forward is not torch.nn.Module.forward
        #: Prompt tokens per pass set for this target (None: :attr:`prefill_chunk` chooses).
        self._prefill_chunk: int | None = None
        self.reset()
        # Recurrent layers (or others transformers adds) forget what a crop would restore.
        self.can_crop = all(type(layer) in CROPPABLE for layer in self.cache.layers)

    def reset(self) -> None:
        self.cache = self.new_sequence()
        #: Prompt tokens fed by :meth:`prefill` and not run yet (see there).
        self._pending: list[int] = []

    def use_choice_files(self, cost_file) -> None:
        """Keep the measured kernel and attention choices beside the policy's ``cost_file``."""
        mode = "row-invariant" if self.kernels.row_invariant else "fastest"
        self.kernels.use_cache_file(cost_file.with_name(f"{cost_file.stem}-{mode}-kernels.json"))
        self.attention.use_cache_file(cost_file.with_name(f"{cost_file.stem}-attention.json"))

    @property
    def weights_format(self) -> str:
        """How the weights are held: ``"Q4_1+Q8_0 GGUF, float32 activations"`` for a GGUF's
        quantized weights (:mod:`~promptlookup.backends.gguf.loader`), else the dtype."""
        formats = getattr(self.model.config, "gguf_formats", None) or {}
        packed = [kind for kind in formats if not kind.startswith(("F", "BF"))]
        if packed:
            return f"{'+'.join(packed)} GGUF, float32 activations"
        return f"{str(self.dtype).removeprefix('torch.')} weights and activations"

    @property
    def row_invariant(self) -> bool:
        """Whether every pass computes each row as a one-token pass would (see the module
        doc): our pass, over row-invariant kernels."""
        return self._row_invariant and self.decoder_pass is not None and self.kernels.row_invariant

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length() + len(self._pending)

    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens one pass takes at most (a longer prompt goes in passes of this many,
        here and in the batch decoder): :data:`WINDOWED_PREFILL_CHUNK` where sliding-window
        layers keep only their window, else :data:`~promptlookup.backends.base.PREFILL_CHUNK`,
        unless set. Any size gives the same keys, values, logits and tokens (row-invariant
        passes; ``tests/test_prefill_chunks.py``); only memory and speed depend on it."""
        if self._prefill_chunk is not None:
            return self._prefill_chunk
        if isinstance(self.cache, WindowedCache):
            return min(WINDOWED_PREFILL_CHUNK, PREFILL_CHUNK)
        return PREFILL_CHUNK

    @prefill_chunk.setter
    def prefill_chunk(self, tokens: int | None) -> None:
        if tokens is not None and tokens < 1:
            raise ValueError(f"prefill_chunk must be at least 1 token, got {tokens}")
        self._prefill_chunk = tokens

    @property
    def max_draft(self) -> int:
        """The longest draft one sequence's pass verifies: as many rows of logits as
        :data:`LOGITS_BYTES` hold, less the bonus token's (Gemma 3 270M: 31 tokens; the batch
        decoder cuts longer drafts). A draft's length never changes a token."""
        return max(1, LOGITS_BYTES // (4 * self.config.vocab_size) - 1)

    @torch.inference_mode()
    def _run(
        self, token_ids: Sequence[int], logits_to_keep: int, cache: DynamicCache | None = None
    ) -> torch.Tensor:
        """A pass over ``token_ids`` appended to ``cache`` (default: the target's own)."""
        cache = self.cache if cache is None else cache
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        length = len(token_ids)
        # Row-invariant passes have their own attention: no prompt-attention choice to time.
        blocked = (
            not self.row_invariant and length > SDPA_MAX_ROWS and self.attention.prefers_blocks()
        )
        own = self.model_forward
        with verification_attention(self.config, blocked, own), self.kernels.use(length):
            if self.decoder_pass is not None and (
                self.row_invariant or length > 1 or self.dtype != torch.float32 or not own
            ):
                return self.decoder_pass(input_ids, cache, logits_to_keep)[0]
            out = self.model(
                input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep
            )
        return out.logits[0]

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Feed the prompt. Its last chunk (up to :attr:`prefill_chunk` tokens; all of a
        shorter prompt) waits and runs in the next forward pass, before that pass's own
        tokens: one pass instead of two, as ``model.generate``'s prefill also yields the first
        token. ``cache_length`` counts the waiting tokens; :meth:`crop` may drop them."""
        self._pending.extend(token_ids)
        chunk = self.prefill_chunk
        if len(self._pending) > chunk:
            whole = (len(self._pending) - 1) // chunk * chunk
            run, self._pending = self._pending[:whole], self._pending[whole:]
            self._extend(run)

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor | None:
        """Append ``token_ids`` (after any waiting prompt tokens) to the cache in chunks; the
        logits (vocab,) after the last of them (None for no tokens). A draft model feeds its
        context this way too."""
        fed, self._pending = [*self._pending, *token_ids], []
        return self._extend(fed)

    def _extend(self, token_ids: Sequence[int]) -> torch.Tensor | None:
        logits, chunk = None, self.prefill_chunk
        for start in range(0, len(token_ids), chunk):
            logits = self._run(token_ids[start : start + chunk], logits_to_keep=1)[-1]
        return logits

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        if not token_ids:
            self.extend(())
            return torch.empty(0, self.config.vocab_size)
        fed, self._pending = [*self._pending, *token_ids], []
        # Logits of this call's tokens only (the waiting prompt tokens before them need none).
        logits = self._run(fed, logits_to_keep=len(token_ids)).float()  # (len(token_ids), vocab)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # so that the caller's timing is real
        return logits

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token of one sequence: keys and values of every layer."""
        _, kv_heads, head_dim = self.attention.shape  # read from the config once, there
        size = torch.empty((), dtype=self.kv_dtype).element_size()
        return 2 * self.config.num_hidden_layers * kv_heads * head_dim * size

    @property
    def reuses_prefixes(self) -> bool:
        """Whether a prefix cache may hand its sequences an earlier sequence's keys and values
        (:class:`~promptlookup.backends.base.PrefixTarget`): where every pass is row-invariant,
        a prefix's keys and values are bit for bit the same however it was fed, and every
        layer is a :class:`~promptlookup.backends.hf.cache.GrowingLayer`."""
        return self.row_invariant and self.can_crop

    @property
    def kv_layout(self) -> str:
        """Layers, heads, head size and dtype of the keys and values (a block's layout)."""
        _, kv_heads, head_dim = self.attention.shape  # read from the config once, there
        # The keys' and values' own dtype where the target holds them in another than its
        # weights' (16-bit keys and values), else the weights'.
        dtype = str(getattr(self, "kv_dtype", self.dtype)).removeprefix("torch.")
        # Blocks of windowed caches: the whole layers' rows first (backends/hf/window.py).
        windowed = " windowed" if isinstance(self.cache, WindowedCache) else ""
        return f"{self.config.num_hidden_layers}x{kv_heads}x{head_dim} {dtype}{windowed}"

    def kv_identity(self) -> str:
        """A digest of the weights, the engine and :attr:`kv_layout` (see
        :class:`~promptlookup.backends.base.PrefixTarget`); hashing the weights takes about a
        second per GB, once per target."""
        if getattr(self, "_kv_identity", None) is None:
            native = self.decoder_pass is not None and self.decoder_pass.native_attention
            one_call = self.decoder_pass is not None and self.decoder_pass.quantized_layers
            digest = weights_digest(self.model)
            engine = f"{type(self).__name__} native={native} one_call={bool(one_call)}"
            self._kv_identity = f"{engine} {self.kv_layout} {build_identity()} weights={digest}"
        return self._kv_identity

    def new_sequence(self) -> GrowingCache:
        """An empty cache for one more sequence of :meth:`forward_batch` (keys transposed
        where row-invariant passes take the native attention kernel)."""
        native = self.decoder_pass is not None and self.decoder_pass.native_attention
        cache = growing_cache(self.model.config, native, self.kv_dtype)
        if native:  # sliding-window layers keep only their window (backends/hf/window.py)
            windows = [layer.window for layer in self.decoder_pass.layers]
            return windowed_cache(cache, windows, native, self.kv_dtype)
        cache.layers = [
            WindowLayer(layer.sliding_window, native, self.kv_dtype)
            if type(layer) is DynamicSlidingWindowLayer
            else layer
            for layer in cache.layers
        ]
        return cache

    def reserve(self, cache: DynamicCache, prompt_tokens: int, new_tokens: int) -> None:
        """Room in ``cache`` (a sequence about to be prefilled) for its ``prompt_tokens`` and
        up to a quarter more of its ``new_tokens``, made at once: grown chunk by chunk, a long
        prompt's cache is copied at every chunk, and the heap keeps the buffers it leaves
        (a third of the keys and values more, measured at 8,000 tokens; docs/server.md). Layers
        that keep a window, or are not :class:`GrowingLayer`, grow as before."""
        tokens = prompt_tokens + min(new_tokens, prompt_tokens // GROWTH)
        _, kv_heads, head_dim = self.attention.shape
        like = torch.empty(1, kv_heads, 0, head_dim, dtype=self.dtype, device=self.device)
        for layer in cache.layers:
            if type(layer) is not GrowingLayer or tokens <= layer.get_seq_length():
                continue
            buffer = getattr(layer, "value_buffer", None)  # None before its first pass
            before = None if buffer is None else buffer.shape[-2]
            layer.make_room(tokens - layer.get_seq_length(), like)
            if layer.value_buffer.shape[-2] != before:  # slots not yet written hold zeros,
                # as the cache promises attention (see GrowingLayer)
                layer.key_buffer[..., layer.length :, :].zero_()
                layer.value_buffer[..., layer.length :, :].zero_()

    def forward_batch(
        self,
        caches: Sequence[DynamicCache],
        token_ids: Sequence[Sequence[int]],
        logits_to_keep: Sequence[int],
    ) -> list[torch.Tensor]:
        """One forward pass over several sequences (see
        :meth:`~promptlookup.backends.base.BatchTarget.forward_batch`): packed into one pass
        when :attr:`row_invariant`, else one pass per sequence on its own cache (the model's
        own forward cannot run sequences of different cache lengths as one without padding
        them, and padding rounds a row differently than it is rounded alone)."""
        vocab = self.config.vocab_size
        if not all(token_ids):  # sequences without new tokens sit this pass out
            fed = [index for index, tokens in enumerate(token_ids) if tokens]
            logits = (
                self.forward_batch(
                    [caches[i] for i in fed],
                    [token_ids[i] for i in fed],
                    [logits_to_keep[i] for i in fed],
                )
                if fed
                else []
            )
            rows = dict(zip(fed, logits))
            return [rows.get(index, torch.empty(0, vocab)) for index in range(len(token_ids))]
        if not self.row_invariant:
            return [
                self._run(tokens, max(kept, 1), cache).float()[max(kept, 1) - kept :]
                for cache, tokens, kept in zip(caches, token_ids, logits_to_keep)
            ]  # (kept, vocab) each
        lengths = [len(tokens) for tokens in token_ids]
        input_ids = torch.tensor(
            [[t for tokens in token_ids for t in tokens]], dtype=torch.long, device=self.device
        )
        with self.kernels.use(sum(lengths)):
            logits = self.decoder_pass.batch(input_ids, caches, lengths, logits_to_keep).float()
        return list(logits.split(list(logits_to_keep)))  # (logits_to_keep[i], vocab) each

    def prepare(self, sizes: Sequence[int]) -> None:
        """Choose the kernels for verification passes of these sizes, and of every shorter
        one, now (they are timed on first use), so that the policy's calibration times the
        passes themselves and later passes find their choice made."""
        longest = max(sizes, default=0)
        for rows in sorted({*sizes, *(rows for rows in TIMED_ROWS if rows <= longest)}):
            self.kernels.choose(rows)

    def crop(self, length: int) -> None:
        cached = self.cache.get_seq_length()
        if length >= cached:  # only waiting prompt tokens go
            del self._pending[max(length - cached, 0) :]
            return
        if not self.can_crop:
            raise UnsupportedModelError(
                f"{type(self.model).__name__} keeps a cache that cannot be cropped; "
                "use drafter='none' (plain decoding)"
            )
        self._pending = []
        self.cache.crop(length)


def __getattr__(name: str):
    """``TransformersTarget``, the name :class:`TorchTarget` had before 0.15 (it also runs GGUF
    files on our own modules and C kernels), still importable with a DeprecationWarning."""
    if name == "TransformersTarget":
        import warnings

        warnings.warn(
            "TransformersTarget is now TorchTarget (promptlookup.backends.hf.target)",
            DeprecationWarning,
            stacklevel=2,
        )
        return TorchTarget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
