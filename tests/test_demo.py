"""``make demo``'s verdict: identical, or where the outputs part and both tokens' logits there."""

from __future__ import annotations

from types import SimpleNamespace

from promptlookup.demo import compare


def test_outputs_that_part_are_named_by_position_and_logits(tiny_lm):
    plain = SimpleNamespace(token_ids=[3, 4, 5, 6], prompt_ids=[1, 2, 3])
    assert compare(tiny_lm, SimpleNamespace(token_ids=[3, 4, 5, 6]), plain) == "identical"
    verdict = compare(tiny_lm, SimpleNamespace(token_ids=[3, 4, 9, 6]), plain)
    assert verdict.startswith("different from new token 2 on: prompt lookup chose 9 (logit ")
    assert "plain decoding 5 (logit " in verdict and "bug" not in verdict
    assert (
        compare(tiny_lm, SimpleNamespace(token_ids=[3, 4]), plain)
        == "different: one output stops at token 2, the other goes on"
    )
