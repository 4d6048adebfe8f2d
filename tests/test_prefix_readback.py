"""A prefix read back from disk is written into the sequence's buffers as it is read: one
block at a time besides the buffers (sized once), whatever the prefix's length; and it is bit
for bit what a prefill makes at every length around the blocks' edges, after memory's blocks
and in buffers taken over, for windowed models around their windows' edges too; a file that
fails as it is read stops the read-back there, as exact. A take-over waits only for the
queued writes of its own buffers, not for another sequence's."""

from __future__ import annotations

import random
import threading
import weakref

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from test_gguf_families import VOCAB
from test_prefix_cache import tiny
from test_window import decoded, gemmas  # noqa: F401 (fixture)

from promptlookup import prefix_disk
from promptlookup.backends.hf.cache import GrowingLayer
from promptlookup.backends.hf.target import TorchTarget
from promptlookup.prefix_cache import PrefixCache
from promptlookup.prefix_disk import DiskTier
from promptlookup.prefix_keys import name_of, tail_name

SIZE = 8  # tokens per block


def stored_on_disk(folder, length: int = 90):
    """A tiny model's target, a prefilled sequence of ``length`` tokens and its tokens, the
    sequence's blocks written to ``folder`` (11 blocks and 2 tokens by default)."""
    target = tiny("float32").target
    tokens = [(index * 7) % 31 + 1 for index in range(length)]
    sequence = target.new_sequence()
    target.forward_batch([sequence], [tokens], [0])
    cache = PrefixCache(mib=8, block_tokens=SIZE, directory=folder)
    cache.store(target, sequence, tokens)
    cache.flush()
    return target, sequence, tokens


def file_of(target, tokens, index: int, folder) -> object:
    """The file of block ``index`` of ``tokens`` (the tail's where ``index`` is past the
    whole blocks)."""
    keys = PrefixCache(mib=8, block_tokens=SIZE)._keys(target, None, tokens)
    if index < len(tokens) // SIZE:
        return folder / name_of(keys[index + 1])
    return folder / tail_name(keys[-1], len(tokens) % SIZE)


