"""One request's way from its parsed body to a queued :class:`~.worker.GenerationJob`, shared
by the OpenAI endpoints (:mod:`.app`) and Anthropic's (:mod:`.anthropic.serving`): checks against the
model and its context, tokenizing (chat messages with their tools, :mod:`.tools`), the
drafter, the grammar and the tenant; then waiting for the job unless the client leaves."""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ..drafters import parse_drafter_spec
from ..drafters.options import LOOKUP_OPTIONS
from ..errors import EmptyPromptError, PromptLookupError
from ..sampling import SamplingParams
from .openai.protocol import ChatCompletionRequest
from .request_base import APIError, content_text, parse_request, read_json
from .state import ServerState
from .texts import CHUNK, bounded_ids
from .tool_schemas import function_tools
from .tool_template import encode
from .tools import tool_texts
from .worker import GenerationJob, QueueFull


def _check_model(state: ServerState, req, chat: bool) -> None:
    """A 400 for a request to another model or with more text than the context can hold."""
    state.ready_model()
    if not state.serves(req.model):
        raise APIError(
            400,
            f"The model {req.model!r} does not exist; this server has {state.model_id!r}",
            param="model",
            code="model_not_found",
        )
    _check_characters(state, req, chat)  # before tokenizing: megabytes take seconds


async def count_tokens(state: ServerState, req) -> int:
    """The prompt tokens of a chat request, tools included, as a job would have them (on a
    thread); its 400s are a job's."""
    return len(await prompt_ids(state, req, chat=True))


async def prompt_ids(state: ServerState, req, chat: bool) -> list[int]:
    """The prompt of a chat (or completions) request as token ids, tools included, as a job
    would have them (on a thread); its 400s are a job's."""
    _check_model(state, req, chat)
    return await run_in_threadpool(_encode, state, req, chat)


async def serve_as_chat(state: ServerState, request: Request, shape):
    """A request of another API (``shape``: its pydantic model, with ``as_chat``) served by
    the chat path: ``(the request in its own shape, as chat, its job, whether the client is
    still there, its choices)``; for a stream, the job has started (an error before that is an
    :class:`APIError`, answered as JSON) and the choices are to come as its events."""
    settings = state.settings
    body = await read_json(
        request, settings.max_body_bytes, settings.body_timeout, state.max_pieces
    )
    try:
        asked, req = await run_in_threadpool(parse_as_chat, shape, body)
        job = await start_job(state, request, req, chat=True)
    except APIError as error:
        raise in_own_terms(error, shape) from None
    waited = started_soon(job, state) if req.stream else job.outcome()
    finished, choices = await unless_disconnected(waited, job, request)
    return asked, req, job, finished, choices


def in_own_terms(error: APIError, shape) -> APIError:
    """``error``, of a request of ``shape``'s API served as chat, naming that API's field
    where the chat form's has another name (``shape.chat_names``): a Responses prompt beyond
    the context is ``input``'s, not ``messages``'."""
    chat_name = (error.param or "").split(".")[0]
    own = getattr(shape, "chat_names", {}).get(chat_name)
    if own is None:
        return error
    message = error.message
    if message.startswith(chat_name):  # "response_format: invalid JSON schema: ..."
        message = own + message[len(chat_name) :]
    return APIError(error.status, message, type=error.type, param=own, code=error.code,
                    headers=error.headers)  # fmt: skip


def parse_as_chat(shape, body):
    """A body of another API validated in its ``shape`` and as chat (:func:`parse_request`),
    on a thread by its callers: validating a large body takes a while (1.8 s for 100,000
    small messages on a busy 2-core host), in which the event loop, serving every other
    stream, would otherwise stand still."""
    asked = parse_request(shape, body)
    return asked, parse_request(ChatCompletionRequest, asked.as_chat())


async def started_soon(job: GenerationJob, state: ServerState) -> None:
    """Wait until a worker starts a streamed ``job``, or raise the :class:`APIError` that ended
    it first (answered as JSON, with its status); but no longer than ``--stream-keepalive``
    seconds: a job still queued then has its stream begin (200) with keep-alives, its
    ``"started"`` event left for the stream, and an error after that is an error event."""
    seconds = state.settings.stream_keepalive
    try:
        await asyncio.wait_for(job.started(), seconds or None)
    except TimeoutError:
        pass


