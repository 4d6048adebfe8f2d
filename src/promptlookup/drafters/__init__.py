"""Drafters: cheap guessers of the next tokens (see :mod:`.base` for the protocol).

Spec strings, for ``drafter=`` in the Python API and ``--drafter`` on the command line:

- ``prompt-lookup``: draft what followed the current suffix earlier in the prompt or output.
- ``reference:FILE``: prompt lookup that also drafts from FILE's text (a "predicted output",
  e.g. the expected new version of a file being edited), tokenized with the target's tokenizer.
- ``draft-model:PATH_OR_ID``: a smaller model sharing the target's tokenizer (a ``.gguf`` file,
  a Hugging Face folder or hub id), loaded on the target's device and dtype.
- ``none``: plain decoding.
- The option ``cross_request=index`` (a :class:`CrossRequestIndex`) makes prompt lookup draft
  also from earlier requests' outputs (:mod:`.shared_lookup`).
- A comma-separated chain, e.g. ``prompt-lookup,draft-model:PATH``: the next drafter is asked
  only when the previous one proposes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..errors import InvalidParameterError
from .base import CallableDrafter, ChainDrafter, Draft, Drafter, NoDrafter, bind_generation
from .cross_request import CrossRequestIndex
from .options import DRAFT_MODEL_DEFAULTS, OPTIONS, check_draft_model_options
from .prompt_lookup import PromptLookupDrafter
from .shared_lookup import SharedLookupDrafter, TenantIndexes
from .suffix_index import Match, SuffixIndex

if TYPE_CHECKING:
    from .draft_model import DraftModelDrafter

#: What ``drafter=`` accepts: a spec string, a drafter, a callable, a loaded draft model
#: (a :class:`~promptlookup.LanguageModel` or ``transformers`` model), None, or a list (a chain).
DrafterSpec = Union[str, Drafter, Callable, None, Sequence]

__all__ = [
    "CallableDrafter",
    "ChainDrafter",
    "CrossRequestIndex",
    "Draft",
    "DraftModelDrafter",
    "Drafter",
    "DrafterSpec",
    "Match",
    "NoDrafter",
    "PromptLookupDrafter",
    "SharedLookupDrafter",
    "SuffixIndex",
    "TenantIndexes",
    "check_drafter_spec",
    "make_drafter",
    "parse_drafter_spec",
]

_TAKES_ARGUMENT = {"reference": "FILE", "draft-model": "PATH_OR_ID"}


def parse_drafter_spec(spec: str) -> list[tuple[str, str | None]]:
    """Split a spec string into ``(name, argument)`` pairs, one per chained drafter.

    >>> parse_drafter_spec("prompt-lookup,draft-model:models/small")
    [('prompt-lookup', None), ('draft-model', 'models/small')]
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise InvalidParameterError("empty drafter spec; choose " + _choices())
    parsed = []
    for item in items:
        name, colon, argument = item.partition(":")
        name, argument = name.strip(), argument.strip()
        if name not in OPTIONS:
            raise InvalidParameterError(f"unknown drafter {item!r}; choose {_choices()}")
        if name in _TAKES_ARGUMENT and not argument:
            raise InvalidParameterError(
                f"drafter {name!r} needs an argument: {name}:{_TAKES_ARGUMENT[name]}"
            )
        if name not in _TAKES_ARGUMENT and colon:
            raise InvalidParameterError(f"drafter {name!r} takes no argument, got {item!r}")
        parsed.append((name, argument or None))
    return parsed


def check_drafter_spec(spec: DrafterSpec, **options) -> None:
    """Validate a spec and its options without loading anything (the CLI calls this before
    loading the target): names, option names and values, that a reference file exists and
    that a draft model can be found."""
    if not isinstance(spec, str) and spec is not None:
        return
    parsed = parse_drafter_spec(spec or "none")
    _check_option_names(parsed, options)
    for name, argument in parsed:
        mine = _options_for(name, options)
        if name in ("prompt-lookup", "reference"):
            _lookup_drafter((), {k: v for k, v in mine.items() if k != "reference_text"})
        elif name == "draft-model":
            _draft_model_options(mine)
            from ..models import resolve_model

            resolve_model(argument)
        if name == "reference" and not Path(argument).expanduser().is_file():
            raise InvalidParameterError(f"reference file not found: {argument}")


