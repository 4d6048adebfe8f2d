"""OpenAI's Responses API request (``POST /v1/responses``), in its own shape
(:class:`ResponsesRequest`), and the same request said as a chat completions body
(:meth:`ResponsesRequest.as_chat`: ``instructions`` as the system message, input items as
messages, ``function_call`` items as an assistant's tool calls, ``function_call_output`` items
as tool messages, ``text.format`` as ``response_format``), which :mod:`.responses.serving` serves.

Nothing is stored: ``previous_response_id``, ``conversation`` and a stored ``prompt`` are a
400 (send the whole conversation as ``input``), ``store`` is accepted without effect.

Unknown fields follow :mod:`.ignored`'s rule. Tools: ``function`` tools are served, and so are
the functions of a ``namespace`` tool (Codex's), under their own names (a call of one is
answered with its ``namespace``); hosted tools (``web_search``, ``file_search``,
``code_interpreter``, ``image_generation``, ``computer_use_preview``, ``mcp``,
``local_shell``, ``shell``, ``apply_patch``, ``custom``, ...) are left out of the prompt.
Earlier items of hosted tools in ``input`` are left out too.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from ..ignored import LeftOut, note
from ..openai.protocol import INT32_MAX
from ..request_base import APIError, LeftOutTool, RequestModel, content_text
from ..tool_schemas import FunctionDef, allowed_names


class InputText(RequestModel):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's, accepted and ignored


class MessageItem(RequestModel):
    """A message: ``{"role", "content"}``, with ``"type": "message"`` or without."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return content_text(self.content)


class FunctionCallItem(RequestModel):
    """An earlier answer's call of a tool."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = None  # a namespace tool's function (see the module doc)


class FunctionCallOutputItem(RequestModel):
    """What a call returned: text, or text parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return content_text(self.output)


class ReasoningItem(RequestModel):
    """An earlier answer's reasoning: its ``reasoning_text`` content goes back into a thinking
    model's prompt as the next assistant message's ``reasoning_content`` (:mod:`..reasoning`);
    a summary and ``encrypted_content`` are left out."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: Any = None
    content: Any = None
    encrypted_content: Any = None
    status: str | None = None

    def text(self) -> str:
        """The reasoning's text: its ``reasoning_text`` parts, joined."""
        parts = self.content if isinstance(self.content, list) else ()
        return "".join(
            p.get("text") or ""
            for p in parts
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )


#: Input items of hosted tools (and compactions): left out of the prompt. (A stored
#: ``item_reference`` is a 400, as ``previous_response_id`` is.)
HOSTED_ITEMS = (
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "code_interpreter_call",
    "image_generation_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "custom_tool_call",
    "custom_tool_call_output",
    "tool_search_call",
    "tool_search_output",
    "compaction",
)


class HostedItem(RequestModel, LeftOut):
    """An earlier item of a hosted tool (see :data:`HOSTED_ITEMS`): left out."""

    type: Literal[HOSTED_ITEMS]


def _kind(item: Any) -> str:
    """An input item's type (a message may leave it out)."""
    kind = (item.get("type") or "message") if isinstance(item, dict) else "message"
    return "hosted" if kind in HOSTED_ITEMS else kind


InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
        Annotated[HostedItem, Tag("hosted")],
    ],
    Discriminator(_kind),
]


class FunctionTool(FunctionDef):
    """A tool, flat (``{"type": "function", "name", "parameters"}``, not under ``function``)."""

    type: Literal["function"]
    defer_loading: bool | None = None  # accepted without effect: every tool is in the prompt


class HostedTool(LeftOutTool):
    """A tool the server does not run (see the module doc): left out of the prompt."""

    served = ("function", "namespace")


def _tool(value: Any) -> str:
    """A tool's kind: ``Function``, ``Namespace`` or ``Hosted`` (any other type)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("function", "namespace"):
        return kind.title()
    return "Function" if not isinstance(kind, str) else "Hosted"


def _member(value: Any) -> str:
    """A namespace member's kind: a namespace within is not served either."""
    kind = _tool(value)
    return "Hosted" if kind == "Namespace" else kind


class NamespaceTool(RequestModel):
    """Tools under one name (Codex's sub-agent tools): its functions are served."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[
        Annotated[
            Union[Annotated[FunctionTool, Tag("Function")], Annotated[HostedTool, Tag("Hosted")]],
            Discriminator(_member),
        ]
    ]


Tool = Annotated[
    Union[
        Annotated[FunctionTool, Tag("Function")],
        Annotated[NamespaceTool, Tag("Namespace")],
        Annotated[HostedTool, Tag("Hosted")],
    ],
    Discriminator(_tool),
]


class NamedFunction(RequestModel):
    type: Literal["function"]
    name: str


class AllowedTools(RequestModel):
    """``{"type": "allowed_tools", "mode", "tools"}``: the answer may call (``auto``) or must
    call (``required``) only the listed function tools; the prompt lists every tool (other
    types listed: tools this server does not run, left out)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(RequestModel):
    format: TextFormat | None = None
    verbosity: Any = None  # accepted without effect


