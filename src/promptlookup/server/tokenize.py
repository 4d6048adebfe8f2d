"""``POST /tokenize`` and ``POST /detokenize``, as llama-server and vLLM have them, in one
shape that takes both servers' requests and answers with both servers' fields.

``/tokenize`` takes a text as llama-server's ``content`` or vLLM's ``prompt``, or vLLM's chat
``messages`` (with ``tools``); it answers ``{"tokens", "count", "max_model_len"}``:

- special tokens (a BOS) are added as each server does by default: not for ``content``
  (llama-server's ``add_special`` false), yes for ``prompt`` (vLLM's ``add_special_tokens``
  true); either flag sets it for either text;
- ``messages`` are tokenized as a ``/v1/chat/completions`` request of the same messages and
  tools is (the chat template, its generation prompt, the tools in its format): their
  ``count`` is that request's ``prompt_tokens``;
- ``with_pieces`` (llama-server) makes each token ``{"id", "piece"}`` (its text);
  ``return_token_strs`` (vLLM) adds ``token_strs``, each token's text.

``/detokenize`` takes ``{"tokens": [...]}`` and answers the text as both ``content``
(llama-server) and ``prompt`` (vLLM), special tokens written out.

Both check ``model`` when it is given, as the other endpoints do; texts are bounded as
prompts are (characters, then tokens, a chunk at a time: :mod:`.texts`): more than the
context holds is a 400 ``context_length_exceeded``, as are more token ids than it holds.
Fields neither server defines are ignored, as both servers do.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from .openai.protocol import ChatCompletionRequest
from .request_base import APIError, parse_request, read_json
from .serving import prompt_ids
from .state import ServerState
from .texts import CHUNK, bounded_ids


class TokenizeRequest(BaseModel):
    """llama-server's and vLLM's ``/tokenize`` fields (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    content: str | None = None  # llama-server
    prompt: str | None = None  # vLLM
    messages: list[dict] | None = None  # vLLM's chat form
    tools: list[dict] | None = None
    add_special: bool | None = None  # llama-server (default false)
    add_special_tokens: bool | None = None  # vLLM (default true for prompt)
    with_pieces: bool = False  # llama-server
    return_token_strs: bool = False  # vLLM

    def cross_check(self) -> None:
        if (self.content is not None) + (self.prompt is not None) + (
            self.messages is not None
        ) != 1:
            raise APIError(400, "give one of content, prompt or messages", param="content")


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]

    def cross_check(self) -> None:
        pass


def _check_model(state: ServerState, model: str | None) -> None:
    state.ready_model()
    if model is not None and not state.serves(model):
        raise APIError(
            400,
            f"The model {model!r} does not exist; this server has {state.model_id!r}",
            param="model",
            code="model_not_found",
        )


async def tokenize(state: ServerState, request: Request) -> JSONResponse:
    """``POST /tokenize`` (see the module doc)."""
    settings = state.settings
    body = parse_request(
        TokenizeRequest,
        await read_json(request, settings.max_body_bytes, settings.body_timeout, state.max_pieces),
    )
    _check_model(state, body.model)
    if body.messages is not None:
        chat = {"model": state.model_id, "messages": body.messages, "max_tokens": 1}
        if body.tools:
            chat["tools"] = body.tools
        ids = await prompt_ids(state, parse_request(ChatCompletionRequest, chat), chat=True)
    else:
        special = body.add_special if body.add_special is not None else body.add_special_tokens
        if special is None:
            special = body.prompt is not None  # each server's own default
        text = body.content if body.content is not None else body.prompt
        ids = await run_in_threadpool(_text_ids, state, text, special)
    answer: dict = {"tokens": ids, "count": len(ids), "max_model_len": state.lm.target.max_context}
    if body.with_pieces or body.return_token_strs:
        pieces = await run_in_threadpool(_pieces, state, ids)
        if body.with_pieces:
            answer["tokens"] = [{"id": i, "piece": p} for i, p in zip(ids, pieces)]
        if body.return_token_strs:
            answer["token_strs"] = pieces
    return JSONResponse(answer)


def _too_long(context: int, param: str, has: str) -> APIError:
    """The 400 of a text or token list beyond the context: ``has`` says its own count."""
    return APIError(
        400,
        f"This model's maximum context length is {context} tokens; {param} has {has}",
        param=param,
        code="context_length_exceeded",
    )


def _text_ids(state: ServerState, text: str, special: bool) -> list[int]:
    """A text's token ids (on a thread), bounded as prompts are (:mod:`.texts`)."""
    lm, context, lock = state.lm, state.lm.target.max_context, state.tokenizer_lock
    if len(text) > state.max_text_chars:
        raise _too_long(
            context, "content", f"{len(text)} characters (at most {state.max_text_chars} fit)"
        )
    # Long texts a chunk at a time, others' requests between chunks, only up to the context;
    # then the whole text at once (tokens across the cuts as they are in one piece).
    if len(text) > CHUNK and bounded_ids(lm.tokenizer, lock, [text], context) is None:
        raise _too_long(context, "content", f"more than {context} tokens")
    with lock:
        try:
            ids = list(lm.tokenizer(text, add_special_tokens=special)["input_ids"])
        except (TypeError, ValueError) as exc:  # a lone surrogate, say (UnicodeEncodeError)
            raise APIError(400, f"content: cannot tokenize it: {exc}", param="content") from None
    if len(ids) > context:
        raise _too_long(context, "content", f"{len(ids)} tokens")
    return ids


def _pieces(state: ServerState, ids: list[int]) -> list[str]:
    """Each token's text."""
    with state.tokenizer_lock:
        return [state.lm.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


async def detokenize(state: ServerState, request: Request) -> JSONResponse:
    """``POST /detokenize`` (see the module doc)."""
    settings = state.settings
    body = parse_request(
        DetokenizeRequest,
        await read_json(request, settings.max_body_bytes, settings.body_timeout, state.max_pieces),
    )
    _check_model(state, body.model)
    lm, context = state.lm, state.lm.target.max_context
    if len(body.tokens) > context:
        raise _too_long(context, "tokens", f"{len(body.tokens)} token ids")
    vocab = getattr(getattr(lm.model, "config", None), "vocab_size", None)
    if vocab and any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"tokens: token ids must be in [0, {vocab})", param="tokens")

    def decode() -> str:
        with state.tokenizer_lock:
            return lm.tokenizer.decode(body.tokens, skip_special_tokens=False)

    try:
        text = await run_in_threadpool(decode)
    except (IndexError, KeyError, OverflowError, TypeError, ValueError) as exc:
        # An id the tokenizer does not have (a model's vocabulary may be padded beyond it).
        raise APIError(400, f"tokens: cannot decode them: {exc}", param="tokens") from None
    return JSONResponse({"content": text, "prompt": text})
