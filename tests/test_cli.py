"""The command line (click's CliRunner): --help is documentation, bad input gives a non-zero
exit and one readable line (no traceback), and a good run prints what it promises."""

from __future__ import annotations

import json

import pytest
from _fixtures import cached_default_model, one_thread  # noqa: F401 (fixtures)
from click.testing import CliRunner

import promptlookup
from promptlookup.cli import main

STATS_KEYS = {
    "new_tokens",
    "forward_passes",
    "drafted_tokens",
    "accepted_tokens",
    "seconds",
    "tokens_per_second",
}
PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog."


@pytest.fixture
def runner():
    return CliRunner()


def assert_one_line_error(result, *needles: str) -> str:
    """Non-zero exit, no traceback, one ``Error:`` line (click may add its usage hint)."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    others = [line for line in lines if not line.startswith(("Error:", "Usage:", "Try "))]
    assert others == [], result.output
    for needle in needles:
        assert needle.lower() in errors[0].lower(), errors[0]
    return errors[0]


# -- help ----------------------------------------------------------------------------------------


def test_main_help_lists_the_commands(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "same output" in result.output
    listed = result.output.split("Commands:")[1]  # click's list, the only one
    assert set(main.list_commands(None)) == {"bench", "generate", "serve", "vllm-serve"}
    for command in main.list_commands(None):  # each loads (vLLM itself is imported on use)
        assert f"\n  {command} " in listed, command
    assert runner.invoke(main, ["-h"]).output == result.output


def test_generate_help_documents_the_options(runner):
    result = runner.invoke(main, ["generate", "--help"])
    assert result.exit_code == 0
    for option in (
        "--prompt-file",
        "--chat",
        "--model",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--repetition-penalty",
        "--seed",
        "--stop",
        "--drafter",
        "--draft-tokens",
        "--json",
        "Examples:",
        "stdin",
    ):
        assert option in result.output, option


def test_version(runner):
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and promptlookup.__version__ in result.output


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--max-new-tokens", "0"], ["max-new-tokens"]),
        (["--temperature", "-1"], ["temperature"]),
        (["--temperature", "nan"], ["temperature"]),
        (["--top-p", "0"], ["top_p"]),
        (["--top-p", "1.5"], ["top_p"]),
        (["--top-k", "-1"], ["top-k"]),
        (["--repetition-penalty", "0"], ["repetition_penalty"]),
        (["--draft-tokens", "0"], ["draft-tokens"]),
        (["--drafter", "magic"], ["magic"]),
        (["--dtype", "float64"], ["dtype"]),
    ],
)
def test_bad_parameter_gives_one_line(runner, args, needles):
    # Checked before any model is loaded: a missing model would be reported otherwise.
    result = runner.invoke(main, ["generate", "--model", "./nope.gguf", *args, PROMPT])
    assert_one_line_error(result, *needles)


@pytest.mark.parametrize("model", ["./nope.gguf", "./missing-folder/", "/no/such/model"])
def test_unknown_model_path(runner, model):
    result = runner.invoke(main, ["generate", "--model", model, PROMPT])
    assert_one_line_error(result, model.rstrip("/"))


@pytest.mark.parametrize("offline_env", [False, True])
def test_unknown_hub_id_fails_fast_with_one_line(runner, monkeypatch, offline_env):
    """A bare name that is neither a path nor cached: one quick line, no retried downloads."""
    import huggingface_hub
    from huggingface_hub import constants

    def no_network(self, repo_id, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline_env)
    result = runner.invoke(main, ["generate", "--model", "no-such-model-xyz", PROMPT])
    assert_one_line_error(
        result, "no-such-model-xyz", "HF_HUB_OFFLINE" if offline_env else "offline"
    )


def test_folder_without_config(runner, tmp_path):
    result = runner.invoke(main, ["generate", "--model", str(tmp_path), PROMPT])
    assert_one_line_error(result, "config.json")


def test_corrupt_gguf(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    result = runner.invoke(main, ["generate", "--model", str(junk), PROMPT])
    assert_one_line_error(result, "junk.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    result = runner.invoke(main, ["generate", "--model", str(empty), PROMPT])
    assert_one_line_error(result, "empty.gguf")


def test_model_file_that_is_not_gguf(runner, tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0" * 16)
    result = runner.invoke(main, ["generate", "--model", str(weights), PROMPT])
    assert_one_line_error(result, "gguf")


@pytest.mark.parametrize("args, stdin", [([""], None), (["   \n"], None), ([], ""), (["-"], " ")])
def test_empty_prompt(runner, args, stdin):
    result = runner.invoke(main, ["generate", *args], input=stdin)
    assert_one_line_error(result, "empty")


def test_empty_prompt_file(runner, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("")
    result = runner.invoke(main, ["generate", "--prompt-file", str(path)])
    assert_one_line_error(result, "empty")


def test_prompt_and_prompt_file_together(runner, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text(PROMPT)
    result = runner.invoke(main, ["generate", "-f", str(path), PROMPT])
    assert_one_line_error(result, "not both")


def test_prompt_beyond_the_context(runner, cached_default_model):
    result = runner.invoke(main, ["generate", "--max-new-tokens", "9000", PROMPT])
    assert_one_line_error(result, "9000", "8192")


# -- good runs -----------------------------------------------------------------------------------


def check_json(result) -> dict:
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"text", "token_ids", "stats"} <= set(data)
    assert STATS_KEYS <= set(data["stats"])
    assert isinstance(data["text"], str)
    assert data["stats"]["new_tokens"] == len(data["token_ids"]) <= 24
    assert data["stats"]["accepted_tokens"] <= data["stats"]["drafted_tokens"]
    return data


def test_generate_json_chat_real_load(runner):
    """The whole path, model load included (seconds when the converted model is cached)."""
    result = runner.invoke(main, ["generate", "--json", "--chat", "--max-new-tokens", "24", PROMPT])
    data = check_json(result)
    assert data["stats"]["forward_passes"] >= 1 and data["token_ids"]


def test_prompt_from_file_and_stdin_give_the_same_output(runner, cached_default_model, tmp_path):
    args = ["generate", "--json", "--chat", "--max-new-tokens", "24"]
    from_arg = check_json(runner.invoke(main, [*args, PROMPT]))
    path = tmp_path / "prompt.txt"
    path.write_text(PROMPT, encoding="utf-8")
    from_file = check_json(runner.invoke(main, [*args, "--prompt-file", str(path)]))
    from_stdin = check_json(runner.invoke(main, args, input=PROMPT))
    from_dash = check_json(runner.invoke(main, [*args, "-"], input=PROMPT))
    assert (
        from_arg["token_ids"]
        == from_file["token_ids"]
        == from_stdin["token_ids"]
        == from_dash["token_ids"]
    )
    plain = check_json(runner.invoke(main, [*args, "--drafter", "none", PROMPT]))
    assert plain["token_ids"] == from_arg["token_ids"]
    assert plain["stats"]["drafted_tokens"] == 0


def test_streaming_output_and_summary(runner, cached_default_model):
    result = runner.invoke(
        main,
        [
            "generate",
            "--chat",
            "-n",
            "16",
            "--draft-tokens",
            "4",
            "--min-match",
            "2",
            "--max-match",
            "8",
            PROMPT,
        ],
    )
    assert result.exit_code == 0, result.output
    expected = cached_default_model.generate(PROMPT, chat=True, max_new_tokens=16, drafter="none")
    assert result.stdout == expected.text + "\n"
    assert "tokens per forward pass" in result.stderr


def test_stop_and_sampling_options(runner, cached_default_model):
    args = [
        "generate",
        "--json",
        "--chat",
        "-n",
        "24",
        "--temperature",
        "0.7",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--repetition-penalty",
        "1.1",
        "--seed",
        "3",
        PROMPT,
    ]
    first = check_json(runner.invoke(main, args))
    assert check_json(runner.invoke(main, args))["token_ids"] == first["token_ids"]
    words = first["text"].split()
    assert len(words) > 2
    stopped = check_json(runner.invoke(main, [*args, "--stop", words[2]]))
    assert words[2] not in stopped["text"]
    assert first["text"].startswith(stopped["text"])
    assert len(stopped["token_ids"]) < len(first["token_ids"])


def test_importing_the_package_and_cli_help_do_not_load_torch():
    """`import promptlookup` and `promptlookup --help` stay fast: torch loads on first use."""
    import subprocess
    import sys

    code = (
        "import sys, promptlookup; from promptlookup import PromptLookupDrafter, make_drafter\n"
        "from promptlookup.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'fastapi' not in sys.modules, 'fastapi was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
