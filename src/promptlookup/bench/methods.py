"""Benchmark methods: a registry of ways to generate, keyed by backend and name.

A *method* is an object with a ``name`` and ``run(prompt_ids, settings) -> MethodOutput``; it
generates up to ``settings.max_new_tokens`` tokens after ``prompt_ids`` with a model loaded
once per benchmark, and times only the generation. Every method of one run shares that model.

Method specs on the command line are ``name`` or ``name:key=value,key=value``, for example
``promptlookup:k=4,min=2`` (see :data:`PARAMETERS` for each method's keys).

Adding a backend (e.g. ``bench/llamacpp_methods.py`` for ``--backend llama.cpp``)::

    from promptlookup.bench.methods import register_backend, register_method

    register_backend("llama.cpp", load=load_for_bench)   # (model, dtype, device, threads) -> model
    register_method("llama.cpp", "plain", PlainFactory, params={})
    register_method("llama.cpp", "llamacpp-pld", PldFactory, params={"k": "num_tokens"})
    register_method("llama.cpp", "promptlookup", OursFactory,
                    params={"k": "num_tokens", "min": "min_match", "max": "max_match"})

``load`` returns the *bench model*: anything with ``name``, ``eos_token_ids``,
``encode(messages) -> list[int]`` (applies the chat template) and either ``decode(ids) -> str``
or a ``tokenizer.decode``; a :class:`~promptlookup.LanguageModel` qualifies. A factory is called
as ``factory(model, options)`` with ``options`` the spec's parameters translated through
``params`` (``{"num_tokens": 4}``), and returns a method. ``plain`` must exist in every
backend: it is the baseline every ratio is computed against. The module named for a backend in
:data:`BACKEND_MODULES` is imported the first time that backend is asked for, and registers
itself on import.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..backend_names import backend_name
from ..drafters.options import BENCH_PARAMS
from ..errors import InvalidParameterError
from ..limits import SamplingParams

#: Modules that register a backend's methods when imported (lazily, on first use).
BACKEND_MODULES = {
    "torch": "promptlookup.bench.torch_methods",
    "llama.cpp": "promptlookup.bench.llamacpp_methods",
}

#: The baseline every speed-up and identity check is measured against.
BASELINE = "plain"
#: promptlookup's own plain decoding (its engine without a drafter): every drafting method must
#: write its text, sampling too, and a speed-up over ``plain`` splits into its part and
#: drafting's (:func:`~promptlookup.bench.summary.speedup_parts`).
OWN_PLAIN = "promptlookup-none"
#: The summaries' row of every task together.
ALL_TASKS = "all"


@dataclass(frozen=True)
class Settings(SamplingParams):
    """Generation settings shared by every method of a run: the sampling parameters
    (``temperature=0`` is greedy; ``seed`` is set per prompt by the runner, base seed + prompt
    index, when sampling) and the token budget."""

    max_new_tokens: int = 128
    #: The prompt's OpenAI request fields (``response_format``, ``tools``; the structured
    #: task, :mod:`.structured`): set per prompt by the runner.
    request: dict | None = field(default=None, hash=False, compare=False)

    @property
    def sampling(self) -> bool:
        return not self.greedy

    def grammar(self):
        """The grammar of the prompt's request (None: unconstrained)."""
        from .structured import constraint

        return constraint([], self.request)[1] if self.request else None

    def as_kwargs(self) -> dict:
        """``generate``'s keyword arguments: the sampling parameters, the token budget and the
        request's grammar."""
        kwargs = {k: v for k, v in super().as_kwargs().items() if k != "request"}
        return {**kwargs, "grammar": self.grammar()}


@dataclass
class MethodOutput:
    """One generation. ``token_ids``: the new tokens (ending with EOS if one was produced);
    ``seconds``: wall time of the generation call alone; ``token_seconds[i]``: time from the
    call's start until new token ``i`` was available (None when unknown); counters are None
    when unknown. A method that gets text rather than tokens (a server) also sets ``text``,
    which the identity checks then compare, and ``new_tokens`` (its own count); the runner
    fills ``peak_rss_mib``, the peak resident memory during the call."""

    token_ids: list[int]
    seconds: float
    forward_passes: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    token_seconds: list[float] | None = None
    text: str | None = None
    new_tokens: int | None = None
    peak_rss_mib: float | None = None


class Method(Protocol):
    name: str

    def run(self, prompt_ids: Sequence[int], settings: Settings) -> MethodOutput: ...


MethodFactory = Callable[[object, dict], Method]


@dataclass
class Backend:
    name: str
    load: Callable | None = None
    factories: dict = None  # method name -> (factory, params: short key -> option name)


_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, load: Callable | None = None) -> Backend:
    """Declare a backend (idempotent); ``load(model, dtype, device, threads)`` returns the
    bench model described in the module docstring."""
    name = backend_name(name)
    backend = _BACKENDS.setdefault(name, Backend(name, None, {}))
    if load is not None:
        backend.load = load
    return backend


def register_method(
    backend: str, name: str, factory: MethodFactory, params: dict[str, str] | None = None
) -> None:
    """Make ``name`` available for ``--backend backend``. ``params`` maps the spec's short keys
    to the option names ``factory`` receives, e.g. ``{"k": "num_tokens"}``; a key that maps to
    itself may be listed as ``{"num_tokens": "num_tokens"}``."""
    register_backend(backend).factories[name] = (factory, dict(params or {}))


def get_backend(name: str) -> Backend:
    name = backend_name(name)
    if name not in _BACKENDS or not _BACKENDS[name].factories:
        module = BACKEND_MODULES.get(name)
        if module is None:
            known = sorted(set(_BACKENDS) | set(BACKEND_MODULES))
            raise InvalidParameterError(f"unknown backend {name!r}; choose {', '.join(known)}")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise InvalidParameterError(f"backend {name!r} is not available: {exc}") from exc
        if name not in _BACKENDS:
            raise InvalidParameterError(f"backend {name!r}: {module} registered no methods")
    return _BACKENDS[name]


