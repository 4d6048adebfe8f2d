"""OpenAI's response bodies, built from the models of :mod:`.bodies`: completions, streaming
chunks (:class:`ChunkEvents`, the stream's hooks of :class:`.streams.APIEvents`), usage,
logprobs.

Logprobs follow OpenAI's two shapes: chat's ``{"content": [{"token", "logprob", "bytes",
"top_logprobs"}], "refusal"}`` and the legacy completions' ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` (``text_offset``: character offsets in the completion text,
counted from its start). There is one entry per token the answer reports
(``usage.completion_tokens`` of them): every generated token, the EOS token included, except
those that only spell a stop string the text was cut at (see :mod:`.shown`).
"""

from __future__ import annotations

from .. import bodies as B
from ..reading import Answer, read_choice
from ..reasoning import Thinking
from ..request_base import APIError
from ..streams import KEEP_ALIVE, APIEvents, sse, sse_error
from ..tools import ToolPlan
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


class ChunkEvents(APIEvents):
    """The chunks of one streamed response (:class:`.streams.APIEvents`): chat's role first,
    each choice's text as content and tool call deltas, its logprobs (keeping each choice's
    text offset), its finish, the usage last (with ``include_usage``), then ``[DONE]``."""

    last = "data: [DONE]\n\n"

    def __init__(
        self,
        meta: dict,
        chat: bool,
        fingerprint: str,
        logprobs: bool,
        plan: ToolPlan | None = None,
        n: int = 1,
        *,
        include_usage: bool = False,
        prediction_tokens: int | None = None,
        thinking: Thinking | None = None,
    ) -> None:
        """``include_usage``: a last chunk with the usage (``stream_options``);
        ``prediction_tokens``: the prediction's, for ``usage.completion_tokens_details``;
        ``thinking``: the reasoning apart, as ``reasoning_content`` deltas."""
        super().__init__(plan, n, thinking)
        self.meta, self.chat, self.fingerprint, self.logprobs = meta, chat, fingerprint, logprobs
        self.n, self.include_usage, self.prediction_tokens = n, include_usage, prediction_tokens
        self._offsets: dict[int, int] = {}
        self._calls = [-1] * n  # per choice, the index of its last call begun

    def _chunk(self, choices: list, **usage) -> str:
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
        return sse(B.dump(chunk))

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

    def keep_alive(self) -> str:
        """What an idle stream sends (:func:`.streams.event_stream`): for chat, a chunk whose
        delta is empty content, since agents' idle timers count chunks, not SSE comments
        (Qwen Code's aborted a 240 s prefill that comments kept alive); an SSE comment for
        completions."""
        return self._chunk([self._choice(0, "")]) if self.chat else KEEP_ALIVE

    def start(self) -> str:
        first = B.ChatDelta(role="assistant", content="")
        roles = [self._chunk([self._choice(i, "", delta=first)]) for i in range(self.n)]
        return "".join(roles) if self.chat else ""

    def delta(self, index: int, text: str | None, infos: list[TokenInfo] | None) -> str:
        """The choice's reasoning, content, then its tool call deltas (one chunk each, the
        logprobs with the last; a delta of logprobs only is a chunk of its own)."""
        thought, content, calls = None, "", []  # thought: None where no reasoning piece came
        for kind, *value in self.pieces(index, text):
            if kind == "reasoning":
                thought = (thought or "") + value[0]
            elif kind == "text":
                content += value[0]
            elif kind == "call":  # a new call: its id and name first
                self._calls[index] += 1
                function = {"name": value[1], "arguments": ""}
                calls.append({"index": self._calls[index], "id": value[0], "type": "function"})
                calls[-1]["function"] = function
            elif kind == "arguments":  # the arguments of the last call begun
                if not calls:
                    calls.append({"index": self._calls[index], "function": {"arguments": ""}})
                calls[-1]["function"]["arguments"] += value[0]
            else:  # a new kind of piece (.streams.APIEvents.pieces) needs its chunk here
                raise NotImplementedError(f"OpenAI's chunks do not say {kind!r} pieces")
        shown = infos if self.logprobs else None
        events = ""
        if thought is not None:  # the logprobs with it where nothing follows
            delta = B.ChatDelta(reasoning_content=thought)
            last = not (content or calls)
            events += self._chunk([self._choice(index, "", shown if last else None, delta=delta)])
            infos = None if last else infos
        events += self._chunk([self._choice(index, content)]) if calls and content else ""
        if calls:
            delta = B.ChatDelta(tool_calls=[B.ToolCallDelta(**call) for call in calls])
            events += self._chunk([self._choice(index, "", shown, delta=delta)])
        elif content or infos:
            events += self._chunk([self._choice(index, content, shown)])
        return events

    def finish(self, index: int, answer: Answer) -> str:
        delta = B.ChatDelta()
        return self._chunk([self._choice(index, "", None, answer.finish_reason, delta=delta)])

    def end(self, choices: list[Choice]) -> str:
        if not self.include_usage:
            return ""
        return self._chunk([], usage=usage(choices, self.prediction_tokens))

    def error(self, error: APIError) -> str:
        return sse_error(error)


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
    calls in the plan's format (:func:`.reading.read_choice`), after its reasoning, with
    ``thinking``, as ``reasoning_content`` (:mod:`..reasoning`)."""
    common = {**meta, "system_fingerprint": fingerprint, "usage": usage(choices, prediction_tokens)}
    answers = [read_choice(c, tools, thinking) for c in choices]
    if chat:
        body = B.ChatCompletion(
            **common,
            object="chat.completion",
            choices=[_chat_choice(c, a) for c, a in zip(choices, answers, strict=True)],
        )
    else:
        body = B.Completion(
            **common,
            object="text_completion",
            choices=[
                B.CompletionChoice(
                    index=c.index,
                    text=a.content,
                    logprobs=completion_logprobs(c.logprobs),
                    finish_reason=a.finish_reason,
                )
                for c, a in zip(choices, answers, strict=True)
            ],
        )
    return B.dump(body)


def _chat_choice(choice: Choice, answer: Answer) -> B.ChatChoice:
    message = B.AssistantMessage(role="assistant", content=answer.content, refusal=None)
    if answer.reasoning is not None:  # a thinking model's, apart (..reasoning)
        message.reasoning_content = answer.reasoning
    if answer.calls:
        message.tool_calls = [B.ToolCall(**call) for call in answer.calls]
    return B.ChatChoice(
        index=choice.index,
        message=message,
        logprobs=chat_logprobs(choice.logprobs),
        finish_reason=answer.finish_reason,
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
