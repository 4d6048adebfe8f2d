"""The llama.cpp target backend: same tokens as llama.cpp's own decoding, a KV cache that crops
correctly, the GGUF's vocabulary, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36)"
)

from click.testing import CliRunner  # noqa: E402

from promptlookup.backends.base import Target  # noqa: E402
from promptlookup.errors import (  # noqa: E402
    InvalidParameterError,
    ModelLoadError,
    ModelNotFoundError,
    PromptTooLongError,
)

#: Prompts that copy from their context (prompt lookup drafts) and one that does not.
PROMPTS = [
    "Fix the typo and return the whole function:\n\ndef area(width, height):\n"
    '    """Area of a rectangle."""\n    retrun width * height\n',
    "Repeat this list exactly, one item per line: apples, pears, plums, cherries, grapes, figs.",
    "Rename the variable x to count everywhere:\n\nx = 0\nfor item in items:\n    if item:\n"
    "        x += 1\nprint(x)\n",
    "Write a haiku about autumn.",
]
NEW_TOKENS = 40


#: Decodes a copying prompt (a prefill, drafts, one-token passes) in a child process.
PROBE = """
from promptlookup.loading import load_llamacpp
lm = load_llamacpp(n_threads=1)
lm.generate(lm.encode("Repeat exactly: one two three four five six seven eight nine ten.",
                      chat=True), max_new_tokens=12)
"""


@pytest.fixture(scope="module", autouse=True)
def _llama_cpp_runs_on_this_cpu():
    """Skip, rather than take pytest down, where the installed llama.cpp build dies of a signal
    (a build for another CPU: an AMX kernel on a machine whose AMX is unusable, say).
    A child that fails without a signal (no default model, say) is left to the tests."""
    child = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600
    )
    if child.returncode < 0:
        pytest.skip(
            f"this llama-cpp-python build crashes on this CPU (signal "
            f"{-child.returncode}); rebuild it: make clean setup"
        )


@pytest.fixture(scope="module")
def llama_lm():
    from promptlookup.loading import load_llamacpp

    try:
        # One thread: llama.cpp's spinning worker threads crawl on an oversubscribed CPU.
        return load_llamacpp(n_threads=1)
    except ModelNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


def llama_cpp_greedy(llama, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """llama.cpp's own greedy decoding (``Llama.generate``), stopping after an end token."""
    import llama_cpp

    llama.reset()
    out: list[int] = []
    for token in llama.generate(
        prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
    ):
        out.append(int(token))
        if (
            llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llama.model), token)
            or len(out) >= max_new_tokens
        ):
            break
    llama.reset()
    return out


def test_is_a_target(llama_lm):
    target = llama_lm.target
    assert isinstance(target, Target)
    assert target.can_crop
    assert target.max_context == llama_lm.model.n_ctx()


