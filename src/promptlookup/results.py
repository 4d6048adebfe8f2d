"""What a generation gives back: its :class:`GenerationResult`, the :class:`GenerationStream`
of its text deltas, and the :class:`TextAssembler` that turns its tokens into that text as they
are accepted (:meth:`promptlookup.LanguageModel.stream`, ``generate_batch`` and the server)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .loop import DecodingSequence, GenerationStats
from .text import IncrementalDetokenizer, StopStrings


@dataclass
class GenerationResult:
    """What a generation returns. ``token_ids`` are the new tokens (ending with the EOS or the
    token that completed a stop string, if any); ``text`` is their text, cut before a stop
    string; ``finish_reason`` is ``"stop"`` (EOS or stop string) or ``"length"``."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str = "length"
    prompt_ids: list[int] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.as_dict(),
        }


class GenerationStream:
    """Iterate to receive text deltas as tokens are accepted; ``result`` is set at the end.
    ``close()`` (or leaving a ``with`` block) stops the generation within one decoding step."""

    def __init__(self, events: Iterator[str]) -> None:
        self._events = events
        self.result: GenerationResult | None = None
        #: The generation's statistics, filled in as it runs (``stats.logprobs`` included).
        self.stats: GenerationStats | None = None

    def __iter__(self) -> Iterator[str]:
        return self._events

    def close(self) -> None:
        self._events.close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TextAssembler:
    """A generation's text as its tokens arrive: incremental detokenization, stop strings
    and the finish reason (``"stop"`` after an EOS token or a stop string)."""

    def __init__(self, tokenizer, stops: Sequence[str], eos_token_ids: Sequence[int]) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopStrings(stops)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pieces: list[str] = []
        self.finish_reason = "length"

    @property
    def stopped(self) -> bool:
        """Whether a stop string has appeared (the generation should end)."""
        return self.stops.stopped

    def add(self, token: int) -> str:
        """Take one token; the text that may be shown now ("" while undecided)."""
        piece = self.stops.feed(self.detokenizer.add(token))
        if token in self.eos_token_ids or self.stops.stopped:
            self.finish_reason = "stop"
        self.pieces.append(piece)
        return piece

    def add_step(
        self, sequence: DecodingSequence, new_tokens: Sequence[int]
    ) -> Iterator[tuple[int, str]]:
        """Take one step's ``new_tokens`` of ``sequence``: each token with the text it lets
        show, in order, up to a stop string. There the sequence finishes (``"stop"``) and
        forgets the step's later tokens, which never happened (before the pair is yielded)."""
        for position, token in enumerate(new_tokens):
            piece = self.add(token)
            if self.stopped:
                sequence.finish("stop", drop=len(new_tokens) - position - 1)
            yield token, piece
            if self.stopped:
                return

    def flush(self) -> str:
        """The text held back at the end (an incomplete character, a possible stop string)."""
        tail = self.stops.feed(self.detokenizer.flush()) + self.stops.flush()
        self.pieces.append(tail)
        return tail

    def result(self, stats: GenerationStats, prompt_ids: Sequence[int]) -> GenerationResult:
        return GenerationResult(
            "".join(self.pieces), self.detokenizer.ids, stats, self.finish_reason, list(prompt_ids)
        )
