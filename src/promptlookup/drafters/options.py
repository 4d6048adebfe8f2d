"""The one table of drafter options: the keyword each drafter takes, the command line's flag for
it and the bench's short parameter name. The CLI, the server, the bench and
:func:`promptlookup.make_drafter` all read it (torch-free, so ``--help`` stays fast)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterOption:
    """``name``: the keyword of :func:`~promptlookup.make_drafter` (and of ``generate``);
    ``kinds``: the drafters that take it; ``flag``: the command line's option, if any;
    ``bench``: the bench's short parameter (``promptlookup:k=8``), if any."""

    name: str
    kinds: tuple[str, ...]
    help: str
    flag: str | None = None
    bench: str | None = None


#: A draft model's defaults (:class:`~promptlookup.drafters.draft_model.DraftModelDrafter`).
DRAFT_MODEL_DEFAULTS = {"num_tokens": 16, "start_tokens": 5, "confidence_threshold": 0.4}


def check_draft_model_options(
    num_tokens: int, start_tokens: int, confidence_threshold: float
) -> None:
    """A draft model's options, checked without loading one (ValueError when wrong)."""
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens!r}")
    if not isinstance(start_tokens, int) or start_tokens < 1:
        raise ValueError(f"start_tokens must be >= 1, got {start_tokens!r}")
    if not isinstance(confidence_threshold, (int, float)) or not 0 <= confidence_threshold <= 1:
        raise ValueError(f"confidence_threshold must be in [0, 1], got {confidence_threshold!r}")


#: The drafters a spec string names (see :mod:`promptlookup.drafters`).
DRAFTER_KINDS = ("none", "prompt-lookup", "reference", "draft-model")
_LOOKUP = ("prompt-lookup", "reference")

DRAFTER_OPTIONS = (
    DrafterOption(
        "num_tokens",
        (*_LOOKUP, "draft-model"),
        "Most tokens per draft (prompt lookup [64], draft model "
        f"[{DRAFT_MODEL_DEFAULTS['num_tokens']}]); the adaptive policy verifies only what pays.",
        flag="--draft-tokens",
        bench="k",
    ),
    DrafterOption(
        "min_match",
        _LOOKUP,
        "Prompt lookup: shortest suffix that may match, in tokens [1].",
        flag="--min-match",
        bench="min",
    ),
    DrafterOption(
        "max_match",
        _LOOKUP,
        "Prompt lookup: longest suffix compared, in tokens [64].",
        flag="--max-match",
        bench="max",
    ),
    DrafterOption(
        "reference_ids",
        ("prompt-lookup",),
        "Prompt lookup: token ids to draft from besides the prompt (a predicted output).",
    ),
    DrafterOption(
        "reference_text",
        ("prompt-lookup",),
        "Prompt lookup: text to draft from besides the prompt, tokenized by the target's "
        "tokenizer.",
    ),
    DrafterOption(
        "cross_request",
        ("prompt-lookup",),
        "Prompt lookup: a promptlookup.CrossRequestIndex kept across requests, drafted from "
        "beside the prompt and output, and given this generation's output.",
    ),
    DrafterOption(
        "start_tokens",
        ("draft-model",),
        f"Draft model: draft length of the first step [{DRAFT_MODEL_DEFAULTS['start_tokens']}].",
    ),
    DrafterOption(
        "confidence_threshold",
        ("draft-model",),
        "Draft model: stop drafting after a token it is less sure of "
        f"[{DRAFT_MODEL_DEFAULTS['confidence_threshold']}].",
    ),
)

#: The keyword options each kind of drafter takes (a chain routes each option to its members).
OPTIONS = {
    kind: {option.name for option in DRAFTER_OPTIONS if kind in option.kinds}
    for kind in DRAFTER_KINDS
}
#: Prompt lookup's own settings (what a predicted output keeps of a server's drafter options).
LOOKUP_OPTIONS = tuple(option.name for option in DRAFTER_OPTIONS if "reference" in option.kinds)
#: The options with a command-line flag, in the order of the flags.
FLAGGED_OPTIONS = tuple(option for option in DRAFTER_OPTIONS if option.flag)
#: Bench parameters of promptlookup's lookup methods -> drafter options (short and long names).
BENCH_PARAMS = {
    **{
        option.bench: option.name
        for option in DRAFTER_OPTIONS
        if option.bench and option.name in LOOKUP_OPTIONS
    },
    **{name: name for name in LOOKUP_OPTIONS},
}


def options_from_flags(**values) -> dict:
    """The drafter options given on the command line (by option name; None = not given).

    >>> options_from_flags(num_tokens=8, min_match=None, max_match=None)
    {'num_tokens': 8}
    """
    return {name: value for name, value in values.items() if value is not None}
