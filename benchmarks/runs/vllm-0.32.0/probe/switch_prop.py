import time
from types import SimpleNamespace
from promptlookup.vllm.proposer import PromptLookupProposer

MODE = {"m": "none", "pl_kwargs": {}}
LOG = []

class Switch:
    def __init__(self, vllm_config):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer
        sc = SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=8)
        cfg = SimpleNamespace(speculative_config=sc, model_config=vllm_config.model_config,
                              scheduler_config=vllm_config.scheduler_config,
                              parallel_config=vllm_config.parallel_config)
        self.ngram = NgramProposer(cfg)
        self.cfg = vllm_config
        self.pl = PromptLookupProposer(vllm_config)
        self.pls = {}
    def load_model(self, *a, **k):
        pass
    def propose(self, sampled, num_tokens, token_ids, slot_mappings=None):
        m = MODE["m"]
        t0 = time.perf_counter()
        if m == "none":
            d = [[] for _ in sampled]
        elif m == "ngram":
            d = self.ngram.propose(8, sampled, num_tokens, token_ids)
        else:
            key = m
            if key not in self.pls:
                n = int(key[2:]) if key[2:].isdigit() else 16
                cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=n),
                                      model_config=self.cfg.model_config)
                self.pls[key] = PromptLookupProposer(cfg, **MODE["pl_kwargs"].get(key, {}))
            p = self.pls[key]
            p._runner = self.pl._runner or self.pl._find_runner()
            d = p.propose(sampled, num_tokens, token_ids, slot_mappings)
        t1 = time.perf_counter()
        LOG.append((t0, t1, [len(s) for s in sampled], [len(x) for x in d]))
        return d
