"""OpenAI's ``prediction`` for vLLM's OpenAI server: an ASGI middleware that moves it into the
request's ``vllm_xargs``, which vLLM passes to the engine as ``SamplingParams.extra_args`` and
the proposer reads (:data:`~.proposer.PREDICTION_KEY`), and that fills in the answer's
``usage.completion_tokens_details`` (``accepted_prediction_tokens``,
``rejected_prediction_tokens``) from vLLM's per-request speculative counts.

vLLM's request models accept unknown fields and drop them (``prediction`` among them), and
``vllm_xargs`` is the one per-request field that reaches the worker untouched; rewriting the
body before vLLM parses it lets clients send OpenAI's own field. A request that already has
``vllm_xargs["prediction"]`` keeps it; a body that is not a JSON object, or a prediction that
is not text, passes unchanged (vLLM then answers it as it would).

The counts: the proposer runs in vLLM's engine process, out of the API server's reach, but
vLLM itself reports each request's draft tokens and the accepted ones in the answer's
``metrics.speculative_decoding`` when its server runs with ``--per-request-spec-decode-metrics
summary`` (``promptlookup vllm-serve`` adds it): in a whole answer's body, and in a stream's
final usage chunk (sent with ``stream_options.include_usage``). For a request with a
prediction the middleware copies them into ``usage.completion_tokens_details`` as
``promptlookup serve`` counts them: draft tokens the model kept, and those it rejected. An
answer without those metrics (the flag off, ``n > 1``) passes unchanged.
"""

from __future__ import annotations

import json

#: The endpoints whose requests may carry a prediction.
PREDICTED_PATHS = ("/v1/chat/completions", "/v1/completions")


def prediction_text(prediction) -> str | None:
    """The text of an OpenAI ``prediction`` (``{"type": "content", "content": text or a list
    of text parts}``), or None when it has none.

    >>> prediction_text({"type": "content", "content": [{"type": "text", "text": "a"}, "b"]})
    'ab'
    >>> prediction_text({"type": "content", "content": 3}) is None
    True
    """
    if not isinstance(prediction, dict):
        return None
    content = prediction.get("content")
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        parts = [p if isinstance(p, str) else p.get("text") for p in content if p]
        if all(isinstance(part, str) for part in parts):
            return "".join(parts) or None
    return None


def rewrite_body(body: bytes) -> bytes | None:
    """The body with ``prediction`` moved into ``vllm_xargs``; None when nothing changes."""
    data = _json_object(body)
    if data is None or "prediction" not in data:
        return None
    text = prediction_text(data["prediction"])
    xargs = data.get("vllm_xargs") or {}
    if text is None or not isinstance(xargs, dict):
        return None
    xargs.setdefault("prediction", text)
    data["vllm_xargs"] = xargs
    del data["prediction"]
    return json.dumps(data).encode()


def is_predicted(body: bytes) -> tuple[bool, bool]:
    """(whether the request, as vLLM receives it, carries a prediction; whether it streams)."""
    data = _json_object(body)
    if data is None:
        return False, False
    xargs = data.get("vllm_xargs")
    predicted = isinstance(xargs, dict) and bool(xargs.get("prediction"))
    return predicted, bool(data.get("stream"))


def add_prediction_usage(answer: dict) -> bool:
    """Fill ``answer["usage"]["completion_tokens_details"]``'s ``accepted_prediction_tokens``
    and ``rejected_prediction_tokens`` from vLLM's ``answer["metrics"]["speculative_decoding"]``
    (draft tokens kept, and drafted but not kept); False when either part is missing.

    >>> answer = {"usage": {"completion_tokens": 9}, "metrics": {"speculative_decoding": {
    ...     "num_draft_tokens": 10, "num_accepted_draft_tokens": 7}}}
    >>> add_prediction_usage(answer), answer["usage"]["completion_tokens_details"]
    (True, {'accepted_prediction_tokens': 7, 'rejected_prediction_tokens': 3})
    """
    usage, metrics = answer.get("usage"), answer.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(usage, dict) or not isinstance(spec, dict):
        return False
    drafted, accepted = spec.get("num_draft_tokens"), spec.get("num_accepted_draft_tokens")
    if not isinstance(drafted, int) or not isinstance(accepted, int):
        return False
    details = usage.get("completion_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details["accepted_prediction_tokens"] = accepted
    details["rejected_prediction_tokens"] = max(drafted - accepted, 0)
    usage["completion_tokens_details"] = details
    return True


def rewrite_answer(body: bytes) -> bytes | None:
    """A whole JSON answer with the prediction counts filled in; None when nothing changes."""
    data = _json_object(body)
    if data is None or not add_prediction_usage(data):
        return None
    return json.dumps(data).encode()


class EventRewriter:
    """Fills in the prediction counts of a server-sent event stream (``data: {...}`` events
    separated by blank lines, split across body messages anywhere): :meth:`feed` returns the
    complete events so far, rewritten where they carry usage and metrics (vLLM's final usage
    chunk), and keeps the incomplete rest for the next call (:meth:`flush` at the end)."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        end = self.pending.rfind(b"\n\n")
        if end < 0:
            return b""
        complete, self.pending = self.pending[: end + 2], self.pending[end + 2 :]
        if b'"speculative_decoding"' not in complete:  # the usual event: as it came
            return complete
        events = complete[:-2].split(b"\n\n")
        return b"".join(self._event(event) + b"\n\n" for event in events)

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest

    @staticmethod
    def _event(event: bytes) -> bytes:
        if not event.startswith(b"data: "):
            return event
        rewritten = rewrite_answer(event[len(b"data: ") :])
        return event if rewritten is None else b"data: " + rewritten


class PredictedOutputs:
    """ASGI middleware (``--middleware promptlookup.vllm.PredictedOutputs``): see the module
    doc."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in PREDICTED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        # Read the whole body, then hand the application the rewritten one.
        chunks, more, other = [], True, None
        while more:
            message = await receive()
            if message["type"] != "http.request":
                other = message  # the client left: let the application see it
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        rewritten = rewrite_body(body) if other is None else None
        if rewritten is not None:
            body = rewritten
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        pending = [other or {"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        predicted, stream = is_predicted(body) if other is None else (False, False)
        if predicted:
            send = _StreamCounts(send) if stream else _AnswerCounts(send)
        await self.app(scope, replay, send)


class _AnswerCounts:
    """``send`` for a whole answer: holds the response start and body until the body is
    complete, then sends them with the counts filled in (and the new length)."""

    def __init__(self, send) -> None:
        self.send, self.start, self.chunks = send, None, []

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        start, body = self.start, b"".join(self.chunks)
        self.start, self.chunks = None, []
        rewritten = rewrite_answer(body) if start.get("status") == 200 else None
        if rewritten is not None:
            body = rewritten
            headers = [
                (k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"
            ]
            start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await self.send(start)
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


class _StreamCounts:
    """``send`` for a stream: its events pass through an :class:`EventRewriter`."""

    def __init__(self, send) -> None:
        self.send, self.events = send, EventRewriter()

    async def __call__(self, message) -> None:
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        more = message.get("more_body", False)
        body = self.events.feed(message.get("body", b""))
        if not more:
            body += self.events.flush()
        if body or not more:
            await self.send({**message, "body": body})


def _json_object(body: bytes) -> dict | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
