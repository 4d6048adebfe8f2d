"""Attention for passes that are not row-invariant: grouped-query attention, no slow paths.

Inexact by design (its SDPA and blocked kernels sum each row in an order that depends on the
pass): it serves a model's own ``forward`` (architectures our pass does not
reproduce) and the bench's ``promptlookup-fastest``. Row-invariant passes take
:mod:`~promptlookup.backends.gguf.row_invariant` or the native kernel instead.

SmolLM2-135M, like most recent models, shares each key/value head among several query heads
(9 query heads, 3 key/value heads). Two cases are slow in transformers' ``sdpa`` attention
on CPU (torch 2.13, measured after a 2,000-token prompt, one thread):

- A verification *forward pass* feeds k > 1 tokens after a cache, so it needs a causal mask
  aligned to the cache's end; with a mask, transformers repeats every key/value head for its
  query heads (``repeat_kv``): a copy of the layer's whole cache, in every layer, every pass.
  That made a pass over 8 tokens cost 2.3x one token in float32.
- A one-token pass in bfloat16 goes to a grouped-query kernel that took 2.6 ms per layer,
  6x the same attention computed with the heads folded as below.

:func:`grouped_sdpa` folds each key/value head's query heads into the query-length axis,
``(batch, heads, k, head_dim) -> (batch, kv_heads, groups * k, head_dim)``, with the mask
tiled to match, and runs plain SDPA on the unrepeated cache: the same attention, row by row.
Float32 one-token passes keep transformers' own path, so plain steps stay bit-identical to
plain decoding.

A third case is a bfloat16 *prompt chunk*: causal attention over hundreds of tokens, where
``sdpa``'s CPU flash kernel reached about 50 GFLOP/s against about 200 for the matrix products
around it (a third of an 824-token prefill). :func:`blocked_attention` computes it as eager
attention does in bfloat16 (scores by a bfloat16 product, a softmax, a product with the
values), one block of :data:`BLOCK` query rows at a time against only the keys the block can
see: 9.9 ms per layer instead of 16.2 for 824 tokens, 49 instead of 73 for 2,000 (a one-off
timing of the attention alone, one thread, AMD EPYC). That is this CPU's: on a Xeon with AMX
``sdpa`` is the faster, 5.9 ms per layer against 9.3 for 824 tokens (a one-off timing too),
so :class:`PromptAttention` times both once per machine and model shape and keeps the faster. A chunk's causal mask (a
chunk after a cache) is recognised once per pass and then not applied element by element.
Float32 keeps ``sdpa`` (there the blocks win only on short prompts, and plain decoding's
rounding is kept).

Drafts keep folded ``sdpa`` (:data:`SDPA_MAX_ROWS`): through the blocks, bfloat16 drafts were
no faster end to end, and their answers parted from plain decoding's in more places (the blocks
round scores to bfloat16 before the softmax, flash attention does not; the CHANGELOG has the
runs).

:func:`verification_attention` switches a model to :func:`grouped_sdpa` for the duration of
our own forward passes only; every other case (CUDA, soft-capping, position biases, float
masks) goes to transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

import contextvars
import functools
import json
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..gguf.linear import median_ratios

NAME = "promptlookup_sdpa"
#: Query rows per block of :func:`blocked_attention` (fastest of 32-256 on prompts of
#: 300-2,000 tokens, bfloat16, one thread).
BLOCK = 64
#: bfloat16 passes over at most this many query tokens keep folded ``sdpa``; longer ones (prompt
#: chunks: drafts are at most 64 tokens) use :func:`blocked_attention` (see the module doc).
SDPA_MAX_ROWS = 64
#: Prompt length at which :class:`PromptAttention` times the blocks against ``sdpa``.
TIMED_PROMPT = 768
#: The blocks must beat ``sdpa`` by this factor to be used (timings are noisy).
MARGIN = 0.95
#: Whether the current pass sends bfloat16 prompt chunks to the blocks (set by
#: :func:`verification_attention` from :class:`PromptAttention`'s choice).
_blocked_prompts = contextvars.ContextVar("promptlookup_blocked_prompts", default=True)


def grouped_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' attention-function signature; shapes ``(batch, heads, length, head_dim)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    plain_case = (
        heads == groups * kv_heads
        and query.device.type == "cpu"
        and (
            attention_mask is None
            or (
                attention_mask.dtype == torch.bool
                and attention_mask.dim() == 4
                and attention_mask.shape[1] == 1
            )
        )
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)
    )
    if (
        plain_case
        and q_len > SDPA_MAX_ROWS
        and query.dtype == torch.bfloat16
        and batch == 1
        and not dropout
        and _blocked_prompts.get()
    ):
        if attention_mask is not None and _mask_derived(attention_mask, "causal", _is_causal):
            attention_mask = None  # the blocks then skip the mask and the keys it hides
        return blocked_attention(query, key, value, attention_mask, scaling), None
    if q_len == 1:
        folds = query.dtype != torch.float32
    else:  # without a mask (a prefill) transformers runs causal grouped attention already
        folds = attention_mask is not None
    folds = folds and groups > 1 and plain_case
    if not folds:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # Rows ordered (query head within its group, position), matching the tiled mask.
    folded_query = query.reshape(batch, kv_heads, groups * q_len, head_dim)
    folded_mask = None if attention_mask is None else _tiled_mask(attention_mask, groups)
    attn_output = torch.nn.functional.scaled_dot_product_attention(
        folded_query,
        key,
        value,
        attn_mask=folded_mask,
        dropout_p=dropout,
        scale=scaling,
    )  # (batch, kv_heads, groups * q_len, head_dim)
    attn_output = attn_output.reshape(batch, heads, q_len, head_dim)
    return attn_output.transpose(1, 2).contiguous(), None


_last_mask: list = [None, {}]  # [weak reference to a mask, {name: value derived from it}]


def _mask_derived(attention_mask: torch.Tensor, name: str, make):
    """``make(attention_mask)``, made once per mask: every layer of a pass gets the same mask
    object, so what is derived from it (a tiling, whether it is causal) is made once a pass."""
    reference, derived = _last_mask
    if reference is None or reference() is not attention_mask:
        derived = {}
        _last_mask[:] = [weakref.ref(attention_mask), derived]
    if name not in derived:
        derived[name] = make(attention_mask)
    return derived[name]


def _tiled_mask(attention_mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``attention_mask`` (batch, 1, q_len, kv_len) repeated ``groups`` times along the query
    axis (made once a pass)."""
    return _mask_derived(
        attention_mask, ("tiled", groups), lambda mask: mask.repeat(1, 1, groups, 1)
    )