async def start_job(state: ServerState, request: Request, req, chat: bool) -> GenerationJob:
    """Check a parsed request against the model, prepare its job (:func:`_prepare`, on a
    thread) and queue it (429 when the queue is full)."""
    settings = state.settings
    _check_model(state, req, chat)
    # The tenant whose cross-request index and prefix cache entries the request uses: its
    # API key's (None without keys; see .edge and .tenants).
    tenant = getattr(request.state, "tenant", None)
    job = await run_in_threadpool(_prepare, state, req, chat, tenant)
    job.bind(asyncio.get_running_loop())
    state.metrics.track(job, tenant)  # its tokens and latencies, when it ends
    try:
        state.worker.submit(job)
    except QueueFull:
        raise APIError(
            429,
            f"the server is busy ({settings.max_queue} requests already waiting); retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(state.worker.retry_after())},
        ) from None
    return job


def _check_characters(state: ServerState, req, chat: bool) -> None:
    """A 400 for a prompt (or prediction) with more characters than the context's tokens can
    hold (:attr:`ServerState.max_text_chars`), found without tokenizing it."""
    limit, context = state.max_text_chars, state.lm.target.max_context
    if chat:  # the tools' text (names, descriptions, schemas) is prompt text too
        tools = sum(map(len, _tool_texts(req)))
        if tools > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; the tools ({tools} "
                f"characters of names, descriptions and schemas) cannot fit in it (at most "
                f"{limit} characters)",
                param="tools",
                code="context_length_exceeded",
            )
        param, chars = "messages", tools + sum(map(len, _message_texts(state, req)))
    else:
        param, chars = "prompt", len(req.prompt) if isinstance(req.prompt, str) else 0
    if chars > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt "
            f"({chars} characters) has more than {context} tokens (at most {limit} characters fit)",
            param=param,
            code="context_length_exceeded",
        )
    if req.prediction is not None and len(content_text(req.prediction.content)) > limit:
        raise APIError(
            400,
            f"prediction: longer than this model's context can use (at most {limit} characters)",
            param="prediction",
        )


def _message_texts(state: ServerState, req) -> list[str]:
    """The messages' texts, and earlier answers' reasoning where it goes into the prompt
    (:mod:`.reasoning`)."""
    texts = [content_text(m.content) for m in req.messages]
    if state.reasoning is None:
        return texts
    return texts + [m.reasoning_content or m.reasoning or "" for m in req.messages]


def _tool_texts(req) -> list[str]:
    return tool_texts([tool.plain() for tool in function_tools(req.tools)])


def _encode(state: ServerState, req, chat: bool) -> list[int]:
    """A request's prompt as token ids (tools through the chat template where it takes
    them, :mod:`.tool_template`), or a 400."""
    lm, context = state.lm, state.lm.target.max_context
    param = "messages" if chat else "prompt"
    # Long texts a chunk at a time, others' requests between chunks, only up to the context.
    texts = _message_texts(state, req) if chat else [req.prompt]
    texts = [text for text in texts if isinstance(text, str)] + (_tool_texts(req) if chat else [])
    lock = state.tokenizer_lock
    if sum(map(len, texts)) > CHUNK and bounded_ids(lm.tokenizer, lock, texts, context) is None:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt has more "
            f"than {context} tokens (its text alone, tokenized no further)",
            param=param,
            code="context_length_exceeded",
        )
    with lock:
        try:
            if chat:
                template = state.tool_template
                messages = req.prompt_messages(template)
                if state.reasoning is not None:  # earlier answers' reasoning, as written
                    sent = req.sent_messages()
                    messages = state.reasoning.with_reasoning(sent, messages)
                prompt_ids = encode(lm, messages, req.template_tools(template))
            else:
                prompt_ids = lm.encode(req.prompt)
        except Exception as exc:  # the prompt's fault, incl. chat template (jinja2) errors?
            if not (
                isinstance(exc, (PromptLookupError, ValueError, TypeError))
                or type(exc).__module__.startswith("jinja2")
            ):
                raise
            empty = isinstance(exc, EmptyPromptError)
            raise APIError(
                400, str(exc) if empty else f"cannot encode the prompt: {exc}", param=param
            ) from None
    vocab = getattr(getattr(lm.model, "config", None), "vocab_size", None)
    if vocab and any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
    return prompt_ids


