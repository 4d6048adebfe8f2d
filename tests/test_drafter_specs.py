"""Drafter specs (``drafter=`` in the API, ``--drafter`` on the command line): parsing, option
routing, clear errors, and greedy identity with plain decoding for every drafter and chain."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_llama

import promptlookup
from promptlookup.cli import main
from promptlookup.drafters import (
    ChainDrafter,
    DraftModelDrafter,
    NoDrafter,
    PromptLookupDrafter,
    check_drafter_spec,
    make_drafter,
    parse_drafter_spec,
)
from promptlookup.errors import InvalidParameterError, ModelNotFoundError, UnsupportedModelError

VOCAB = 12
LETTERS = "abcdefghijkl"  # token i is LETTERS[i]


def letter_tokenizer(letters: str = LETTERS):
    """A real ``transformers`` tokenizer, one token per letter (saved and loaded like any)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(
        models.WordLevel({c: i for i, c in enumerate(letters)}, unk_token=letters[0])
    )
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Saved tiny draft models: ``draft`` shares the target's tokenizer, ``permuted`` maps the
    letters to other ids, ``bigger`` has one more token; plus a reference text file."""
    root = tmp_path_factory.mktemp("drafters")
    paths = {}
    for name, letters, seed in [
        ("draft", LETTERS, 1),
        ("permuted", LETTERS[::-1], 1),
        ("bigger", LETTERS + "m", 2),
    ]:
        paths[name] = root / name
        tiny_llama(len(letters), seed=seed).save_pretrained(paths[name])
        letter_tokenizer(letters).save_pretrained(paths[name])
    paths["reference"] = root / "reference.txt"
    paths["reference"].write_text("abcdefghijklkjihgfedcba" * 2, encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def lm():
    """A tiny target with a real tokenizer and no end-of-sequence token (runs to length)."""
    model = tiny_llama(VOCAB, seed=0)
    model.generation_config.eos_token_id = None
    return promptlookup.from_transformers(model, letter_tokenizer(), name="tiny-letters")


# -- parsing and options ----------------------------------------------------------------------


def test_parse_drafter_spec():
    assert parse_drafter_spec("prompt-lookup") == [("prompt-lookup", None)]
    assert parse_drafter_spec(" prompt-lookup , draft-model:org/small-model ") == [
        ("prompt-lookup", None),
        ("draft-model", "org/small-model"),
    ]
    assert parse_drafter_spec("reference:C:/work/old.py") == [("reference", "C:/work/old.py")]


@pytest.mark.parametrize(
    "spec",
    ["bogus", "draft-model", "reference:", "prompt-lookup:3", "none:x", ",", "prompt-lookup,bogus"],
)
def test_bad_spec_is_a_one_line_error(spec):
    with pytest.raises(InvalidParameterError) as info:
        make_drafter(spec)
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidParameterError):
        check_drafter_spec(spec)


def test_options_go_to_the_drafters_that_take_them(folders, lm):
    chain = make_drafter(
        f"prompt-lookup,draft-model:{folders['draft']}",
        tokenizer=lm.tokenizer,
        num_tokens=7,
        min_match=2,
        confidence_threshold=0.1,
    )
    lookup, draft_model = chain.drafters
    assert (lookup.num_tokens, lookup.min_match) == (7, 2)
    assert (draft_model.num_tokens, draft_model.confidence_threshold) == (7, 0.1)


@pytest.mark.parametrize(
    "spec, options",
    [
        ("prompt-lookup", {"confidence_threshold": 0.1}),
        ("none", {"num_tokens": 3}),
        ("prompt-lookup", {"colour": "red"}),
    ],
)
def test_an_option_no_drafter_takes_is_an_error(spec, options):
    with pytest.raises(InvalidParameterError, match="takes no option"):
        make_drafter(spec, **options)
    with pytest.raises(InvalidParameterError, match="takes no option"):
        check_drafter_spec(spec, **options)


def test_bad_option_values_are_errors(folders):
    with pytest.raises(InvalidParameterError):
        check_drafter_spec(f"draft-model:{folders['draft']}", confidence_threshold=2)
    with pytest.raises(InvalidParameterError):
        check_drafter_spec("prompt-lookup", num_tokens=0)


# -- reference text ---------------------------------------------------------------------------


def test_reference_file_is_tokenized_with_the_target_tokenizer(folders, lm):
    drafter = make_drafter(f"reference:{folders['reference']}", tokenizer=lm.tokenizer)
    text = folders["reference"].read_text(encoding="utf-8")
    assert isinstance(drafter, PromptLookupDrafter)
    assert drafter.reference_ids == lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    # It drafts from the reference: "kji" continues with "hgf" only there.
    assert drafter.propose(lm.encode("lkji"), 3) == lm.encode("hgf")


def test_reference_text_option(lm):
    drafter = make_drafter("prompt-lookup", tokenizer=lm.tokenizer, reference_text="abcdef")
    assert drafter.reference_ids == [0, 1, 2, 3, 4, 5]


def test_missing_reference_file_is_a_clear_error(tmp_path, lm):
    missing = tmp_path / "nowhere.txt"
    for check in (
        lambda: make_drafter(f"reference:{missing}", tokenizer=lm.tokenizer),
        lambda: check_drafter_spec(f"reference:{missing}"),
    ):
        with pytest.raises(InvalidParameterError, match="reference file not found"):
            check()


def test_reference_needs_the_target_tokenizer(folders):
    with pytest.raises(InvalidParameterError, match="tokenizer"):
        make_drafter(f"reference:{folders['reference']}")


# -- draft models -----------------------------------------------------------------------------


def test_draft_model_spec_loads_the_model(folders, lm):
    drafter = make_drafter(f"draft-model:{folders['draft']}", tokenizer=lm.tokenizer)
    assert isinstance(drafter, DraftModelDrafter)
    assert drafter.model.config.vocab_size == VOCAB


@pytest.mark.parametrize("name", ["permuted", "bigger"])
def test_draft_model_with_another_tokenizer_is_a_clear_error(folders, lm, name):
    with pytest.raises(UnsupportedModelError, match="share the target's tokenizer") as info:
        make_drafter(f"draft-model:{folders[name]}", tokenizer=lm.tokenizer)
    assert "\n" not in str(info.value)


def test_a_missing_draft_model_is_a_clear_error(tmp_path, lm):
    for check in (
        lambda: make_drafter(f"draft-model:{tmp_path / 'none'}", tokenizer=lm.tokenizer),
        lambda: check_drafter_spec(f"draft-model:{tmp_path / 'none'}"),
    ):
        with pytest.raises(ModelNotFoundError):
            check()


def test_checking_a_spec_loads_nothing(folders, monkeypatch):
    import promptlookup.drafters as drafters

    def no_loading(*args, **kwargs):
        raise AssertionError("check_drafter_spec loaded a model")

    monkeypatch.setattr(drafters, "load_draft_model", no_loading)
    check_drafter_spec(
        f"prompt-lookup,draft-model:{folders['draft']},reference:{folders['reference']}"
    )


def test_a_loaded_model_is_a_draft_model(folders, lm):
    from promptlookup.models import load_pretrained

    model, tokenizer, _ = load_pretrained(str(folders["draft"]))
    small = promptlookup.from_transformers(model, tokenizer)
    assert isinstance(make_drafter(small, tokenizer=lm.tokenizer), DraftModelDrafter)
    assert isinstance(make_drafter(model, tokenizer=lm.tokenizer), DraftModelDrafter)
    with pytest.raises(InvalidParameterError, match="takes no option"):
        make_drafter(small, tokenizer=lm.tokenizer, min_match=3)


def test_a_drafter_object_gets_the_generation_sampler(folders, lm):
    chooser = promptlookup.TokenChooser.from_params(promptlookup.SamplingParams(temperature=1.0))
    model_drafter = make_drafter(f"draft-model:{folders['draft']}", tokenizer=lm.tokenizer)
    chain = ChainDrafter([NoDrafter(), model_drafter])
    assert make_drafter(chain, chooser=chooser) is chain
    assert model_drafter.chooser is chooser


# -- every drafter and chain: token-identical to plain decoding -------------------------------


def repeat_last_four(tokens):
    """The documented callable drafter: the last four tokens once more."""
    return list(tokens[-4:])


SPECS = [
    "prompt-lookup",
    "reference:{reference}",
    "draft-model:{draft}",
    "prompt-lookup,draft-model:{draft}",
    "reference:{reference},draft-model:{draft}",
    "draft-model:{draft},prompt-lookup",
    repeat_last_four,
    [repeat_last_four, "draft-model:{draft}"],
]
PROMPTS = ["abcabcabd", "kjihgfe", "aaaaaaaab"]


def fill(spec, folders):
    if isinstance(spec, str):
        return spec.format(**{k: str(v) for k, v in folders.items()})
    if isinstance(spec, list):
        return [fill(item, folders) for item in spec]
    return spec


def spec_id(spec) -> str:
    if isinstance(spec, list):
        return "+".join(spec_id(item) for item in spec)
    return getattr(spec, "__name__", str(spec))


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_drafter_is_greedy_identical_to_plain_decoding(folders, lm, spec):
    drafted = 0
    for prompt in PROMPTS:
        plain = lm.generate(prompt, drafter="none", max_new_tokens=24)
        result = lm.generate(
            prompt, drafter=fill(spec, folders), max_new_tokens=24, speculation="fixed"
        )  # every draft verified whole
        assert result.token_ids == plain.token_ids and len(plain.token_ids) == 24
        drafted += result.stats.drafted_tokens
    assert drafted > 0


def test_sampling_with_a_draft_model_spec_runs(folders, lm):
    result = lm.generate(
        "abcab",
        drafter=f"prompt-lookup,draft-model:{folders['draft']}",
        temperature=0.8,
        top_p=0.9,
        seed=1,
        max_new_tokens=16,
        speculation="fixed",
    )
    assert len(result.token_ids) == 16 and result.stats.drafted_tokens > 0


# -- command line -----------------------------------------------------------------------------


def test_cli_help_documents_the_specs():
    out = " ".join(CliRunner().invoke(main, ["generate", "--help"]).output.split())
    for spec in ("reference:FILE", "draft-model:PATH_OR_ID", "prompt-lookup,draft-model:PATH"):
        assert spec in out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bogus", "unknown drafter"),
        ("reference:/no/such/file.txt", "reference file not found"),
        ("draft-model:/no/such/model", "no such model"),
    ],
)
def test_cli_rejects_a_bad_spec_in_one_line(spec, message):
    result = CliRunner().invoke(main, ["generate", "abc", "--drafter", spec])
    assert result.exit_code == 1
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_runs_a_chain_with_a_draft_model(folders):
    def run(spec):
        result = CliRunner().invoke(
            main,
            [
                "generate",
                "abcabcab",
                "-m",
                str(folders["draft"]),
                "-n",
                "12",
                "--json",
                "--drafter",
                spec,
            ],
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.output.strip().splitlines()[-1])

    plain = run("none")
    chained = run(f"prompt-lookup,draft-model:{folders['draft']}")
    assert chained["token_ids"] == plain["token_ids"]


def test_a_reference_the_output_follows_raises_tokens_per_forward(lm, tmp_path):
    """The point of a reference (a "predicted output"): text the prompt lacks but the output
    contains is drafted from it."""
    prompt = "abcab"
    plain = lm.generate(prompt, drafter="none", max_new_tokens=24)
    reference = tmp_path / "predicted.txt"
    reference.write_text(lm.tokenizer.decode(plain.token_ids), encoding="utf-8")
    lookup = lm.generate(prompt, drafter="prompt-lookup", max_new_tokens=24, speculation="fixed")
    predicted = lm.generate(
        prompt, drafter=f"reference:{reference}", max_new_tokens=24, speculation="fixed"
    )
    assert predicted.token_ids == lookup.token_ids == plain.token_ids
    assert predicted.stats.tokens_per_forward > max(2 * lookup.stats.tokens_per_forward, 4)
