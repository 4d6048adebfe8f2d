"""OpenAI's request bodies, validated at the edge; errors in OpenAI's JSON.

Policies:

- *Unknown fields* are ignored and said (``x-promptlookup-ignored-fields``, a log line),
  unless one is a typo of a field this server implements: a 400 naming the intended field
  (:mod:`.ignored`, the rule of every API). Tools of a type the server does not run are left
  out of the prompt and said (``x-promptlookup-ignored-tools``).
- *Accepted without effect*: ``user``, ``store``, ``metadata``, ``service_tier``,
  ``prompt_cache_key`` (the prefix cache is automatic), ``safety_identifier``,
  ``reasoning_effort``, ``verbosity``; an earlier answer's ``reasoning_content`` (or
  ``reasoning``) goes back into a thinking model's prompt (:mod:`.reasoning`), and
  ``reasoning_format: "none"`` keeps its answer's text whole.
- *Text* must be valid Unicode: a lone surrogate anywhere is a 400 naming its field.
- *Strict types*: integers must be JSON integers (not booleans, floats or strings), numbers
  must be finite JSON numbers, booleans must be ``true``/``false``.
- *Ranges* keep every number where torch's arithmetic stays finite: ``temperature`` 0
  (greedy) or in [:data:`~promptlookup.limits.MIN_TEMPERATURE`, 2]; ``top_p`` in (0, 1];
  ``repetition_penalty`` in :data:`~promptlookup.limits.REPETITION_PENALTY_RANGE`; ``seed`` a signed 64-bit integer; ``n`` in [1, 16]; ``top_logprobs`` in
  [0, 20] (chat, with ``logprobs: true``); ``logprobs`` in [0, 5] (completions); ``stop``
  one string or a list of up to 4, each at most 1,000 characters.
- *Refused features*: parameters whose only supported value is the default (``echo``,
  ``best_of``, ``suffix``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, the
  deprecated ``functions``/``function_call``) are accepted at that value and a 400 naming the
  parameter otherwise.
- *Structured output and tools* (:mod:`.tool_schemas`, :mod:`.tools`): ``response_format``
  (``text``, ``json_object``, ``json_schema``), ``tools``, ``tool_choice``,
  ``parallel_tool_calls``, assistant messages with ``tool_calls`` and ``tool`` messages; a
  schema the grammar engine cannot compile, or a ``tool_choice`` naming no tool, is a 400.
- Extensions beyond OpenAI: ``top_k`` and ``repetition_penalty`` (as in
  ``promptlookup generate``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, field_validator, model_validator

from ...errors import GrammarError
from ...grammar import Grammar
from ...limits import MIN_TEMPERATURE, REPETITION_PENALTY_RANGE
from ..ignored import LeftOut
from ..request_base import APIError, Content, RequestModel, TextPart, content_text
from ..tool_schemas import (
    AllowedToolsChoice,
    ChatTool,
    ChatToolCall,
    ResponseFormat,
    ToolChoice,
    check_tool_choice,
    function_tools,
    tools_problem,
)
from ..tool_template import TemplateFormat
from ..tools import ToolPlan, prompt_messages

#: Most stop strings per request (OpenAI's limit), and the most characters in one.
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1000
#: Most sequences per request (``n``).
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
INT64 = (-(2**63), 2**63 - 1)
INT32_MAX = 2**31 - 1


class RefusalPart(RequestModel, LeftOut):
    """An earlier answer's refusal as a content part (OpenAI's assistant messages may carry
    one): left out of the prompt, as a message's ``refusal`` is, and said."""

    type: Literal["refusal"]
    refusal: str
    text: ClassVar[str] = ""  # nothing of it in the message's text (content_text)


