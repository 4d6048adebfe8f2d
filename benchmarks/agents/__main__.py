"""``python -m benchmarks.agents``: install the agents, or run the check (``make test-agents``
does both), or write a run's report again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from . import report
from .agents import LAUNCHERS
from .run import install, run
from .servers import llama_server_binary

SERVERS = ("promptlookup", "llama-server")


@click.group()
def main():
    """The agents' conformance check: Claude Code, Codex, Qwen Code and opencode against
    promptlookup serve (and llama-server), on a small task in a scratch repository."""


@main.command("install")
@click.option("--prefix", default=".agents", show_default=True, type=click.Path(path_type=Path))
def install_command(prefix):
    """Install the agents at their pinned versions into PREFIX (npm; git-ignored)."""
    install(prefix)


@main.command("run")
@click.option("--prefix", default=".agents", show_default=True, type=click.Path(path_type=Path),
              help="Where `install` put the agents.")  # fmt: skip
@click.option("--agent", "agents", multiple=True, type=click.Choice(list(LAUNCHERS)),
              help="An agent to run (repeatable) [default: all four].")  # fmt: skip
@click.option("--against", multiple=True, type=click.Choice(SERVERS),
              help="A server to run them against (repeatable) [default: promptlookup, and "
              "llama-server when LLAMA_SERVER or PATH has one].")  # fmt: skip
@click.option("--turns", default=6, show_default=True, type=click.IntRange(min=1),
              help="Model turns each agent may take; then it is stopped.")  # fmt: skip
@click.option("--timeout", "timeout_s", default=900.0, show_default=True,
              type=click.FloatRange(min=1), help="Seconds each agent may run.")  # fmt: skip
@click.option("--threads", type=click.IntRange(min=1), help="The servers' CPU threads.")
@click.option("--out", type=click.Path(path_type=Path),
              help="The run folder [default: bench-out/agents/<UTC time>].")  # fmt: skip
def run_command(prefix, agents, against, turns, timeout_s, threads, out):
    """Run each agent on the task against each server; write report.md and report.json (and
    requests.jsonl, logs/, scratch/) into the run folder."""
    if not (prefix / "node_modules" / ".bin").is_dir():
        raise click.ClickException(f"no agents in {prefix}: run `install` first")
    against = list(against) or (["promptlookup", "llama-server"] if llama_server_binary()
                                else ["promptlookup"])  # fmt: skip
    if "llama-server" in against and llama_server_binary() is None:
        raise click.ClickException("no llama-server binary: set LLAMA_SERVER or put it on PATH")
    out = out or Path("bench-out/agents") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = run(list(agents) or list(LAUNCHERS), against, out, prefix, turns, timeout_s, threads)
    click.echo(path.read_text())
    click.echo(f"report: {path}")


@main.command("report")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
def report_command(folder):
    """Write FOLDER's report.md and report.json again from its requests.jsonl and the runs its
    report.json holds (after a change in how the records are read)."""
    click.echo(report.rebuild(folder).read_text())


if __name__ == "__main__":
    main()
