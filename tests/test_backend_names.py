"""The torch backend's names: ``backend="torch"`` and :class:`TorchTarget`, and the names they
had before 0.15 (``"transformers"``, ``TransformersTarget``), still taken where a user wrote
them: the same model, the same tokens, the same measurement files."""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner
from conftest import tiny_llama
from test_drafter_specs import letter_tokenizer

import promptlookup
from promptlookup import cache_files
from promptlookup.backend_names import ALIASES, BACKENDS, backend_name
from promptlookup.cli import main
from promptlookup.errors import InvalidParameterError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny model saved as a Hugging Face folder, with a real tokenizer."""
    path = tmp_path_factory.mktemp("tiny-folder")
    tiny_llama(12, seed=3).save_pretrained(path)
    letter_tokenizer().save_pretrained(path)
    return path


def test_transformers_target_is_torch_target_with_a_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the module and its new name import without a warning
        from promptlookup.backends.hf import target
        from promptlookup.backends.hf.target import TorchTarget
    with pytest.warns(DeprecationWarning, match="TorchTarget"):
        from promptlookup.backends.hf.target import TransformersTarget
    assert TransformersTarget is TorchTarget
    with pytest.raises(AttributeError, match="NoSuchTarget"):
        target.NoSuchTarget  # noqa: B018 (the attribute lookup is the test)


def test_the_old_name_maps_to_torch_and_only_it():
    assert backend_name("transformers") == "torch"
    assert [backend_name(name) for name in BACKENDS] == list(BACKENDS)
    assert set(ALIASES.values()) <= set(BACKENDS)


def test_load_model_takes_both_names_and_names_them_in_its_error(folder):
    prompt = "abcabcab"
    torch_lm = promptlookup.load_model(str(folder), backend="torch")
    old_lm = promptlookup.load_model(str(folder), backend="transformers")
    assert type(old_lm.target) is type(torch_lm.target)
    first = torch_lm.generate(prompt, max_new_tokens=8, drafter="none").token_ids
    assert old_lm.generate(prompt, max_new_tokens=8, drafter="none").token_ids == first
    with pytest.raises(InvalidParameterError, match="choose torch or llama.cpp"):
        promptlookup.load_model(str(folder), backend="onnx")


def test_the_torch_backend_keeps_its_measurement_files():
    """Cost curves and kernel choices measured under the old name are found, not remeasured."""
    name = cache_files.cost_file_for("tiny", "torch", "float32", "cpu", 1).name
    assert name.startswith("tiny-transformers-float32-cpu-1threads-v")
    assert "torch" in name.split("-v", 1)[1]  # the library versions still key it


def test_cli_takes_both_names_and_says_so(folder):
    runner = CliRunner()
    outputs = [
        runner.invoke(main, ["generate", "--json", "-n", "6", "-m", str(folder), *args, "abcab"])
        for args in ([], ["--backend", "torch"], ["--backend", "transformers"])
    ]
    assert [result.exit_code for result in outputs] == [0, 0, 0], outputs[0].output
    token_ids = [json.loads(result.stdout)["token_ids"] for result in outputs]
    assert token_ids[1] == token_ids[0] and token_ids[2] == token_ids[0]
    help_text = " ".join(runner.invoke(main, ["generate", "--help"]).output.split())
    assert "[default: torch]" in help_text and "'transformers', its name before 0.15" in help_text


def test_bench_takes_both_names():
    from promptlookup.bench.methods import get_backend

    assert get_backend("transformers") is get_backend("torch")
    assert "plain" in get_backend("torch").factories
