"""promptlookup inside transformers' model.generate (custom_generate): the same output as plain
generate, with every argument a transformers user already passes."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (autouse fixture)
from conftest import tiny_llama
from scipy.stats import chi2_contingency
from transformers import (
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TextIteratorStreamer,
    TextStreamer,
)

import promptlookup
from promptlookup.hf_generate import generate as promptlookup_generate
from promptlookup.hf_generate import make_custom_generate

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Greedy continuations of this prompt on tiny_llama() repeat, so drafts get accepted.
REPETITIVE = [1, 2, 3] * 5
#: Greedy continuation of this prompt reaches EOS (id 0) after 13 new tokens.
REACHES_EOS = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]


def ids(tokens) -> torch.Tensor:
    return torch.tensor([tokens])  # (1, n)


def assert_same(plain: torch.Tensor, ours: torch.Tensor) -> None:
    assert ours.tolist() == plain.tolist()


def test_exports_and_the_callable_signature():
    assert promptlookup.custom_generate is promptlookup.hf_generate.custom_generate
    assert (
        "custom_generate" in promptlookup.__all__ and "make_custom_generate" in promptlookup.__all__
    )
    cg = make_custom_generate("prompt-lookup", num_tokens=4)
    assert cg.drafter_options == {"num_tokens": 4}
    with pytest.raises(promptlookup.InvalidParameterError):
        make_custom_generate("prompt-lookup", no_such_option=1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 40},
        {"max_new_tokens": 40, "eos_token_id": None, "pad_token_id": 0},
        {"max_new_tokens": 40, "repetition_penalty": 1.3},
        {"max_length": 30, "eos_token_id": 22, "pad_token_id": 0},
        {"max_new_tokens": 40, "min_new_tokens": 20},
    ],
    ids=["default", "no-eos", "repetition-penalty", "max-length-and-eos", "min-new-tokens"],
)
def test_greedy_equals_plain_generate(tiny_model, kwargs):
    plain = tiny_model.generate(ids(REPETITIVE), do_sample=False, **kwargs)
    # Adaptive (the default) and fixed; only fixed drafts regardless of measured pass costs.
    for cg in (make_custom_generate(), make_custom_generate(speculation="fixed")):
        ours = tiny_model.generate(ids(REPETITIVE), do_sample=False, custom_generate=cg, **kwargs)
        assert_same(plain, ours)
    assert cg.last_stats.accepted_tokens > 0
    assert cg.last_stats.forward_passes < cg.last_stats.new_tokens


def test_default_callable_stops_at_eos_like_plain(tiny_model):
    plain = tiny_model.generate(ids(REACHES_EOS), max_new_tokens=40)
    ours = tiny_model.generate(
        ids(REACHES_EOS), max_new_tokens=40, custom_generate=promptlookup.custom_generate
    )
    assert_same(plain, ours)
    assert ours[0, -1].item() == 0 and ours.shape[1] < len(REACHES_EOS) + 40


def test_return_dict_in_generate(tiny_model):
    plain = tiny_model.generate(ids(REPETITIVE), max_new_tokens=30, return_dict_in_generate=True)
    ours = tiny_model.generate(
        ids(REPETITIVE),
        max_new_tokens=30,
        return_dict_in_generate=True,
        custom_generate=promptlookup.custom_generate,
    )
    assert type(ours) is type(plain)
    assert_same(plain.sequences, ours.sequences)
    # Like plain generate's cache: every token but the last.
    assert (
        ours.cache.get_seq_length() == plain.cache.get_seq_length() == ours.sequences.shape[1] - 1
    )


@pytest.mark.parametrize("flag", ["output_scores", "output_logits", "output_attentions"])
def test_unsupported_outputs_raise_instead_of_being_wrong(tiny_model, flag):
    with pytest.raises(promptlookup.InvalidParameterError, match=flag):
        tiny_model.generate(
            ids(REPETITIVE),
            max_new_tokens=5,
            return_dict_in_generate=True,
            custom_generate=promptlookup.custom_generate,
            **{flag: True},
        )


def test_beam_search_and_several_return_sequences_raise(tiny_model):
    with pytest.raises(ValueError, match="num_return_sequences"):
        tiny_model.generate(
            ids(REPETITIVE),
            max_new_tokens=5,
            do_sample=True,
            num_return_sequences=2,
            custom_generate=promptlookup.custom_generate,
        )
    with pytest.raises(ValueError, match="beam search"):
        tiny_model.generate(
            ids(REPETITIVE),
            max_new_tokens=5,
            num_beams=2,
            custom_generate=promptlookup.custom_generate,
        )


def test_left_padding_is_stripped_and_kept_in_the_output(tiny_model):
    padded = ids([0, 0, 0] + REPETITIVE)
    mask = torch.tensor([[0, 0, 0] + [1] * len(REPETITIVE)])
    kwargs = dict(attention_mask=mask, max_new_tokens=30, repetition_penalty=1.2, pad_token_id=0)
    plain = tiny_model.generate(padded, **kwargs)
    for cg in (make_custom_generate(), make_custom_generate(speculation="fixed")):
        ours = tiny_model.generate(padded, custom_generate=cg, **kwargs)
        assert_same(plain, ours)
    assert cg.last_stats.accepted_tokens > 0  # fixed: drafts whatever the passes cost


def test_attention_mask_zeros_that_are_not_left_padding_raise(tiny_model):
    mask = torch.ones(1, len(REPETITIVE), dtype=torch.long)
    mask[0, 5] = 0
    with pytest.raises(promptlookup.InvalidParameterError, match="left padding"):
        tiny_model.generate(
            ids(REPETITIVE),
            attention_mask=mask,
            max_new_tokens=5,
            custom_generate=promptlookup.custom_generate,
        )


# -- batches (left padded) ----------------------------------------------------------------


def left_padded(prompts, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (B, longest) as a left-padding tokenizer gives."""
    longest = max(map(len, prompts))
    input_ids = torch.tensor([[pad] * (longest - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    return input_ids, mask


def batch_equals_plain(model, prompts, speculation="adaptive", **kwargs):
    """Plain generate's output for the left-padded batch, after checking ours equals it, and
    our last stats (summed over the rows)."""
    input_ids, mask = left_padded(prompts)
    kwargs = dict(attention_mask=mask, do_sample=False, **kwargs)
    plain = model.generate(input_ids, **kwargs)
    cg = make_custom_generate(speculation=speculation)
    assert_same(plain, model.generate(input_ids, custom_generate=cg, **kwargs))
    assert cg.last_stats.new_tokens > 0 and cg.last_stats.prompt_tokens == sum(map(len, prompts))
    return plain, cg.last_stats


@pytest.mark.parametrize("speculation", ["adaptive", "fixed"])
@pytest.mark.parametrize(
    "prompts, kwargs",
    [
        ([REPETITIVE, [5, 6, 7, 5, 6]], {"max_new_tokens": 30, "eos_token_id": None}),
        ([REPETITIVE, [5, 6, 7, 5, 6, 7, 5], [9, 8, 9]], {"max_new_tokens": 30}),
        ([[9, 8, 9], REPETITIVE, [5, 6, 7, 5]], {"max_length": 40, "repetition_penalty": 1.3}),
        ([REPETITIVE, [5, 6, 7, 5]], {"max_new_tokens": 25, "min_new_tokens": 20}),
    ],
    ids=["B2-no-eos", "B3", "B3-max-length-repetition-penalty", "B2-min-new-tokens"],
)
def test_left_padded_batch_greedy_equals_plain_generate(tiny_model, prompts, kwargs, speculation):
    plain, stats = batch_equals_plain(tiny_model, prompts, speculation, **kwargs)
    assert plain.shape[0] == len(prompts)
    if speculation == "fixed":  # adaptive drafts as the measured pass costs say
        assert stats.accepted_tokens > 0 and stats.forward_passes < stats.new_tokens


@pytest.mark.parametrize(
    "kwargs, pad",
    [
        ({}, 0),  # the model's pad_token_id (= its EOS here)
        ({"pad_token_id": 5}, 5),
        ({"pad_token_id": None, "eos_token_id": [22, 0]}, 22),  # no pad id: eos_token_id[0]
    ],
    ids=["model-pad", "pad-5", "pad-falls-back-to-eos"],
)
def test_batch_rows_that_stop_early_are_right_padded_like_plain(tiny_model, kwargs, pad):
    prompts = [REACHES_EOS, REPETITIVE[:7], [9, 8, 9]]
    plain, _ = batch_equals_plain(tiny_model, prompts, max_new_tokens=30, **kwargs)
    eos = kwargs.get("eos_token_id", [0])
    padded = 0
    for row in plain[:, len(REACHES_EOS) :].tolist():
        stop = next((i for i, token in enumerate(row) if token in eos), len(row))
        assert row[stop + 1 :] == [pad] * len(row[stop + 1 :])  # after EOS, only padding
        padded += len(row) - stop > 2
    assert padded  # a row stopped well before the longest one


class LastTokenIn(StoppingCriteria):
    def __init__(self, tokens):
        self.tokens = torch.tensor(tokens)

    def __call__(self, input_ids, scores, **kwargs):
        return torch.isin(input_ids[:, -1], self.tokens)  # (B,)


@pytest.mark.parametrize("eos", [None, 0], ids=["no-eos-rows-go-on", "eos-rows-padded"])
def test_batch_stopping_criteria_stop_each_row_like_plain(tiny_model, eos):
    """Without an EOS criterion, plain generate keeps decoding a stopped row (only an EOS
    criterion pads it) until every row has stopped; ours too."""
    prompts = [REACHES_EOS, REPETITIVE[:7], [9, 8, 9]]
    criteria = StoppingCriteriaList([LastTokenIn([6])])
    for speculation in ("adaptive", "fixed"):
        plain, _ = batch_equals_plain(
            tiny_model,
            prompts,
            speculation,
            max_new_tokens=30,
            eos_token_id=eos,
            pad_token_id=0,
            stopping_criteria=criteria,
        )
        new = plain[:, len(REACHES_EOS) :]
        assert new.shape[1] < 30 and int((new[:, -1] == 6).sum()) == 1


def test_batch_return_dict_and_streamer(tiny_model):
    input_ids, mask = left_padded([REPETITIVE, [5, 6, 7]])
    kwargs = dict(attention_mask=mask, max_new_tokens=10, return_dict_in_generate=True)
    plain = tiny_model.generate(input_ids, **kwargs)
    ours = tiny_model.generate(input_ids, custom_generate=promptlookup.custom_generate, **kwargs)
    assert type(ours) is type(plain) and ours.cache is None
    assert_same(plain.sequences, ours.sequences)
    streamer = RecordingStreamer()
    with pytest.raises(promptlookup.InvalidParameterError, match="stream"):
        tiny_model.generate(
            input_ids,
            attention_mask=mask,
            max_new_tokens=5,
            streamer=streamer,
            custom_generate=promptlookup.custom_generate,
        )
    assert streamer.ended == 1


def test_batch_prefix_allowed_tokens_fn_gets_each_rows_index(tiny_model):
    input_ids, mask = left_padded([REPETITIVE, [5, 6, 7], [9, 8]])
    calls = set()

    def allowed(batch_id, row_ids):
        calls.add(batch_id)
        return [4 + batch_id, 7 + batch_id, 11]

    kwargs = dict(attention_mask=mask, max_new_tokens=8, prefix_allowed_tokens_fn=allowed)
    plain = tiny_model.generate(input_ids, **kwargs)
    ours = tiny_model.generate(input_ids, custom_generate=promptlookup.custom_generate, **kwargs)
    assert_same(plain, ours)
    assert calls == {0, 1, 2} and len({tuple(row) for row in plain[:, -8:].tolist()}) > 1


def test_batch_with_right_padding_or_holes_raises(tiny_model):
    input_ids, mask = left_padded([REPETITIVE, [5, 6, 7]])
    right = torch.flip(mask, dims=[1])  # ones first, then zeros: right padding
    holes = torch.ones_like(mask)
    holes[1, 4] = 0
    for bad in (right, holes):
        with pytest.raises(promptlookup.InvalidParameterError, match="left padding"):
            tiny_model.generate(
                input_ids,
                attention_mask=bad,
                max_new_tokens=5,
                custom_generate=promptlookup.custom_generate,
            )


class RecordingStreamer:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_the_prompt_then_each_token_then_end(tiny_model):
    plain_streamer, our_streamer = RecordingStreamer(), RecordingStreamer()
    plain = tiny_model.generate(ids(REPETITIVE), max_new_tokens=20, streamer=plain_streamer)
    ours = tiny_model.generate(
        ids(REPETITIVE),
        max_new_tokens=20,
        streamer=our_streamer,
        custom_generate=promptlookup.custom_generate,
    )
    assert_same(plain, ours)
    assert our_streamer.puts == plain_streamer.puts  # [prompt (1, n)], then [token] each
    assert our_streamer.ended == plain_streamer.ended == 1
    folder_streamer = RecordingStreamer()
    tiny_model.generate(
        ids(REPETITIVE),
        max_new_tokens=20,
        streamer=folder_streamer,
        custom_generate=str(REPO_ROOT),
        trust_remote_code=True,
    )
    assert folder_streamer.puts == plain_streamer.puts and folder_streamer.ended == 1


def test_streamer_ends_even_when_the_call_is_rejected(tiny_model):
    streamer = RecordingStreamer()
    with pytest.raises(promptlookup.InvalidParameterError):
        tiny_model.generate(
            ids(REPETITIVE),
            max_new_tokens=5,
            streamer=streamer,
            output_scores=True,
            return_dict_in_generate=True,
            custom_generate=promptlookup.custom_generate,
        )
    assert streamer.ended == 1  # a TextIteratorStreamer consumer does not hang


# -- sampling -------------------------------------------------------------------------------


def first_tokens(model, prompt, seeds, **kwargs) -> list[tuple[int, ...]]:
    """The first two new tokens of a seeded sampling run per seed."""
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        sequence = model.generate(
            ids(prompt),
            do_sample=True,
            max_new_tokens=3,
            eos_token_id=None,
            pad_token_id=0,
            **kwargs,
        )
        out.append(tuple(sequence[0, len(prompt) : len(prompt) + 2].tolist()))
    return out


def test_seeded_sampling_matches_plain_sampling_in_distribution():
    """Chi-square two-sample test on the first two new tokens over many seeds (vocab 8: 64
    categories), sampling with top-p and a repetition penalty. With max_new_tokens=3 both tokens
    come from one verifying forward pass whenever the draft's first token is accepted. Each
    side uses its own seeds so the samples are independent. (This setup tells temperature 1.0
    from 0.8 at p < 0.001.)"""
    model = tiny_llama(vocab_size=8, seed=2)
    prompt = [1, 2, 3, 4] * 4
    kwargs = dict(temperature=1.0, top_p=0.95, repetition_penalty=1.1)
    cg = make_custom_generate(speculation="fixed")  # verify every draft: what is tested here
    accepted = 0
    ours = []
    for seed in range(10_000, 10_400):
        torch.manual_seed(seed)
        sequence = model.generate(
            ids(prompt),
            do_sample=True,
            max_new_tokens=3,
            eos_token_id=None,
            pad_token_id=0,
            custom_generate=cg,
            **kwargs,
        )
        ours.append(tuple(sequence[0, len(prompt) : len(prompt) + 2].tolist()))
        accepted += cg.last_stats.accepted_tokens
    plain = first_tokens(model, prompt, range(400), **kwargs)
    categories = sorted(set(plain) | set(ours))
    table = [[plain.count(c) for c in categories], [ours.count(c) for c in categories]]
    assert len(categories) > 10  # a real distribution, not a point mass
    assert chi2_contingency(table).pvalue > 0.001
    assert accepted >= 20  # drafts were verified by sampling, not just plain steps


def test_same_seed_gives_the_same_sample_as_plain_generate():
    """Not a guarantee (verifying several positions in one forward pass may change the logits'
    last bits), but both draw once per token from torch's global RNG in the same order, so on
    this tiny model the same seed gives the same tokens."""
    model = tiny_llama(vocab_size=8, seed=2)
    prompt = [1, 2, 3, 4] * 4
    cg = make_custom_generate(speculation="fixed")
    accepted = 0
    for seed in range(40):
        torch.manual_seed(seed)
        plain = model.generate(ids(prompt), do_sample=True, max_new_tokens=6, top_k=5)
        torch.manual_seed(seed)
        ours = model.generate(
            ids(prompt), do_sample=True, max_new_tokens=6, top_k=5, custom_generate=cg
        )
        assert_same(plain, ours)
        accepted += cg.last_stats.accepted_tokens
    assert accepted > 0


# -- the repository folder and the function wrapper -----------------------------------------


def test_repository_folder_works_as_custom_generate(tiny_model):
    plain = tiny_model.generate(ids(REPETITIVE), max_new_tokens=30)
    ours = tiny_model.generate(
        ids(REPETITIVE), max_new_tokens=30, custom_generate=str(REPO_ROOT), trust_remote_code=True
    )
    assert_same(plain, ours)
    out = tiny_model.generate(
        ids(REPETITIVE),
        max_new_tokens=30,
        custom_generate=str(REPO_ROOT),
        trust_remote_code=True,
        drafter="none",
        return_dict_in_generate=True,
    )
    assert_same(plain, out.sequences)


def test_model_repository_shipping_the_folder_generates_with_promptlookup(tiny_model, tmp_path):
    """A model saved with custom_generate/ beside its weights, loaded with trust_remote_code,
    gets promptlookup as its ``generate`` (transformers binds it with functools.partial)."""
    from transformers import AutoModelForCausalLM

    tiny_model.save_pretrained(tmp_path)
    shutil.copytree(REPO_ROOT / "custom_generate", tmp_path / "custom_generate")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert isinstance(loaded.generate, functools.partial)
    plain = tiny_model.generate(ids(REPETITIVE), max_new_tokens=30)
    assert_same(plain, loaded.generate(ids(REPETITIVE), max_new_tokens=30))


def test_repository_folder_needs_trust_remote_code(tiny_model):
    with pytest.raises(ValueError, match="trust_remote_code"):
        tiny_model.generate(
            ids(REPETITIVE),
            max_new_tokens=5,
            custom_generate=str(REPO_ROOT),
            trust_remote_code=False,
        )


def test_function_wrapper_passes_drafter_options(tiny_model):
    calls = []

    def drafter(tokens, max_tokens):
        calls.append(max_tokens)
        return []

    plain = tiny_model.generate(ids(REPETITIVE), max_new_tokens=10)
    ours = promptlookup_generate(tiny_model, ids(REPETITIVE), max_new_tokens=10, drafter=drafter)
    assert_same(plain, ours)
    assert calls == list(range(8, 0, -1))  # the room left for a draft, from the second step


# -- the real default model -----------------------------------------------------------------


def chat_ids(lm, text: str) -> torch.Tensor:
    return ids(lm.encode([{"role": "user", "content": text}]))


def test_stop_strings_with_tokenizer_equal_plain(default_lm):
    model, tokenizer = default_lm.model.as_transformers(), default_lm.tokenizer
    prompt = chat_ids(default_lm, "List three fruits, one per line.")
    kwargs = dict(max_new_tokens=40, stop_strings=["\n"], tokenizer=tokenizer, do_sample=False)
    plain = model.generate(prompt, **kwargs)
    assert tokenizer.decode(plain[0, prompt.shape[1] :]).endswith("\n")  # the stop string fired
    # The function wrapper and the repository folder handle stop_strings + tokenizer.
    assert_same(plain, promptlookup_generate(model, prompt, **kwargs))
    assert_same(
        plain,
        model.generate(prompt, custom_generate=str(REPO_ROOT), trust_remote_code=True, **kwargs),
    )
    # The callable: equal with the stop strings as a stopping criterion...
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, ["\n"])])
    ours = model.generate(
        prompt,
        max_new_tokens=40,
        do_sample=False,
        stopping_criteria=criteria,
        custom_generate=promptlookup.custom_generate,
    )
    assert_same(plain, ours)
    # ...because transformers 5.24 drops tokenizer= for callables (update this when it stops).
    with pytest.raises(ValueError, match="tokenizer"):
        model.generate(prompt, custom_generate=promptlookup.custom_generate, **kwargs)