def _is_causal(attention_mask: torch.Tensor) -> bool:
    """Whether a (1, 1, q_len, kv_len) mask lets each query see exactly the keys up to its own
    position, the last ``q_len`` of ``kv_len`` (a prompt chunk fed after a cache)."""
    q_len, kv_len = attention_mask.shape[-2:]
    causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=attention_mask.device)
    return bool(torch.equal(attention_mask[0, 0], causal.tril(kv_len - q_len)))


def blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of one sequence's query tokens, the last ``q_len`` of the ``kv_len`` cached
    ones, in blocks of :data:`BLOCK` query rows; returns ``(1, q_len, heads, head_dim)``.

    ``query`` (1, heads, q_len, head_dim); ``key``/``value`` (1, kv_heads, kv_len, head_dim);
    ``attention_mask`` (1, 1, q_len, kv_len) of booleans (True: may attend), or None for
    causal attention. A block sees keys up to its last query's position only when the mask
    hides every later key (always, for a causal mask), so the masked half of a prompt's scores
    is mostly never computed.
    """
    _, heads, q_len, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    offset = kv_len - q_len  # cache length before these queries
    scaling = head_dim**-0.5 if scaling is None else scaling
    grouped_query = query[0].view(kv_heads, groups, q_len, head_dim)
    keys, values = key[0], value[0]  # (kv_heads, kv_len, head_dim)
    output = torch.empty(q_len, kv_heads, groups, head_dim, dtype=query.dtype, device=query.device)
    causal = torch.ones(BLOCK, BLOCK, dtype=torch.bool, device=query.device).tril()
    for start in range(0, q_len, BLOCK):
        stop = min(q_len, start + BLOCK)
        rows = stop - start
        visible = offset + stop  # keys up to the block's last query
        if attention_mask is None:
            hidden = ~causal[:rows, :rows]  # (rows, rows): later keys within the block
        else:
            if attention_mask[0, 0, start:stop, visible:].any():
                visible = kv_len
            hidden = ~attention_mask[0, 0, start:stop, :visible]  # (rows, visible)
        block_query = query.new_empty(kv_heads, groups, rows, head_dim)
        torch.mul(grouped_query[:, :, start:stop], scaling, out=block_query)  # a scaled copy
        block_query = block_query.view(kv_heads, groups * rows, head_dim)
        scores = torch.bmm(block_query, keys[:, :visible].transpose(1, 2))
        scores.view(kv_heads, groups, rows, visible)[
            ..., visible - hidden.shape[-1] :
        ].masked_fill_(hidden, float("-inf"))  # (kv_heads, groups * rows, visible)
        weights = torch.softmax(scores, dim=-1)
        block_output = torch.bmm(
            weights, values[:, :visible]
        )  # (kv_heads, groups * rows, head_dim)
        output[start:stop] = block_output.view(kv_heads, groups, rows, head_dim).permute(2, 0, 1, 3)
    return output.view(1, q_len, heads, head_dim)


#: (heads, kv_heads, head_dim) -> the choice :class:`PromptAttention` timed in this process.
_timed_choices: dict[tuple[int, int, int], str] = {}


class PromptAttention:
    """Whether bfloat16 prompt chunks take :func:`blocked_attention` or ``sdpa`` on this machine.

    Timed once, on the model's head shapes over a causal chunk of :data:`TIMED_PROMPT` tokens
    (both kernels interleaved, median of five rounds); the blocks are used only when they beat
    ``sdpa`` by :data:`MARGIN`. The choice can be kept in a file
    (:meth:`use_cache_file`), like :class:`~promptlookup.backends.gguf.linear.LinearKernels`', and
    is timed once per process and head shape. Other dtypes and devices always keep ``sdpa``.
    """

    KERNELS = ("blocked", "sdpa")

    def __init__(self, config, dtype: torch.dtype, device: torch.device) -> None:
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.shape = (heads, kv_heads, head_dim)
        self.applies = dtype == torch.bfloat16 and device.type == "cpu" and heads % kv_heads == 0
        self.choice: str | None = None
        self.cache_file: Path | None = None

    def use_cache_file(self, path: str | Path) -> None:
        """Keep the choice in ``path`` (JSON); a missing or foreign file means timing again."""
        self.cache_file = Path(path)
        try:
            stored = json.loads(self.cache_file.read_text())["bfloat16_prompt"]
            if stored in self.KERNELS:
                self.choice = stored
        except (OSError, ValueError, TypeError, KeyError):
            pass

    def prefers_blocks(self) -> bool:
        """Whether a prompt chunk of this model goes to the blocks (timed on first call)."""
        if not self.applies:
            return False
        if self.choice is None:
            if self.shape not in _timed_choices:  # timed once per process and head shape
                _timed_choices[self.shape] = self._fastest()
            self.choice = _timed_choices[self.shape]
            if self.cache_file is not None:
                from ...cache_files import save_cache_json

                save_cache_json(self.cache_file, {"bfloat16_prompt": self.choice})
        return self.choice == "blocked"

    @torch.inference_mode()
    def _fastest(self) -> str:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        heads, kv_heads, head_dim = self.shape
        generator = torch.Generator().manual_seed(0)
        query = torch.randn(1, heads, TIMED_PROMPT, head_dim, generator=generator).bfloat16()
        key, value = (
            torch.randn(1, kv_heads, TIMED_PROMPT, head_dim, generator=generator).bfloat16()
            for _ in range(2)
        )  # (1, kv_heads, TIMED_PROMPT, head_dim)
        module = types.SimpleNamespace(
            is_causal=True, training=False, num_key_value_groups=heads // kv_heads
        )
        kernels = {
            "blocked": lambda: blocked_attention(query, key, value, None, None),
            "sdpa": lambda: sdpa_attention_forward(module, query, key, value, None),
        }
        ratios = median_ratios(kernels, baseline="sdpa", rounds=5)
        return "blocked" if ratios["blocked"] < MARGIN else "sdpa"


@functools.cache
def _register() -> None:
    """Make :data:`NAME` known to transformers (once per process, on first use)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextmanager
def verification_attention(
    config, blocked_prompts: bool = True, model_forward: bool = True
) -> Iterator[None]:
    """Run the enclosed forward passes with :func:`grouped_sdpa` if ``config`` uses ``sdpa``;
    ``blocked_prompts``: whether bfloat16 prompt chunks go to :func:`blocked_attention`.
    ``model_forward=False``: no pass calls the model's own forward (only our
    passes, which call :func:`grouped_sdpa` themselves), so transformers' attention registry
    (its modelling code, a sizeable import) is left alone."""
    token = _blocked_prompts.set(blocked_prompts)  # read by grouped_sdpa, however it is called
    try:
        if not model_forward or getattr(config, "_attn_implementation", None) != "sdpa":
            yield
            return
        _register()
        config._attn_implementation_internal = NAME
        try:
            yield
        finally:
            config._attn_implementation_internal = "sdpa"
    finally:
        _blocked_prompts.reset(token)
