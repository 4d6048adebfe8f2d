"""The torch backend's target, ``TorchTarget``, over a ``transformers`` causal LM or our GGUF
modules (:mod:`.target`), and its growing KV cache (:mod:`.cache`)."""
