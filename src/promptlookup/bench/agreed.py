"""Speed on agreed prefixes: every method timed over the very same tokens.

In float32 every greedy method writes plain decoding's tokens, so tokens per second compare
like with like. In bfloat16 they do not: a forward pass over 8 tokens rounds a little
differently from 8 passes over one, a near-tie between two tokens can flip, and from there the
outputs part. One method then writes a long, easily drafted repetition while another stops
after 60 tokens, and its tokens per second say more about *what* it wrote than about how fast.

The *agreed prefix* of a prompt is the longest run of leading new tokens that every method of
the run produced. Each method is timed until it had produced all of it (``token_seconds``,
prefill included), so every method is measured on identical text. Example: plain writes
``[5, 6, 7, 8]`` and a faster method ``[5, 6, 9]``; the agreed prefix is ``[5, 6]``, and each
method's row keeps 2 new tokens and the time at which it had the second one.

Only greedy rows count (sampled outputs differ by design), and a prompt counts only when every
method recorded its token times and the agreed prefix is not empty. A prompt's early tokens
are often harder to draft than its later ones, so where prefixes are short these speed-ups
lean low; ``agreed_share`` says how much of plain's output they cover.
"""

from __future__ import annotations

from collections.abc import Sequence

from .methods import ALL_TASKS, BASELINE


def agreed_length(token_lists: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of ``token_lists``.

    >>> agreed_length([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7]])
    2
    """
    if not token_lists:
        return 0
    length = min(len(tokens) for tokens in token_lists)
    for i in range(length):
        if len({tokens[i] for tokens in token_lists}) > 1:
            return i
    return length


def agreed_records(records: Sequence[dict]) -> list[dict]:
    """The greedy rows cut to their prompt's agreed prefix: ``new_tokens`` is its length,
    ``seconds`` the time until the method had produced it; other counters become None.

    >>> rows = [{"task": "t", "id": 0, "method": "plain", "identical_to_plain": True,
    ...          "token_ids": [5, 6, 7, 8], "token_seconds": [1.0, 2.0, 3.0, 4.0]},
    ...         {"task": "t", "id": 0, "method": "fast", "identical_to_plain": False,
    ...          "token_ids": [5, 6, 9], "token_seconds": [0.5, 0.6, 0.7]}]
    >>> [(r["method"], r["new_tokens"], r["seconds"]) for r in agreed_records(rows)]
    [('plain', 2, 2.0), ('fast', 2, 0.6)]
    """
    by_prompt: dict[tuple, list[dict]] = {}
    for record in records:
        if record.get("identical_to_plain") is not None:
            by_prompt.setdefault((record["task"], record["id"]), []).append(record)
    cut = []
    for rows in by_prompt.values():
        if any(r.get("token_ids") is None or r.get("token_seconds") is None for r in rows):
            continue
        length = agreed_length([r["token_ids"] for r in rows])
        if length == 0:
            continue
        cut += [
            {
                "task": r["task"],
                "id": r["id"],
                "method": r["method"],
                "new_tokens": length,
                "seconds": r["token_seconds"][length - 1],
                "token_seconds": r["token_seconds"][:length],
                "forward_passes": None,
                "drafted_tokens": None,
                "accepted_tokens": None,
                "identical_to_plain": True,
            }
            for r in rows
        ]
    return cut


def agreed_share(records: Sequence[dict], agreed: Sequence[dict], task: str) -> float | None:
    """Agreed tokens over plain's new tokens, on the task's greedy prompts (``"all"``: every
    task). None when plain wrote nothing."""

    def plain_tokens(rows: Sequence[dict]) -> int:
        return sum(
            r["new_tokens"]
            for r in rows
            if r["method"] == BASELINE
            and task in (ALL_TASKS, r["task"])
            and r.get("identical_to_plain") is not None
        )

    total = plain_tokens(records)
    return plain_tokens(agreed) / total if total else None
