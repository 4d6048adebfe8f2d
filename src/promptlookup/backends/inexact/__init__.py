"""Kernels that need not round as a one-token pass does: attention through ``sdpa`` or in
blocks (:mod:`.attention`), and products by timing (:mod:`.fastest`)."""
