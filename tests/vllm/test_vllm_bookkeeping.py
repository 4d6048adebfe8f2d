"""The vLLM proposer's bookkeeping without vLLM: a fake input batch (rows of token ids, the
counts vLLM passes) whose requests join, leave, move and come back."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from promptlookup.vllm import PromptLookupProposer

MAX_LEN = 256


def config(num_tokens: int = 8):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=num_tokens),
        model_config=SimpleNamespace(
            max_model_len=MAX_LEN, hf_text_config=SimpleNamespace(eos_token_id=0)
        ),
    )


class FakeBatch:
    """vLLM's persistent batch as the proposer sees it: ``token_ids_cpu`` rows and their
    lengths; requests are lists of tokens placed in rows."""

    def __init__(self, rows: int = 4) -> None:
        self.now = 0.0  # a fake clock: each step costs 10 ms plus 1 ms per token it verified
        self.pass_tokens = 0
        self.token_ids = np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self.requests: list[list[int]] = []

    def place(self, requests: list[list[int]]) -> None:
        self.requests = requests
        for i, tokens in enumerate(requests):
            self.token_ids[i, : len(tokens)] = tokens
            self.lengths[i] = len(tokens)

    def step(self, proposer, sampled: list[list[int]]):
        self.now += 0.01 + 0.001 * self.pass_tokens
        proposer.clock = lambda: self.now
        drafts = proposer.propose(sampled, self.lengths, self.token_ids)
        self.pass_tokens = sum(1 + len(draft) for draft in drafts)
        return drafts


def test_a_repeating_request_drafts_its_continuation():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    batch.place([[5, 1, 2, 3, 4, 9, 1, 2]])
    assert batch.step(proposer, [[2]]) == [[3, 4, 9, 1, 2, 3, 4, 9]]


def test_rows_follow_their_requests_when_the_batch_is_condensed():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    a, b, c = [7, 1, 2, 3, 1, 2], [8, 4, 5, 6, 4, 5], [9, 10, 11, 12, 10, 11]
    batch.place([a, b, c])
    first = batch.step(proposer, [[2], [5], [11]])
    assert [d[:1] for d in first] == [[3], [6], [12]]
    states = list(proposer.table.rows)
    # b leaves; c moves into its row; a grows by an accepted draft token and a bonus token
    batch.place([a + [3, 1], c + [12, 10]])
    second = batch.step(proposer, [[3, 1], [12, 10]])
    assert proposer.table.rows == [states[0], states[2]]
    assert [d[:1] for d in second] == [[2], [11]]
    assert proposer.table.created == 3  # nothing re-indexed
    assert states[0].tokens == a + [3, 1]


def test_a_preempted_request_finds_its_state_again():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    a, b = [7, 1, 2, 3, 1, 2], [8, 4, 5, 6, 4, 5]
    batch.place([a, b])
    batch.step(proposer, [[2], [5]])
    state_b = proposer.table.rows[1]
    batch.place([a + [3]])  # b preempted: out of the batch
    batch.step(proposer, [[3]])
    batch.place([a + [3, 1], b])  # b back, its tokens recomputed
    batch.step(proposer, [[1], [5]])
    assert proposer.table.rows[1] is state_b and proposer.table.created == 2


def test_identical_requests_get_states_of_their_own():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    same = [7, 1, 2, 3, 1, 2]
    batch.place([same, list(same)])
    batch.step(proposer, [[2], [2]])
    assert proposer.table.rows[0] is not proposer.table.rows[1]


def test_acceptance_is_read_from_what_vllm_kept():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    a = [7, 1, 2, 3, 4, 1, 2]
    batch.place([a])
    (draft,) = batch.step(proposer, [[2]])
    assert draft[:2] == [3, 4]
    state = proposer.table.rows[0]
    batch.place([a + [3, 4, 8]])  # two draft tokens kept, then the model's own token
    batch.step(proposer, [[3, 4, 8]])
    assert (state.drafted, state.accepted) == (len(draft) * 1 + len(state.last_draft), 2)


def test_a_prefilling_row_gets_no_draft_and_untimed_steps():
    proposer = PromptLookupProposer(config(), adaptive=False)
    batch = FakeBatch()
    batch.place([[7, 1, 2, 1, 2], [3, 3, 3, 3]])
    assert batch.step(proposer, [[2], []])[1] == []
    assert proposer.timed_steps == 0


def test_the_policy_stops_drafting_what_is_never_accepted():
    """Drafts always rejected, passes 1 ms dearer per token: soon the policy verifies none."""
    proposer = PromptLookupProposer(config())
    batch = FakeBatch()
    tokens = [7, 1, 2, 1, 2]
    batch.place([tokens])
    drafted = []
    draft = batch.step(proposer, [[2]])[0]
    rng = random.Random(0)
    for _ in range(200):
        token = rng.choice([t for t in range(1, 7) if not draft or t != draft[0]])
        tokens = tokens + [token]
        batch.place([tokens])
        draft = batch.step(proposer, [[token]])[0]
        drafted.append(len(draft))
    assert sum(drafted[:50]) > 10 * max(1, sum(drafted[-50:]))


def test_drafts_stop_short_of_the_model_length():
    proposer = PromptLookupProposer(config(num_tokens=16), adaptive=False)
    batch = FakeBatch()
    tokens = [1, 2] * ((MAX_LEN - 4) // 2)
    batch.place([tokens])
    (draft,) = batch.step(proposer, [[2]])
    assert len(tokens) + len(draft) + 1 <= MAX_LEN


def test_vllm_serve_runs_vllms_server_with_the_proposer_and_the_middleware():
    import json

    from promptlookup.vllm.command import server_command

    command = server_command("/models/m", "m", 12, ("--port", "9000", "--served-model-name=x"))
    assert command[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {
        "method": "custom_class",
        "model": "promptlookup.vllm.PromptLookupProposer",
        "num_speculative_tokens": 12,
    }
    assert command[command.index("--middleware") + 1] == "promptlookup.vllm.PredictedOutputs"
    assert command[command.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert command[-3:] == ["--port", "9000", "--served-model-name=x"]
    assert command.count("--served-model-name") == 0  # the user's own name wins


def test_openmp_preload_adds_intel_openmp_once(tmp_path, monkeypatch):
    from promptlookup.vllm import command

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(command.sys, "prefix", str(tmp_path))
    env = command.openmp_preload({"LD_PRELOAD": "/x/libtcmalloc.so"})
    assert env["LD_PRELOAD"] == f"{tmp_path}/lib/libiomp5.so:/x/libtcmalloc.so"
    assert command.openmp_preload(env)["LD_PRELOAD"] == env["LD_PRELOAD"]
