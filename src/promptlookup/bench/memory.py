"""Resident memory of the bench's methods, and the format of the weights they run.

Peak RSS policy: before each generation the runner resets the kernel's high-water mark of
resident memory (``VmHWM``, by writing ``5`` to ``/proc/PID/clear_refs``) and reads it after,
so each row says how much memory the process held at most *during that generation*. Local
methods share one process, so each one's peak includes the model every method shares; a server
raced with ``--against`` is measured in its own process (found by its listening port on this
machine). Where the mark cannot be reset (not Linux, no permission), a local method's peak is
unknown (None: the process's lifetime peak would charge one method with another's memory); a
server's is its lifetime peak, since the server runs nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path

MIB = 1024 * 1024


def reset_peak(pid: int | None = None) -> bool:
    """Reset the high-water mark of resident memory of ``pid`` (None: this process)."""
    try:
        Path(f"/proc/{pid or 'self'}/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def _status_kib(pid: int | None, key: str) -> int | None:
    try:
        text = Path(f"/proc/{pid or 'self'}/status").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def peak_rss_mib(pid: int | None = None) -> float | None:
    """The high-water mark of resident memory (MiB) of ``pid`` (None: this process); None
    where the kernel does not report it.

    >>> peak_rss_mib() is None or peak_rss_mib() > 1
    True
    """
    kib = _status_kib(pid, "VmHWM")
    return None if kib is None else round(kib / 1024, 1)


class PeakMeter:
    """Measures one generation's peak RSS of a process: ``start()`` before, ``stop()`` after
    (None when unknown; see the module's policy)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._reset = False

    def start(self) -> None:
        self._reset = reset_peak(self.pid)

    def stop(self) -> float | None:
        if not self._reset and self.pid is None:
            return None
        return peak_rss_mib(self.pid)


def rss_mib(pid: int | None = None) -> float | None:
    """The resident memory (MiB) of ``pid`` (None: this process) now; None where the kernel
    does not report it.

    >>> rss_mib() is None or rss_mib() <= peak_rss_mib()
    True
    """
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else round(kib / 1024, 1)


def pid_listening_on(host: str, port: int) -> int | None:
    """The id of the local process listening on ``port`` (``host`` a loopback address or this
    machine's name), through psutil when installed; None otherwise."""
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", os.uname().nodename):
        return None
    try:
        import psutil
    except ImportError:
        return None
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for connection in connections:
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr
            and connection.laddr.port == port
            and connection.pid
        ):
            return connection.pid
    return None


#: GGUF ``general.file_type`` values (llama.cpp's ``llama_ftype``) of the common files.
GGUF_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


def weights_format(lm) -> str | None:
    """How the bench model's weights are held, for the run's header: the target's own
    ``weights_format`` when it says (e.g. ``"Q4_1 GGUF, float32 activations"``), a llama.cpp
    model's GGUF file type, else the torch parameters' dtype.

    >>> from types import SimpleNamespace
    >>> weights_format(SimpleNamespace(target=SimpleNamespace(weights_format="Q4_0 GGUF")))
    'Q4_0 GGUF'
    """
    target = getattr(lm, "target", None)
    stated = getattr(target, "weights_format", None)
    if callable(stated):
        stated = stated()
    if stated:
        return str(stated)
    model = getattr(lm, "model", None)
    metadata = getattr(model, "metadata", None)
    if isinstance(metadata, dict) and "general.file_type" in metadata:
        code = int(metadata["general.file_type"])
        return f"{GGUF_FILE_TYPES.get(code, f'file type {code}')} GGUF, run by llama.cpp"
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        weight = next(iter(parameters()), None)
        if weight is not None:
            dtype = str(weight.dtype).removeprefix("torch.")
            return f"{dtype} weights and activations (torch)"
    return None