def test_text_iterator_streamer_receives_the_same_text(default_lm):
    model, tokenizer = default_lm.model.as_transformers(), default_lm.tokenizer
    prompt = chat_ids(default_lm, "Repeat exactly: the quick brown fox jumps over the lazy dog.")

    def streamed(**kwargs) -> str:
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=120)
        thread = threading.Thread(
            target=model.generate,
            kwargs=dict(
                inputs=prompt, max_new_tokens=24, do_sample=False, streamer=streamer, **kwargs
            ),
        )
        thread.start()
        text = "".join(streamer)
        thread.join()
        return text

    plain = streamed()
    assert plain.strip()
    assert streamed(custom_generate=promptlookup.custom_generate) == plain


def test_text_streamer_prints_the_same(default_lm, capsys):
    model, tokenizer = default_lm.model.as_transformers(), default_lm.tokenizer
    prompt = chat_ids(default_lm, "Say hello.")
    model.generate(prompt, max_new_tokens=12, do_sample=False, streamer=TextStreamer(tokenizer))
    plain = capsys.readouterr().out
    model.generate(
        prompt,
        max_new_tokens=12,
        do_sample=False,
        streamer=TextStreamer(tokenizer),
        custom_generate=promptlookup.custom_generate,
    )
    assert capsys.readouterr().out == plain


