"""OpenAI's wire format: request bodies (validated), response bodies and chunks, errors.

Every model forbids unknown fields (``extra="forbid"``): a misspelt or unsupported parameter is
a 400, never silently ignored. OpenAI parameters whose only supported value is the default
(``n``, ``presence_penalty``, ``frequency_penalty``, ``logprobs``, ``echo``, ``best_of``,
``suffix``) are accepted at that value and rejected otherwise. Extensions beyond OpenAI:
``top_k`` and ``repetition_penalty`` (as in ``promptlookup generate``).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt,
                      ValidationError, field_validator)

from .._version import __version__

if TYPE_CHECKING:
    from ..generation import GenerationResult

#: Names the software that answered (OpenAI's field): a new version may answer differently.
SYSTEM_FINGERPRINT = f"promptlookup-{__version__}"
#: Most stop strings per request (OpenAI's limit).
MAX_STOP_STRINGS = 4
#: A JSON number (an integer is a number too; a boolean or a string is not).
Number = Union[StrictInt, StrictFloat]
#: Seeds torch takes: a signed 64-bit integer.
SEED_RANGE = (-(2 ** 63), 2 ** 63 - 1)
#: The largest token count a request may ask for (beyond any model's context anyway).
MAX_TOKENS = 2 ** 31 - 1


class APIError(Exception):
    """An error answered with OpenAI's JSON: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        #: Seconds a client should wait before trying again (429, 503): a Retry-After header.
        self.retry_after = retry_after
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class _Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Forbid):
    type: Literal["text"]
    text: str


#: Message or prediction content: text, or a list of text parts.
Content = Union[str, list[TextPart]]


def content_text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class ChatMessage(_Forbid):
    role: Literal["system", "developer", "user", "assistant"]
    content: Content
    name: Optional[str] = None

    def as_dict(self) -> dict:
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content_text(self.content)}


class Prediction(_Forbid):
    """OpenAI's predicted output: text the answer will largely repeat (e.g. a file being
    edited). It becomes the prompt lookup drafter's reference text."""

    type: Literal["content"]
    content: Content


class StreamOptions(_Forbid):
    include_usage: Optional[bool] = False
    include_obfuscation: Optional[bool] = None  # accepted, ignored (no obfuscation is added)


def _only(default: Any, name: str):
    """A validator accepting ``default`` (or null) only."""

    def check(value):
        if value is not None and value != default:
            raise ValueError(f"only {name}={default!r} is supported")
        return value

    return check


class _GenerationRequest(_Forbid):
    model: str
    max_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS)
    # Absent: 1.0, as OpenAI. OpenAI's range; between 0 and MIN_TEMPERATURE the scaled logits
    # overflow float32, so the range starts again there (see SamplingParams).
    temperature: Optional[Number] = Field(None, ge=0, le=2)
    top_p: Optional[Number] = Field(None, gt=0, le=1)
    top_k: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOKENS)  # extension; 0 = off
    repetition_penalty: Optional[Number] = Field(None, ge=0.01, le=100)  # extension
    seed: Optional[StrictInt] = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: Union[str, list[str], None] = None
    stream: Optional[StrictBool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    n: Optional[StrictInt] = 1
    presence_penalty: Optional[Number] = Field(0.0, ge=-2, le=2)
    frequency_penalty: Optional[Number] = Field(0.0, ge=-2, le=2)
    prediction: Optional[Prediction] = None

    _n = field_validator("n")(_only(1, "n"))
    _presence = field_validator("presence_penalty")(_only(0, "presence_penalty"))
    _frequency = field_validator("frequency_penalty")(_only(0, "frequency_penalty"))

    @field_validator("temperature")
    @classmethod
    def _check_temperature(cls, value):
        from ..sampling import MIN_TEMPERATURE

        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value):
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> dict:
        """Keyword arguments for :meth:`promptlookup.LanguageModel.stream`."""
        return {"temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p,
                "top_k": self.top_k or 0,
                "repetition_penalty": self.repetition_penalty or 1.0,
                "seed": self.seed, "stop": self.stop_list}


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: Optional[StrictBool] = False

    _logprobs = field_validator("logprobs")(_only(False, "logprobs"))

    @property
    def requested_max_tokens(self) -> int | None:
        newer = self.max_completion_tokens
        return newer if newer is not None else self.max_tokens