def _prepare(state: ServerState, req, chat: bool, tenant: str | None = None) -> GenerationJob:
    """Tokenize and check one request (runs on a thread): its :class:`GenerationJob`, prompt
    lookup's with ``tenant``'s cross-request index (see ``--cross-request``)."""
    lm, context = state.lm, state.lm.target.max_context
    param = "messages" if chat else "prompt"
    reference_ids = None
    if req.prediction is not None:
        prediction = [content_text(req.prediction.content)]
        reference_ids = bounded_ids(lm.tokenizer, state.tokenizer_lock, prediction, context)
        if reference_ids is None:
            raise APIError(
                400,
                f"prediction: more tokens than this model's context of {context} can use",
                param="prediction",
            )
    prompt_ids = _encode(state, req, chat)
    asked = req.sampling()
    try:  # the one sampling object, from here to the sequence
        sampling = SamplingParams(**{name: asked[name] for name in SamplingParams.keywords()})
    except PromptLookupError as exc:
        raise APIError(400, str(exc), param=str(exc).split()[0]) from None
    used = len(prompt_ids)
    # max_tokens is a ceiling: a generation also ends where the context is full
    # (finish_reason "length"), as llama-server does; agents ask for more than a small local
    # model's context holds (Claude Code: 32,000). A prompt that leaves no room is a 400.
    if used >= context:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens; the prompt has "
            f"{used} tokens and leaves no room for an answer",
            param=param,
            code="context_length_exceeded",
        )
    max_new_tokens = req.requested_max_tokens or state.settings.default_max_tokens
    max_new_tokens = min(max_new_tokens, context - used)
    drafter, options = state.settings.drafter, state.settings.drafter_options
    if reference_ids:
        lookup = {k: v for k, v in options.items() if k in LOOKUP_OPTIONS}
        drafter, options = "prompt-lookup", {**lookup, "reference_ids": reference_ids}
    # A prediction is the request's own draft material: no index beside it (its accepted
    # drafts are then what usage.completion_tokens_details counts).
    index = None if reference_ids else state.cross_request.for_tenant(tenant)
    if index is not None and _looks_up(drafter):
        options = {**options, "cross_request": index}
    constraint = (
        req.grammar(state.tool_template) if chat else None
    )  # a 400 for a schema that cannot compile
    return GenerationJob(
        prompt_ids,
        max_new_tokens,
        sampling,
        tuple(asked["stop"]),
        drafter,
        options,
        state.settings.generation_options.get("speculation", "adaptive"),
        # The policy weighs the request's drafts with its tenant's history only, and the
        # prefix cache gives it its tenant's entries (unless --prefix-cache-scope global).
        tenant=tenant,
        prefix_cache=state.prefix_cache or False,
        grammar=constraint,
        n=req.choices,
        logprobs=req.top_logprobs_count,
        wants_deltas=bool(req.stream),
    )


def _looks_up(drafter) -> bool:
    """Whether a drafter spec has a prompt lookup member (which takes ``cross_request``)."""
    return isinstance(drafter, str) and any(
        name == "prompt-lookup" for name, _ in parse_drafter_spec(drafter)
    )


async def unless_disconnected(waited, job: GenerationJob, request: Request):
    """``(True, result)`` of ``waited`` (one of the job's coroutines; its
    :class:`APIError` raised), or ``(False, None)`` and the job cancelled if the client
    disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(waited)
    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return True, task.result()
        return False, None
    finally:
        if not task.done() or task.cancelled():
            job.cancel()  # the client left (or this handler was cancelled) first
        task.cancel()
        gone.cancel()
