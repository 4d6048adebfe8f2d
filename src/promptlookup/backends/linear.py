"""Matrix products for short verification passes, with the kernel chosen by measurement.

A verification *forward pass* multiplies every weight matrix by a few rows (the last token and
its draft). ``torch.nn.functional.linear`` computes ``x @ W.T``; for 2-4 rows on this project's
CPUs (AMD EPYC, torch 2.13's MKL) that cost 1.6-1.9x one row, while the same product computed
weight-first, ``(W @ x.T).T``, cost about one row (measured on SmolLM2-135M in float32 after a
500-token prompt: passes over 2, 3, 4 tokens at 1.65/1.66/1.25x a one-token pass with
``linear``, 0.98/0.98/0.88x weight-first). Which order is faster depends on the CPU, the BLAS,
the dtype, the matrix shape and the number of rows, so :class:`LinearKernels` measures both for
each weight shape the first time a pass has a given number of rows, and switches the model's
``nn.Linear`` modules to the faster one for the duration of our own passes only (transformers'
``model.generate`` on the same model object is untouched). The choices can be kept in a file
(:meth:`LinearKernels.use_cache_file`; ``load_model`` keeps them beside the policy's cost
curve), so only the first process on a machine pays for the timing.

Both orders compute the same sums of products; only the rounding of the accumulation differs,
as between any two passes of different lengths. One-token passes always keep ``linear``, so
plain decoding steps stay bit-identical to transformers' own.
"""

from __future__ import annotations

import json
import statistics
import time
import types
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

#: Passes with more rows than this keep ``linear`` (matrix-matrix kernels are efficient there).
MAX_ROWS = 16
#: Weight-first must beat ``linear`` by this factor to be used (timings are noisy).
MARGIN = 0.95


def weight_first_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as ``(W @ x.T).T``; ``x`` is (..., in_features)."""
    rows = x.reshape(-1, x.shape[-1])  # (rows, in)
    if module.bias is None:
        out = torch.mm(module.weight, rows.t())  # (out, rows)
    else:
        out = torch.addmm(module.bias.unsqueeze(1), module.weight, rows.t())
    return out.t().contiguous().reshape(*x.shape[:-1], module.out_features)


class LinearKernels:
    """Per number of rows, which of ``model``'s ``nn.Linear`` modules run weight-first.

    Modules are grouped by weight shape and dtype; a group's choice is timed over all its
    modules in turn (as a forward pass streams them from memory), both orders interleaved,
    median of three rounds. Only CPU models are switched.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.groups: dict[tuple, list[torch.nn.Linear]] = defaultdict(list)
        for module in model.modules():
            if type(module) is torch.nn.Linear and module.weight.device.type == "cpu":
                key = (*module.weight.shape, module.weight.dtype, module.bias is not None)
                self.groups[key].append(module)
        #: rows -> the modules that run weight-first in a pass over that many rows.
        self.choices: dict[int, list[torch.nn.Linear]] = {}
        self.cache_file: Path | None = None

    @staticmethod
    def _name(key: tuple) -> str:
        out_features, in_features, dtype, bias = key
        return f"{out_features}x{in_features}-{str(dtype).removeprefix('torch.')}-{'bias' if bias else 'nobias'}"

    def use_cache_file(self, path: str | Path) -> None:
        """Keep the choices in ``path`` (JSON); choices already stored there are used as they
        are. A missing, unreadable or foreign file only means measuring again."""
        self.cache_file = Path(path)
        try:
            stored = json.loads(self.cache_file.read_text())
            groups = {self._name(key): modules for key, modules in self.groups.items()}
            for rows, names in stored.items():
                if set(names) <= set(groups):
                    self.choices[int(rows)] = [m for name in names for m in groups[name]]
        except (OSError, ValueError, TypeError, AttributeError):
            pass

    def _save(self) -> None:
        if self.cache_file is None:
            return
        names = {id(m): self._name(key) for key, modules in self.groups.items() for m in modules}
        stored = {str(rows): sorted({names[id(m)] for m in modules})
                  for rows, modules in self.choices.items()}
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(stored))
            tmp.replace(self.cache_file)
        except OSError:
            pass  # a read-only cache only costs measuring again

    def weight_first_modules(self, rows: int) -> list[torch.nn.Linear]:
        """The modules to switch for a pass over ``rows`` rows (measured on first use)."""
        if rows < 2 or rows > MAX_ROWS or not self.groups:
            return []
        if rows not in self.choices:
            self.choices[rows] = [module for key, modules in self.groups.items()
                                  if self._weight_first_wins(modules, rows) for module in modules]
            self._save()
        return self.choices[rows]

    @torch.inference_mode()
    def _weight_first_wins(self, modules: list[torch.nn.Linear], rows: int) -> bool:
        weight = modules[0].weight
        x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
        x = x.to(weight.dtype)
        timings: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for weight_first in (False, True):
                start = time.perf_counter()
                for module in modules:
                    weight_first_linear(module, x) if weight_first else module(x)
                timings[weight_first].append(time.perf_counter() - start)
        return statistics.median(timings[True]) < MARGIN * statistics.median(timings[False])

    @contextmanager
    def use(self, rows: int) -> Iterator[None]:
        """Run the enclosed pass over ``rows`` rows with the faster kernel per module."""
        switched = self.weight_first_modules(rows)
        for module in switched:
            module.forward = types.MethodType(weight_first_linear, module)
        try:
            yield
        finally:
            for module in switched:
                del module.forward
