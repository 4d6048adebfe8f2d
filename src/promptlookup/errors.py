"""Named exceptions. Every error a user can cause is a :class:`PromptLookupError` whose message
is one readable line; the CLI and the server print that line instead of a traceback."""


class PromptLookupError(Exception):
    """Base class of every error promptlookup raises on purpose."""


class InvalidParameterError(PromptLookupError, ValueError):
    """A generation or drafter parameter is out of range (e.g. ``temperature < 0``)."""


class EmptyPromptError(InvalidParameterError):
    """The prompt has no tokens."""


class PromptTooLongError(InvalidParameterError):
    """Prompt tokens plus ``max_new_tokens`` exceed the model's context length."""


class ModelNotFoundError(PromptLookupError):
    """``--model`` names no local folder or file, and no reachable hub model."""


class ModelLoadError(PromptLookupError):
    """The model exists but could not be loaded (a corrupt GGUF, a folder transformers cannot
    read...)."""


class UnsupportedModelError(PromptLookupError):
    """The model cannot be verified speculatively (e.g. its KV cache cannot be cropped), or its
    GGUF architecture can be run neither quantized nor by transformers' GGUF loader."""


class GrammarError(InvalidParameterError):
    """A JSON schema, regular expression or Lark grammar that the grammar engine cannot
    compile (or a ``response_format`` of an unknown shape)."""


class GrammarFailed(GrammarError):
    """A grammar that compiled but allows no token at some point of one sequence's generation
    (the grammar engine's error, or a token it refused), raised by the sequence's
    :class:`~promptlookup.grammar.GrammarState`: that sequence ends, and only that one. Its
    message is one line, without the engine's internal state."""
