"""The prefix cache's disk tier (:mod:`promptlookup.prefix_cache`): blocks of keys and values in
files of a folder, found again by a later request or a later process, within a byte budget.

- *Content keys*: a block's file is named by a hash chain (:mod:`promptlookup.prefix_keys`).
- *Files*: safetensors, one tensor (the block in the backend's layout, its bits as integers
  of its dtype's width) and a header with the file's own name, its tokens, its dtype and a
  SHA-256 of the tensor's bytes; written by a background thread to a temporary file renamed
  into place (a crash leaves no half file under a block's name). The thread copies with
  numpy, never with torch (:func:`bits`). The folder is made ``0700``, the files ``0600``.
- *Checked on reading*: a file that is truncated, corrupt, renamed or written by something
  else (its name, tokens or checksum do not match) is removed and never used; the first such
  file of a tier is said in one ``RuntimeWarning``, the rest only counted (:attr:`skipped`).
- *Read back in a stream*: a request plans its read-back from the files' headers alone
  (:meth:`DiskTier.header`: tokens and shape, a few hundred bytes each), so that its
  sequence's buffers are sized once for the whole prefix; then :meth:`DiskTier.blocks` reads
  and checks one block at a time as the sequence's cache writes them in, so that a read-back
  holds one block besides the buffers however long the conversation.
- *Eviction*: least recently used files go first when the folder would exceed its budget
  (recency: the files' modification times at start, then every use); a use touches a
  sequence's blocks deepest first, so a block's parent outlives it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import json
import os
import queue
import struct
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .prefix_keys import NAME, TEMPORARY, VERSION

if TYPE_CHECKING:
    import torch

#: ``promptlookup serve``'s disk budget by default (``--prefix-cache-disk-mib``): 10 GiB.
DEFAULT_DISK_MIB = 10 * 1024
#: Bytes of copied blocks (each in its own tensor) that may wait to be written; a save past
#: them waits for the writer. A long sequence that does not share its buffers (a windowed
#: model's) is copied block by block as its blocks are written, so that storing a
#: 24,000-token prompt of Gemma 3 270M holds a few MiB of copies, not all 72 of them at once.
QUEUED_COPIES_BYTES = 8 << 20


class Stored(NamedTuple):
    """A block planned from its file's header (:meth:`DiskTier.header`), read when its turn
    comes (:meth:`DiskTier.blocks`): the file, the block's shape, its tokens."""

    name: str
    shape: tuple[int, ...]
    tokens: list[int]


