"""Thinking models' reasoning apart from their answer: the text a model writes between its
family's markers (``<think>`` ... ``</think>``: Qwen3, QwQ, DeepSeek-R1) is answered as
reasoning (chat's ``reasoning_content``, Anthropic's ``thinking`` blocks, a Responses
``reasoning`` item), the rest as the answer; and an earlier turn's reasoning that a client
sends back goes into the prompt where the model wrote it.

*When.* ``--reasoning-format auto`` (the default, as llama-server's) splits the answers of a
model whose chat template mentions a marker (:func:`detect`); ``none`` never does, and a chat
request's ``reasoning_format: "none"`` (llama-server's per-request field) keeps its answer's
text whole in ``content``. A prompt whose text ends in the opening marker (a template that
opens the thinking for the model, as DeepSeek-R1's newer ones do) has its answer begin inside
the reasoning; otherwise reasoning is what an answer *begins* with (whitespace aside) between
the markers, and an answer that begins otherwise is all answer.

*Exact texts.* The reasoning is the text between the markers and the answer the text after
the closing one, nothing trimmed (vLLM's choice; llama-server trims), so that the reasoning
and answer a client sends back are, markers put around them again, the text generated (what
is lost: whitespace before the opening marker). This is presentation only: the tokens
generated, drafted and cached, and the usage counts, are the same with or without it.

*Back into the prompt* (:meth:`ThinkFormat.with_reasoning`): an assistant message's reasoning
goes to a template that reads ``reasoning_content`` itself (Qwen3's) under that key, and to
any other template inside its content, as ``<think>`` reasoning ``</think>`` answer. Where the
template renders it where the model wrote it, the next turn's prompt starts with the tokens
generated (:mod:`promptlookup.rendering`) and the prefix cache holds the answer too. Where
not, the cache holds the prompt up to that answer only: templates that drop earlier turns'
reasoning (Qwen3's, for turns before the last user message; DeepSeek-R1's, for all), a
template that opened the thinking in the prompt with text other than the bare marker (a
newline after it, say), and whitespace the template trims.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The ``--reasoning-format`` values: ``auto`` (split where the template has markers) or
#: ``none`` (all text is the answer).
FORMATS = ("auto", "none")
#: Each thinking family's opening and closing markers, tried in order on the chat template.
MARKERS = (("<think>", "</think>"),)
#: Prompt tokens decoded to see whether the prompt ends in the opening marker.
TAIL_TOKENS = 8


@dataclass(frozen=True)
class ThinkFormat:
    """How a model's chat template marks reasoning."""

    open: str
    close: str
    #: Whether the template renders an assistant message's ``reasoning_content`` itself.
    template_takes_reasoning: bool = False

    def opened_by(self, prompt_tail: str) -> bool:
        """Whether a prompt ending in ``prompt_tail`` leaves the model inside its reasoning."""
        return prompt_tail.rstrip().endswith(self.open)

    def split(self, text: str, inside: bool = False) -> tuple[str | None, str]:
        """A whole answer as ``(reasoning, answer)``; reasoning None where there is none."""
        if not inside:
            stripped = text.lstrip()
            if not stripped.startswith(self.open):
                return None, text
            text = stripped[len(self.open) :]
        reasoning, _, answer = text.partition(self.close)
        return reasoning, answer

    def with_reasoning(self, sent: list[dict], rendered: list[dict]) -> list[dict]:
        """``rendered`` (the chat template's messages made of ``sent``'s, the assistant
        messages in the same order) with each assistant's ``reasoning_content`` of ``sent``
        where the template takes it (see the module doc)."""
        thoughts = [m.get("reasoning_content") for m in sent if m.get("role") == "assistant"]
        if not any(thoughts):
            return rendered
        out, turn = [], 0
        for message in rendered:
            if message.get("role") == "assistant":
                thought = thoughts[turn] if turn < len(thoughts) else None
                turn += 1
                if thought and self.template_takes_reasoning:
                    message = {**message, "reasoning_content": thought}
                elif thought:  # as the model wrote it
                    answer = message.get("content") or ""
                    message = {**message, "content": f"{self.open}{thought}{self.close}{answer}"}
            out.append(message)
        return out


def detect(tokenizer, setting: str = "auto") -> ThinkFormat | None:
    """The markers of ``tokenizer``'s chat template (None: it has none, or ``setting`` is
    ``none``)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: any of them
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    if setting == "none" or not isinstance(template, str):
        return None
    for opening, closing in MARKERS:
        if opening in template or closing in template:
            return ThinkFormat(opening, closing, "reasoning_content" in template)
    return None


class ReasoningSplitter:
    """One answer's text deltas as ``(reasoning, answer)`` pieces, as :meth:`ThinkFormat.split`
    splits the whole text: a marker split across deltas is held back until it is whole (or
    cannot be), and so is leading whitespace until the answer shows how it begins."""

    def __init__(self, form: ThinkFormat, inside: bool = False) -> None:
        self.form = form
        #: "before" (nothing but whitespace yet), "reasoning" or "answer".
        self.state = "reasoning" if inside else "before"
        self.held = ""  # text not yet given out
        self.reasoned = inside  # whether the answer has reasoning

    def feed(self, delta: str) -> tuple[str, str]:
        """The reasoning and answer text that ``delta`` completes (the reasoning first)."""
        text, reasoning, self.held = self.held + delta, "", ""
        if self.state == "before":
            stripped = text.lstrip()
            if stripped.startswith(self.form.open):  # reasoning begins
                self.state, self.reasoned = "reasoning", True
                text = stripped[len(self.form.open) :]
            elif not stripped or self.form.open.startswith(stripped):  # it may yet
                self.held = text
                return "", ""
            else:
                self.state = "answer"
        if self.state == "reasoning":
            before, found, after = text.partition(self.form.close)
            if found:
                reasoning, text, self.state = before, after, "answer"
            else:  # a closing marker's beginning at the end waits for the rest
                keep = _partial_suffix(text, self.form.close)
                reasoning, self.held = text[: len(text) - keep], text[len(text) - keep :]
                return reasoning, ""
        return reasoning, text  # the answer: all of it, as it comes

    def finish(self) -> tuple[str, str]:
        """What is still held back once the answer has ended, as it stands."""
        held, self.held = self.held, ""
        return (held, "") if self.state == "reasoning" else ("", held)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (not all of it)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class Thinking:
    """One request's reasoning: its model's markers, and whether its prompt opened them."""

    def __init__(self, form: ThinkFormat, inside: bool) -> None:
        self.form, self.inside = form, inside

    def split(self, text: str) -> tuple[str | None, str]:
        return self.form.split(text, self.inside)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.form, self.inside)


def apart(thinking: Thinking | None, text: str) -> tuple[str | None, str]:
    """A whole answer's ``(reasoning, answer)``: all answer without ``thinking``."""
    return thinking.split(text) if thinking is not None else (None, text)


def for_request(state, prompt_ids, req=None) -> Thinking | None:
    """A chat request's :class:`Thinking` (None: its answer is all text, where the model has
    no markers, ``--reasoning-format none``, or the request's ``reasoning_format`` is
    ``none``): whether its prompt, ``prompt_ids``, ends inside the reasoning is read off its
    last tokens."""
    form = getattr(state, "reasoning", None)
    if form is None or getattr(req, "reasoning_format", None) == "none":
        return None
    tail = state.lm.tokenizer.decode(list(prompt_ids[-TAIL_TOKENS:]), skip_special_tokens=False)
    return Thinking(form, form.opened_by(tail))
