"""OpenAI's request bodies, validated at the edge; errors in OpenAI's JSON.

Policies:

- *Unknown fields* are a 400 (``extra="forbid"``): a misspelt parameter is never silently
  ignored.
- *Strict types*: integers must be JSON integers (not booleans, floats or strings), numbers
  must be finite JSON numbers, booleans must be ``true``/``false``.
- *Ranges* keep every number where torch's arithmetic stays finite (see :data:`LIMITS`):
  ``temperature`` 0 (greedy) or in [1e-4, 2]; ``top_p`` in (0, 1]; ``repetition_penalty`` in
  [0.01, 100]; ``seed`` a signed 64-bit integer; ``n`` in [1, 16]; ``top_logprobs`` in
  [0, 20] (chat, with ``logprobs: true``); ``logprobs`` in [0, 5] (completions); ``stop``
  one string or a list of up to 4, each at most 1,000 characters.
- *Refused features*: parameters whose only supported value is the default (``echo``,
  ``best_of``, ``suffix``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``,
  ``response_format`` other than text, ``tools``/``functions``) are accepted at that value and
  a 400 naming the parameter otherwise.
- Extensions beyond OpenAI: ``top_k`` and ``repetition_penalty`` (as in
  ``promptlookup generate``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..limits import MIN_TEMPERATURE, REPETITION_PENALTY_RANGE
from .bodies import ErrorDetail, ErrorResponse, dump

#: Most stop strings per request (OpenAI's limit), and the most characters in one.
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1000
#: Most sequences per request (``n``).
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
INT64 = (-(2**63), 2**63 - 1)
INT32_MAX = 2**31 - 1


class APIError(Exception):
    """An error answered with OpenAI's JSON: ``{"error": {"message", "type", "param", "code"}}``,
    with optional extra response ``headers`` (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return dump(ErrorResponse(error=detail))


class _Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


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
    name: str | None = None

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
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # accepted, ignored (no obfuscation is added)


class ResponseFormat(_Forbid):
    type: Literal["text"]  # structured output (json_object, json_schema) is not supported


#: One stop sequence (a request's ``stop`` is one, or a list of up to four).
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


def _only(default: Any, name: str, why: str = ""):
    """A validator accepting ``default`` (or null) only."""

    def check(value):
        if value is not None and value != default:
            raise ValueError(f"only {name}={default!r} is supported{why}")
        return value

    return check


def _float(default=None, **limits):
    return Field(default, allow_inf_nan=False, **limits)


class _GenerationRequest(_Forbid):
    model: str
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = _float(ge=0, le=2)  # absent: 1.0, as OpenAI
    top_p: float | None = _float(gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)  # extension; 0 = off
    repetition_penalty: float | None = _float(
        ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1]
    )  # extension
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    presence_penalty: float | None = _float(0.0, ge=-2, le=2)
    frequency_penalty: float | None = _float(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    prediction: Prediction | None = None

    _presence = field_validator("presence_penalty")(_only(0, "presence_penalty"))
    _frequency = field_validator("frequency_penalty")(_only(0, "frequency_penalty"))

    @field_validator("temperature")
    @classmethod
    def _finite_temperature(cls, value):
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and 2")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported")
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

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def top_logprobs_count(self) -> int | None:
        """How many alternatives to report per token; None: no logprobs at all."""
        return None

    def sampling(self) -> dict:
        """Keyword arguments for :meth:`promptlookup.LanguageModel.stream`."""
        return {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k or 0,
            "repetition_penalty": self.repetition_penalty or 1.0,
            "seed": self.seed,
            "stop": self.stop_list,
        }

    def cross_check(self) -> None:
        """Rules between fields, as a 400."""


_UNSUPPORTED_TOOLS = " (tool calling is not supported)"


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Literal["none"] | None = None

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value):
        if value:
            raise ValueError("tools are not supported" + _UNSUPPORTED_TOOLS)
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        newer = self.max_completion_tokens
        return newer if newer is not None else self.max_tokens

    @property
    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def cross_check(self) -> None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400,
                "top_logprobs: logprobs must be true when top_logprobs is given",
                param="top_logprobs",
            )


class CompletionRequest(_GenerationRequest):
    #: Text, or token ids; a list of one text or one token list is accepted too (no batching).
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # must equal n when given
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: str | None = None

    _echo = field_validator("echo")(_only(False, "echo"))
    _suffix = field_validator("suffix")(_only(None, "suffix"))

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
            return value[0]
        return value

    @property
    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    def cross_check(self) -> None:
        if self.best_of is not None and self.best_of != self.choices:
            raise APIError(400, "best_of: only best_of equal to n is supported", param="best_of")


async def read_json(request, limit: int, timeout: float | None = None):
    """The request's JSON body; 413 beyond ``limit`` bytes (checked before and while reading),
    408 when the whole body has not arrived within ``timeout`` seconds (a stalled client)."""
    try:
        async with asyncio.timeout(timeout):
            raw = await _read_body(request, limit)
    except TimeoutError:
        raise APIError(
            408,
            f"the request body did not arrive within {timeout:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise APIError(
            400,
            "We could not parse the JSON body of your request: it is not valid JSON",
            code="invalid_json",
        ) from None


async def _read_body(request, limit: int) -> bytes:
    too_large = APIError(
        413, f"request body larger than {limit} bytes", param=None, code="request_too_large"
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
    return b"".join(parts)


def parse_request(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body, or raise a 400 :class:`APIError` naming the first bad field."""
    try:
        request = model.model_validate(body)
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
    request.cross_check()
    return request
