"""Our engine: a GGUF file's model in modules of our own, and the row-invariant pass over them.

A pass goes :class:`~promptlookup.backends.hf.target.TorchTarget` ->
:class:`~.decoder_pass.DecoderPass` (our pass, layer by layer in
:mod:`.decoder_layer`) -> :class:`~.quantized_layers.QuantizedLayers` (every layer in one C
call, where the model's weights are quantized) -> ``native/``.

- Reading: :mod:`.file` (the GGUF reader), :mod:`.blocks` (quantized blocks and their
  panels), :mod:`.architectures` (each family's metadata), :mod:`.modules` (our module
  tree), :mod:`.twin` (``transformers``' model over the same modules), :mod:`.loader`.
- Products: :mod:`.quantized` (over quantized weights), :mod:`.linear` (over float
  ``nn.Linear`` weights, row-invariant by choice of kernel).
- Attention: :mod:`.row_invariant` (over a BLAS), :mod:`.native_attention` (a C kernel).
- C: ``native/*.c``, separate translation units sharing ``native/*.h`` (the kernels' bounds
  in ``bounds.h``), compiled on first use by :mod:`.native_build`.
"""