class ResponsesRequest(RequestModel):
    """The request (see the module doc)."""

    #: The chat form's fields that have other names here (an error of the chat form names
    #: this API's field, :func:`..serving.in_own_terms`).
    chat_names: ClassVar[dict[str, str]] = {
        "messages": "input",
        "response_format": "text.format",
        "max_tokens": "max_output_tokens",
    }
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    stream: bool | None = False
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | AllowedTools | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    # Accepted without effect: nothing is stored, reasoning is not apart, the prefix cache is
    # automatic, there are no tiers, nothing is truncated (a prompt beyond the context: 400).
    store: Any = None
    reasoning: Any = None
    metadata: Any = None
    include: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    client_metadata: Any = None
    safety_identifier: Any = None
    user: Any = None
    service_tier: Any = None
    truncation: Any = None
    stream_options: Any = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice_of_a_served_tool(cls, value):
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
            raise ValueError(
                f"choosing a {kind!r} tool is not supported (this server runs function tools "
                "only); choose 'auto', 'required', 'none', a function or allowed_tools"
            )
        return value

    @model_validator(mode="after")
    def _stateless(self):
        for name, what in [
            ("previous_response_id", "responses"),
            ("conversation", "conversations"),
            ("prompt", "prompts"),
        ]:
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{name}: this server stores no {what}; send the whole conversation as input"
                )
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input: the list of input items is empty; send at least a message")
        return self

    def functions(self, say: bool = False) -> list[tuple[FunctionTool, str | None]]:
        """The served tools and their namespaces (None: none), the first of each name (a
        later one of the same name is left out; ``say``: noted in
        ``x-promptlookup-ignored-tools``)."""
        served: list[tuple[FunctionTool, str | None]] = []
        for tool in self.tools or ():
            if isinstance(tool, FunctionTool):
                served.append((tool, None))
            elif isinstance(tool, NamespaceTool):
                served += [(t, tool.name) for t in tool.tools if isinstance(t, FunctionTool)]
        names: set[str] = set()
        kept = []
        for tool, namespace in served:
            if tool.name in names:
                if say:
                    where = f"{namespace}.{tool.name}" if namespace else tool.name
                    note("tools", f"{where} (a second tool of that name)")
                continue
            names.add(tool.name)
            kept.append((tool, namespace))
        return kept

    def namespaces(self) -> dict[str, str]:
        """The namespace of each served tool that has one, by the tool's name."""
        return {tool.name: space for tool, space in self.functions() if space is not None}

    def cross_check(self) -> None:
        """Rules between fields: checked on the request's chat form."""

    def as_chat(self) -> dict:
        """The same request as a chat completions body."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        thought = ""  # a reasoning item's, for the assistant message that follows it
        for item in items:
            if isinstance(item, ReasoningItem):
                thought += item.text()
                continue
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                last = messages[-1] if messages else None
                if last and last["role"] == "assistant" and last.get("tool_calls") is not None:
                    last["tool_calls"].append(call)  # parallel calls: one assistant message
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
                )
            answer = isinstance(item, (MessageItem, FunctionCallItem))
            if thought and answer and messages[-1]["role"] == "assistant":
                messages[-1]["reasoning_content"] = thought
            thought = ""
        body: dict = {"model": self.model, "messages": messages, "stream": bool(self.stream)}
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if not any(m["role"] != "system" for m in messages):
            raise APIError(400, "input: there is no message to answer", param="input")
        if functions := self.functions(say=True):
            body["tools"] = [
                {"type": "function", "function": {
                    "name": tool.name, "description": tool.description or "",
                    "parameters": tool.parameters}}  # None: takes {} (as the other APIs)
                for tool, _ in functions
            ]  # fmt: skip
        choice = self.tool_choice
        if isinstance(choice, AllowedTools):  # chat's shape, its function tools only
            allowed = [{"type": "function", "function": {"name": name}} for name in
                       allowed_names(choice.tools)]  # fmt: skip
            body["tool_choice"] = {
                "type": "allowed_tools",
                "allowed_tools": {"mode": choice.mode, "tools": allowed},
            }
        elif choice is not None:
            named = isinstance(choice, NamedFunction)
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}} if named else choice
            )
        form = self.text.format if self.text is not None else None
        if form is not None and form.type == "json_schema":
            schema = {"name": form.name or "output", "schema": form.schema_}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif form is not None:
            body["response_format"] = {"type": form.type}
        return body
