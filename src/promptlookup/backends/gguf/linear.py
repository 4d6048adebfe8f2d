"""Matrix products for our forward passes, each row computed as in a one-token pass.

A *forward pass* multiplies every weight matrix by its rows: one for a plain decoding step,
the last token and its draft for a verification pass, hundreds for a prompt chunk. For a draft
never to change a token, row i of a k-row product must equal, bit for bit, the product of that
row alone. ``nn.Linear`` does not give that on a CPU: the BLAS takes one path for a single row
(a matrix-vector product), another for two or three, and blocked paths beyond, each summing in
its own order (float32, every row count here; bfloat16 on some shapes).

oneDNN's linear over a copy of the weight reordered once into its blocked layout
(``torch.ops.mkldnn``, the ``packed`` kernel) sums every row of a product of two or more rows in
the same order; a single row is therefore padded to two. That is the *reference* product in
:class:`LinearKernels`' default, row-invariant mode. Other kernels (``linear``: ``nn.Linear``;
``weight_first``: ``(W @ x.T).T``) are timed against it only where they give bit-identical
float32 results on random rows at every row count that uses the choice (a bfloat16 result
rounds most reorderings of a sum away, so a check there proves little and bfloat16 keeps the
reference), so the choice by timing never changes a value. If the reference itself is found
to depend on the row count on some machine (checked the same way), that weight shape's rows
are multiplied one at a time (``rows``): exact by construction, and slow. The reordered copies double the weights' memory.

Exact only: the bench's ``promptlookup-fastest`` method (what exactness costs) takes the fastest
kernel by timing whatever its rounding, :class:`~promptlookup.backends.inexact.fastest.FastestKernels`.

The kernels are switched on the model's ``nn.Linear`` modules for the duration of our own
passes only (transformers' ``model.generate`` on the same model object is untouched). Choices
can be kept in a file (:meth:`LinearKernels.use_cache_file`), so only the first process on a
machine pays for the timing.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

#: Row counts at which kernels are timed; a pass uses the choice of the next one up, and a
#: longer one (a chunk of the prompt) the choice of the last.
TIMED_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
#: A kernel must beat ``nn.Linear`` by this factor to be used (timings are noisy).
MARGIN = 0.95
KERNELS = ("linear", "weight_first", "packed")


def weight_first_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as ``(W @ x.T).T``; ``x`` is (..., in_features)."""
    rows = x.reshape(-1, x.shape[-1])  # (rows, in)
    if module.bias is None:
        out = torch.mm(module.weight, rows.t())  # (out, rows)
    else:
        out = torch.addmm(module.bias.unsqueeze(1), module.weight, rows.t())
    return out.t().contiguous().reshape(*x.shape[:-1], module.out_features)


def packed_linear(module: torch.nn.Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``module(x)`` by oneDNN over ``packed``, the module's weight reordered once."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")


def at_least_two_rows(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``forward`` with a single row padded to two (a zero row, dropped from the result), so
    that one row takes the path of every longer product."""

    def padded(x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return forward(x)
        pair = torch.cat([x.reshape(1, -1), x.new_zeros(1, x.shape[-1])])  # (2, in)
        return forward(pair)[:1].reshape(*x.shape[:-1], -1)

    return padded


def one_row_at_a_time(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``forward`` applied to each row on its own (as a one-token pass applies it)."""

    def by_rows(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, 1, x.shape[-1])  # (rows, 1, in)
        return torch.cat([forward(row) for row in rows]).reshape(*x.shape[:-1], -1)

    return by_rows


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN reorders weights of ``dtype`` on this CPU (bfloat16 needs AVX-512 or
    AVX-NE-CONVERT; elsewhere the products stay with ``nn.Linear``, checked the same way)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), None)
    except RuntimeError:
        return False
    return True


