"""The building blocks of the request bodies (:mod:`.openai.protocol`, :mod:`.tool_schemas`,
:mod:`.anthropic.protocol`, :mod:`.responses.protocol`)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .bodies import ErrorDetail, ErrorResponse, dump
from .ignored import LeftOut, Typo, check_extras, check_type, close_name


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


class RequestModel(BaseModel):
    """A request model: types are strict (see :mod:`.openai.protocol`); fields it does not declare are
    kept aside, then ignored or a typo's 400 (:func:`.ignored.check_extras`)."""

    model_config = ConfigDict(extra="allow", strict=True)


#: The former name (unknown fields were a 400 before :mod:`.ignored`).
Forbid = RequestModel


class LeftOutTool(RequestModel, LeftOut):
    """A tool of a type the server does not run: left out of the prompt and said in
    ``x-promptlookup-ignored-tools``; a type a typo away from one it serves (``served``, each
    API's own) is a 400."""

    kind = "tools"
    served: ClassVar[tuple[str, ...]] = ()
    type: str

    @field_validator("type")
    @classmethod
    def _not_a_typo(cls, value: str) -> str:
        check_type(value, cls.served)
        return value


class TextPart(RequestModel):
    type: Literal["text"]
    text: str
    cache_control: Any = None  # accepted, no effect: the prefix cache is automatic


#: Message or prediction content: text, or a list of text parts.
Content = Union[str, list[TextPart]]


def content_text(content: Content | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)


def first_error(exc: ValidationError) -> tuple[str, str | None]:
    """One readable line for a validation error, and its top-level field: of the errors a
    union gives (one per member), the one that got furthest into the body, its path without
    the members' type names (``messages.0.content.0.type``, not
    ``messages.0.content.list[TextPart].0.type``).

    >>> from pydantic import TypeAdapter
    >>> body = {"content": [{"type": "image_url"}]}
    >>> try:
    ...     TypeAdapter(dict[str, str | list[TextPart]]).validate_python(body)
    ... except ValidationError as exc:
    ...     first_error(exc)
    ("content.0.type: only text content is supported (the model reads text), not 'image_url'", 'content')
    """
    error = max(exc.errors(), key=lambda error: len(error["loc"]))  # the first of the deepest
    loc = [part for part in error["loc"] if not _TYPE_NAME.match(str(part))]
    where = ".".join(map(str, loc))
    param = str(loc[0]) if loc else None
    if error["type"] == "extra_forbidden":
        return f"Unrecognized request argument supplied: {where}", param
    if error["type"] == "missing" and loc and isinstance(error.get("input"), dict):
        # A required field missing beside a typo of its name: the typo is the error.
        wanted = str(loc[-1])
        near = next((key for key in error["input"] if close_name(key, [wanted])), None)
        if near is not None:
            where = ".".join(map(str, [*loc[:-1], near]))
            return f"{where}: unknown field; did you mean {wanted!r}?", param
    message = error["msg"].removeprefix("Value error, ")
    kind = None  # a content part's or block's type that no member takes
    if error["type"] == "union_tag_invalid":
        kind = error.get("ctx", {}).get("tag")
    elif error["type"] == "literal_error" and loc and loc[-1] == "type":
        kind = error["input"]
    if "content" in loc and isinstance(kind, str):
        message = f"only text content is supported (the model reads text), not {kind!r}"
        if loc[-1] != "type":  # a tagged union's error stands at the part: its type is wrong
            where = f"{where}.type"
    return (f"{where}: {message}" if where else message), param


#: A union member's name in a validation error's path (``str``, ``list[TextPart]``, ``TextBlock``).
_TYPE_NAME = re.compile(r"^(str|int|float|bool|dict|list|none|[A-Z]\w*|\w+\[.*\])$")


def lone_surrogate(body: Any) -> str | None:
    """The path of the first string (or key) in a decoded JSON body that is not valid Unicode
    (a lone surrogate, which JSON's ``\\ud800`` escapes can spell); None: all are.

    >>> lone_surrogate({"messages": [{"content": "ok"}, {"content": "a\\ud800"}]})
    'messages.1.content'
    """
    stack = [((), body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodes(value):
                return ".".join(map(str, path)) or "body"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if not key.isascii() and not _encodes(key):
                    return ".".join(map(str, (*path, "<key>")))
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in reversed(list(enumerate(value))))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def read_json(request, limit: int, timeout: float | None = None, pieces: int = 0):
    """The request's JSON body; 413 beyond ``limit`` bytes (checked before and while reading),
    408 when the whole body has not arrived within ``timeout`` seconds (a stalled client), 400
    for invalid JSON, a string that is not valid Unicode (a lone surrogate), or more than
    ``pieces`` (if not 0) pieces of a prompt (:func:`prompt_pieces`)."""
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
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise APIError(
            400,
            "We could not parse the JSON body of your request: it is not valid JSON",
            code="invalid_json",
        ) from None
    # Only a \ud8xx-\udfxx escape spells a surrogate: the body is walked only if it has one.
    if _SURROGATE_ESCAPE.search(raw) and (where := lone_surrogate(body)) is not None:
        message = f"{where}: the text is not valid Unicode (a lone surrogate)"
        raise APIError(400, message, param=where.split(".")[0])
    if pieces and (where := prompt_pieces(body, pieces)) is not None:
        raise APIError(
            400,
            f"This model's maximum context length is {pieces} tokens; the request has more "
            f"than {pieces} messages, items, content parts, tool calls, tools and token ids in "
            f"all (at most one per token of the context)",
            param=where,
            code="context_length_exceeded",
        )
    return body


#: The lists whose entries are each a piece of a prompt (in any API): messages and input
#: items, their content parts and blocks and tool calls, system blocks, tools (namespaces'
#: too), a completion's and ``/detokenize``'s token ids. Schemas are never walked.
PIECES = ("messages", "input", "content", "system", "tools", "tool_calls", "output", "prompt",
          "tokens")  # fmt: skip


def prompt_pieces(body: Any, limit: int) -> str | None:
    """The top-level field where a decoded JSON body passes ``limit`` pieces of a prompt
    (:data:`PIECES`, counted together), or None. Validating hundreds of thousands of small
    objects (a 4 MiB body of empty messages) holds the server's event loop, and with it every
    other client's stream, for seconds; no prompt of more pieces than the context has tokens
    is of use, so they are counted first, in microseconds per piece.

    >>> prompt_pieces({"messages": [{"content": [{"type": "text"}] * 3}] * 2}, 7)
    'messages'
    >>> prompt_pieces({"messages": [{"content": [{"type": "text"}] * 3}] * 2}, 8) is None
    True
    """
    if not isinstance(body, dict):
        return None
    count = 0
    for top in PIECES:
        stack = [body.get(top)]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                stack += [value[key] for key in PIECES if isinstance(value.get(key), list)]
            elif isinstance(value, list):
                count += len(value)
                if count > limit:
                    return top
                stack += [item for item in value if isinstance(item, (dict, list))]
    return None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


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
    """Validate a decoded JSON body, or raise a 400 :class:`APIError` naming the first bad
    field; fields it does not declare are noted as ignored, or a typo's 400 (:mod:`.ignored`)."""
    try:
        request = model.model_validate(body)
        check_extras(request)
    except ValidationError as exc:
        message, param = first_error(exc)
        raise APIError(400, message, param=param) from None
    except Typo as typo:
        raise APIError(400, str(typo), param=typo.path.split(".")[0]) from None
    request.cross_check()
    return request