class CompletionRequest(_GenerationRequest):
    #: Text, or token ids; a list of one text or one token list is accepted too (no batching).
    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: Optional[StrictBool] = False
    best_of: Optional[StrictInt] = 1
    logprobs: Optional[StrictInt] = Field(None, ge=0, le=5)
    suffix: Optional[str] = None

    _echo = field_validator("echo")(_only(False, "echo"))
    _best_of = field_validator("best_of")(_only(1, "best_of"))
    _logprobs = field_validator("logprobs")(_only(None, "logprobs"))
    _suffix = field_validator("suffix")(_only(None, "suffix"))

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
            return value[0]
        return value


def _no_constant(name: str):
    """``NaN`` and ``Infinity`` are not JSON (Python's parser takes them): refused."""
    raise ValueError(f"{name} is not a JSON number")


async def read_json(request, limit: int, timeout: float | None = None):
    """The request's JSON body; 413 beyond ``limit`` bytes (checked before and while reading),
    408 when the client sends nothing for ``timeout`` seconds in the middle of it."""
    too_large = APIError(413, f"request body larger than {limit} bytes", param=None,
                         code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body stopped arriving (nothing for {timeout} s)",
                           code="request_timeout") from None
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
    try:
        return json.loads(b"".join(parts), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise APIError(400, "We could not parse the JSON body of your request: it is not valid "
                            "JSON", code="invalid_json") from None


def parse_request(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body, or raise a 400 :class:`APIError` naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        param = str(error["loc"][0]) if error["loc"] else None
        if error["type"] == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {where}"
        else:
            message = error["msg"].removeprefix("Value error, ")
            message = f"{where}: {message}" if where else message
        raise APIError(400, message, param=param) from None


# -- responses ---------------------------------------------------------------------------


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def chunk(meta: dict, chat: bool, delta, finish_reason: str | None = None) -> dict:
    """A streaming chunk; ``delta`` None gives the usage chunk's empty ``choices``."""
    if delta is None:
        choices = []
    elif chat:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}]
    return {**meta, "object": "chat.completion.chunk" if chat else "text_completion",
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}


def completion_body(meta: dict, chat: bool, result: GenerationResult) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text,
                                          "refusal": None},
                  "logprobs": None, "finish_reason": result.finish_reason}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None,
                  "finish_reason": result.finish_reason}
    return {**meta, "object": "chat.completion" if chat else "text_completion",
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [choice], "usage": usage(result)}


def usage(result: GenerationResult) -> dict:
    """OpenAI's counts; ``completion_tokens_details`` counts the drafted tokens the model kept
    and those it rejected as OpenAI's accepted and rejected prediction tokens (drafts come from
    the prediction and the prompt alike), and ``speculative`` adds the loop's counters."""
    stats = result.stats
    prompt, completion = len(result.prompt_ids), len(result.token_ids)
    details = {"accepted_prediction_tokens": stats.accepted_tokens,
               "rejected_prediction_tokens": stats.drafted_tokens - stats.accepted_tokens}
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "completion_tokens_details": details,
            "speculative": {"forward_passes": stats.forward_passes,
                            "drafted_tokens": stats.drafted_tokens,
                            "accepted_tokens": stats.accepted_tokens,
                            "tokens_per_forward": round(stats.tokens_per_forward, 3),
                            "acceptance_rate": round(stats.acceptance_rate, 3),
                            "seconds": round(stats.seconds, 6)}}
