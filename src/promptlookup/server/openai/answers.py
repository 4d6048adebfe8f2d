"""OpenAI's response bodies, built from the models of :mod:`.bodies`: completions, streaming
chunks, usage, logprobs, server-sent events.

Logprobs follow OpenAI's two shapes: chat's ``{"content": [{"token", "logprob", "bytes",
"top_logprobs"}], "refusal"}`` and the legacy completions' ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` (``text_offset``: character offsets in the completion text,
counted from its start). There is one entry per token the answer reports
(``usage.completion_tokens`` of them): every generated token, the EOS token included, except
those that only spell a stop string the text was cut at (see :mod:`.shown`).
"""

from __future__ import annotations

from .. import bodies as B
from ..reasoning import Thinking, apart
from ..tools import ToolPlan, read_answer
from ..worker import Choice, TokenInfo


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "surrogatepass"))


def chat_logprobs(infos: list[TokenInfo] | None) -> B.ChatLogprobs | None:
    if infos is None:
        return None
    return B.ChatLogprobs(
        content=[
            B.TokenLogprobEntry(
                token=t.text,
                logprob=t.logprob,
                bytes=_bytes(t.text),
                top_logprobs=[
                    B.TopLogprob(token=s, logprob=lp, bytes=_bytes(s)) for s, lp in t.top
                ],
            )
            for t in infos
        ],
        refusal=None,
    )


def completion_logprobs(
    infos: list[TokenInfo] | None, offset: int = 0
) -> B.CompletionLogprobs | None:
    if infos is None:
        return None
    offsets = []
    for t in infos:
        offsets.append(offset)
        offset += len(t.text)
    return B.CompletionLogprobs(
        tokens=[t.text for t in infos],
        token_logprobs=[t.logprob for t in infos],
        top_logprobs=[dict(t.top) for t in infos],
        text_offset=offsets,
    )


class ChunkWriter:
    """The chunks of one streamed response; keeps each choice's text offset for logprobs."""

    def __init__(self, meta: dict, chat: bool, fingerprint: str, logprobs: bool) -> None:
        self.meta, self.chat, self.fingerprint, self.logprobs = meta, chat, fingerprint, logprobs
        self._offsets: dict[int, int] = {}

    def _chunk(self, choices: list, **usage) -> dict:
        if self.chat:
            chunk = B.ChatCompletionChunk(
                **self.meta,
                object="chat.completion.chunk",
                system_fingerprint=self.fingerprint,
                choices=choices,
                **usage,
            )
        else:
            chunk = B.CompletionChunk(
                **self.meta,
                object="text_completion",
                system_fingerprint=self.fingerprint,
                choices=choices,
                **usage,
            )
        return B.dump(chunk)

    def _choice(self, index: int, text: str, infos=None, finish_reason=None, delta=None):
        """One choice of a chunk: ``text`` (chat: the delta's content, unless ``delta`` is
        given), the logprobs of ``infos``, and the finish reason at the end."""
        if self.chat:
            return B.ChatChunkChoice(
                index=index,
                delta=delta if delta is not None else B.ChatDelta(content=text),
                logprobs=chat_logprobs(infos),
                finish_reason=finish_reason,
            )
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + sum(len(t.text) for t in infos or ())
        return B.CompletionChunkChoice(
            index=index,
            text=text,
            logprobs=completion_logprobs(infos, offset),
            finish_reason=finish_reason,
        )

    def role(self, index: int) -> dict:
        first = B.ChatDelta(role="assistant", content="")
        return self._chunk([self._choice(index, "", delta=first)])

    def delta(self, index: int, text: str, infos: list[TokenInfo]) -> dict:
        return self._chunk([self._choice(index, text, infos if self.logprobs else None)])

    def tool_calls(self, index: int, calls: list[dict], infos=None) -> dict:
        """Tool call deltas (:class:`.tools.ToolStream`'s) of one choice."""
        delta = B.ChatDelta(tool_calls=[B.ToolCallDelta(**call) for call in calls])
        infos = infos if self.logprobs else None
        return self._chunk([self._choice(index, "", infos, delta=delta)])

    def reasoning(self, index: int, text: str, infos=None) -> dict:
        """A reasoning delta of one choice (:mod:`..reasoning`)."""
        delta = B.ChatDelta(reasoning_content=text)
        infos = infos if self.logprobs else None
        return self._chunk([self._choice(index, "", infos, delta=delta)])

    def finish(self, index: int, finish_reason: str) -> dict:
        return self._chunk([self._choice(index, "", None, finish_reason, delta=B.ChatDelta())])

    def usage(self, choices: list[Choice], prediction_tokens: int | None) -> dict:
        return self._chunk([], usage=usage(choices, prediction_tokens))


