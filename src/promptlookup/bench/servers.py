"""Racing OpenAI-compatible servers: ``promptlookup bench --against NAME=URL``.

A server method sends each bench prompt's chat messages to ``URL/v1/chat/completions``
(llama.cpp's ``llama-server``, vLLM, ``promptlookup serve``, ...), interleaved with the local
methods in the same balanced order, and reports in the same tables. Policies:

- The same request for every server: the row's messages, ``max_tokens`` = the run's max new
  tokens, greedy (``temperature`` 0) or the run's sampling settings and per-prompt seed,
  streamed with ``stream_options.include_usage``; ``cache_prompt: false`` too (llama-server
  would otherwise reuse the previous request's prompt cache), dropped for the rest of the run
  when a server refuses it; but not in the multi-turn session mode (``keep_cache``,
  :mod:`~promptlookup.bench.sessions.conversations`), where each server keeps its own defaults, its
  prompt cache included. The model is the first one ``/v1/models`` lists.
- Timing: from sending the request to the end of the stream; each content chunk's arrival time
  goes to the tokens it holds. New tokens are the server's ``usage.completion_tokens``.
- The server's text is compared with ``plain``'s (and ``promptlookup-none``'s) decoded text for
  the identity columns; its ``token_ids`` are that text re-encoded by the local tokenizer (for
  the agreed-prefix timings, meaningful where the server runs the same model).
- Forward-pass counters are unknown (None); the peak RSS is the server process's, when it
  listens on this machine (:mod:`promptlookup.bench.memory`).
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from ..errors import InvalidParameterError
from .memory import pid_listening_on
from .methods import MethodOutput, Settings
from .structured import server_request

TIMEOUT = 600.0


class ServerError(InvalidParameterError):
    """A server raced with ``--against`` could not be reached or answered an error."""


def parse_against(item: str) -> tuple[str, str]:
    """``NAME=URL`` -> ``(NAME, base URL without /v1)``.

    >>> parse_against("llamacpp=http://127.0.0.1:8080/v1/")
    ('llamacpp', 'http://127.0.0.1:8080')
    """
    name, sep, url = item.partition("=")
    name, url = name.strip(), url.strip().rstrip("/")
    parts = urlsplit(url)
    if not sep or not name or "," in name or ":" in name or parts.scheme not in ("http", "https"):
        raise InvalidParameterError(
            f"--against {item!r}: expected NAME=URL, e.g. llamacpp=http://127.0.0.1:8080"
        )
    return name, url.removesuffix("/v1")


class ServerMethod:
    """One OpenAI-compatible server, as a bench method named ``name``."""

    def __init__(
        self, name: str, url: str, lm=None, api_key: str | None = None, keep_cache: bool = False
    ) -> None:
        self.name = name
        self.url = url
        self.lm = lm
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._extra = {} if keep_cache else {"cache_prompt": False}
        self.model_id = self._first_model()
        #: The server's process on this machine, for its peak RSS (None: unknown).
        self.pid = pid_listening_on(self._host, self._port)

    def _connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=TIMEOUT)

    def _first_model(self) -> str:
        connection = self._connection()
        try:
            connection.request("GET", self._prefix + "/v1/models", headers=self._headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise ServerError(
                    f"{self.name}: {self.url}/v1/models answered HTTP {response.status}"
                )
            models = json.loads(body).get("data") or []
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            raise ServerError(f"{self.name}: cannot reach {self.url} ({exc})") from None
        finally:
            connection.close()
        if not models or "id" not in models[0]:
            raise ServerError(f"{self.name}: {self.url}/v1/models lists no model")
        return str(models[0]["id"])

    def body(self, messages: list, settings: Settings) -> dict:
        """The request for one prompt (a structured prompt's tools in the generic format,
        :func:`.structured.server_request`)."""
        messages, fields = server_request(messages, settings.request)
        body = {
            "model": self.model_id,
            "messages": messages,
            "max_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._extra,
            **fields,
        }
        if settings.sampling:
            body["top_p"] = settings.top_p
            if settings.seed is not None:
                body["seed"] = settings.seed
            if settings.top_k:
                body["top_k"] = settings.top_k
        return body

    def run_chat(self, messages: list, settings: Settings) -> MethodOutput:
        """Generate for one prompt's messages through the server (see the module's policy)."""
        body = self.body(messages, settings)
        status, chunks, usage, seconds = self._stream(body)
        if status in (400, 422) and "cache_prompt" in body:  # a server that refuses it
            self._extra = {}  # (another request sent at the same time may have seen it first)
            status, chunks, usage, seconds = self._stream(self.body(messages, settings))
        if status != 200:
            detail = "".join(text for _, text in chunks)[:300]
            raise ServerError(f"{self.name}: HTTP {status} from {self.url}: {detail}")
        text = "".join(piece for _, piece in chunks)
        token_ids, token_seconds = self._tokens(chunks, text)
        new_tokens = (usage or {}).get("completion_tokens")
        return MethodOutput(
            token_ids,
            seconds,
            token_seconds=token_seconds,
            text=text,
            new_tokens=new_tokens if isinstance(new_tokens, int) else len(token_ids),
        )

    def chat(self, messages: list, max_tokens: int) -> dict:
        """One turn of the session mode (:mod:`~promptlookup.bench.sessions.conversations`): greedy,
        streamed; its text, time to first token, seconds and the usage's token counts."""
        status, chunks, usage, seconds = self._stream(
            self.body(messages, Settings(max_new_tokens=max_tokens))
        )
        if status != 200:
            detail = "".join(text for _, text in chunks)[:300]
            raise ServerError(f"{self.name}: HTTP {status} from {self.url}: {detail}")
        usage = usage or {}
        return {
            "text": "".join(piece for _, piece in chunks),
            "first_token_seconds": chunks[0][0] if chunks else seconds,
            "seconds": seconds,
            "completion_tokens": usage.get("completion_tokens") or 0,
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        }

    def run(self, prompt_ids: Sequence[int], settings: Settings) -> MethodOutput:
        raise InvalidParameterError(f"{self.name}: a server method needs the prompt's messages")

    def _stream(self, body: dict):
        """``(HTTP status, [(seconds, text)], usage, seconds)`` of one streamed request."""
        connection = self._connection()
        chunks: list[tuple[float, str]] = []
        usage = None
        start = time.perf_counter()
        try:
            connection.request(
                "POST", self._prefix + "/v1/chat/completions", json.dumps(body), self._headers
            )
            response = connection.getresponse()
            if response.status != 200:
                return response.status, [(0.0, response.read().decode(errors="replace"))], None, 0
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if event.get("error"):
                    raise ServerError(f"{self.name}: error in the stream: {event['error']}")
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        chunks.append((time.perf_counter() - start, content))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ServerError(f"{self.name}: request to {self.url} failed ({exc})") from None
        finally:
            connection.close()
        return 200, chunks, usage, time.perf_counter() - start

    def _tokens(self, chunks, text: str) -> tuple[list[int], list[float] | None]:
        """The text re-encoded by the local tokenizer, and for each token the arrival time of
        the chunk that completed it (the tokens of the text received so far, chunk by chunk)."""
        tokenizer = getattr(self.lm, "tokenizer", None)
        if tokenizer is None or not text:
            return [], None

        def encode(part: str) -> list[int]:
            return list(tokenizer(part, add_special_tokens=False)["input_ids"])

        token_ids = encode(text)
        times: list[float] = []
        received = ""
        for seconds, piece in chunks:
            received += piece
            complete = min(len(encode(received)), len(token_ids))
            times += [round(seconds, 6)] * max(0, complete - len(times))
        times += [times[-1] if times else 0.0] * (len(token_ids) - len(times))
        return token_ids, times
