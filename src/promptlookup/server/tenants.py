"""API keys and the tenants they belong to.

A server started with keys (``--api-key KEY``, repeatable, and ``--api-keys-file FILE``)
answers ``/v1`` requests only with ``Authorization: Bearer <one of them>``; the key that
matched names the request's *tenant*: the keys file's name for it, or ``key-`` and the first
12 hex digits of the key's SHA-256 for a key given with ``--api-key``. The tenant comes from
the key, not from the header's spelling (``bearer`` or ``Bearer``, spaces around the key), so
a client is one tenant however it writes its header. Without keys every request is the one
tenant None.

Tenants keep what could reveal one client's prompts or answers to another apart: each has
its own cross-request index and its own entries in the prefix cache (unless the server is
started to share them: ``--cross-request global``, ``--prefix-cache-scope global``), and
its own acceptance history in the speculation policy; the index and the history are kept for
the :data:`~promptlookup.limits.MAX_TENANTS` most recent tenants. Several keys may name one
tenant (key rotation).

The keys file has one ``TENANT KEY`` pair a line; blank lines and lines starting with ``#``
are skipped.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path

from ..errors import InvalidParameterError


class Tenants:
    """The server's keys, each with its tenant's name (see the module doc)."""

    def __init__(self, keys: dict[str, str]) -> None:
        #: Each key's SHA-256 digest and its tenant (digests: comparisons take the same time
        #: whatever the key's length).
        self._digests = [(_digest(key), tenant) for key, tenant in keys.items()]

    @classmethod
    def of(cls, api_keys: Iterable[str] = (), keys_file: str | Path | None = None) -> Tenants:
        """The keys of ``--api-key`` (each its own tenant) and of ``--api-keys-file``."""
        keys = {key: "key-" + _digest(key).hex()[:12] for key in api_keys if key}
        if keys_file is not None:
            for key, tenant in read_keys_file(keys_file).items():
                if keys.get(key, tenant) != tenant:
                    raise InvalidParameterError(
                        f"{keys_file}: a key of tenant {tenant!r} is also given with --api-key"
                    )
                keys[key] = tenant
        return cls(keys)

    @property
    def required(self) -> bool:
        """Whether requests need a key."""
        return bool(self._digests)

    def tenant(self, authorization: bytes | str | None) -> str | None:
        """The tenant of an ``Authorization`` header's key, or None if it holds none of the
        keys (every key is compared, in constant time each)."""
        if isinstance(authorization, str):
            authorization = authorization.encode("utf-8", "surrogateescape")
        scheme, _, token = (authorization or b"").strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        digest, found = _digest(token.strip()), None
        for key, tenant in self._digests:
            if hmac.compare_digest(digest, key):
                found = tenant
        return found


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def read_keys_file(path: str | Path) -> dict[str, str]:
    """A keys file's keys and their tenants; a named error for a line that is not ``TENANT
    KEY`` or a key given twice."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"cannot read the keys file {path}: {exc}") from None
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise InvalidParameterError(
                f"{path}:{number}: expected 'TENANT KEY', got {len(fields)} fields"
            )
        tenant, key = fields
        if key in keys:
            raise InvalidParameterError(f"{path}:{number}: this key is already on a line above")
        keys[key] = tenant
    if not keys:
        raise InvalidParameterError(f"{path}: no keys in the keys file")
    return keys