def test_token_ids_agree_with_llama_cpp_tokenizer(llama_lm):
    llama = llama_lm.model
    for text in [
        "Hello, world!",
        "def f(x):\n    return x  # tabs\tand  spaces",
        "naïve café — 東京 🙂",
        "  leading and trailing  ",
        "1234567 + 89 = ?",
    ]:
        ours = list(llama_lm.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert ours == llama.tokenize(text.encode(), add_bos=False, special=False), text
        assert llama_lm.tokenizer.decode(ours) == llama.detokenize(ours).decode()


def test_chat_template_tokens_agree_with_llama_cpp(llama_lm):
    messages = [{"role": "user", "content": "Say hi."}]
    text = llama_lm.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    ids = llama_lm.encode(messages)
    assert ids == llama_lm.model.tokenize(text.encode(), add_bos=False, special=True)
    assert llama_lm.model.token_eos() in llama_lm.eos_token_ids


def test_plain_decoding_equals_llama_cpp_generate(llama_lm):
    """drafter='none' feeds the prompt in llama.cpp's chunks, then one token per forward pass,
    like llama.cpp itself: the same numbers, hence the same tokens."""
    for prompt in PROMPTS:
        prompt_ids = llama_lm.encode(prompt, chat=True)
        ours = llama_lm.generate(prompt_ids, max_new_tokens=NEW_TOKENS, drafter="none").token_ids
        assert ours == llama_cpp_greedy(llama_lm.model, prompt_ids, NEW_TOKENS), prompt


def prompt_lookup_tokens(lm, prompt_ids, max_new_tokens, chooser=None, totals=None):
    """Our loop with whole prompt-lookup drafts verified (no cost policy trimming them);
    ``totals`` (a dict) sums drafted and accepted tokens."""
    from promptlookup import GenerationStats, PromptLookupDrafter, speculative_generate

    drafter = PromptLookupDrafter(num_tokens=10, eos_token_ids=lm.eos_token_ids)
    stats = GenerationStats()
    tokens = list(
        speculative_generate(
            lm.target,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            drafter=drafter,
            chooser=chooser,
            eos_token_ids=lm.eos_token_ids,
            stats=stats,
        )
    )
    if totals is not None:
        for key in ("drafted_tokens", "accepted_tokens"):
            totals[key] = totals.get(key, 0) + getattr(stats, key)
    return tokens


@pytest.fixture(scope="module")
def invariant_lm(llama_lm):
    """The same llama.cpp model with every forward pass over at least two tokens."""
    from promptlookup import LanguageModel
    from promptlookup.backends.llamacpp.target import LlamaCppTarget

    return LanguageModel(
        LlamaCppTarget(llama_lm.model, batch_invariant=True),
        llama_lm.tokenizer,
        name="invariant",
        model=llama_lm.model,
    )


def test_prompt_lookup_greedy_differs_from_llama_cpp_only_at_near_ties(llama_lm):
    """llama.cpp scores one token with other kernels than several (logits differ by up to ~1 at
    a scale of ~40), so drafting may flip a near-tie; anywhere else the tokens must agree."""
    totals: dict = {}
    identical = 0
    for prompt in PROMPTS:
        prompt_ids = llama_lm.encode(prompt, chat=True)
        ours = prompt_lookup_tokens(llama_lm, prompt_ids, NEW_TOKENS, totals=totals)
        theirs = llama_cpp_greedy(llama_lm.model, prompt_ids, NEW_TOKENS)
        if ours == theirs:
            identical += 1
            continue
        d = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        # llama.cpp's own logits where the outputs part (plain decoding reproduces them).
        target = llama_lm.target
        target.reset()
        target.prefill(prompt_ids[:-1])
        for token in [prompt_ids[-1], *theirs[:d]]:
            logits = target.forward([token])[0]  # (vocab,): the last one scores position d
        margin = float(logits[theirs[d]] - logits[ours[d]])
        assert 0 <= margin < 1.5, (prompt, d, margin)
    print(
        f"\nprompt lookup on llama.cpp: {identical}/{len(PROMPTS)} greedy outputs identical "
        f"to llama.cpp's own decoding; {totals['accepted_tokens']}/{totals['drafted_tokens']} "
        f"drafted tokens accepted"
    )
    assert totals["accepted_tokens"] > 0  # multi-token forward passes were verified


def test_batch_invariant_prompt_lookup_equals_plain_exactly(invariant_lm):
    totals: dict = {}
    for prompt in PROMPTS:
        prompt_ids = invariant_lm.encode(prompt, chat=True)
        plain = invariant_lm.generate(prompt_ids, max_new_tokens=NEW_TOKENS, drafter="none")
        ours = prompt_lookup_tokens(invariant_lm, prompt_ids, NEW_TOKENS, totals=totals)
        assert ours == plain.token_ids, prompt
    assert totals["accepted_tokens"] > 0


def test_multi_token_passes_agree_bit_for_bit(llama_lm, invariant_lm):
    """Any split of tokens into passes of >= 2 tokens gives the same logits; a one-token pass
    gives slightly different ones unless the target is batch invariant."""
    ids = llama_lm.encode(PROMPTS[0], chat=True)
    target = llama_lm.target
    target.reset()
    target.prefill(ids[:-16])
    whole = target.forward(ids[-16:])  # (16, vocab)
    assert whole.shape == (16, target.vocab_size) and whole.dtype == torch.float32
    target.reset()
    target.prefill(ids[:-40])
    target.prefill(ids[-40:-16])
    split = torch.cat(
        [target.forward(ids[-16:-13]), target.forward(ids[-13:-8]), target.forward(ids[-8:])]
    )
    assert torch.equal(split, whole)
    target.reset()
    target.prefill(ids[:-16])
    single = torch.cat([target.forward([token]) for token in ids[-16:]])  # (16, vocab)
    torch.testing.assert_close(single, whole, atol=2.0, rtol=0)  # other kernels, close
    invariant = invariant_lm.target
    invariant.reset()
    invariant.prefill(ids[:-16])
    padded = torch.cat([invariant.forward([token]) for token in ids[-16:]])
    assert invariant.cache_length == len(ids)
    assert torch.equal(padded, whole)


def test_crop_removes_rejected_positions_from_the_cache(llama_lm):
    target = llama_lm.target
    ids = llama_lm.encode(PROMPTS[1], chat=True)
    rejected = llama_lm.tokenizer(" bananas kiwis mangos", add_special_tokens=False)["input_ids"]
    continuation = llama_lm.tokenizer(" apples, pears", add_special_tokens=False)["input_ids"]
    target.reset()
    target.prefill(ids[:-1])
    target.forward([ids[-1], *rejected])
    assert target.cache_length == len(ids) + len(rejected)
    target.crop(len(ids))
    assert target.cache_length == len(ids)
    after_crop = target.forward(continuation)  # (len(continuation), vocab)
    target.reset()
    target.prefill(ids)
    fresh = target.forward(continuation)
    assert torch.equal(after_crop, fresh)
    # Without the crop the rejected tokens would change these logits a lot.
    target.reset()
    target.prefill([*ids, *rejected])
    polluted = target.forward(continuation)
    assert (polluted - fresh).abs().max() > 0.1


def test_sampling_with_prompt_lookup_draws_the_same_tokens_as_plain(invariant_lm):
    """Seeded sampling consumes one random number per token in both paths."""
    from promptlookup import SamplingParams, TokenChooser

    prompt_ids = invariant_lm.encode(PROMPTS[2], chat=True)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=3)
    plain = invariant_lm.generate(
        prompt_ids, drafter="none", max_new_tokens=32, temperature=0.7, top_p=0.9, seed=3
    ).token_ids
    looked_up = prompt_lookup_tokens(invariant_lm, prompt_ids, 32, TokenChooser.from_params(params))
    assert looked_up == plain