def spoil(path, how: str) -> None:
    """A file truncated (its header says more than it holds), cut to a stub (not even the
    header's length) or with a byte of its keys and values changed (found only by the
    checksum, as it is read)."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) - 40])
    elif how == "stub":
        path.write_bytes(data[:5])
    else:
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))


def assert_holds(restored, sequence, found: int) -> None:
    """``restored``'s every layer holds exactly ``sequence``'s first ``found`` positions."""
    assert restored.get_seq_length() == found
    for before, after in zip(sequence.layers, restored.layers if found else ()):
        assert torch.equal(after.keys, before.keys[:, :, :found])
        assert torch.equal(after.values, before.values[:, :, :found])


@pytest.mark.parametrize("take_over", [False, True])
def test_a_prefix_partly_in_memory_is_read_on_from_disk_bit_for_bit(tmp_path, take_over):
    """Memory holds the first 44 tokens (a finished sequence's buffers, in place), the disk
    the rest: every longer prefix is memory's blocks then the disk's, written after them into
    a new sequence or into the finished buffers taken over, exactly."""
    target, sequence, tokens = stored_on_disk(tmp_path)
    for length in range(45, len(tokens) + 1):
        cache = PrefixCache(mib=8, block_tokens=SIZE, directory=tmp_path)
        earlier = target.new_sequence()
        target.forward_batch([earlier], [tokens[:44]], [0])
        cache.store(target, earlier, tokens[:44], ended=True)
        restored, found = cache.join(
            target, target.new_sequence(), [*tokens[:length], 0], take_over=take_over
        )
        assert found == (length if length >= 88 else max(44, length // SIZE * SIZE))
        assert (restored is earlier) == take_over
        assert_holds(restored, sequence, found)


@pytest.mark.parametrize("how", ["truncated", "stub", "changed"])
@pytest.mark.parametrize("take_over", [False, True])
def test_a_file_that_fails_mid_way_stops_the_read_back_there_exactly(tmp_path, how, take_over):
    """Block 7's file truncated or a stub (found unusable from its header, before anything is
    written) or with a byte changed (found as it is read, after blocks 5 and 6 are written): the
    read-back stops before block 7 either way, removes the file, and holds exactly the first
    56 positions, in a new sequence or in buffers taken over (cropped back and written again)."""
    target, sequence, tokens = stored_on_disk(tmp_path)
    spoil(file_of(target, tokens, 7, tmp_path), how)
    cache = PrefixCache(mib=8, block_tokens=SIZE, directory=tmp_path)
    earlier = target.new_sequence()
    target.forward_batch([earlier], [tokens[:44]], [0])
    cache.store(target, earlier, tokens[:44], ended=True)
    with pytest.warns(RuntimeWarning, match="truncated, corrupt or foreign"):
        restored, found = cache.join(target, target.new_sequence(), tokens, take_over=take_over)
    assert found == 7 * SIZE and cache.disk.skipped == 1
    assert not file_of(target, tokens, 7, tmp_path).exists()
    assert_holds(restored, sequence, found)


def test_a_read_back_holds_one_block_at_a_time_and_sizes_the_buffers_once(tmp_path, monkeypatch):
    """Every block tensor read from disk is let go before the next is read (counted by weak
    references: no timing, no resident memory), and each layer's buffers are made once, for
    the whole prefix and a new turn's tokens after it, however many blocks it has."""
    target, sequence, tokens = stored_on_disk(tmp_path, length=8 * SIZE * 3 + 5)  # 24 blocks
    alive, most, read = set(), [0], [0]
    load, reserve = DiskTier.load, GrowingLayer._reserve

    def counted_load(self, name):
        loaded = load(self, name)
        if loaded is not None:
            read[0] += 1
            key = read[0]
            alive.add(key)
            weakref.finalize(loaded[0], alive.discard, key)
            most[0] = max(most[0], len(alive))
        return loaded

    made = []

    def counted_reserve(self, needed, *states):
        before = None if self.key_buffer is None else self.key_buffer.data_ptr()
        reserve(self, needed, *states)
        if self.key_buffer.data_ptr() != before:
            made.append(self)

    monkeypatch.setattr(DiskTier, "load", counted_load)
    monkeypatch.setattr(GrowingLayer, "_reserve", counted_reserve)
    restored = target.new_sequence()
    found = PrefixCache(mib=8, block_tokens=SIZE, directory=tmp_path).restore(
        target, restored, tokens
    )
    assert found == len(tokens) and read[0] == len(tokens) // SIZE + 1  # every block, the tail
    assert most[0] == 1 and not alive  # one at a time, none left
    assert sorted(map(id, made)) == sorted(map(id, restored.layers))  # each layer's once
    assert_holds(restored, sequence, found)
    target.forward_batch([restored], [tokens[:40]], [0])  # a new turn's tokens: room for them
    assert len(made) == len(restored.layers)


@pytest.mark.parametrize("window", [8, 16])
def test_a_windowed_model_reads_back_from_disk_exactly_around_the_windows_edges(
    gemmas,  # noqa: F811 (fixture)
    tmp_path,
    window,
):
    """A windowed model's sequence (decoded with drafts) stored to disk: a request sharing
    its first ``length`` tokens resumes from disk where memory would from the blocks the
    disk holds of it (its whole blocks, or all with the tail: the windows the blocks carry,
    planned from the files' headers), its logits bit for bit those with the cache off; with
    the tail's file changed, it resumes where memory would without the tail."""
    target, rng = TorchTarget(gemmas[window]), random.Random(window)
    first = [rng.randrange(1, VOCAB) for _ in range(100)]
    sequence = decoded(target, first, rng)
    memory = PrefixCache(mib=64, block_tokens=16)
    memory.store(target, sequence, first)
    disk = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    disk.store(target, sequence, first)
    disk.flush()

    def resumes(cache, length: int) -> int:
        """Where a request of ``first[:length]`` and one more token resumes from ``cache``;
        its logits checked against the cache off."""
        request, restored = [*first[:length], 0], target.new_sequence()
        resumed = cache.restore(target, restored, request[:-1])
        target.cache = restored
        rest = target.forward(request[resumed:])
        target.reset()
        assert torch.equal(rest, target.forward(request)[resumed:]), (length, resumed)
        return resumed

    lengths = sorted({*range(1, 100, 9), *range(window, 2 * window + 2), *range(66, 101)})
    for length in lengths:
        fresh = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)  # nothing in memory
        on_disk = length if length == 100 else length // 16 * 16  # whole blocks, or all
        assert resumes(fresh, length) == resumes(memory, on_disk)
    assert resumes(memory, 100) > 96  # the tail read too
    tail = tmp_path / tail_name(disk._keys(target, None, first)[-1], 100 % 16)
    spoil(tail, "changed")
    fresh = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    with pytest.warns(RuntimeWarning, match="truncated, corrupt or foreign"):
        assert resumes(fresh, 100) == resumes(memory, 96) > 0  # written again without it
    assert fresh.disk.skipped == 1


