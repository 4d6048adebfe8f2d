"""The server's settings: one dataclass whose fields carry their default, help text and check,
from which the options of ``promptlookup serve`` are generated (:func:`settings_options`).

>>> ServerSettings(max_queue=4).max_queue
4
>>> ServerSettings(max_queue=0)
Traceback (most recent call last):
    ...
promptlookup.errors.InvalidParameterError: --max-queue: 0 is not in the range x>=1.

Only click is imported here, so that ``promptlookup --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import click

from ..drafters.cross_request import INDEX_TOKENS
from ..drafters.shared_lookup import SHARING
from ..errors import InvalidParameterError
from ..limits import MAX_TENANTS
from ..prefix_disk import DEFAULT_DISK_MIB


def setting(default: Any, flag: str, help: str, type: Any = None, **option: Any) -> Any:
    """A settings field: its ``default``, and the ``promptlookup serve`` option ``flag`` with
    its ``help`` and click ``type`` (also the check the field's value must pass)."""
    return field(default=default, metadata={"flag": flag, "help": help, "type": type, **option})


class Spelling(click.Choice):
    """A choice that also takes older spellings of its values (``older``: old -> new), which
    ``--help`` does not show."""

    def __init__(self, choices, older: dict[str, str]) -> None:
        super().__init__(choices)
        self.older = older

    def convert(self, value, param, ctx):
        return super().convert(self.older.get(value, value), param, ctx)


@dataclass
class ServerSettings:
    """Everything ``promptlookup serve`` and :func:`~promptlookup.server.create_app` take
    besides the model. Values are checked on creation (an
    :class:`~promptlookup.errors.InvalidParameterError` naming the option)."""

    host: str = setting(
        "127.0.0.1",
        "--host",
        "Address to listen on. The default accepts local connections only; any other "
        "address exposes the server to the network (use --api-key).",
    )
    port: int = setting(
        8000, "--port", "Port to listen on (0 picks a free one).", click.IntRange(0, 65535)
    )
    api_key: tuple[str, ...] = setting(
        (),
        "--api-key",
        "Require 'Authorization: Bearer KEY' on /v1/* (else HTTP 401). Repeat it for several "
        "keys, each its own tenant (see --api-keys-file). Also read from PROMPTLOOKUP_API_KEY "
        "(keys separated by spaces), which keeps them out of `ps`.",
        envvar="PROMPTLOOKUP_API_KEY",
        metavar="KEY",
        multiple=True,
    )
    api_keys_file: str | None = setting(
        None,
        "--api-keys-file",
        "A file of 'TENANT KEY' lines: more keys, a request's tenant being its key's name. "
        "Tenants never share a cross-request index or prefix cache entries, since the speed "
        "of a reply could reveal another client's prompt or answer.",
        click.Path(exists=True, dir_okay=False),
        metavar="FILE",
    )
    model_id: str | None = setting(
        None, "--model-id", "The name clients send as 'model' [default: the model's name]."
    )
    model_alias: tuple[str, ...] = setting(
        (),
        "--model-alias",
        "Another name a request's 'model' may give (repeatable), such as the one an agent is "
        "set up with; '*' takes any name, as llama-server does. Answers name --model-id.",
        metavar="NAME",
        multiple=True,
    )
    max_batch: int | None = setting(
        None,
        "--max-batch",
        "Sequences that share each forward pass (continuous batching); 1 runs one "
        "generation at a time [default: 4 per core, at most 16, fewer if the "
        "machine's memory cannot hold their caches at full context].",
        click.IntRange(min=1),
    )
    prefill_tokens: int | None = setting(
        None,
        "--prefill-tokens",
        "Prompt tokens a step carries while other sequences decode: more lifts "
        "throughput and shortens later requests' time to first token; fewer keeps "
        "running streams' inter-token latency low (such a step costs about one pass "
        "over this many tokens) [default: 512].",
        click.IntRange(min=1),
    )
    max_queue: int = setting(
        16,
        "--max-queue",
        "Requests that may wait beyond the running batch; then HTTP 429.",
        click.IntRange(min=1),
    )
    default_max_tokens: int = setting(
        512,
        "--default-max-tokens",
        "Token limit of requests without max_tokens (capped by the context left).",
        click.IntRange(min=1),
    )
    max_body_bytes: int = setting(
        4 * 1024 * 1024,
        "--max-body-bytes",
        "Largest request body accepted; a larger one gets HTTP 413.",
        click.IntRange(min=1),
    )
    body_timeout: float = setting(
        30.0,
        "--body-timeout",
        "Seconds a request body may take to arrive; a client "
        "that stalls longer gets HTTP 408 and is disconnected.",
        click.FloatRange(min=0, min_open=True),
    )
    header_timeout: float = setting(
        10.0,
        "--header-timeout",
        "Seconds a connection may take to send a complete request head (its first "
        "one, or the next after some bytes of it); then it is closed.",
        click.FloatRange(min=0, min_open=True),
    )
    stream_keepalive: float = setting(
        5.0,
        "--stream-keepalive",
        "Seconds a stream may go without an event before the server sends a keep-alive (an "
        "SSE comment; Anthropic's ping event on /v1/messages), so that clients' idle timers "
        "do not fire while a request waits in the queue or its long prompt is prefilled; a "
        "stream's response also begins after this long in the queue. 0: never.",
        click.FloatRange(min=0),
        metavar="SECONDS",
    )
    reasoning_format: str = setting(
        "auto",
        "--reasoning-format",
        "A thinking model's <think> text (where the chat template has such markers): 'auto' "
        "answers it apart, as chat's reasoning_content, Anthropic's thinking blocks and a "
        "Responses reasoning item; 'none' leaves it in the answer's text.",
        click.Choice(["auto", "none"]),
    )
    cross_request: str = setting(
        "per-tenant",
        "--cross-request",
        "Prompt lookup also drafts from earlier requests' outputs (a bounded index): 'off'; "
        "'per-tenant', an index per tenant (one when no key is set; 'per-key' before 0.15), "
        "since acceptance speed could reveal another client's answers; or 'global', one index "
        "for every request.",
        Spelling(SHARING, older={"per-key": "per-tenant"}),
    )
    cross_request_tokens: int = setting(
        INDEX_TOKENS,
        "--cross-request-tokens",
        "Tokens each cross-request index holds (about 1.3 KB each at most), the oldest "
        f"outputs evicted first; at most {MAX_TENANTS} indexes (tenants), the least recently "
        "used forgotten.",
        click.IntRange(min=1),
    )
    prefix_cache_mib: int | None = setting(
        None,
        "--prefix-cache-mib",
        "MiB of keys and values of recent prompts and answers kept in memory for later "
        "requests that start with the same tokens (a conversation's next turn prefills only "
        "its new tokens); least recently used first out (to the disk tier, if any); the "
        "latest conversation larger than this is kept beside it; 0 turns the cache off. Exact: only on "
        "row-invariant targets (the default GGUF on the CPU). [default: 64 with a disk "
        "tier, 1024 without]",
        click.IntRange(min=0),
    )
    prefix_cache_scope: str = setting(
        "per-tenant",
        "--prefix-cache-scope",
        "Whose cached prefixes a request reuses: its own tenant's ('per-tenant': one tenant "
        "without keys) or every request's ('global', whose reply times may reveal whether "
        "another client sent a prompt).",
        click.Choice(["per-tenant", "global"]),
    )
    prefix_cache_dir: str = setting(
        "auto",
        "--prefix-cache-dir",
        "Folder (made, readable by this user only, if missing) where the prefix cache also "
        "keeps its blocks, within --prefix-cache-disk-mib: prefixes evicted from memory, and "
        "every conversation after a restart, are read back from there. Reused only for the "
        "same model weights, engine, KV dtype, tenant and tokens; a damaged file is skipped. "
        "'auto': prefix-cache in $PROMPTLOOKUP_CACHE or ~/.cache/promptlookup (memory only, "
        "with a warning, where it cannot be made); 'none': memory only.",
        metavar="DIR|auto|none",
    )
    prefix_cache_disk_mib: int = setting(
        DEFAULT_DISK_MIB,
        "--prefix-cache-disk-mib",
        "MiB of files in --prefix-cache-dir, least recently used first out.",
        click.IntRange(min=1),
    )
    threads: int | None = setting(
        None,
        "--threads",
        "CPU threads for torch [default: torch's choice, one per core]. On a busy "
        "machine, 1 can be much faster than oversubscribed cores.",
        click.IntRange(min=1),
    )
    log_level: str = setting(
        "info",
        "--log-level",
        "Messages logged: the server's and uvicorn's.",
        click.Choice(["critical", "error", "warning", "info", "debug"]),
    )
    #: The drafter spec and options of requests without a prediction, as in
    #: :func:`promptlookup.make_drafter` (serve's drafter flags, shared with generate).
    drafter: str = "prompt-lookup"
    drafter_options: dict = field(default_factory=dict)
    #: More keyword arguments for every generation (e.g. ``{"speculation": "fixed"}``).
    generation_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api_key is None or isinstance(self.api_key, str):  # one key, or none
            self.api_key = (self.api_key,) if self.api_key else ()
        self.api_key = tuple(self.api_key)
        if isinstance(self.model_alias, str):
            self.model_alias = (self.model_alias,)
        self.model_alias = tuple(self.model_alias)
        for item in options():
            value = getattr(self, item.name)
            if value is None or item.metadata["type"] is None:
                continue
            try:
                setattr(self, item.name, item.metadata["type"].convert(value, None, None))
            except click.BadParameter as exc:
                raise InvalidParameterError(f"{item.metadata['flag']}: {exc.message}") from None

    def replace(self, **changes: Any) -> ServerSettings:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def options() -> list[dataclasses.Field]:
    """The settings that are options of ``promptlookup serve``, in help order."""
    return [item for item in dataclasses.fields(ServerSettings) if "flag" in item.metadata]


def settings_options(func):
    """Add one click option per setting to a command; its parameter is the field's name."""
    for item in reversed(options()):
        meta = dict(item.metadata)
        flag, kind = meta.pop("flag"), meta.pop("type")
        func = click.option(
            flag,
            item.name,
            type=kind,
            default=item.default,
            show_default=item.default not in (None, ()),
            **meta,
        )(func)
    return func