class LinearKernels:
    """Per number of rows, which kernel each of ``model``'s ``nn.Linear`` modules uses.

    Modules are grouped by weight shape and dtype; a group's choice is timed over all its
    modules in turn (as a forward pass streams them from memory), the kernels interleaved, by
    the median of five rounds' ratios to ``nn.Linear`` after a warm-up round. Only CPU models
    are switched.
    """

    #: Whether every row of a product is computed as the product of that row alone.
    row_invariant = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.groups: dict[tuple, list[torch.nn.Linear]] = defaultdict(list)
        for module in model.modules():
            if type(module) is torch.nn.Linear and module.weight.device.type == "cpu":
                self.groups[self._key(module)].append(module)
        dtypes = {key[2] for key in self.groups}
        packing = all(map(packs, dtypes)) and self._can_pack()
        self.kernels = KERNELS if packing else KERNELS[:2]
        #: The product every candidate must reproduce bit for bit (row-invariant mode).
        self.reference = "packed" if packing else "linear"
        #: rows -> {group key: kernel name}, for the groups not on ``nn.Linear``.
        self.choices: dict[int, dict[tuple, str]] = {}
        #: id(module) -> (reordered weight, (data pointer, version) of the weight it copies)
        self.packed: dict[int, tuple[torch.Tensor, tuple[int, int]]] = {}
        self.cache_file: Path | None = None
        #: timed rows -> [(module, the forward it runs)]: the switch :meth:`use` makes.
        self.switches: dict[int, list[tuple[torch.nn.Linear, Callable]]] = {}

    @staticmethod
    def _name(key: tuple) -> str:
        out_features, in_features, dtype, bias = key
        return f"{out_features}x{in_features}-{str(dtype).removeprefix('torch.')}-{'bias' if bias else 'nobias'}"

    def use_cache_file(self, path: str | Path) -> None:
        """Keep the choices in ``path`` (JSON); choices already stored there are used as they
        are. A missing, unreadable or foreign file only means measuring again."""
        self.cache_file = Path(path)
        self.switches.clear()
        try:
            stored = json.loads(self.cache_file.read_text())
            keys = {self._name(key): key for key in self.groups}
            for rows, chosen in stored.items():
                if set(chosen) <= set(keys) and set(chosen.values()) <= self._known():
                    self.choices[int(rows)] = {
                        keys[name]: kernel for name, kernel in chosen.items()
                    }
        except (OSError, ValueError, TypeError, AttributeError):
            pass

    def _save(self) -> None:
        if self.cache_file is None:
            return
        from ...cache_files import save_cache_json

        save_cache_json(
            self.cache_file,
            {
                str(rows): {self._name(key): kernel for key, kernel in chosen.items()}
                for rows, chosen in self.choices.items()
            },
        )

    def choose(self, rows: int) -> dict[tuple, str]:
        """The groups switched away from ``nn.Linear`` in a pass over ``rows`` rows, and their
        kernels (measured on first use, at the next row count up in :data:`TIMED_ROWS`, or at
        its last for longer passes)."""
        if rows < 1 or not self.groups:
            return {}
        rows = _timed_rows(rows)
        if rows not in self.choices:
            self.choices[rows] = {}
            for key, modules in self.groups.items():
                kernel = self._choice(key, modules, rows)
                if kernel is not None:
                    self.choices[rows][key] = kernel
            self._drop_unused_packing()
            self._save()
        return self.choices[rows]

    def _can_pack(self) -> bool:
        """Whether the reordered (``packed``) reference can be used here."""
        return torch.backends.mkldnn.is_available()

    def _choice(self, key: tuple, modules: list[torch.nn.Linear], rows: int) -> str | None:
        """The kernel of group ``key`` in passes over ``rows`` rows (None: ``nn.Linear``)."""
        return self._fastest(modules, rows)

    def _known(self) -> set[str]:
        return {*self.kernels, "rows"}

    def _forward(
        self, kernel: str, module: torch.nn.Linear
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The forward ``kernel`` runs for ``module``: one row padded to two (``rows``: the
        reference one row at a time)."""
        if kernel == "rows":
            return one_row_at_a_time(self._forward(self.reference, module))
        return at_least_two_rows(self._plain_forward(kernel, module))

    def _plain_forward(self, kernel: str, module: torch.nn.Linear) -> Callable:
        if kernel == "weight_first":
            return types.MethodType(weight_first_linear, module)
        if kernel == "packed":

            def forward(x: torch.Tensor) -> torch.Tensor:
                # Reordered again whenever the weight was changed or replaced since.
                weight = module.weight
                stamp = (weight.data_ptr(), weight._version)
                packed, packed_stamp = self.packed.get(id(module), (None, None))
                if packed_stamp != stamp:
                    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
                    self.packed[id(module)] = (packed, stamp)
                return packed_linear(module, x, packed)

            return forward
        return module.forward

    @torch.inference_mode()
    def _fastest(self, modules: list[torch.nn.Linear], rows: int) -> str:
        # Beyond 16 rows the products are bound by arithmetic, not by streaming the weights
        # from memory, so fewer of the group's modules tell as much (and keep timing short).
        modules = modules[: max(1, len(modules) * 16 // rows)]
        weight = modules[0].weight
        x = torch.randn(1, rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
        x = x.to(weight.dtype)

        def run_all(functions: list[Callable]) -> None:
            for function in functions:
                function(x)

        candidates, baseline = self._candidates(modules[0], rows)
        if len(candidates) == 1:
            return candidates[0]
        ratios = median_ratios(
            {
                kernel: functools.partial(run_all, [self._forward(kernel, m) for m in modules])
                for kernel in candidates
            },
            baseline=baseline,
            rounds=5,
        )
        best = min(ratios, key=ratios.get)
        return best if ratios[best] < MARGIN else baseline

    def _candidates(self, module: torch.nn.Linear, rows: int) -> tuple[list[str], str]:
        """The kernels to time for ``module``'s group at ``rows`` rows, and the baseline a
        kernel must beat: those that compute the reference's bits
        (:meth:`_row_invariant_candidates`)."""
        candidates = self._row_invariant_candidates(module, rows)
        return candidates, self.reference if self.reference in candidates else candidates[0]

    @torch.inference_mode()
    def _row_invariant_candidates(self, module: torch.nn.Linear, rows: int) -> list[str]:
        """The kernels whose products of random rows are bit-identical to the reference's
        product of each row alone, at every row count that uses the choice made at ``rows``
        (:func:`checked_rows`); ``["rows"]`` if even the reference's are not."""
        counts = checked_rows(rows)
        x = torch.randn(
            1, max(counts), module.in_features, generator=torch.Generator().manual_seed(rows)
        ).to(module.weight.dtype)
        alone = one_row_at_a_time(self._forward(self.reference, module))(x)
        # Only where the check is sharp are other kernels trusted: up to 16 rows (every count
        # checked) in float32 (bfloat16 results round most reorderings of a sum away).
        sharp = rows <= 16 and module.weight.dtype == torch.float32
        kernels = self.kernels if sharp else [self.reference]
        agree = [
            kernel
            for kernel in kernels
            if all(
                torch.equal(self._forward(kernel, module)(x[:, :count]), alone[:, :count])
                for count in counts
            )
        ]
        return agree if self.reference in agree else ["rows"]

    def _drop_unused_packing(self) -> None:
        """Free the reordered copies of groups that no row count uses."""
        used = {
            id(m)
            for chosen in self.choices.values()
            for key, kernel in chosen.items()
            if kernel == "packed" or (kernel == "rows" and self.reference == "packed")
            for m in self.groups[key]
        }
        for module_id in set(self.packed) - used:
            del self.packed[module_id]

    @staticmethod
    def _key(module: torch.nn.Linear) -> tuple:
        return (*module.weight.shape, module.weight.dtype, module.bias is not None)

    @contextmanager
    def use(self, rows: int) -> Iterator[None]:
        """Run the enclosed pass over ``rows`` rows with the fastest kernel per module."""
        timed = _timed_rows(rows)
        switch = self.switches.get(timed) if rows >= 1 else []
        if switch is None:
            switch = self.switches[timed] = [
                (module, self._forward(kernel, module))
                for key, kernel in self.choose(rows).items()
                for module in self.groups[key]
            ]
        # An instance attribute shadows nn.Linear.forward; set in the instance's __dict__
        # directly (what nn.Module.__setattr__ ends with for a function, minus its checks).
        for module, forward in switch:
            module.__dict__["forward"] = forward
        try:
            yield
        finally:
            for module, _ in switch:
                module.__dict__.pop("forward", None)


def median_ratios(
    kernels: dict[str, Callable[[], object]], baseline: str, rounds: int, warmup: int = 1
) -> dict[str, float]:
    """Each of ``kernels``' time over ``baseline``'s, the median over ``rounds`` rounds that run
    them in turn (interleaved, and each round's ratios from that round alone, so a slow spell
    of the host hits both sides of a ratio), after ``warmup`` untimed rounds (first calls pay
    for one-off set-up: reordered weights, oneDNN primitives)."""
    ratios: dict[str, list[float]] = {name: [] for name in kernels}
    for round_number in range(warmup + rounds):
        seconds = {}
        for name, kernel in kernels.items():
            start = time.perf_counter()
            kernel()
            seconds[name] = time.perf_counter() - start
        if round_number >= warmup:
            for name in kernels:
                ratios[name].append(seconds[name] / max(seconds[baseline], 1e-12))
    return {name: statistics.median(values) for name, values in ratios.items()}


def checked_rows(rows: int) -> list[int]:
    """The row counts at which kernels are checked against the reference before the choice for
    passes of ``rows`` (a count in :data:`TIMED_ROWS`) is made: every count up to it, up to
    16 rows; beyond, where only the reference itself is checked, a few, and for prompt chunks
    (the last) a longer one too.

    >>> checked_rows(3), checked_rows(24), checked_rows(128)
    ([1, 2, 3], [17, 20, 24], [65, 96, 128, 259])
    """
    index = TIMED_ROWS.index(rows)
    previous = TIMED_ROWS[index - 1] if index else 0
    if rows <= 16:  # from one row: the head of a pass multiplies only the rows it keeps
        return list(range(1, rows + 1))
    counts = [previous + 1, (previous + 1 + rows) // 2, rows]
    return counts + [2 * rows + 3] if rows == TIMED_ROWS[-1] else counts


def _timed_rows(rows: int) -> int:
    """The row count in :data:`TIMED_ROWS` whose kernel choice a pass over ``rows`` uses."""
    return next((timed for timed in TIMED_ROWS if timed >= rows), TIMED_ROWS[-1])