def test_code_edit_prompt_greedy_equals_plain(default_lm, shared_data):
    path = shared_data / "code_edit.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    with path.open() as f:
        record = json.loads(f.readline())
    prompt = ids(default_lm.encode(record["messages"]))
    cg = make_custom_generate()
    plain = default_lm.model.as_transformers().generate(prompt, max_new_tokens=96, do_sample=False)
    ours = default_lm.model.as_transformers().generate(
        prompt, max_new_tokens=96, do_sample=False, custom_generate=cg
    )
    assert_same(plain, ours)
    assert cg.last_stats.forward_passes < cg.last_stats.new_tokens


def test_adaptive_by_default_with_one_policy_per_model_and_fixed_on_request(tiny_model):
    """The default verifies only what the policy finds worth it (measured costs, learned
    acceptance, kept per model object); speculation="fixed" verifies whole drafts."""
    from promptlookup.hf_generate import _POLICIES, policy_for

    model = tiny_llama(seed=3)
    assert model not in _POLICIES
    plain = model.generate(ids(REPETITIVE), do_sample=False, max_new_tokens=30)
    fixed = make_custom_generate(speculation="fixed")
    assert_same(
        plain,
        model.generate(ids(REPETITIVE), do_sample=False, max_new_tokens=30, custom_generate=fixed),
    )
    assert model not in _POLICIES  # fixed: no policy, no calibration
    adaptive = make_custom_generate()
    assert_same(
        plain,
        model.generate(
            ids(REPETITIVE), do_sample=False, max_new_tokens=30, custom_generate=adaptive
        ),
    )
    assert policy_for(model) is _POLICIES[model] and policy_for(model).calibrated
    assert adaptive.last_stats.drafted_tokens <= fixed.last_stats.drafted_tokens
    with pytest.raises(promptlookup.InvalidParameterError, match="speculation"):
        make_custom_generate(speculation="sometimes")


