"""Probe proposers for measuring vLLM CPU step costs."""
import os, time, json
from promptlookup.vllm.proposer import PromptLookupProposer

K = {"k": 0}
LOG = []

class FixedProposer:
    """Drafts K['k'] copies of a token unlikely to be accepted, for every decoding row."""
    def __init__(self, vllm_config):
        self.last = None
    def load_model(self, *a, **k):
        pass
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        now = time.perf_counter()
        rows = len(sampled_token_ids)
        decoding = sum(1 for s in sampled_token_ids if s)
        tokens = sum(len(s) for s in sampled_token_ids)
        LOG.append((now, rows, decoding, tokens))
        k = K["k"]
        return [[7] * k if s else [] for s in sampled_token_ids]

class TimedProposer(PromptLookupProposer):
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        t0 = time.perf_counter()
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        t1 = time.perf_counter()
        LOG.append((t0, t1, [len(s) for s in sampled_token_ids], [len(d) for d in drafts]))
        return drafts
