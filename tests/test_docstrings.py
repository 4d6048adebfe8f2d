"""The worked examples in docstrings (matching policies, drafters, report helpers) are true.

The package's own usage examples load the real model and are exercised by the API tests
instead; the modules below hold self-contained examples.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "promptlookup.backends.linear",
    "promptlookup.backends.row_invariant",
    "promptlookup.bench.summary",
    "promptlookup.drafters",
    "promptlookup.drafters.base",
    "promptlookup.drafters.options",
    "promptlookup.drafters.prompt_lookup",
    "promptlookup.drafters.suffix_index",
    "promptlookup.text",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
