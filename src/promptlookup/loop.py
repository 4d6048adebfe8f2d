"""The speculative decoding loop.

Glossary (used everywhere in promptlookup):

- *target*: the model whose output we want, unchanged (a :class:`~promptlookup.backends.base.Target`).
- *drafter*: a cheap guesser of the next tokens; its guess is the *draft*.
- *forward pass*: one call of the target over several new tokens, with its KV cache.
- *accepted* tokens: the leading draft tokens the target would have produced itself.
- *bonus* token: the target's own token right after the accepted ones (every forward pass
  yields one, so a step produces ``accepted + 1`` tokens and never fewer than plain decoding).

Why it is lossless: at every verified position the target's token is chosen exactly as plain
decoding would choose it (argmax, or a sample from the processed distribution); a draft token is
kept only if it *equals* that choice. For sampling with a deterministic drafter this is
speculative sampling with a point-mass draft, and it draws one random number per generated token,
in the same order as plain decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .backends.base import Target
from .calibration import calibrate
from .drafters.base import Draft, Drafter, NoDrafter, bind_generation
from .drafters.prompt_lookup import REFERENCE
from .errors import UnsupportedModelError
from .grammar import GrammarState, forced_count
from .policy import NO_POLICY, NoPolicy, Speculation, SpeculationPolicy
from .sampling import TokenChooser, TokenLogprob, token_logprob


@dataclass
class GenerationStats:
    """Counters of one generation. ``forward_passes`` counts the target passes that produced
    tokens (plain decoding: one per new token); the prompt's prefill is not counted.
    ``token_seconds[i]``: seconds from the start (prefill included) to new token ``i``'s
    acceptance. ``cached_tokens``: prompt tokens whose keys and values came from a prefix
    cache (kept by the batch decoder, :mod:`promptlookup.batching`), not prefilled."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    #: Accepted draft tokens that a grammar forced (:mod:`promptlookup.grammar`).
    forced_tokens: int = 0
    seconds: float = 0.0
    token_seconds: list[float] = field(default_factory=list, repr=False)
    #: With ``speculative_generate(logprobs=N)``: one entry per new token, in order.
    logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)
    #: Per new token: whether it was an accepted draft token from the reference (a predicted
    #: output, :data:`~promptlookup.drafters.prompt_lookup.REFERENCE`).
    from_reference: list[bool] = field(default_factory=list, repr=False)
    cached_tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "forced_tokens": self.forced_tokens,
            "seconds": round(self.seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "tokens_per_forward": round(self.tokens_per_forward, 3),
        }