def completion_body(
    meta: dict,
    chat: bool,
    choices: list[Choice],
    fingerprint: str,
    prediction_tokens: int | None,
    tools: ToolPlan | None = None,
    thinking: Thinking | None = None,
) -> dict:
    """The whole answer; with ``tools``, each choice's text read back into content or tool
    calls in the plan's format (:func:`.tools.parse`), after its reasoning, with
    ``thinking``, as ``reasoning_content`` (:mod:`..reasoning`)."""
    common = {**meta, "system_fingerprint": fingerprint, "usage": usage(choices, prediction_tokens)}
    if chat:
        body = B.ChatCompletion(
            **common,
            object="chat.completion",
            choices=[_chat_choice(c, tools, thinking) for c in choices],
        )
    else:
        body = B.Completion(
            **common,
            object="text_completion",
            choices=[
                B.CompletionChoice(
                    index=c.index,
                    text=c.result.text,
                    logprobs=completion_logprobs(c.logprobs),
                    finish_reason=c.result.finish_reason,
                )
                for c in choices
            ],
        )
    return B.dump(body)


def _chat_choice(choice: Choice, tools: ToolPlan | None, thinking=None) -> B.ChatChoice:
    result, calls = choice.result, None
    finish_reason = result.finish_reason
    reasoning, text = apart(thinking, result.text)
    content, found = read_answer(text, tools)
    if found:
        calls, finish_reason = [B.ToolCall(**call) for call in found], "tool_calls"
    shown = {} if reasoning is None else {"reasoning_content": reasoning}
    message = B.AssistantMessage(role="assistant", content=content, refusal=None, **shown)
    if calls:
        message.tool_calls = calls
    return B.ChatChoice(
        index=choice.index,
        message=message,
        logprobs=chat_logprobs(choice.logprobs),
        finish_reason=finish_reason,
    )


def usage(choices: list[Choice], prediction_tokens: int | None) -> B.Usage:
    """OpenAI's token counts over all choices (the prompt counted once, its tokens found in
    the prefix cache as ``prompt_tokens_details.cached_tokens``), OpenAI's
    ``completion_tokens_details`` for a predicted output of ``prediction_tokens`` tokens (None:
    no prediction), and ``speculative`` statistics.

    As OpenAI counts them: ``accepted_prediction_tokens``, the reported completion tokens that
    were accepted draft tokens from the prediction (so never more than
    ``completion_tokens``; drafts from the prompt or the output so far do not count);
    ``rejected_prediction_tokens``, the prediction's tokens that did not so appear
    (``prediction_tokens`` less the accepted ones, per choice)."""
    results = [c.result for c in choices]
    prompt = len(results[0].prompt_ids) if results else 0
    completion = sum(c.tokens for c in choices)
    passes = sum(r.stats.forward_passes for r in results)
    drafted = sum(r.stats.drafted_tokens for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    details = None
    if prediction_tokens is not None:
        from_prediction = [sum(c.result.stats.from_reference[: c.tokens]) for c in choices]
        details = B.CompletionTokensDetails(
            accepted_prediction_tokens=sum(from_prediction),
            rejected_prediction_tokens=sum(max(0, prediction_tokens - n) for n in from_prediction),
            reasoning_tokens=0,
            audio_tokens=0,
        )
    return B.Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=B.PromptTokensDetails(
            cached_tokens=results[0].stats.cached_tokens if results else 0
        ),
        completion_tokens_details=details,
        speculative=B.Speculative(
            forward_passes=passes,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            tokens_per_forward=round(completion / passes, 3) if passes else 0.0,
            acceptance_rate=round(accepted / drafted, 3) if drafted else 0.0,
            seconds=round(sum(r.stats.seconds for r in results), 6),
        ),
    )