def test_a_take_over_does_not_wait_for_another_sequences_writes(tmp_path, monkeypatch):
    """The disk's writer held back on another tenant's blocks: a conversation's next turn
    still takes its own finished buffers over (their blocks all written) at once, and answers
    as without the cache; the held writes are then done."""
    lm, rng = tiny("float32"), random.Random(5)
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    first = [rng.randrange(1, 32) for _ in range(70)]
    answer = lm.generate(first, max_new_tokens=10, prefix_cache=cache).token_ids
    cache.flush()  # this conversation's blocks written
    (storage,) = cache._finished.keys()
    gate, holding, timed_out, write = threading.Event(), threading.Event(), [], DiskTier._write

    def held_write(self, *args):
        holding.set()
        if not gate.wait(timeout=120):  # only if the take-over below waited for it
            timed_out.append(args[0])
        write(self, *args)

    monkeypatch.setattr(DiskTier, "_write", held_write)
    other = [rng.randrange(1, 32) for _ in range(50)]
    lm.generate(other, max_new_tokens=5, prefix_cache=cache, tenant="b")
    assert holding.wait(timeout=120)  # the writer holds the other tenant's first block
    prompt = [*first, *answer, *(rng.randrange(1, 32) for _ in range(6))]
    resumed = lm.generate(prompt, max_new_tokens=8, prefix_cache=cache)
    assert not gate.is_set() and not timed_out
    assert len(cache._finished[storage]) > len(prompt)  # its buffers went on: taken over
    assert resumed.stats.cached_tokens == len(first) + len(answer) - 1
    gate.set()
    cache.flush()
    assert not timed_out
    plain = lm.generate(prompt, max_new_tokens=8, prefix_cache=False)
    assert resumed.token_ids == plain.token_ids


def test_a_sequence_copied_to_disk_holds_only_a_bounded_run_of_copies_at_once(
    gemmas,  # noqa: F811 (fixture)
    tmp_path,
    monkeypatch,
):
    """A windowed model's sequence does not share its buffers, so its blocks are copied for
    the disk: they are read out a run at a time and a save waits while the copies queued
    before it hold ``QUEUED_COPIES_BYTES``, so that a long prompt's copies are never all
    alive at once. Recorded at every write: the bytes of the copies queued or being written;
    every block is still written and read back exact."""
    target, rng = TorchTarget(gemmas[8]), random.Random(2)
    first = [rng.randrange(1, VOCAB) for _ in range(300)]
    sequence = decoded(target, first, rng)
    block_bytes = sequence.read_blocks(0, 16, 16)[0].nbytes
    monkeypatch.setattr(prefix_disk, "QUEUED_COPIES_BYTES", 3 * block_bytes)
    alive, write = [], DiskTier._write

    def recorded_write(self, name, block, tokens):
        queued = [job[2] for job in list(self._queue.queue) if job[0] == "save"]
        alive.append(sum(b.nbytes for b in [block, *queued] if isinstance(b, torch.Tensor)))
        write(self, name, block, tokens)

    monkeypatch.setattr(DiskTier, "_write", recorded_write)
    disk = PrefixCache(mib=1, block_tokens=16, directory=tmp_path)
    disk.store(target, sequence, first)
    disk.flush()
    assert len(alive) == 300 // 16 + 1  # every whole block and the tail
    assert max(alive) <= 3 * block_bytes
    restored = target.new_sequence()
    fresh = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    assert fresh.restore(target, restored, [*first, 0]) == 300
