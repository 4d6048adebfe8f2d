"""The worked examples in docstrings are true, in every module of the package.

Modules are discovered, not listed, so that a new module's examples run too. Examples that load
the real model are marked ``+SKIP`` and exercised by the API tests instead; a module whose
optional dependency is not installed (llama.cpp, vLLM) is skipped.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import promptlookup

#: Modules not imported here: running ``python -m promptlookup`` is the CLI.
NOT_IMPORTED = {"promptlookup.__main__"}


def package_modules() -> list[str]:
    names = ["promptlookup"]
    for info in pkgutil.walk_packages(promptlookup.__path__, prefix="promptlookup."):
        if info.name not in NOT_IMPORTED:
            names.append(info.name)
    return sorted(names)


MODULES = package_modules()


def test_discovery_finds_every_layer():
    for name in ("promptlookup.bench.summary", "promptlookup.drafters.suffix_index"):
        assert name in MODULES
    assert "promptlookup.bench.suite" in MODULES and "promptlookup.server" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional dependency (llama-cpp-python, vllm)
        pytest.skip(f"{name}: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
