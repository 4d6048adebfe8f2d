"""OpenAI's ``prediction`` for vLLM's OpenAI server: an ASGI middleware that moves it into the
request's ``vllm_xargs``, which vLLM passes to the engine as ``SamplingParams.extra_args`` and
the proposer reads (:data:`~.proposer.PREDICTION_KEY`).

vLLM's request models accept unknown fields and drop them (``prediction`` among them), and
``vllm_xargs`` is the one per-request field that reaches the worker untouched; rewriting the
body before vLLM parses it lets clients send OpenAI's own field. A request that already has
``vllm_xargs["prediction"]`` keeps it; a body that is not a JSON object, or a prediction that
is not text, passes unchanged (vLLM then answers it as it would).
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
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or "prediction" not in data:
        return None
    text = prediction_text(data["prediction"])
    xargs = data.get("vllm_xargs") or {}
    if text is None or not isinstance(xargs, dict):
        return None
    xargs.setdefault("prediction", text)
    data["vllm_xargs"] = xargs
    del data["prediction"]
    return json.dumps(data).encode()


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

        await self.app(scope, replay, send)
