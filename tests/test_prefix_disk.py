"""The prefix cache's disk tier never changes a token either: a conversation's next turn after a
restart (a new cache over the same folder, a new model object) finds its prompt on disk and
answers token for token as without any cache; a truncated, corrupt or foreign file is skipped
with one warning; another tenant, another model or another dtype finds nothing; the folder and
its files are the server user's only; the folder stays within its budget."""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
import warnings

import pytest
import torch
from _fixtures import one_thread  # noqa: F401 (fixture)
from conftest import TinyTokenizer, tiny_llama
from test_prefix_cache import SAMPLING, tiny

import promptlookup
from promptlookup import cache_files
from promptlookup.errors import InvalidParameterError
from promptlookup.prefix_cache import PrefixCache
from promptlookup.prefix_disk import DiskTier
from promptlookup.prefix_keys import NAME
from promptlookup.server.settings import ServerSettings
from promptlookup.server.state import prefix_cache


def turns(lm, cache, count: int, seed: int = 7, tenant=None, options=None) -> tuple[list, list]:
    """``count`` turns of a conversation (each prompt the last one, its answer and new tokens):
    the results, and the next turn's prompt."""
    rng = random.Random(seed)
    vocab = lm.tokenizer.vocab_size
    prompt, results = [rng.randrange(1, vocab) for _ in range(90)], []
    for _ in range(count):
        result = lm.generate(
            prompt, max_new_tokens=20, prefix_cache=cache, tenant=tenant, **(options or {})
        )
        results.append(result)
        prompt = [*prompt, *result.token_ids, *(rng.randrange(1, vocab) for _ in range(5))]
    return results, prompt


def files(folder) -> list:
    return sorted(path for path in folder.iterdir() if NAME.match(path.name))


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "quantized"])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampled"])
def test_a_conversation_goes_on_after_a_restart_as_without_a_cache(tmp_path, kind, options):
    options = {**options, "logprobs": 2}
    before = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    _, prompt = turns(tiny(kind), before, 2, options=options)
    before.flush()
    assert files(tmp_path)
    # A new process: a new model object, a new cache over the same folder.
    lm, after = tiny(kind), PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    resumed = lm.generate(prompt, max_new_tokens=20, prefix_cache=after, **options)
    plain = lm.generate(prompt, max_new_tokens=20, prefix_cache=False, **options)
    assert resumed.token_ids == plain.token_ids
    assert resumed.stats.logprobs == plain.stats.logprobs
    assert resumed.stats.cached_tokens >= 0.9 * resumed.stats.prompt_tokens


