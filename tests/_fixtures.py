"""Fixtures shared by a few test modules (import them by name into a module to use them)."""

from __future__ import annotations

import pytest
import torch

import promptlookup
from promptlookup.backend_names import backend_name


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: small models run several times faster than with two on a busy
    shared CPU, and no result depends on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cached_default_model(monkeypatch, default_lm):
    """Make ``promptlookup.load_model()`` of the default model (as the CLI calls it) return the
    session's already loaded model: a real load takes seconds."""
    real_load = promptlookup.load_model

    def load_model(model=None, *, dtype="auto", device="cpu", **kwargs):
        if (
            model is None
            and dtype == "auto"
            and device == "cpu"
            and backend_name(kwargs.get("backend", "torch")) == "torch"
        ):
            return default_lm
        return real_load(model, dtype=dtype, device=device, **kwargs)

    monkeypatch.setattr(promptlookup, "load_model", load_model)
    return default_lm


@pytest.fixture(params=["native", "blas"])
def attention_path(request, monkeypatch):
    """Row-invariant attention in the native kernel, or (where no compiler built it) per
    sequence over the BLAS: passes are row-invariant either way."""
    from promptlookup.backends.gguf import decoder_pass, native_attention

    if request.param == "blas":
        monkeypatch.setattr(decoder_pass, "kernel_takes", lambda *shape: False)
    elif native_attention.kernel() is None:
        pytest.skip("no C compiler on this machine")
    return request.param