#: A chat message's content: text, or text and refusal parts (a plain union: its errors'
#: paths name no member, see request_base.first_error).
MessageContent = Union[str, list[Union[TextPart, RefusalPart]]]


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MessageContent | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    refusal: str | None = None  # as OpenAI's answers carry it, when a client sends one back
    # An earlier answer's reasoning (llama-server's name; vLLM's newer ``reasoning``, also
    # OpenRouter's): back into the prompt for a thinking model (.reasoning), else left out;
    # its annotations are left out.
    reasoning_content: str | None = None
    reasoning: str | None = None
    annotations: list[Any] | None = None

    @model_validator(mode="after")
    def _shape(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.content is None and not self.tool_calls:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def as_dict(self) -> dict:
        """The message as :func:`.tools.prompt_messages` takes it."""
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": content_text(self.content)}
        if calls := function_tools(self.tool_calls):  # another type's calls: left out
            message["tool_calls"] = [call.plain() for call in calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.role == "assistant" and (self.reasoning_content or self.reasoning):
            message["reasoning_content"] = self.reasoning_content or self.reasoning
        return message


class Prediction(RequestModel):
    """OpenAI's predicted output: text the answer will largely repeat (e.g. a file being
    edited). It becomes the prompt lookup drafter's reference text."""

    type: Literal["content"]
    content: Content


class StreamOptions(RequestModel):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # accepted, ignored (no obfuscation is added)


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


class _GenerationRequest(RequestModel):
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
    # Accepted without effect (see the module doc).
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None

    _presence = field_validator("presence_penalty")(_only(0, "presence_penalty"))
    _frequency = field_validator("frequency_penalty")(_only(0, "frequency_penalty"))

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_count(cls, value):
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences, got {len(value)}")
        return value

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


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    reasoning_effort: Any = None  # accepted without effect
    # llama-server's per-request choice: "none" keeps a thinking model's answer whole (.reasoning)
    reasoning_format: Literal["auto", "none"] | None = None
    verbosity: Any = None  # accepted without effect

    _tool_choice = field_validator("tool_choice", mode="before")(check_tool_choice)

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, value):
        if value:
            raise ValueError("the deprecated functions API is not supported; use tools")
        return value

    def tool_plan(self, template: TemplateFormat | None = None) -> ToolPlan | None:
        """How this request may call its tools (None: it may not), in the chat template's
        format where it has one (:func:`.tool_template.detect`), else the generic format."""
        choice, served = self.tool_choice or "auto", function_tools(self.tools)
        allowed = None
        if isinstance(choice, AllowedToolsChoice):  # its mode, and only its tools callable
            choice, allowed = choice.allowed_tools.mode, tuple(choice.allowed_tools.names())
            choice = choice if allowed else "none"  # none of them is a function (auto)
        if not served or choice == "none":
            return None
        named = choice if isinstance(choice, str) else choice.function.name
        parallel = self.parallel_tool_calls is not False
        # Under "auto" an answer without calls takes the response format; where calls are
        # required, the format has no answer to shape (as OpenAI serves it).
        form = self.response_format
        answer = form.schema() if form is not None and named == "auto" else None
        tools = [tool.plain() for tool in served]
        return ToolPlan(tools, named, parallel, template, answer, allowed)

    def sent_messages(self) -> list[dict]:
        """The messages as dicts (:meth:`ChatMessage.as_dict`), without what the prompt leaves
        out: the results of earlier calls of tools the server does not run, and an assistant
        message that had nothing but such calls."""
        left_out = {
            call.id for m in self.messages for call in m.tool_calls or () if call.type != "function"
        }
        sent = []
        for m in self.messages:
            message = m.as_dict()
            answered = m.role == "tool" and m.tool_call_id in left_out
            emptied = m.tool_calls and not message.get("tool_calls") and not message["content"]
            if not (answered or (emptied and not message.get("reasoning_content"))):
                sent.append(message)
        return sent

    def prompt_messages(self, template: TemplateFormat | None = None) -> list[dict]:
        """The messages for the chat template: the history's tool calls and results in the
        template's own shapes (:meth:`.tool_template.TemplateFormat.messages`), or with the
        tools in the generic format (:func:`.tools.prompt_messages`)."""
        messages = self.sent_messages()
        if template is not None:
            return template.messages(messages)
        return prompt_messages(messages, self.tool_plan())

    def template_tools(self, template: TemplateFormat | None) -> list[dict] | None:
        """The tools the chat template lists (None: none, or the generic format)."""
        plan = self.tool_plan(template)
        return None if template is None or plan is None else template.tools(plan)

    def grammar(self, template: TemplateFormat | None = None) -> Grammar | None:
        """What the answer must match: its tool calls' grammar, or ``response_format``."""
        plan, param = self.tool_plan(template), "response_format"
        try:
            if self.response_format is not None:  # its own errors first, whatever follows
                grammar = Grammar.of_response_format(self.response_format.plain())
            if plan is not None:
                param = "tools"
                return plan.grammar()
            if self.response_format is not None:
                return grammar
        except GrammarError as exc:
            raise APIError(400, f"{param}: {exc}", param=param) from None
        return None

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
        tools = function_tools(self.tools)
        problem = tools_problem(tools, self.tool_choice, self.response_format)
        if problem is not None:
            raise APIError(400, f"{problem[0]}: {problem[1]}", param=problem[0])


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