def parse_method_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"promptlookup:k=4,min=2"`` -> ``("promptlookup", {"k": "4", "min": "2"})``."""
    name, _, rest = spec.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InvalidParameterError(f"method {spec!r}: parameters are key=value, got {item!r}")
        params[key.strip()] = value.strip()
    if not name.strip():
        raise InvalidParameterError(f"method {spec!r} has no name")
    return name.strip(), params


def split_methods(text: str) -> list[str]:
    """Split ``--methods`` on commas that start a new method, not those between parameters:
    ``"plain,promptlookup:k=4,min=2,hf-pld"`` -> ``["plain", "promptlookup:k=4,min=2", "hf-pld"]``."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if specs and ":" in specs[-1] and "=" in part and ":" not in part:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _convert(value: str):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def make_method(backend: str, spec: str, model) -> Method:
    """Build the method a spec names, for ``backend``, on the loaded ``model``."""
    name, raw = parse_method_spec(spec)
    registry = get_backend(backend).factories
    if name not in registry:
        raise InvalidParameterError(
            f"unknown method {name!r} for backend {backend!r}; choose {', '.join(sorted(registry))}"
        )
    factory, params = registry[name]
    unknown = sorted(set(raw) - set(params))
    if unknown:
        allowed = ", ".join(sorted(params)) or "none"
        raise InvalidParameterError(
            f"method {name!r}: unknown parameter(s) {', '.join(unknown)} (allowed: {allowed})"
        )
    options = {params[key]: _convert(value) for key, value in raw.items()}
    method = factory(model, options)
    method.name = canonical_name(spec)
    return method


def canonical_name(spec: str) -> str:
    """The name a method's rows carry: the spec without spaces, parameters in given order."""
    name, params = parse_method_spec(spec)
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


#: The ``--sweep`` grid: draft length k x shortest match, for the ``promptlookup`` method.
SWEEP_K = (2, 4, 6, 8, 12, 16, 24)
SWEEP_MIN_MATCH = (1, 2, 3)


def sweep_specs() -> list[str]:
    return [f"promptlookup:k={k},min={m}" for m in SWEEP_MIN_MATCH for k in SWEEP_K]


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds`` (perf_counter wall time)."""

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start

    def elapsed(self) -> float:
        """Seconds since the block was entered (inside it)."""
        return time.perf_counter() - self._start


def cut_after_eos(token_ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
    """New tokens up to and including the first EOS (how every method's output is compared)."""
    eos = set(eos_token_ids)
    out: list[int] = []
    for token in token_ids:
        out.append(int(token))
        if token in eos:
            break
    return out


#: The spec keys of promptlookup's own lookup methods, every backend's: the drafter's options
#: (short and long names) and ``speculation``.
LOOKUP_PARAMS = {**BENCH_PARAMS, "speculation": "speculation"}


def lookup_factory(lm_of: Callable = lambda lm: lm) -> MethodFactory:
    """The factory of promptlookup's loop with its default drafter (the spec's options checked,
    keys :data:`LOOKUP_PARAMS`) on ``lm_of(lm)``."""
    return lambda lm, options: PromptLookupMethod(
        lm_of(lm), "prompt-lookup", check_int_options("promptlookup", options)
    )


def register_own_methods(backend: str) -> None:
    """Register promptlookup's own methods for ``backend``, whose bench model is a
    :class:`~promptlookup.LanguageModel`: ``promptlookup`` (the default drafter) and
    ``promptlookup-none`` (no drafter: the loop's own overhead)."""
    register_method(backend, "promptlookup", lookup_factory(), params=LOOKUP_PARAMS)
    register_method(backend, OWN_PLAIN, lambda lm, options: PromptLookupMethod(lm, "none"))


def check_int_options(method: str, options: dict) -> dict:
    """A lookup method's options (but ``speculation``) must be integers; returns them."""
    for key, value in options.items():
        if key != "speculation" and not isinstance(value, int):
            raise InvalidParameterError(f"{method}: {key} must be an integer, got {value!r}")
    return options


class PromptLookupMethod:
    """:meth:`LanguageModel.generate` with a token-id prompt; the loop's own counters."""

    name = "promptlookup"

    def __init__(self, lm, drafter: str = "prompt-lookup", options: dict | None = None) -> None:
        from ..drafters import check_drafter_spec

        self.lm = lm
        self.drafter = drafter
        self.options = dict(options or {})
        self.generate_options = {
            k: self.options.pop(k) for k in ("speculation",) if k in self.options
        }
        if "num_tokens" in self.options:  # an explicit k is a fixed setting (as in --sweep)
            self.generate_options.setdefault("speculation", "fixed")
        check_drafter_spec(drafter, **self.options)  # fail early

    def run(self, prompt_ids: Sequence[int], settings: Settings) -> MethodOutput:
        with Timer() as timer:
            result = self.lm.generate(
                list(prompt_ids),
                drafter=self.drafter,
                **settings.as_kwargs(),  # the sampling parameters and max_new_tokens
                **self.generate_options,
                **self.options,
            )
        stats = result.stats
        new = cut_after_eos(result.token_ids, self.lm.eos_token_ids)
        # The loop times its tokens from its own start; the call's set-up came before it.
        set_up = timer.seconds - stats.seconds
        token_seconds = [set_up + t for t in stats.token_seconds[: len(new)]]
        return MethodOutput(
            new,
            timer.seconds,
            stats.forward_passes,
            stats.drafted_tokens,
            stats.accepted_tokens,
            token_seconds,
        )
