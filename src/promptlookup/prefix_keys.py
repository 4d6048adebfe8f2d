"""The prefix cache's content keys: the names of the disk tier's files
(:mod:`promptlookup.prefix_disk`), one per block, a hash chain as vLLM's block hashes are. The
root hashes the model's :meth:`~promptlookup.backends.base.PrefixTarget.kv_identity` (weights,
engine, KV layout and dtype), the tenant and the block size; each whole block hashes its
parent's key and its own tokens (:func:`chain`). A block is therefore found only for the same
model, engine, KV dtype, tenant and every token before it, and a file name reveals no tenant
and no prompt. A *tail* (a sequence's last tokens that do not fill a block) is named by its
parent and its length (:func:`tail_name`), holds its tokens, and is reused for the tokens a
request shares with them."""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Hashable, Sequence

#: The format of the files and of their names; another version's files are never found.
VERSION = "promptlookup-prefix-blocks-2"
SUFFIX = ".safetensors"
NAME = re.compile(r"^[0-9a-f]{64}" + re.escape(SUFFIX) + "$")
#: A file being written (by process ``[1]``), renamed to its block's name when whole.
TEMPORARY = re.compile(r"^\.[0-9a-f]{64}" + re.escape(SUFFIX) + r"\.(\d+)\.tmp$")


def root_key(identity: str, namespace: Hashable, block_tokens: int) -> bytes:
    """The key above a tenant's first block: the model's identity, the tenant, the block size."""
    tenant = (
        json.dumps(namespace)
        if namespace is None or isinstance(namespace, str)
        else repr(namespace)
    )
    text = f"{VERSION}\0{identity}\0{tenant}\0{block_tokens}"
    return hashlib.sha256(text.encode()).digest()


def chain(root: bytes, tokens: Sequence[int], block_tokens: int) -> list[bytes]:
    """The keys of the whole blocks of ``tokens``: each block's key hashes its parent's key
    (``root`` for the first) and its tokens."""
    keys, parent = [], root
    for start in range(0, len(tokens) // block_tokens * block_tokens, block_tokens):
        block = array("q", tokens[start : start + block_tokens]).tobytes()
        parent = hashlib.sha256(parent + block).digest()
        keys.append(parent)
    return keys


def name_of(key: bytes) -> str:
    return key.hex() + SUFFIX


def tail_name(parent: bytes, length: int) -> str:
    """The file of a tail of ``length`` tokens below the block (or root) keyed ``parent``."""
    return name_of(hashlib.sha256(parent + b"tail" + length.to_bytes(4, "little")).digest())
