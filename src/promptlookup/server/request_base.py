"""The building blocks of the request bodies (:mod:`.schemas`, :mod:`.tool_schemas`)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict


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