def test_blocks_read_back_from_disk_are_bit_for_bit_at_every_length(tmp_path):
    target, prompt = tiny("float32").target, list(range(1, 31)) * 3  # 11 blocks and 2 tokens
    sequence = target.new_sequence()
    target.forward_batch([sequence], [prompt], [0])
    cache = PrefixCache(mib=8, block_tokens=8, directory=tmp_path)
    cache.store(target, sequence, prompt)
    cache.flush()
    for length in range(1, len(prompt) + 1):
        restored = target.new_sequence()
        fresh = PrefixCache(mib=8, block_tokens=8, directory=tmp_path)  # nothing in memory
        # Another token after ``length`` (none of the prompt's): to the block, or to the token
        # within the stored sequence's tail.
        found = fresh.restore(target, restored, [*prompt[:length], 0])
        assert found == (length if length >= 88 else length // 8 * 8)
        for before, after in zip(sequence.layers, restored.layers if found else ()):
            assert torch.equal(after.keys, before.keys[:, :, :found])
            assert torch.equal(after.values, before.values[:, :, :found])


def test_blocks_in_place_are_written_as_stored_though_the_next_turn_takes_them_over(
    tmp_path, monkeypatch
):
    """A block held in place goes to disk uncopied (read when written). The writer is held
    back here until someone waits for it, so that without that wait a next turn would take
    the buffers over and rewrite them past its prefix first: the files must still hold the
    stored tokens' keys and values, bit for bit those of a prefill."""
    gate, write, flush = threading.Event(), DiskTier._write, DiskTier.flush
    wait_for = DiskTier.wait_for

    def held_write(self, *args):
        assert gate.wait(timeout=120)
        write(self, *args)

    def opening_flush(self):
        gate.set()
        flush(self)

    def opening_wait(self, storage):
        gate.set()
        wait_for(self, storage)

    monkeypatch.setattr(DiskTier, "_write", held_write)
    monkeypatch.setattr(DiskTier, "flush", opening_flush)
    monkeypatch.setattr(DiskTier, "wait_for", opening_wait)
    lm, rng = tiny("float32"), random.Random(3)
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    first = [rng.randrange(1, 32) for _ in range(90)]
    answer = lm.generate(first, max_new_tokens=30, prefix_cache=cache).token_ids
    stored = [*first, *answer[:-1]]  # the last token's keys and values were never made
    # The next turn keeps a shorter answer (an edit): its buffers rewritten from token 96 on.
    edited = [*first, *answer[:6], *(rng.randrange(1, 32) for _ in range(40))]
    assert lm.generate(edited, max_new_tokens=4, prefix_cache=cache).stats.cached_tokens == 96
    cache.flush()
    target, restored = lm.target, lm.target.new_sequence()
    fresh = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    found = fresh.restore(target, restored, [*stored, 0])
    assert found == len(stored)
    prompt = stored
    prefilled = target.new_sequence()
    target.forward_batch([prefilled], [prompt[:found]], [0])
    for before, after in zip(prefilled.layers, restored.layers):
        assert torch.equal(after.keys, before.keys)
        assert torch.equal(after.values, before.values)


#: torch operations that compute nothing: views of a tensor's memory.
VIEWS = {"view", "slice", "select", "alias", "as_strided", "_unsafe_view", "detach"}


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "quantized"])
def test_the_disk_writer_runs_no_torch_operation_that_computes(tmp_path, monkeypatch, kind):
    """The writer thread copies blocks with numpy: a torch operation there would start a
    second OpenMP team beside decoding's, and with more OpenMP threads than cores libgomp
    stops spinning in every team's waits (decoding beside the writer ran 1.4x slower). Every
    aten operation it calls is recorded; the files are still read back bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorded(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            called.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    called, write = set(), DiskTier._write

    def recorded_write(self, *args):
        with Recorded():
            write(self, *args)

    monkeypatch.setattr(DiskTier, "_write", recorded_write)
    lm = tiny(kind)
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    _, prompt = turns(lm, cache, 2)
    cache.flush()
    assert files(tmp_path) and called and called <= VIEWS, called - VIEWS
    resumed = lm.generate(prompt, max_new_tokens=20, prefix_cache=PrefixCache(
        mib=64, block_tokens=16, directory=tmp_path))  # fmt: skip
    assert resumed.stats.cached_tokens >= 0.9 * resumed.stats.prompt_tokens
    assert resumed.token_ids == lm.generate(prompt, max_new_tokens=20).token_ids


def test_a_block_queued_to_be_written_is_not_queued_again(tmp_path, monkeypatch):
    """A store that comes while the last store's writes are still queued (the writer held
    back here) queues only the blocks not queued yet: each file is written once."""
    gate, write, flush = threading.Event(), DiskTier._write, DiskTier.flush
    written = []

    def held_write(self, name, *args):
        assert gate.wait(timeout=120)
        written.append(name)
        write(self, name, *args)

    def opening_flush(self):
        gate.set()
        flush(self)

    monkeypatch.setattr(DiskTier, "_write", held_write)
    monkeypatch.setattr(DiskTier, "flush", opening_flush)
    monkeypatch.setattr(DiskTier, "wait_for", lambda self, storage: gate.set())
    lm = tiny("float32")
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    _, prompt = turns(lm, cache, 3)  # each turn stores its whole sequence again
    cache.flush()
    assert written and len(written) == len(set(written)) == len(files(tmp_path))


def test_blocks_evicted_from_memory_are_read_back_from_disk(tmp_path):
    lm = tiny("float32")
    per_block = lm.target.kv_bytes_per_token * 16
    cache = PrefixCache(mib=3 * per_block / 2**20, block_tokens=16, directory=tmp_path)
    _, first = turns(lm, cache, 2, seed=1)
    turns(lm, cache, 2, seed=2)  # pushes the first conversation out of memory
    cache.flush()
    resumed = lm.generate(first, max_new_tokens=20, prefix_cache=cache)
    assert resumed.token_ids == lm.generate(first, max_new_tokens=20, prefix_cache=False).token_ids
    assert resumed.stats.cached_tokens >= 0.9 * resumed.stats.prompt_tokens
    assert cache.used_bytes <= cache.limit_bytes


def test_truncated_corrupt_and_foreign_files_are_skipped_with_one_warning(tmp_path):
    lm = tiny("float32")
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    conversations = [turns(lm, cache, 1, seed=seed)[1] for seed in (1, 2, 3)]
    cache.flush()
    found = files(tmp_path)
    written = [path.read_bytes() for path in found]
    # Spoil every file: a third truncated, a third with a changed byte, a third another's.
    for index, (path, data) in enumerate(zip(found, written)):
        if index % 3 == 0:
            path.write_bytes(data[: len(data) // 2])
        elif index % 3 == 1:
            path.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
        else:
            path.write_bytes(written[index - 1])
    after = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [lm.generate(p, max_new_tokens=20, prefix_cache=after) for p in conversations]
    said = [w for w in caught if "truncated, corrupt or foreign" in str(w.message)]
    assert len(said) == 1 and after.disk.skipped >= 3
    for prompt, result in zip(conversations, results):
        assert result.token_ids == lm.generate(prompt, max_new_tokens=20).token_ids
        assert result.stats.cached_tokens == 0


def test_another_tenant_finds_nothing_on_disk(tmp_path):
    lm = tiny("float32")
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    _, prompt = turns(lm, cache, 1, tenant="a")
    cache.flush()
    after = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    other = lm.generate(prompt, max_new_tokens=4, prefix_cache=after, tenant="b")
    assert other.stats.cached_tokens == 0
    again = lm.generate(prompt, max_new_tokens=4, prefix_cache=after, tenant="a")
    assert again.stats.cached_tokens > 0


@pytest.mark.parametrize("other", ["another model", "another dtype"])
def test_another_model_or_dtype_finds_nothing_on_disk(tmp_path, other):
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    _, prompt = turns(tiny("float32"), cache, 1)
    cache.flush()
    model = tiny_llama(seed=2) if other == "another model" else tiny_llama(seed=1)
    if other == "another dtype":
        model = model.to(torch.bfloat16)
    lm = promptlookup.from_transformers(model, TinyTokenizer(32), name="other")
    after = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    assert lm.generate(prompt, max_new_tokens=4, prefix_cache=after).stats.cached_tokens == 0


def test_the_folder_and_files_are_the_users_only(tmp_path):
    old = os.umask(0o022)
    try:
        folder = tmp_path / "made" / "here"
        cache = PrefixCache(mib=64, block_tokens=16, directory=folder)
        turns(tiny("float32"), cache, 1)
        cache.flush()
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert files(folder)
    assert {stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()} == {0o600}


def test_file_names_reveal_no_tenant_and_no_prompt(tmp_path):
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path)
    turns(tiny("float32"), cache, 1, tenant="tenant-secret")
    cache.flush()
    names = [path.name for path in tmp_path.iterdir()]
    assert names and all(NAME.match(name) for name in names)


def test_the_folder_stays_within_its_budget_and_forgets_the_least_recently_used(tmp_path):
    lm = tiny("float32")
    per_block = lm.target.kv_bytes_per_token * 16
    budget = 20 * per_block / 2**20  # about one and a half conversations' blocks
    cache = PrefixCache(mib=64, block_tokens=16, directory=tmp_path, disk_mib=budget)
    prompts = []
    for seed in range(4):
        prompts.append(turns(lm, cache, 2, seed=seed)[1])
        cache.flush()
        assert sum(path.stat().st_size for path in files(tmp_path)) <= budget * 2**20
    after = PrefixCache(mib=64, block_tokens=16, directory=tmp_path, disk_mib=budget)
    latest = lm.generate(prompts[-1], max_new_tokens=4, prefix_cache=after)
    assert latest.stats.cached_tokens >= 0.9 * latest.stats.prompt_tokens
    assert lm.generate(prompts[0], max_new_tokens=4, prefix_cache=after).stats.cached_tokens == 0


def test_a_write_cut_short_by_its_process_end_is_cleared_at_start(tmp_path):
    import subprocess
    import sys

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    name = "ab" * 32 + ".safetensors"
    dead = tmp_path / f".{name}.{int(ended.stdout)}.tmp"
    alive = tmp_path / f".{name}.{os.getpid()}.tmp"  # a live process's: still being written
    for path in (dead, alive):
        path.write_bytes(b"half a block")
    DiskTier(tmp_path, 2**20)
    assert not dead.exists() and alive.exists()


def test_a_disk_tier_needs_a_budget_and_a_folder(tmp_path):
    with pytest.raises(InvalidParameterError, match="budget"):
        PrefixCache(mib=8, directory=tmp_path, disk_mib=0)
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(InvalidParameterError, match="folder"):
        PrefixCache(mib=8, directory=tmp_path / "a-file" / "below")


def test_the_server_keeps_blocks_on_disk_by_default_in_the_users_cache(tmp_path):
    default = prefix_cache(ServerSettings())
    assert default.disk.directory == cache_files.prefix_cache_folder()  # this test's, here
    assert default.budget_bytes == 64 * 2**20
    memory_only = prefix_cache(ServerSettings(prefix_cache_dir="none"))
    assert memory_only.disk is None and memory_only.budget_bytes == 1024 * 2**20
    chosen = prefix_cache(ServerSettings(prefix_cache_mib=96, prefix_cache_dir=str(tmp_path)))
    assert chosen.disk.directory == tmp_path and chosen.budget_bytes == 96 * 2**20
    assert prefix_cache(ServerSettings(prefix_cache_mib=0)) is None


def test_a_default_folder_that_cannot_be_made_leaves_the_disk_out_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setattr(cache_files, "prefix_cache_folder", lambda: tmp_path / "a-file" / "x")
    cache = prefix_cache(ServerSettings())
    assert cache.disk is None and cache.budget_bytes == 1024 * 2**20
    assert "keeps its blocks in memory only" in caplog.text
    with pytest.raises(InvalidParameterError, match="folder"):  # one named: an error
        prefix_cache(ServerSettings(prefix_cache_dir=str(tmp_path / "a-file" / "x")))


@pytest.mark.slow
def test_the_default_model_resumes_a_conversation_after_a_restart(default_lm, tmp_path):
    code = "\n".join(f"def add_{i}(x):\n    return x + {i}" for i in range(40))
    messages = [{"role": "user", "content": f"{code}\n\nWhat do these functions do?"}]
    cache = PrefixCache(mib=256, directory=tmp_path / "run")
    first = default_lm.generate(messages, max_new_tokens=48, prefix_cache=cache)
    cache.flush()
    shutil.copytree(tmp_path / "run", tmp_path / "restart")  # the folder after the first turn
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Make them subtract."},
    ]
    in_memory = default_lm.generate(messages, max_new_tokens=48, prefix_cache=cache)
    restarted = PrefixCache(mib=256, directory=tmp_path / "restart")
    default_lm.target._kv_identity = None  # computed again, as a new process would
    resumed = default_lm.generate(messages, max_new_tokens=48, prefix_cache=restarted)
    plain = default_lm.generate(messages, max_new_tokens=48, prefix_cache=False)
    assert resumed.token_ids == in_memory.token_ids == plain.token_ids
    assert resumed.stats.cached_tokens == in_memory.stats.cached_tokens
    assert resumed.stats.cached_tokens >= 0.9 * resumed.stats.prompt_tokens