def test_kernel_choices_are_timed_once_per_model_not_per_call(monkeypatch):
    """Timing the matrix-product kernels takes seconds on a real model, so calls with the same
    model object reuse the choices; a model cast to another dtype gets its own."""
    from promptlookup.backends.gguf.linear import LinearKernels
    from promptlookup.hf_generate import target_for

    timed = []
    fastest = LinearKernels._fastest
    monkeypatch.setattr(
        LinearKernels,
        "_fastest",
        lambda self, modules, rows: timed.append(rows) or fastest(self, modules, rows),
    )
    model = tiny_llama(seed=5)
    plain = model.generate(ids(REPETITIVE), do_sample=False, max_new_tokens=30)
    timed_after = []
    for _ in range(2):
        assert_same(
            plain,
            model.generate(
                ids(REPETITIVE),
                do_sample=False,
                max_new_tokens=30,
                custom_generate=make_custom_generate(speculation="fixed"),
            ),
        )
        timed_after.append(len(timed))
    assert timed_after[0] > 0 and timed_after[1] == timed_after[0]  # the second call timed nothing
    assert target_for(model).kernels is target_for(model).kernels
    float32_kernels = target_for(model).kernels
    model.to(torch.bfloat16)
    assert target_for(model).kernels is not float32_kernels
