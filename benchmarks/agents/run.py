"""One run of the check: for each server, start it behind the recording proxy, run each agent
on the task in its own scratch repository and home (one at a time, with a bound on its turns
and its wall-clock time), then write the report into the run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from . import report, servers, task
from .agents import LAUNCHERS, PACKAGES, npm_specs
from .proxy import Recorder, start_proxy

#: Seconds an agent may go on after its turns are used up before it is stopped.
GRACE_S = 15.0


def install(prefix: Path) -> None:
    """Install every agent at its pinned version into ``prefix`` (npm)."""
    prefix.mkdir(parents=True, exist_ok=True)
    argv = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", *npm_specs()]
    subprocess.run(argv, check=True)


def installed_versions(prefix: Path) -> dict[str, str]:
    """The version of each agent found in ``prefix`` (its package.json), by agent name."""
    versions = {}
    for agent, (package, _) in PACKAGES.items():
        manifest = prefix / "node_modules" / package / "package.json"
        if manifest.is_file():
            versions[agent] = json.loads(manifest.read_text()).get("version", "?")
    return versions


def _stop_group(process: subprocess.Popen) -> None:
    """End the agent and every process it started (its own session)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def run_agent(agent: str, server: str, base_url: str, folder: Path, bin_dir: Path,
              recorder: Recorder, turns: int, timeout_s: float) -> dict:  # fmt: skip
    """Run ``agent`` on the task against ``base_url``; what the harness saw."""
    scratch = folder / "scratch" / server / agent
    home, repo = scratch / "home", task.make_repo(scratch / "repo")
    home.mkdir(parents=True, exist_ok=True)
    launch = LAUNCHERS[agent](bin_dir, base_url, home, repo, task.PROMPT, turns)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TERM": "dumb",
        **launch.env,
    }
    label = f"{server}/{agent}"
    recorder.agent = label
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (
        (logs / f"{server}-{agent}.out").open("w") as out,
        (logs / f"{server}-{agent}.err").open("w") as err,
    ):
        process = subprocess.Popen(
            launch.argv, cwd=launch.cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
        stopped, capped_at = "exit", None
        while process.poll() is None:
            now = time.monotonic()
            if now - started > timeout_s:
                stopped = "timeout"
                break
            if capped_at is None and recorder.turns(label) >= turns:
                capped_at = now
            if capped_at is not None and now - capped_at > GRACE_S:
                stopped = "turn cap"
                break
            time.sleep(0.5)
        _stop_group(process)
    recorder.agent = ""
    return {
        "server": server,
        "agent": agent,
        "exit_code": process.returncode,
        "stopped": stopped,
        "wall_seconds": round(time.monotonic() - started, 1),
        **task.outcome(repo),
    }


def run(
    agents: list[str],
    against: list[str],
    folder: Path,
    prefix: Path,
    turns: int,
    timeout_s: float,
    threads: int | None = None,
) -> Path:
    """Run every agent against every server; returns the markdown report's path."""
    folder, prefix = folder.resolve(), prefix.resolve()  # the agents run in other folders
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    bin_dir = (prefix / "node_modules" / ".bin").resolve()
    recorder = Recorder(folder / "requests.jsonl")
    runs, meta = [], {}
    for server in against:
        port = servers.free_port()
        if server == "llama-server":
            binary = servers.llama_server_binary()
            argv = servers.llama_server_argv(binary, port, threads)
            meta["llama-server"] = _version_line([binary, "--version"])
        else:
            argv = servers.promptlookup_argv(port, threads)
            meta["promptlookup"] = _version_line(argv[:3] + ["--version"])
        print(f"starting {server} on port {port}", flush=True)
        running = servers.start(server, argv, port, folder / "logs" / f"{server}.log")
        proxy = start_proxy(("127.0.0.1", port), recorder)
        base_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        try:
            for agent in agents:
                print(f"running {agent} against {server}", flush=True)
                runs.append(
                    run_agent(agent, server, base_url, folder, bin_dir, recorder, turns, timeout_s)
                )
                row = report.summarize(
                    [r for r in recorder.records if r["agent"] == f"{server}/{agent}"], runs[-1]
                )
                print(f"  {row['statuses']} turns {row['turns_ok']}/{row['turns']}, "
                      f"tests pass: {row['tests_pass']}", flush=True)  # fmt: skip
        finally:
            proxy.shutdown()
            running.stop()
    meta.update(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        model=servers.MODEL,
        turns_cap=turns,
        timeout_s=timeout_s,
        cpus=os.cpu_count(),
    )
    rows = report.build(recorder.records, runs)
    return report.write(folder, rows, installed_versions(prefix), meta)


def _version_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"unknown ({exc})"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return next((line for line in lines if "version" in line.lower()), lines[-1] if lines else "?")
