"""OpenAI's response bodies: completions, streaming chunks, usage, logprobs, server-sent events.

Logprobs follow OpenAI's two shapes: chat's ``{"content": [{"token", "logprob", "bytes",
"top_logprobs"}], "refusal"}`` and the legacy completions' ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` (``text_offset``: character offsets in the completion text,
counted from its start). There is one entry per token the answer reports
(``usage.completion_tokens`` of them): every generated token, the EOS token included, except
those that only spell a stop string the text was cut at (see :mod:`.shown`).
"""

from __future__ import annotations

import json

from .schemas import APIError
from .worker import Choice, TokenInfo


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_error(error: APIError) -> str:
    return f"event: error\ndata: {json.dumps(error.body())}\n\n"


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "surrogatepass"))


def chat_logprobs(infos: list[TokenInfo] | None) -> dict | None:
    if infos is None:
        return None
    return {
        "content": [
            {
                "token": t.text,
                "logprob": t.logprob,
                "bytes": _bytes(t.text),
                "top_logprobs": [
                    {"token": s, "logprob": lp, "bytes": _bytes(s)} for s, lp in t.top
                ],
            }
            for t in infos
        ],
        "refusal": None,
    }


def completion_logprobs(infos: list[TokenInfo] | None, offset: int = 0) -> dict | None:
    if infos is None:
        return None
    offsets = []
    for t in infos:
        offsets.append(offset)
        offset += len(t.text)
    return {
        "tokens": [t.text for t in infos],
        "token_logprobs": [t.logprob for t in infos],
        "top_logprobs": [dict(t.top) for t in infos],
        "text_offset": offsets,
    }


class ChunkWriter:
    """The chunks of one streamed response; keeps each choice's text offset for logprobs."""

    def __init__(self, meta: dict, chat: bool, fingerprint: str, logprobs: bool) -> None:
        self.meta, self.chat, self.fingerprint, self.logprobs = meta, chat, fingerprint, logprobs
        self._offsets: dict[int, int] = {}

    def _chunk(self, choices: list[dict]) -> dict:
        return {
            **self.meta,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }

    def role(self, index: int) -> dict:
        return self._chunk(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )

    def delta(self, index: int, text: str, infos: list[TokenInfo]) -> dict:
        infos = infos if self.logprobs else None
        if self.chat:
            return self._chunk(
                [
                    {
                        "index": index,
                        "delta": {"content": text},
                        "logprobs": chat_logprobs(infos),
                        "finish_reason": None,
                    }
                ]
            )
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + sum(len(t.text) for t in infos or ())
        return self._chunk(
            [
                {
                    "index": index,
                    "text": text,
                    "logprobs": completion_logprobs(infos, offset),
                    "finish_reason": None,
                }
            ]
        )

    def finish(self, index: int, finish_reason: str) -> dict:
        key = "delta" if self.chat else "text"
        return self._chunk(
            [
                {
                    "index": index,
                    key: {} if self.chat else "",
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ]
        )

    def usage(self, choices: list[Choice], predicted: bool) -> dict:
        return {**self._chunk([]), "usage": usage(choices, predicted)}


def completion_body(
    meta: dict, chat: bool, choices: list[Choice], fingerprint: str, predicted: bool
) -> dict:
    items = []
    for c in choices:
        if chat:
            items.append(
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.result.text, "refusal": None},
                    "logprobs": chat_logprobs(c.logprobs),
                    "finish_reason": c.result.finish_reason,
                }
            )
        else:
            items.append(
                {
                    "index": c.index,
                    "text": c.result.text,
                    "logprobs": completion_logprobs(c.logprobs),
                    "finish_reason": c.result.finish_reason,
                }
            )
    return {
        **meta,
        "object": "chat.completion" if chat else "text_completion",
        "system_fingerprint": fingerprint,
        "choices": items,
        "usage": usage(choices, predicted),
    }


def usage(choices: list[Choice], predicted: bool) -> dict:
    """OpenAI's token counts over all choices (the prompt counted once), OpenAI's
    ``completion_tokens_details`` for predicted outputs, and ``speculative`` statistics."""
    results = [c.result for c in choices]
    prompt = len(results[0].prompt_ids) if results else 0
    completion = sum(c.tokens for c in choices)
    passes = sum(r.stats.forward_passes for r in results)
    drafted = sum(r.stats.drafted_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    details = None
    if predicted:
        details = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
            "reasoning_tokens": 0,
            "audio_tokens": 0,
        }
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": details,
        "speculative": {
            "forward_passes": passes,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "tokens_per_forward": round(completion / passes, 3) if passes else 0.0,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
            "seconds": round(sum(r.stats.seconds for r in results), 6),
        },
    }
