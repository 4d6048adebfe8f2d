"""The building blocks of the request bodies (:mod:`.schemas`, :mod:`.tool_schemas`)."""

from __future__ import annotations

import re
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError


class Forbid(BaseModel):
    """A request model: unknown fields are a 400, types are strict (see :mod:`.schemas`)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(Forbid):
    type: Literal["text"]
    text: str


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
    message = error["msg"].removeprefix("Value error, ")
    kind = None  # a content part's or block's type that no member takes
    if error["type"] == "union_tag_invalid":
        kind = error.get("ctx", {}).get("tag")
    elif error["type"] == "literal_error" and loc and loc[-1] == "type":
        kind = error["input"]
    if "content" in loc and isinstance(kind, str):
        message = f"only text content is supported (the model reads text), not {kind!r}"
    return (f"{where}: {message}" if where else message), param


#: A union member's name in a validation error's path (``str``, ``list[TextPart]``, ``TextBlock``).
_TYPE_NAME = re.compile(r"^(str|int|float|bool|dict|list|none|[A-Z]\w*|\w+\[.*\])$")
