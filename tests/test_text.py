"""Text handling: incremental detokenization (deltas add up to the full decode) and stop
strings (held back while undecided, cut at the first one, whatever the deltas' boundaries)."""

from __future__ import annotations

import pytest
from conftest import TinyTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.text import IncrementalDetokenizer, StopStrings


def stream_text(tokenizer, ids) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(i) for i in ids]
    return deltas, "".join(deltas) + detok.flush()


@pytest.fixture(scope="module")
def real_tokenizer():
    """The default model's tokenizer (byte-level BPE), from the converted-model cache."""
    from promptlookup.errors import PromptLookupError
    from promptlookup.models import _convert_gguf, resolve_model

    try:
        folder = _convert_gguf(resolve_model(None))
    except PromptLookupError as exc:
        pytest.skip(f"default model unavailable: {exc}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


# -- IncrementalDetokenizer ----------------------------------------------------------------------


def test_tiny_tokenizer_deltas_concatenate_to_decode():
    tokenizer = TinyTokenizer(32)
    ids = [3, 1, 0, 20, 20, 0, 0, 5]
    deltas, text = stream_text(tokenizer, ids)
    assert text == tokenizer.decode(ids) == "catte"
    assert deltas[2] == ""  # the EOS (a special token) has no text


MIXED = [
    "Hello, world!",
    "héllo 世界 🎉 naïve ∑ x² — “quotes” 👩‍👩‍👧",
    "def f(x):\n    return x  # ok\n\n\tindented",
    "   leading and trailing spaces   ",
    "🎉🎉🎉",
]


@pytest.mark.parametrize("text", MIXED)
def test_real_tokenizer_deltas_concatenate_to_decode(real_tokenizer, text):
    ids = real_tokenizer(text, add_special_tokens=False)["input_ids"]
    deltas, streamed = stream_text(real_tokenizer, ids)
    assert streamed == real_tokenizer.decode(ids, skip_special_tokens=True) == text
    # No delta ever shows half a character.
    assert not any("\ufffd" in d for d in deltas)


def test_real_tokenizer_holds_back_a_split_character(real_tokenizer):
    ids = real_tokenizer("🎉", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # the emoji's bytes span several tokens
    detok = IncrementalDetokenizer(real_tokenizer)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1]) == "🎉"


def test_real_tokenizer_skips_special_tokens(real_tokenizer):
    special = real_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = real_tokenizer("Done.", add_special_tokens=False)["input_ids"] + [special]
    _, streamed = stream_text(real_tokenizer, ids)
    assert streamed == "Done."


def test_flush_releases_an_incomplete_character(real_tokenizer):
    ids = real_tokenizer("ok 🎉", add_special_tokens=False)["input_ids"][:-1]
    deltas, streamed = stream_text(real_tokenizer, ids)
    assert streamed == real_tokenizer.decode(ids)
    assert streamed.endswith("\ufffd")  # released by flush()
    assert "".join(deltas).startswith("ok") and "\ufffd" not in "".join(deltas)


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=40))
def test_any_text_streams_back_exactly(real_tokenizer, text):
    ids = real_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert stream_text(real_tokenizer, ids)[1] == real_tokenizer.decode(
        ids, skip_special_tokens=True
    )


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=30))
def test_any_token_ids_stream_back_exactly(real_tokenizer, ids):
    """Even nonsense ids (invalid byte sequences, special tokens) add up to the full decode."""
    assert stream_text(real_tokenizer, ids)[1] == real_tokenizer.decode(
        ids, skip_special_tokens=True
    )


# -- StopStrings ---------------------------------------------------------------------------------


def feed_all(stops: StopStrings, deltas) -> list[str]:
    return [stops.feed(d) for d in deltas] + [stops.flush()]


def test_holds_back_a_partial_stop_string():
    stops = StopStrings(["END"])
    assert stops.feed("abc E") == "abc "  # "E" may begin "END"
    assert stops.feed("N") == ""
    assert stops.feed("x") == "ENx"  # it did not: released
    assert not stops.stopped
    assert stops.feed("EN") == ""
    assert stops.flush() == "EN"  # generation ended: nothing is stopped, release everything


def test_stop_spanning_deltas():
    stops = StopStrings(["<stop>"])
    out = feed_all(stops, ["Hello <", "st", "op", "> ignored", " more"])
    assert "".join(out) == "Hello "
    assert stops.stopped
    assert stops.feed("after") == ""


def test_first_complete_stop_string_wins_whatever_the_split():
    for deltas in (["abcd"], ["a", "b", "c", "d"], ["ab", "cd"]):
        stops = StopStrings(["abcd", "c"])
        assert "".join(feed_all(stops, deltas)) == "ab"


def test_multiple_stop_strings_first_in_text_wins():
    stops = StopStrings(["zz", "\n\n", "END"])
    assert "".join(feed_all(stops, ["one END two\n\nthree zz"])) == "one "
    stops = StopStrings(["END", "two"])
    assert "".join(feed_all(stops, ["one t", "wo END"])) == "one "
    # Held back by the longest partial match among all stop strings.
    stops = StopStrings(["abcd", "xbc"])
    assert stops.feed("..ab") == ".."
    assert stops.feed("c") == ""  # "abc" may still become "abcd"
    assert stops.feed("e") == "abce"


def test_no_stop_strings_pass_everything():
    stops = StopStrings([])
    assert feed_all(stops, ["a", "b", ""]) == ["a", "b", "", ""]
    stops = StopStrings([""])  # an empty stop string is ignored
    assert "".join(feed_all(stops, ["abc"])) == "abc" and not stops.stopped


def reference_cut(text: str, stop: list[str]) -> str:
    """Text up to the stop string that is complete first (ends earliest; if two end together,
    the one starting earliest): what streaming one character at a time gives."""
    best = None
    for s in stop:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or (i + len(s), i) < best):
            best = (i + len(s), i)
    return text if best is None else text[: best[1]]


@st.composite
def split_text(draw):
    text = draw(st.text(alphabet="abc", max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=400, deadline=None)
@given(
    split=split_text(), stop=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3)
)
def test_stop_strings_match_reference_for_any_split(split, stop):
    text, deltas = split
    expected = reference_cut(text, stop)
    stops = StopStrings(stop)
    shown = ""
    for delta in deltas:
        shown += stops.feed(delta)
        assert expected.startswith(shown)  # nothing shown is ever taken back
    shown += stops.flush()
    assert shown == expected
    assert stops.stopped == any(s in text for s in stop)
