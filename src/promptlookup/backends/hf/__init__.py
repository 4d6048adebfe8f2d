"""The target over a ``transformers`` causal LM (:mod:`.target`) and its growing KV cache
(:mod:`.cache`)."""