def test_prompt_too_long_is_a_named_error():
    from promptlookup.loading import load_llamacpp

    lm = load_llamacpp(n_ctx=256, n_batch=32, n_threads=1)  # llama.cpp pads n_ctx to 256
    assert lm.target.max_context == 256
    with pytest.raises(PromptTooLongError, match="256 tokens"):
        lm.generate("word " * 300, max_new_tokens=8)
    # Prompts longer than one batch are prefilled in n_batch chunks.
    result = lm.generate("one two three " * 12, max_new_tokens=4, drafter="none")
    assert len(result.prompt_ids) > 32 and len(result.token_ids) == 4


def test_missing_gguf_is_model_not_found(tmp_path):
    import promptlookup

    with pytest.raises(ModelNotFoundError):
        promptlookup.load_model(str(tmp_path / "absent.gguf"), backend="llama.cpp")


def test_corrupt_gguf_is_model_load_error(tmp_path):
    import promptlookup

    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        promptlookup.load_model(str(corrupt), backend="llama.cpp")


def test_backend_needs_a_gguf_file(tmp_path):
    import promptlookup

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidParameterError, match="gguf"):
        promptlookup.load_model(str(tmp_path), backend="llama.cpp")
    with pytest.raises(InvalidParameterError, match="backend"):
        promptlookup.load_model(backend="onnx")


def test_cli_generate_with_llama_cpp_backend():
    from promptlookup.cli import main

    result = CliRunner().invoke(
        main,
        [
            "generate",
            "--backend",
            "llama.cpp",
            "--chat",
            "-n",
            "4",
            "--drafter",
            "none",
            "--json",
            "Repeat: red green blue",
        ],
    )
    assert result.exit_code == 0, result.output
    assert 1 <= len(json.loads(result.output.strip().splitlines()[-1])["token_ids"]) <= 4


def test_cli_reports_a_missing_gguf_in_one_line(tmp_path):
    from promptlookup.cli import main

    result = CliRunner().invoke(
        main, ["generate", "--backend", "llama.cpp", "-m", str(tmp_path / "nope.gguf"), "hi"]
    )
    assert result.exit_code == 1
    assert "nope.gguf" in result.output and "Traceback" not in result.output


def test_bench_methods_record_when_each_token_arrived(llama_lm):
    from promptlookup.bench import Settings
    from promptlookup.bench.methods import make_method

    prompt_ids = llama_lm.encode([{"role": "user", "content": PROMPTS[0]}])
    for spec in ("plain", "promptlookup"):
        out = make_method("llama.cpp", spec, llama_lm).run(prompt_ids, Settings(max_new_tokens=8))
        assert len(out.token_seconds) == len(out.token_ids) > 0, spec
        assert out.token_seconds == sorted(out.token_seconds) <= [out.seconds] * 8
