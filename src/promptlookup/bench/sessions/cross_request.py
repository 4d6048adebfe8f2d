"""Running the session workload (:mod:`~promptlookup.bench.sessions.workload`) and tallying it.

Modes: ``off`` (prompt lookup, no index), ``per-tenant`` (one index per session, as the server
keeps one per tenant, each session a client) and ``global`` (one index for all sessions).
Sessions run one after another (concurrency 1), or ``concurrency`` at a time with
:meth:`~promptlookup.LanguageModel.generate_batch` (their n-th requests together). Modes are
interleaved request by request in a rotating order, so a slow spell of a shared machine hits
all alike. Every mode's output must equal the ``off`` mode's, token for token (the index only
drafts); :func:`run_sessions` checks it.

Servers (``servers``: :class:`~promptlookup.bench.servers.ServerMethod`, e.g. ``promptlookup
serve --cross-request global``, ``llama-server --spec-type ngram-mod`` with its n-gram pool
shared across slots, vLLM with ``suffix``) are more modes in the same rotation: the same
messages through their OpenAI API, greedy, the group's requests sent at once (each session a
client), timed from sending to the end of the stream. Their forward passes are unknown; their
text is compared with the ``off`` mode's (a server that runs the same model with other
kernels or templates may differ, which is reported, not an error).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...drafters import CrossRequestIndex
from ...drafters.cross_request import INDEX_TOKENS
from ...drafters.shared_lookup import SHARING
from ...loop import GenerationStats
from .workload import KINDS, Session

MODES = SHARING


@dataclass
class Tally(GenerationStats):
    """What one mode did over some requests: their :class:`~promptlookup.GenerationStats`
    added up (``seconds``: as the client waited), with the request count and the decoding
    after each request's first token (its prompt's prefill and first pass left out)."""

    requests: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    def add(self, stats, seconds: float) -> None:
        """Add one request's counters (a GenerationStats, or a server's, which has no
        prompt or logprobs) and the seconds its client waited."""
        self.requests += 1
        self.new_tokens += stats.new_tokens
        self.forward_passes += stats.forward_passes
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        self.seconds += seconds
        if stats.token_seconds:
            self.decode_tokens += stats.new_tokens - 1
            self.decode_seconds += stats.token_seconds[-1] - stats.token_seconds[0]

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def as_dict(self) -> dict:
        return {
            **super().as_dict(),
            "requests": self.requests,
            "decode_tokens": self.decode_tokens,
            "decode_seconds": round(self.decode_seconds, 6),
        }


@dataclass
class SessionRun:
    """A run's tallies by ``(kind, mode)`` (kind ``"all"``: every session), whether every
    output equalled the ``off`` mode's, and the indexes' sizes at the end."""

    tallies: dict[tuple[str, str], Tally]
    identical: bool
    mismatches: list[str]
    index_tokens: dict[str, int]
    #: One record per session, step and mode: its counts, seconds and (index off) text.
    records: list[dict] = field(default_factory=list)
    #: Per server mode: how many of its answers had the ``off`` mode's text.
    same_text: dict[str, int] = field(default_factory=dict)


def run_sessions(
    lm,
    sessions: Sequence[Session],
    *,
    modes: Sequence[str] = MODES,
    max_new_tokens: int = 160,
    requests: int = 6,
    concurrency: int = 1,
    max_tokens: int = INDEX_TOKENS,
    servers: Sequence = (),
    log=print,
) -> SessionRun:
    """Run every session under every mode and server (see the module doc) and tally tokens,
    passes and generation time (prompt prefill included, as a client waits for it)."""
    modes = ["off", *[mode for mode in modes if mode != "off"]]
    by_name = {server.name: server for server in servers}
    local = list(modes)
    modes = [*modes, *by_name]
    same_text = dict.fromkeys(by_name, 0)
    tallies: dict[tuple[str, str], Tally] = {}
    per_tenant = {session.name: CrossRequestIndex(max_tokens) for session in sessions}
    shared = CrossRequestIndex(max_tokens)
    mismatches: list[str] = []
    records: list[dict] = []

    def index_of(mode: str, session: Session) -> CrossRequestIndex | None:
        return {"off": None, "per-tenant": per_tenant[session.name], "global": shared}[mode]

    turn = 0
    groups = [sessions[i : i + concurrency] for i in range(0, len(sessions), concurrency)]
    # A warm-up, not recorded: the first passes of a batch size learn its cost curve.
    _generate(lm, [session.messages(0) for session in groups[0]], [None] * len(groups[0]), 8)
    for group in groups:
        for step in range(requests):
            prompts = [session.messages(step) for session in group]
            outputs, spent = {}, {}
            for mode in modes[turn % len(modes) :] + modes[: turn % len(modes)]:
                start = time.perf_counter()
                if mode in by_name:
                    results = _ask(by_name[mode], prompts, max_new_tokens)
                else:
                    indexes = [index_of(mode, session) for session in group]
                    results = _generate(lm, prompts, indexes, max_new_tokens)
                seconds = (time.perf_counter() - start) / len(results)  # concurrency 1: all
                outputs[mode], spent[mode] = results, seconds * len(results)
                for session, result in zip(group, results):
                    for kind in (session.kind, "all"):
                        tallies.setdefault((kind, mode), Tally()).add(result.stats, seconds)
            turn += 1
            for position, session in enumerate(group):
                expected = outputs["off"][position]
                for mode in local:
                    if outputs[mode][position].token_ids != expected.token_ids:
                        mismatches.append(f"{session.name} step {step} mode {mode}")
                for name in by_name:
                    same_text[name] += outputs[name][position].text.strip() == expected.text.strip()
                session.answers.append(outputs["off"][position].text)
                for mode in modes:
                    stats = outputs[mode][position].stats
                    records.append(
                        {
                            "session": session.name,
                            "step": step,
                            "mode": mode,
                            "new_tokens": stats.new_tokens,
                            "forward_passes": stats.forward_passes,
                            "seconds": round(spent[mode] / len(group), 3),
                            "text": outputs[mode][position].text
                            if mode == "off" or mode in by_name
                            else None,
                        }
                    )
            log(
                f"{', '.join(s.name for s in group)} step {step + 1}/{requests}: "
                + ", ".join(
                    f"{mode} {sum(r.stats.new_tokens for r in outputs[mode])} tokens in "
                    f"{sum(r.stats.forward_passes for r in outputs[mode])} passes, "
                    f"{spent[mode]:.2f} s"
                    for mode in modes
                )
            )
    sizes = {"global": len(shared), "per-tenant": sum(map(len, per_tenant.values()))}
    return SessionRun(tallies, not mismatches, mismatches, sizes, records, same_text)


@dataclass
class _Output:
    token_ids: list[int]
    text: str
    stats: object


def _generate(lm, prompts, indexes, max_new_tokens) -> list[_Output]:
    """One request alone (``lm.generate``), or several in shared forward passes, each with its
    own index (``generate_batch`` takes one set of options for all its prompts)."""
    if len(prompts) == 1:
        result = lm.generate(prompts[0], max_new_tokens=max_new_tokens, cross_request=indexes[0])
        return [_Output(result.token_ids, result.text, result.stats)]
    from ...batching import BatchDecoder

    decoder = BatchDecoder(lm.target, lm.policy, max_batch=len(prompts))
    sequences = []
    for prompt, index in zip(prompts, indexes):
        sequence, _ = lm.batch_sequence(prompt, max_new_tokens=max_new_tokens, cross_request=index)
        sequences.append(decoder.add(sequence))
    for _ in decoder.run():
        pass
    outputs = []
    for sequence in sequences:
        new = list(sequence.tokens[len(sequence.prompt_ids) :])
        outputs.append(
            _Output(new, lm.tokenizer.decode(new, skip_special_tokens=True), sequence.stats)
        )
    return outputs


def _ask(server, prompts, max_new_tokens) -> list[_Output]:
    """The prompts sent to ``server`` at once (one client each), greedy."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from ..methods import Settings

    settings = Settings(max_new_tokens=max_new_tokens)
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: server.run_chat(p, settings), prompts))
    outputs = []
    for answer in answers:
        stats = SimpleNamespace(
            new_tokens=answer.new_tokens,
            forward_passes=0,  # unknown
            drafted_tokens=0,
            accepted_tokens=0,
            token_seconds=answer.token_seconds,
        )
        outputs.append(_Output(answer.token_ids, answer.text, stats))
    return outputs


