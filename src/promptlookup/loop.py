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
from .drafters.base import Draft, Drafter, NoDrafter
from .errors import UnsupportedModelError
from .policy import SpeculationPolicy
from .sampling import TokenChooser, TokenLogprob, token_logprob


@dataclass
class GenerationStats:
    """Counters of one generation. ``forward_passes`` counts the target passes that produced
    tokens (plain decoding: one per new token); the prompt's prefill is not counted.
    ``token_seconds[i]``: seconds from the start (prefill included) to new token ``i``'s yield."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    seconds: float = 0.0
    token_seconds: list[float] = field(default_factory=list, repr=False)
    #: With ``speculative_generate(logprobs=N)``: one entry per new token, in order.
    logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)

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
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "seconds": round(self.seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "tokens_per_forward": round(self.tokens_per_forward, 3),
        }


def speculative_generate(
    target: Target,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    drafter: Drafter | None = None,
    chooser: TokenChooser | None = None,
    eos_token_ids: Sequence[int] = (),
    stats: GenerationStats | None = None,
    policy: SpeculationPolicy | None = None,
    should_stop: Callable[[], bool] | None = None,
    logprobs: int | None = None,
) -> Iterator[int]:
    """Yield the target's tokens after ``prompt_ids`` one by one, at most ``max_new_tokens``,
    stopping after an EOS token. Closing the generator early (a stop string) is fine.

    ``drafter.propose`` returns a :class:`~promptlookup.drafters.base.Draft` (or a plain list):
    its tokens, and optionally the distributions they were sampled from and the match length
    behind them; that is all the loop reads from a drafter. ``policy`` (optional) trims each
    draft to the length worth verifying, from measured forward-pass costs and learned
    acceptance; without it every draft is verified whole. A drafter that needs the policy too
    (a draft model) is built with it (:func:`promptlookup.make_drafter`).

    ``should_stop()`` (optional) is asked before every forward pass, the prefill included; when
    it returns true the generator ends there (a cancelled request). ``logprobs=N`` records each
    yielded token's :class:`~promptlookup.sampling.TokenLogprob` with its ``N`` most likely
    alternatives in ``stats.logprobs``, from the target's row for that position: a drafted
    token gets exactly the value plain decoding computes from the same row."""
    drafter = drafter or NoDrafter()
    chooser = chooser or TokenChooser(None, do_sample=False)
    stats = stats if stats is not None else GenerationStats()
    eos = frozenset(eos_token_ids)
    tokens = list(prompt_ids)  # the prompt plus every accepted token; grows in place
    stats.prompt_tokens = len(tokens)
    if not tokens or max_new_tokens < 1:
        return
    if not target.can_crop and not isinstance(drafter, NoDrafter):
        raise UnsupportedModelError(
            "this model's KV cache cannot be cropped after a rejected "
            "draft; use drafter='none' (plain decoding)"
        )
    start = time.perf_counter()
    if should_stop is not None and should_stop():
        return
    # 1. Prefill: the cache holds every token but the last, which each step feeds first (a
    #    target may keep the prompt's last chunk back and run it in the first step's pass).
    target.reset()
    target.prefill(tokens[:-1])
    if policy is not None:
        policy.start(target, probe_token=tokens[-1], sampling=chooser.do_sample)
    while stats.new_tokens < max_new_tokens:
        if should_stop is not None and should_stop():
            break
        # 2. Draft: leave room for the bonus token so a step never overshoots the budget.
        room = max_new_tokens - stats.new_tokens - 1
        draft = Draft.of(drafter.propose(tokens, room)).cut(room) if room > 0 else Draft()
        if policy is not None:  # keep only the part of the draft worth its verification cost
            draft = draft.cut(policy.draft_length(draft, draft.match_length))
        stats.drafted_tokens += len(draft)
        # 3. One target forward pass over the last token and the draft (the target's one-off
        #    set-up for a new pass size comes first, so the policy times the pass alone).
        target.prepare([len(draft) + 1])
        forward_start = time.perf_counter()
        target_logits = target.forward([tokens[-1], *draft])  # (len(draft) + 1, vocab)
        stats.forward_passes += 1
        if policy is not None and stats.forward_passes > 1:  # the first also ends the prompt
            policy.record_forward(len(draft) + 1, time.perf_counter() - forward_start)
        # 4. Verify: the target's own choice at each position; keep drafts while they agree.
        accepted_before = stats.accepted_tokens
        for token in kept_tokens(chooser, tokens, draft, target_logits, stats, start, logprobs):
            yield token
            if token in eos:
                return
        num_accepted = stats.accepted_tokens - accepted_before
        # 5. Crop the cache back to the accepted tokens (the bonus token is fed next step),
        #    and tell the drafter and the policy how the draft fared.
        target.crop(len(tokens) - 1)
        drafter.update(draft, num_accepted)
        if policy is not None and draft:
            source = {} if draft.source is None else {"source": draft.source}
            policy.record_acceptance(draft.match_length, len(draft), num_accepted, **source)
    stats.seconds = time.perf_counter() - start


def kept_tokens(
    chooser: TokenChooser,
    tokens: list[int],
    draft: Draft,
    target_logits: torch.Tensor,
    stats: GenerationStats,
    start: float,
    logprobs: int | None = None,
) -> Iterator[int]:
    """Step 4 for one sequence: each token it keeps from a forward pass (accepted draft tokens,
    then the bonus token), appended to ``tokens`` and counted in ``stats`` (its logprob with
    ``logprobs=N``, its time since ``start``) before it is yielded."""
    for i, token in enumerate(
        verified_tokens(chooser, tokens, draft, target_logits, draft.draft_probs if draft else None)
    ):
        if logprobs is not None:
            stats.logprobs.append(token_logprob(chooser, tokens, target_logits[i], token, logprobs))
        tokens.append(token)
        stats.new_tokens += 1
        stats.accepted_tokens += i < len(draft) and token == draft[i]
        stats.seconds = time.perf_counter() - start
        stats.token_seconds.append(stats.seconds)
        yield token


def verified_tokens(
    chooser: TokenChooser,
    tokens: list[int],
    draft: Sequence[int],
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> Iterator[int]:
    """The target's tokens for one forward pass: each accepted draft token, then the bonus token.

    ``target_logits`` (len(draft) + 1, vocab): row i scores the token after ``draft[:i]``.
    ``tokens`` must be extended by the caller with each yielded token before the next is chosen
    (the repetition penalty sees them). ``draft_probs`` (len(draft), vocab), given by drafters
    that sample their drafts, switches sampling to the speculative-sampling rejection rule.
    """
    if draft_probs is not None and chooser.do_sample:
        from .rejection import verify_sampled_draft

        yield from verify_sampled_draft(chooser, tokens, draft, draft_probs, target_logits)
        return
    if chooser.plain_argmax:
        target_choice = target_logits.argmax(dim=-1).tolist()  # (len(draft) + 1,)
        for i, token in enumerate(target_choice):
            yield token
            if i == len(draft) or token != draft[i]:
                return
        return
    for i in range(len(draft) + 1):
        input_ids = torch.tensor([tokens], dtype=torch.long, device=target_logits.device)
        token = chooser.choose(input_ids, target_logits[i])
        yield token
        if i == len(draft) or token != draft[i]:
            return