def make_drafter(
    spec: DrafterSpec = "prompt-lookup",
    *,
    eos_token_ids: Sequence[int] = (),
    tokenizer=None,
    chooser=None,
    device: str = "cpu",
    dtype: str = "float32",
    **options,
) -> Drafter:
    """Build a fresh drafter for one generation.

    Context (``LanguageModel.generate`` passes it): ``tokenizer``, the target's (tokenizes
    reference texts, and a draft model's tokenizer must equal it); ``chooser``, the generation's
    :class:`~promptlookup.sampling.TokenChooser` (a draft model samples its drafts with it);
    ``device`` and ``dtype`` for loading a draft model. A drafter object gets ``chooser``
    through :func:`~.base.bind_generation`; the speculation policy, which a draft model sizes
    its drafts with, is handed to every drafter by the sequence it drafts for
    (:class:`~promptlookup.loop.DecodingSequence`). ``options`` configure the drafters (each member of a chain
    takes the options it knows).

    >>> make_drafter("prompt-lookup", num_tokens=4)
    PromptLookupDrafter(num_tokens=4, min_match=1, max_match=64)
    >>> make_drafter("none")
    NoDrafter()
    >>> make_drafter("reference:old_version.py", tokenizer=tok)               # doctest: +SKIP
    PromptLookupDrafter(num_tokens=64, min_match=1, max_match=64, reference_ids=<812 tokens>)
    >>> make_drafter("prompt-lookup,draft-model:SmolLM2-135M.gguf", tokenizer=tok)  # doctest: +SKIP
    ChainDrafter([PromptLookupDrafter(...), DraftModelDrafter(LlamaForCausalLM, ...)])
    >>> make_drafter(lambda tokens: tokens[-3:])        # any function of the tokens so far
    CallableDrafter('<lambda>')
    """
    context = dict(
        eos_token_ids=eos_token_ids,
        tokenizer=tokenizer,
        chooser=chooser,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
    )
    if spec is None or isinstance(spec, str):
        parsed = parse_drafter_spec(spec or "none")
        _check_option_names(parsed, options)
        drafters = [
            _build(name, argument, _options_for(name, options), context)
            for name, argument in parsed
        ]
        return drafters[0] if len(drafters) == 1 else ChainDrafter(drafters)
    if isinstance(spec, (list, tuple)):
        return ChainDrafter(
            [make_drafter(item, **context, **_options_for_item(item, options)) for item in spec]
        )
    torch = sys.modules.get("torch")  # a torch model can only exist once torch is imported
    loaded = torch is not None and _is_loaded_model(spec, torch)
    if loaded or (torch is not None and isinstance(spec, torch.nn.Module)):
        _check_option_names([("draft-model", None)], options)
        if loaded:
            from .draft_model import check_same_tokenizer

            check_same_tokenizer(spec.tokenizer, tokenizer, f"draft model {spec.name}")
            spec = spec.model
        return _draft_model(spec, options, context)
    if isinstance(spec, Drafter):
        bind_generation(spec, chooser=chooser)
        return spec
    if callable(spec):
        return CallableDrafter(spec)
    raise InvalidParameterError(f"not a drafter: {spec!r}")


# -- building one drafter ----------------------------------------------------------------------