class DiskTier:
    """Blocks in files of ``directory`` (made if missing), at most ``budget_bytes`` of them
    (see the module doc). Thread-safe; writes happen in a thread of their own
    (:meth:`flush` waits for them)."""

    def __init__(self, directory: str | os.PathLike, budget_bytes: int) -> None:
        self.directory, self.budget_bytes = Path(directory), budget_bytes
        if not self.directory.is_dir():
            self.directory.mkdir(mode=0o700, parents=True)
            self.directory.chmod(0o700)  # whatever the umask
        #: Files of blocks by name, with their size, least recently used first.
        self._files: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        #: Writes queued of blocks held in place, by their storage's id (a queued job holds
        #: its block, so the id is its storage's while counted), and their end said.
        self._pending: collections.Counter[int] = collections.Counter()
        #: Names of the blocks queued to be written, not yet written.
        self._queued: set[str] = set()
        #: Bytes of the copied blocks among them (see QUEUED_COPIES_BYTES).
        self._copies_bytes = 0
        self._written = threading.Condition(self._lock)
        #: Files found unusable and removed (the first one warned about).
        self.skipped = 0
        found = []
        for entry in os.scandir(self.directory):
            if (left := TEMPORARY.match(entry.name)) and not _running(int(left[1])):
                with contextlib.suppress(OSError):  # a write cut short by its process's end
                    os.unlink(entry.path)
            elif NAME.match(entry.name) and entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                found.append((stat.st_mtime_ns, entry.name, stat.st_size))
        for _, name, size in sorted(found):
            self._files[name] = size
        self._bytes = sum(self._files.values())  # the files' sizes together
        self._warned = False  # whether the one warning was said
        with self._lock:
            self._evict(0)  # a budget smaller than last time's

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def has(self, name: str) -> bool:
        """Whether file ``name`` is written (and may be read)."""
        with self._lock:
            return name in self._files

    def lacks(self, name: str) -> bool:
        """Whether file ``name`` is neither written nor queued to be (a store that comes while
        the last one's writes are queued does not queue them again)."""
        with self._lock:
            return name not in self._files and name not in self._queued

    def touch(self, names: Sequence[str]) -> None:
        """Mark the files ``names`` (a sequence's blocks, root to leaf) used, the deepest
        first, once the writes asked for before are done: here, and in their modification
        times (for the next process)."""
        if names:
            self._queue_job(("touch", list(names)))

    def header(self, name: str) -> Stored | None:
        """The block in file ``name`` as its header says (shape and tokens: the file's first
        bytes, not its keys and values); None when missing or unusable (then removed). The
        keys and values are checked when read (:meth:`load`)."""
        if not self.has(name):
            return None
        try:
            with open(self.directory / name, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                length = struct.unpack("<Q", file.read(8))[0]
                if length > size - 8:
                    raise ValueError("truncated header")
                header = json.loads(file.read(length))
            meta, entry = _metadata(header, name), header["block"]
            if 8 + length + int(entry["data_offsets"][1]) != size:
                raise ValueError("truncated")
            shape = tuple(int(extent) for extent in entry["shape"])
            tokens = [int(token) for token in meta["tokens"].split()]
        except FileNotFoundError:  # evicted meanwhile
            self._forget(name)
            return None
        except Exception as error:  # truncated, corrupt or foreign: never used
            self._skip(name, error)
            return None
        return Stored(name, shape, tokens)

    def blocks(self, payloads: Sequence, failed: set[str]) -> Iterator:
        """``payloads`` one after another, each :class:`Stored` one read from its file when
        its turn comes (one block held at a time); stops before the first that is missing,
        unusable or not what its header said, its name added to ``failed``."""
        for payload in payloads:
            if not isinstance(payload, Stored):
                yield payload
                continue
            loaded = self.load(payload.name)
            if loaded is None or (tuple(loaded[0].shape), loaded[1]) != payload[1:]:
                failed.add(payload.name)
                return
            yield loaded[0]
            del loaded  # not held while the next one is read

    def load(self, name: str) -> tuple[torch.Tensor, list[int]] | None:
        """The block in file ``name`` and its tokens; None when missing or unusable (then
        removed)."""
        import safetensors.torch  # here: the cache imports no torch until it holds blocks

        if not self.has(name):
            return None
        try:
            data = (self.directory / name).read_bytes()
        except FileNotFoundError:  # evicted meanwhile
            self._forget(name)
            return None
        try:
            header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
            meta = _metadata(header, name)
            block = safetensors.torch.load(data)["block"]  # integers of the dtype's width
            if meta["sha256"] != _digest(block.numpy()):
                raise ValueError("checksum mismatch")
            block = block.view(_dtype(meta["dtype"]))
            tokens = [int(token) for token in meta["tokens"].split()]
        except Exception as error:  # truncated, corrupt or foreign: never used
            self._skip(name, error)
            return None
        return block, tokens

    def save(self, name: str, block, tokens: Sequence[int]) -> None:
        """Write ``block`` (of ``tokens``) as file ``name``, in the background: a tensor, or a
        block in place whose ``bits()`` gives its bits when it is written (see :func:`bits`).
        A tensor waits first while the copies queued before it hold
        :data:`QUEUED_COPIES_BYTES`."""
        storage = _storage(block)
        size = block.nbytes if storage is None else 0
        with self._written:
            if name in self._files or name in self._queued:
                return
            self._written.wait_for(
                lambda: not self._copies_bytes or self._copies_bytes + size <= QUEUED_COPIES_BYTES
            )
            self._queued.add(name)
            self._copies_bytes += size
            if storage is not None:  # read from its buffers when written
                self._pending[id(storage)] += 1
        self._queue_job(("save", name, block, [int(token) for token in tokens]))

    def flush(self) -> None:
        """Wait until every write asked for so far is done."""
        self._queue.join()

    def wait_for(self, storage) -> None:
        """Wait until every write asked for so far of a block held in place in ``storage``
        is done (not the others': another tenant's, another sequence's), so that ``storage``
        may be rewritten."""
        with self._written:
            self._written.wait_for(lambda: not self._pending[id(storage)])

    def _queue_job(self, job: tuple) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_jobs, name="prefix-cache-disk", daemon=True
                )
                self._writer.start()
                atexit.register(_flush, weakref.ref(self))
        self._queue.put(job)

    def _write_jobs(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job[0] == "save":
                    self._write(*job[1:])
                else:
                    self._touch(job[1])
            except Exception as error:  # a full disk, a file gone: the cache is only a cache
                self._warn(f"prefix cache folder {self.directory}: {type(error).__name__}: {error}")
            finally:
                if job[0] == "save":
                    with self._written:
                        self._queued.discard(job[1])
                        if (storage := _storage(job[2])) is not None:
                            self._pending[id(storage)] -= 1
                            if not self._pending[id(storage)]:
                                del self._pending[id(storage)]
                        else:
                            self._copies_bytes -= job[2].nbytes
                        self._written.notify_all()
                self._queue.task_done()

    def _touch(self, names: list[str]) -> None:
        with self._lock:
            held = [name for name in reversed(names) if name in self._files]
            for name in held:  # deepest first: each more recent than its child
                self._files.move_to_end(name)
        for name in held:
            with contextlib.suppress(FileNotFoundError):  # removed as unusable meanwhile
                os.utime(self.directory / name)

    def _write(self, name: str, block, tokens: list[int]) -> None:
        import numpy as np
        import safetensors.numpy

        # The block's bits, copied by numpy, not torch (see bits()); in place: read now.
        array = np.ascontiguousarray(bits(block) if _storage(block) is None else block.bits())
        meta = {
            "version": VERSION,
            "name": name,
            "tokens": " ".join(map(str, tokens)),
            "dtype": str(block.dtype),  # the bits' (numpy's integers of its width)
            "sha256": _digest(array),
        }
        data = safetensors.numpy.save({"block": array}, metadata=meta)
        with self._lock:
            if name in self._files or len(data) > self.budget_bytes:
                return
            self._evict(len(data))
        temporary = self.directory / f".{name}.{os.getpid()}.tmp"
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.fchmod(descriptor, 0o600)  # whatever the umask
                with os.fdopen(descriptor, "wb", closefd=False) as file:
                    file.write(data)
            finally:
                os.close(descriptor)
            os.replace(temporary, self.directory / name)  # whole, or not there
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        with self._lock:
            self._files[name] = len(data)
            self._bytes += len(data)

    def _evict(self, room: int) -> None:
        """Remove the least recently used files until ``room`` more bytes fit (lock held)."""
        while self._files and self._bytes + room > self.budget_bytes:
            old, size = self._files.popitem(last=False)
            self._bytes -= size
            (self.directory / old).unlink(missing_ok=True)

    def _forget(self, name: str) -> None:
        """A file gone (evicted meanwhile) forgotten."""
        with self._lock:
            self._bytes -= self._files.pop(name, 0)

    def _skip(self, name: str, error: Exception) -> None:
        with self._lock:
            self._bytes -= self._files.pop(name, 0)
            self.skipped += 1
        with contextlib.suppress(OSError):  # not ours to remove: forgotten all the same
            (self.directory / name).unlink(missing_ok=True)
        self._warn(
            f"prefix cache: skipped and removed {self.directory / name}, a truncated, corrupt "
            f"or foreign file ({type(error).__name__}: {error}); further ones are not reported"
        )

    def _warn(self, message: str) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _flush(tier: weakref.ref) -> None:
    """At the interpreter's exit, a live tier's writes done (:meth:`DiskTier.flush`): so
    that a script's last blocks are kept, and that its writer thread, a daemon, is not in
    the middle of a write (in torch's or numpy's code) when the interpreter ends: that
    aborted the process ("terminate called without an active exception")."""
    if (alive := tier()) is not None:
        alive.flush()


def _running(pid: int) -> bool:
    """Whether process ``pid`` is alive (it may still be writing its temporary files)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _metadata(header: dict, name: str) -> dict:
    """A block file's metadata from its parsed ``header``, checked to be block ``name``'s in
    this version of the format (else a ``ValueError``)."""
    meta = header["__metadata__"]
    if meta["name"] != name or meta["version"] != VERSION:
        raise ValueError("written for another block")
    return meta


def _storage(block):
    """The storage a block held in place is read from when written (its ``storage``); None
    for a block in its own tensor."""
    import torch

    return None if isinstance(block, torch.Tensor) else getattr(block, "storage", None)


def bits(tensor: torch.Tensor):
    """A view of ``tensor``'s bits as a numpy array of integers of its dtype's width (numpy
    has no bfloat16), made by no torch operation that computes. The disk tier's writer reads
    blocks this way because it runs in a thread of its own: a torch operation there starts a
    second OpenMP team, and once libgomp manages more threads than the machine has cores it
    stops spinning in every team's waits: decoding beside the writer ran 1.4x slower."""
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.view(width[tensor.element_size()]).numpy()


def _dtype(name: str):
    """The dtype a file's keys and values are in, by its name (``torch.bfloat16``)."""
    import torch

    return {str(dtype): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16)}[name]


def _digest(array) -> str:
    """SHA-256 of a numpy array's bytes, in C order."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8)).hexdigest()