@dataclass(eq=False)
class DecodingSequence:
    """One sequence being decoded: its inputs (as :func:`speculative_generate` takes them), its
    state, and its step, which the single-stream loop and the batch decoder
    (:mod:`promptlookup.batching`) both run: :meth:`propose` a draft, then, after a forward
    pass over the last token and (part of) it, :meth:`accept` what the target agrees with.

    ``policy`` sizes its drafts (:data:`~promptlookup.policy.NO_POLICY`: verified whole),
    weighing them with the acceptance history of ``tenant``'s requests;
    ``speculation`` holds the sequence's side of it, its own acceptance statistics, and is
    its drafter's ``policy`` (:func:`~promptlookup.drafters.base.bind_generation`).
    ``finish_reason`` is set when it ends: ``"stop"`` (EOS, or a caller's stop string or
    criterion, :meth:`finish`), ``"length"``, ``"cancelled"`` or, in a batch, ``"error"`` (its
    own step raised, :meth:`~promptlookup.batching.BatchSequence.fail`). ``grammar``: the state of
    the grammar the output must match (:mod:`promptlookup.grammar`), which drafts the tokens
    it forces, cuts drafts where it forbids a token and masks every verified position."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    drafter: Drafter = field(default_factory=NoDrafter)
    chooser: TokenChooser = field(default_factory=lambda: TokenChooser(None, do_sample=False))
    eos_token_ids: Sequence[int] = ()
    logprobs: int | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    finish_reason: str | None = None
    policy: SpeculationPolicy | NoPolicy = NO_POLICY
    tenant: str | None = None
    grammar: GrammarState | None = None

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_ids)  # the prompt plus every accepted token
        self.stats.prompt_tokens = len(self.tokens)
        self.speculation = Speculation(
            self.policy, self.chooser.do_sample, len(self.tokens), self.tenant
        )
        bind_generation(self.drafter, policy=self.speculation)
        self.started = time.perf_counter()
        self._eos = frozenset(self.eos_token_ids)
        self._accepted: list[bool] = []  # per new token: whether it was an accepted draft token
        self._forced: list[bool] = []  # per new token: whether it was accepted and forced

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def propose(self) -> Draft:
        """Step 1: the drafter's draft, leaving room for the bonus token so that a step never
        overshoots the token budget. On the first step, whose pass ends the prompt, only the
        tokens a grammar forces (sure to be accepted): the first token comes sooner (after a
        cached prefix that pass is most of the wait)."""
        room = self.max_new_tokens - self.stats.new_tokens - 1
        first = not self.stats.forward_passes
        if self.grammar is not None and room > 0:  # forced tokens, then the drafter's
            return self.grammar.draft(self.drafter, self.tokens, room, forced_only=first)
        if room <= 0 or first:
            return Draft()
        return Draft.of(self.drafter.propose(self.tokens, room)).cut(room)

    def accept(self, draft: Draft, target_logits: torch.Tensor) -> list[int]:
        """Steps 4 and 5 after a forward pass over the last token and ``draft``
        (``target_logits`` (len(draft) + 1, vocab)): the target's own choice at each position,
        the draft tokens kept while they agree, then the bonus token. Each is appended to
        ``tokens`` and counted in ``stats`` (its logprob with ``logprobs=N``, its time since
        the start); an EOS token ends the sequence (``"stop"``), as does the token budget
        (``"length"``). The drafter and the policy are told how the draft fared. Returns the
        new tokens; the caller crops its cache to ``len(tokens) - 1`` (the bonus token is fed
        next step)."""
        stats = self.stats
        stats.forward_passes += 1
        stats.drafted_tokens += len(draft)
        new_tokens: list[int] = []
        probs = draft.draft_probs if draft else None
        referenced = draft.source == REFERENCE
        forced = forced_count(draft)
        for i, token in enumerate(
            verified_tokens(self.chooser, self.tokens, draft, target_logits, probs, self.grammar)
        ):
            if self.logprobs is not None:
                logprob = token_logprob(
                    self.chooser, self.tokens, target_logits[i], token, self.logprobs
                )
                stats.logprobs.append(logprob)
            accepted = i < len(draft) and token == draft[i]
            self.tokens.append(token)
            self._accepted.append(accepted)
            self._forced.append(accepted and i < forced)
            new_tokens.append(token)
            stats.new_tokens += 1
            stats.accepted_tokens += accepted
            stats.forced_tokens += accepted and i < forced
            stats.seconds = time.perf_counter() - self.started
            stats.token_seconds.append(stats.seconds)
            stats.from_reference.append(accepted and referenced)
            if token in self._eos:
                self.finish_reason = "stop"
                break
        if self.finish_reason is None and stats.new_tokens >= self.max_new_tokens:
            self.finish_reason = "length"
        num_accepted = sum(self._accepted[len(self._accepted) - len(new_tokens) :])
        # The drafter drafted after the forced tokens (all of the draft without a grammar).
        self.drafter.update(draft[forced:], max(num_accepted - forced, 0))
        self.speculation.learn(draft, num_accepted)
        return new_tokens

    def forget(self, count: int) -> None:
        """Forget the last ``count`` new tokens, which came after a caller's stop (a stop
        string or a stopping criterion) within their step: they never happened."""
        if count <= 0:
            return
        stats = self.stats
        stats.accepted_tokens -= sum(self._accepted[-count:])
        stats.forced_tokens -= sum(self._forced[-count:])
        stats.new_tokens -= count
        del self.tokens[-count:], self._accepted[-count:], stats.token_seconds[-count:]
        del stats.from_reference[-count:], self._forced[-count:]
        if self.grammar is not None:
            self.grammar.rollback(count)
        del stats.logprobs[max(0, len(stats.logprobs) - count) :]

    def finish(self, reason: str, drop: int = 0) -> None:
        """End the sequence before its next step with ``reason`` (a caller's stop string:
        ``"stop"``), forgetting its last ``drop`` new tokens (:meth:`forget`)."""
        self.forget(drop)
        if self.finish_reason in (None, "length"):
            self.finish_reason = reason


def speculative_generate(
    target: Target,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    drafter: Drafter | None = None,
    chooser: TokenChooser | None = None,
    eos_token_ids: Sequence[int] = (),
    stats: GenerationStats | None = None,
    policy: SpeculationPolicy | NoPolicy = NO_POLICY,
    should_stop: Callable[[], bool] | None = None,
    logprobs: int | None = None,
    tenant: str | None = None,
    grammar: GrammarState | None = None,
) -> Iterator[int]:
    """Yield the target's tokens after ``prompt_ids`` one by one, at most ``max_new_tokens``,
    stopping after an EOS token. Closing the generator early (a stop string) is fine: the
    tokens not yet yielded are then left out of ``stats``.

    ``drafter.propose`` returns a :class:`~promptlookup.drafters.base.Draft` (or a plain list):
    its tokens, and optionally the distributions they were sampled from and the match length
    behind them; that is all the loop reads from a drafter. ``policy`` trims each draft to the
    length worth verifying, from measured forward-pass costs and learned acceptance (the
    default, :data:`~promptlookup.policy.NO_POLICY`, verifies every draft whole); a drafter
    that consults it too (a draft model) is handed the sequence's side of it.

    ``should_stop()`` (optional) is asked before every forward pass, the prefill included; when
    it returns true the generator ends there (a cancelled request). ``logprobs=N`` records each
    yielded token's :class:`~promptlookup.sampling.TokenLogprob` with its ``N`` most likely
    alternatives in ``stats.logprobs``, from the target's row for that position: a drafted
    token gets exactly the value plain decoding computes from the same row. ``tenant``: whose
    acceptance history the policy weighs this request's drafts with (an opaque key; a server
    passes its client's). ``grammar``: the output must match it (see
    :class:`DecodingSequence`).

    This is the reference loop, one sequence over a plain target, each step spelled out; the
    library, the server and the transformers drop-in run the same steps of
    :class:`DecodingSequence` through the batch decoder (:mod:`promptlookup.batching`), which
    also reuses cached prefixes, and the tests hold the two to the same tokens."""
    sequence = DecodingSequence(
        prompt_ids,
        max_new_tokens,
        drafter or NoDrafter(),
        chooser or TokenChooser(None, do_sample=False),
        eos_token_ids,
        logprobs,
        stats if stats is not None else GenerationStats(),
        policy=policy,
        tenant=tenant,
        grammar=grammar,
    )
    tokens, stats = sequence.tokens, sequence.stats  # tokens: the prompt and every accepted one
    if not tokens or max_new_tokens < 1:
        return
    if not target.can_crop and not isinstance(sequence.drafter, NoDrafter):
        raise UnsupportedModelError(
            "this model's KV cache cannot be cropped after a rejected "
            "draft; use drafter='none' (plain decoding)"
        )
    if should_stop is not None and should_stop():
        return
    # Before the steps, prefill: the cache holds every token but the last, which each step
    # feeds first (a target may keep the prompt's last chunk back for the first step's pass).
    target.reset()
    target.prefill(tokens[:-1])
    # Time passes for the policy's cost curve if it has none for this context yet.
    calibrate(target, policy, probe_token=tokens[-1])
    while not sequence.done:
        if should_stop is not None and should_stop():
            break
        # 1-2. Draft, and keep only the part of it worth its verification cost.
        draft = sequence.speculation.shape(sequence.propose())
        # 3. One target forward pass over the last token and the draft (the target's one-off
        #    set-up for a new pass size comes first, so the policy times the pass alone).
        target.prepare([len(draft) + 1])
        forward_start = time.perf_counter()
        target_logits = target.forward([tokens[-1], *draft])  # (len(draft) + 1, vocab)
        if stats.forward_passes:  # the first also ends the prompt
            seconds = time.perf_counter() - forward_start
            policy.record_forward(len(draft) + 1, seconds, sequence.speculation.context)
        # 4-5. Verify and learn (DecodingSequence.accept); crop the cache back to the accepted
        #      tokens (the bonus token is fed next step).
        new_tokens = sequence.accept(draft, target_logits)
        target.crop(len(tokens) - 1)
        for position, token in enumerate(new_tokens):
            try:
                yield token
            except GeneratorExit:  # the caller stopped here: the later tokens never happened
                sequence.forget(len(new_tokens) - position - 1)
                raise
    stats.seconds = time.perf_counter() - sequence.started
    target.reset()  # free the KV cache (each generation starts from an empty one)


def verified_tokens(
    chooser: TokenChooser,
    tokens: list[int],
    draft: Sequence[int],
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    grammar: GrammarState | None = None,
) -> Iterator[int]:
    """The target's tokens for one forward pass: each accepted draft token, then the bonus token.

    ``target_logits`` (len(draft) + 1, vocab): row i scores the token after ``draft[:i]``.
    ``tokens`` must be extended by the caller with each yielded token before the next is chosen
    (the repetition penalty sees them). ``draft_probs`` (len(draft), vocab), given by drafters
    that sample their drafts, switches sampling to the speculative-sampling rejection rule.
    With a ``grammar``, each row is masked in place to the tokens it allows before the choice
    (so logprobs read the masked row), which then advances it.
    """
    if draft_probs is not None and chooser.do_sample:
        from .rejection import verify_sampled_draft

        yield from verify_sampled_draft(chooser, tokens, draft, draft_probs, target_logits)
        return
    if chooser.plain_argmax and grammar is None:
        target_choice = target_logits.argmax(dim=-1).tolist()  # (len(draft) + 1,)
        for i, token in enumerate(target_choice):
            yield token
            if i == len(draft) or token != draft[i]:
                return
        return
    for i in range(len(draft) + 1):
        input_ids = torch.tensor([tokens], dtype=torch.long, device=target_logits.device)
        if grammar is not None:  # the target's distribution, masked to what the grammar allows
            grammar.mask_(target_logits[i])
        token = chooser.choose(input_ids, target_logits[i])
        if grammar is not None:
            grammar.advance(token)
        yield token
        if i == len(draft) or token != draft[i]:
            return