def _build(name: str, argument: str | None, options: dict, context: dict) -> Drafter:
    if name == "none":
        return NoDrafter()
    if name == "prompt-lookup":
        if "reference_text" in options:
            text = options.pop("reference_text")
            options["reference_ids"] = _tokenize(text, context["tokenizer"], "reference_text")
        return _lookup_drafter(context["eos_token_ids"], options)
    if name == "reference":
        path = Path(argument).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidParameterError(f"reference file not found: {argument}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameterError(
                f"cannot read reference file {argument}: {type(exc).__name__}"
            ) from None
        reference_ids = _tokenize(text, context["tokenizer"], f"reference:{argument}")
        return _lookup_drafter(
            context["eos_token_ids"], {**options, "reference_ids": reference_ids}
        )
    # draft-model
    from .draft_model import check_same_tokenizer, load_draft_model

    model, draft_tokenizer = load_draft_model(
        argument, dtype=context["dtype"], device=context["device"]
    )
    check_same_tokenizer(draft_tokenizer, context["tokenizer"], f"draft model {argument}")
    return _draft_model(model, options, context)


def _lookup_drafter(eos_token_ids, options: dict) -> PromptLookupDrafter:
    index = options.pop("cross_request", None)
    try:
        if index is not None:
            return SharedLookupDrafter(index, eos_token_ids=eos_token_ids, **options)
        return PromptLookupDrafter(eos_token_ids=eos_token_ids, **options)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"prompt-lookup drafter: {exc}") from exc


def _draft_model_options(options: dict) -> dict:
    """Check the draft model's options (its constructor's checks, without a model)."""
    try:
        check_draft_model_options(**{**DRAFT_MODEL_DEFAULTS, **options})
    except ValueError as exc:
        raise InvalidParameterError(f"draft-model drafter: {exc}") from exc
    return options


def _is_loaded_model(spec, torch) -> bool:
    """Whether ``spec`` is a loaded model (a :class:`~promptlookup.LanguageModel`: a torch
    ``model`` with its ``tokenizer`` and ``name``), read from its attributes so that drafters
    need not import the API built on them."""
    return all(
        hasattr(spec, name) for name in ("model", "tokenizer", "name", "target")
    ) and isinstance(spec.model, torch.nn.Module)


def _draft_model(model, options: dict, context: dict) -> DraftModelDrafter:
    from .draft_model import DraftModelDrafter

    options = _draft_model_options(
        {k: v for k, v in options.items() if k in OPTIONS["draft-model"]}
    )
    return DraftModelDrafter(
        model,
        eos_token_ids=context["eos_token_ids"],
        chooser=context["chooser"],
        **options,
    )


def _tokenize(text: str, tokenizer, what: str) -> list[int]:
    if tokenizer is None:
        raise InvalidParameterError(
            f"{what} needs the target's tokenizer (make_drafter(..., "
            "tokenizer=...); LanguageModel.generate passes it)"
        )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- options -----------------------------------------------------------------------------------


def _options_for(name: str, options: dict) -> dict:
    return {k: v for k, v in options.items() if k in OPTIONS[name]}


def _options_for_item(item, options: dict) -> dict:
    if isinstance(item, str):
        names = set().union(*(OPTIONS[n] for n, _ in parse_drafter_spec(item)))
        return {k: v for k, v in options.items() if k in names}
    return options if isinstance(item, (list, tuple)) else {}


def _check_option_names(parsed: list[tuple[str, str | None]], options: dict) -> None:
    known = set().union(*(OPTIONS[name] for name, _ in parsed))
    unknown = sorted(set(options) - known)
    if unknown:
        names = ",".join(name for name, _ in parsed)
        raise InvalidParameterError(
            f"drafter {names!r} takes no option {', '.join(unknown)}"
            + (f" (it takes {', '.join(sorted(known))})" if known else "")
        )


def _choices() -> str:
    return (
        "prompt-lookup, reference:FILE, draft-model:PATH_OR_ID, none, or a comma-separated "
        "chain of these"
    )


def __getattr__(name: str):
    """The draft-model drafter needs torch: import it only when asked for."""
    if name in ("DraftModelDrafter", "check_same_tokenizer", "load_draft_model"):
        from . import draft_model

        return getattr(draft_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