def report(run: SessionRun, modes: Sequence[str] = MODES) -> str:
    """A markdown table: per kind and mode, tokens per forward pass, tokens/s (whole requests,
    prefill included; and decode only, after each first token) and the speed-ups over
    ``off``."""
    modes = ["off", *[mode for mode in modes if mode != "off"], *run.same_text]
    lines = [
        "| kind | mode | requests | new tokens | passes | tokens/pass | tokens/s | x off "
        "| decode tokens/s | x off |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kinds = [kind for kind in (*KINDS, "all") if (kind, "off") in run.tallies]
    for kind in kinds:
        base = run.tallies[(kind, "off")]
        for mode in modes:
            tally = run.tallies[(kind, mode)]
            passes = "-" if mode in run.same_text else str(tally.forward_passes)
            per_pass = "-" if mode in run.same_text else f"{tally.tokens_per_forward:.2f}"
            lines.append(
                f"| {kind} | {mode} | {tally.requests} | {tally.new_tokens} | "
                f"{passes} | {per_pass} | "
                f"{tally.tokens_per_second:.1f} | "
                f"{_ratio(tally.tokens_per_second, base.tokens_per_second)} | "
                f"{tally.decode_tokens_per_second:.1f} | "
                f"{_ratio(tally.decode_tokens_per_second, base.decode_tokens_per_second)} |"
            )
    verdict = "identical" if run.identical else f"DIFFERENT: {', '.join(run.mismatches)}"
    lines.append(f"\nOutputs with the index against without: {verdict}.")
    lines.append(f"Index tokens held at the end: {run.index_tokens}.")
    for name, same in run.same_text.items():
        total = run.tallies[("all", name)].requests
        lines.append(f"{name}: {same} of {total} answers the same text as the index-off output.")
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"
