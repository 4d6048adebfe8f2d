"""The ``promptlookup serve`` command: a thin layer over :func:`promptlookup.server.create_app`
and uvicorn."""

from __future__ import annotations

import logging

import click

from ..cli import (
    backend_option,
    drafter_options,
    friendly_errors,
    kv_dtype_option,
    model_options,
)
from .settings import ServerSettings, settings_options

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@click.command()
@model_options
@backend_option
@kv_dtype_option
@settings_options
@drafter_options
@friendly_errors
def serve(model, dtype, device, backend, kv_dtype, drafter, speculation, drafter_options, **fields):
    """Run an OpenAI-compatible HTTP server over one model.

    \b
    Endpoints:
      POST /v1/chat/completions  chat; "stream": true for server-sent events
      POST /v1/completions       text completion (a prompt string or token ids)
      POST /v1/messages          Anthropic's Messages API (text, tool_use, tool_result)
      POST /v1/messages/count_tokens  the prompt tokens of such a request
      POST /v1/responses         OpenAI's Responses API (stateless: send the whole input)
      GET  /v1/models            the served model's id (send it as "model")
      GET  /v1/models/{id}       that model (404 for any other id)
      GET  /health               503 while the model loads, 200 when ready
      GET  /metrics              Prometheus metrics (behind the key, as /v1 is)
      POST /tokenize, /detokenize  token ids and back (llama-server's and vLLM's shapes)
      GET  /openapi.json         the request and response bodies (OpenAPI 3)

    The server listens at once and loads the model in the background. Requests take OpenAI's
    parameters (max_tokens, temperature [default 1; 0 = greedy], top_p, seed, stop, stream,
    stream_options.include_usage, user, n, logprobs, top_logprobs) plus top_k and
    repetition_penalty. response_format (json_object, json_schema) and tools (tool_choice,
    parallel_tool_calls) are enforced by a grammar, whose forced tokens are drafted for free;
    tools go through the chat template where it takes them in the Hermes format, else a
    generic JSON format. OpenAI's "prediction" (predicted output) becomes the prompt lookup
    drafter's reference text. The response's usage.speculative reports forward passes,
    drafted and accepted tokens; usage.prompt_tokens_details.cached_tokens the prompt tokens
    the prefix cache held. The full list: docs/server.md.

    Up to --max-batch sequences generate together, every step verifying all their drafts in
    one forward pass; each gets exactly the text it would get alone. Requests join and leave
    the batch between steps (a joining prompt is read in chunks, so running streams keep
    going); --max-queue more may wait, and further requests get HTTP 429. A request with n > 1
    is n sequences of the batch. A client that disconnects cancels its generation only. A
    request starting with tokens its tenant sent before (a conversation's next turn) reads
    their keys and values from the prefix cache (--prefix-cache-mib) and computes only the
    rest. A generation ends at max_tokens (without it, --default-max-tokens) or where the
    model's context is full; a prompt that fills the context is a 400 error. 429 and 503
    answers carry Retry-After. On SIGTERM the server stops taking requests, answers the
    waiting ones with a 503 and ends the running stream with an error event and [DONE].

    \b
    Example:
      promptlookup serve --port 8000
      curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "SmolLM2-135M-Instruct.Q4_1", "temperature": 0,
             "messages": [{"role": "user", "content": "Hi"}]}'
    """
    import promptlookup

    from ..drafters import check_drafter_spec
    from ..models import resolve_model
    from .app import create_app
    from .state import Server

    check_drafter_spec(drafter, **drafter_options)  # bad ones: one line, before anything starts
    settings = ServerSettings(
        **fields,
        drafter=drafter,
        drafter_options=drafter_options,
        generation_options={"speculation": speculation},
    )
    source = resolve_model(model)  # an unknown model: one line, before anything starts
    if settings.host not in LOOPBACK_HOSTS:
        click.echo(
            f"warning: listening on {settings.host}, reachable from other machines"
            + ("" if settings.api_key or settings.api_keys_file else " and without --api-key"),
            err=True,
        )
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)  # process-wide, seen by the generation thread
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-9s %(message)s"))
    logger = logging.getLogger("promptlookup")
    logger.addHandler(handler)
    logger.setLevel(settings.log_level.upper())

    server: Server | None = None

    def load():
        lm = promptlookup.load_model(
            model, dtype=dtype, device=device, backend=backend, kv_dtype=kv_dtype
        )
        logger.info("measuring forward-pass costs (kept on disk: the first start only)")
        lm.warm_up()  # so that no request pays for it
        logger.info("model %s ready", app.state.server.model_id)
        return lm

    def stop_on_load_error(message: str) -> None:
        if server is not None:
            server.should_exit = True

    if settings.model_id is None:  # the file's name, and the name it was given by, if other
        given = () if model is None or str(model) == source.name else (str(model),)
        settings = settings.replace(
            model_id=source.name, model_alias=(*settings.model_alias, *given)
        )
    app = create_app(load, settings, on_load_error=stop_on_load_error)
    logger.info("loading %s in the background (GET /health is 503 until it is ready)", source.name)
    server = Server.for_app(app)
    server.run()
    if app.state.server.load_error:
        raise click.ClickException(f"cannot load the model: {app.state.server.load_error}")
