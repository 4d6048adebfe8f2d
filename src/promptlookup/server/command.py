"""The ``promptlookup serve`` command: a thin layer over :func:`promptlookup.server.create_app`
and uvicorn."""

from __future__ import annotations

import logging

import click

from ..cli import drafter_kwargs, drafter_options, friendly_errors, model_options

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@click.command()
@model_options
@click.option(
    "--backend",
    type=click.Choice(["transformers", "llama.cpp"]),
    default="transformers",
    show_default=True,
    help="As for generate: llama.cpp runs a .gguf model with "
    "llama-cpp-python (--dtype is then ignored).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The default accepts local connections only; any other "
    "address exposes the server to the network (use --api-key).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0 picks a free one).",
)
@click.option(
    "--api-key",
    envvar="PROMPTLOOKUP_API_KEY",
    default=None,
    metavar="KEY",
    help="Require 'Authorization: Bearer KEY' on /v1/* (else HTTP 401). "
    "Also read from PROMPTLOOKUP_API_KEY, which keeps it out of `ps`.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=None,
    help="Sequences that share each forward pass (continuous batching); 1 runs one "
    "generation at a time [default: 4 per core, at most 16, fewer if the "
    "machine's memory cannot hold their caches at full context].",
)
@click.option(
    "--prefill-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Prompt tokens a step carries while other sequences decode: more lifts "
    "throughput and shortens later requests' time to first token; fewer keeps "
    "running streams' inter-token latency low (such a step costs about one pass "
    "over this many tokens) [default: 512].",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests that may wait beyond the running batch; then HTTP 429.",
)
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Token limit of requests without max_tokens (capped by the context left).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads for torch [default: torch's choice, one per core]. On a busy "
    "machine, 1 can be much faster than oversubscribed cores.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a request body may take to arrive; a client "
    "that stalls longer gets HTTP 408 and is disconnected.",
)
@click.option(
    "--model-id", default=None, help="The name clients send as 'model' [default: the model's name]."
)
@drafter_options
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
@friendly_errors
def serve(
    model,
    dtype,
    device,
    backend,
    host,
    port,
    api_key,
    max_batch,
    prefill_tokens,
    max_queue,
    default_max_tokens,
    threads,
    body_timeout,
    model_id,
    drafter,
    speculation,
    draft_tokens,
    min_match,
    max_match,
    log_level,
):
    """Run an OpenAI-compatible HTTP server over one model.

    \b
    Endpoints:
      POST /v1/chat/completions  chat; "stream": true for server-sent events
      POST /v1/completions       text completion (a prompt string or token ids)
      GET  /v1/models            the served model's id (send it as "model")
      GET  /v1/models/{id}       that model (404 for any other id)
      GET  /health               503 while the model loads, 200 when ready
      GET  /openapi.json         the request and response bodies (OpenAPI 3)

    The server listens at once and loads the model in the background. Requests take OpenAI's
    parameters (max_tokens, temperature [default 1; 0 = greedy], top_p, seed, stop, stream,
    stream_options.include_usage, user, n, logprobs, top_logprobs) plus top_k and
    repetition_penalty; tools and structured output (response_format) are refused (400).
    OpenAI's "prediction" (predicted output) becomes the prompt lookup drafter's reference
    text. The response's usage.speculative reports forward passes, drafted and accepted tokens.
    The full list: docs/server.md.

    Up to --max-batch sequences generate together, every step verifying all their drafts in
    one forward pass; each gets exactly the text it would get alone. Requests join and leave
    the batch between steps (a joining prompt is read in chunks, so running streams keep
    going); --max-queue more may wait, and further requests get HTTP 429. A request with n > 1
    is n sequences of the batch. A client that disconnects cancels its generation only. Without max_tokens a request generates at
    most --default-max-tokens tokens; a prompt plus max_tokens beyond the model's context is a
    400 error. 429 and 503 answers carry Retry-After. On SIGTERM the server stops taking
    requests, answers the waiting ones with a 503 and ends the running stream with an error
    event and [DONE].

    \b
    Example:
      promptlookup serve --port 8000
      curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "SmolLM2-135M-Instruct.Q4_1", "temperature": 0,
             "messages": [{"role": "user", "content": "Hi"}]}'
    """
    import uvicorn

    import promptlookup

    from ..drafters import check_drafter_spec
    from ..models import resolve_model
    from .app import create_app
    from .state import Server

    options = drafter_kwargs(draft_tokens, min_match, max_match)
    check_drafter_spec(drafter, **options)  # bad drafter settings: one line, before anything starts
    source = resolve_model(model)  # an unknown model: one line, before anything starts
    if host not in LOOPBACK_HOSTS:
        click.echo(
            f"warning: listening on {host}, reachable from other machines"
            + ("" if api_key else " and without --api-key"),
            err=True,
        )
    if threads is not None:
        import torch

        torch.set_num_threads(threads)  # a process-wide setting, seen by the generation thread
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-9s %(message)s"))
    logger = logging.getLogger("promptlookup")
    logger.addHandler(handler)
    logger.setLevel(log_level.upper())

    server: Server | None = None

    def load():
        lm = promptlookup.load_model(model, dtype=dtype, device=device, backend=backend)
        logger.info("measuring forward-pass costs (kept on disk: the first start only)")
        lm.warm_up()  # so that no request pays for it
        logger.info("model %s ready", app.state.server.model_id)
        return lm

    def stop_on_load_error(message: str) -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(
        load,
        model_id=model_id or source.name,
        api_key=api_key,
        max_queue=max_queue,
        default_max_tokens=default_max_tokens,
        drafter=drafter,
        drafter_options=options,
        on_load_error=stop_on_load_error,
        generation_options={"speculation": speculation},
        body_timeout=body_timeout,
        max_batch=max_batch,
        prefill_tokens=prefill_tokens,
    )
    logger.info("loading %s in the background (GET /health is 503 until it is ready)", source.name)
    server = Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    )
    server.run()
    if app.state.server.load_error:
        raise click.ClickException(f"cannot load the model: {app.state.server.load_error}")
