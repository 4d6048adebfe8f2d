"""The drafter over a :class:`~.cross_request.CrossRequestIndex` beside the request's own
context, and the indexes of a server's tenants."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from ..errors import InvalidParameterError
from ..limits import MAX_TENANTS
from .base import Draft
from .cross_request import INDEX_TOKENS, SHARED, CrossRequestIndex, Document
from .prompt_lookup import PromptLookupDrafter

#: How a server shares cross-request indexes between its tenants (see :class:`TenantIndexes`).
SHARING = ("off", "per-tenant", "global")


class SharedLookupDrafter(PromptLookupDrafter):
    """Prompt lookup over the request's own context and over a :class:`CrossRequestIndex`.

    Each step drafts from the request's own prompt and output first (exactly as
    :class:`PromptLookupDrafter`) and from the shared index, and proposes the shared draft only
    where it is worth more: with the speculation policy, more expected accepted tokens by each
    source's own acceptance statistics (:meth:`~promptlookup.policy.Speculation.expected_accepted`),
    so a source whose drafts are not accepted stops being drafted from (with
    ``speculation="fixed"``: the longer draft); without one, a strictly longer match. The generation's accepted tokens join the index as one document after every
    step (its last step's when it ends on an end-of-sequence token is left out).

    >>> index = CrossRequestIndex()
    >>> index.add([7, 8, 9, 10, 11])
    >>> SharedLookupDrafter(index).propose([1, 2, 8, 9], max_tokens=4)  # nothing of its own
    [10, 11]
    """

    def __init__(self, index: CrossRequestIndex, *, policy=None, **options) -> None:
        if not isinstance(index, CrossRequestIndex):
            raise InvalidParameterError(
                f"cross_request must be a promptlookup.CrossRequestIndex, got {index!r}"
            )
        super().__init__(**options)
        self.shared = index
        #: The sequence's side of the speculation policy (handed by bind_generation).
        self.policy = policy
        self._published_list: Sequence[int] | None = None
        self._published = 0
        self._document: Document | None = None

    def propose(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        self._publish(tokens)
        own = super().propose(tokens, max_tokens)
        limit = min(max_tokens, self.num_tokens)
        shared = self.shared.draft(tokens, limit, self.min_match, self.eos_token_ids)
        return self._choose(own, shared)

    def update(self, draft: Sequence[int], num_accepted: int) -> None:
        if self._published_list is not None:
            self._publish(self._published_list)

    def _choose(self, own: Draft, shared: Draft) -> Draft:
        """The request's own draft unless the shared one is worth more (see the class doc)."""
        if not shared:
            return own
        if not own:
            return shared
        if self.policy is None:
            return shared if shared.match_length > own.match_length else own
        own_gain = self.policy.expected_accepted(len(own), own.match_length, own.source)
        shared_gain = self.policy.expected_accepted(len(shared), shared.match_length, SHARED)
        return shared if shared_gain > own_gain else own

    def _publish(self, tokens: Sequence[int]) -> None:
        """Add the tokens accepted since the last call to this generation's document (the
        first call, with the prompt only, opens it)."""
        if tokens is not self._published_list:
            self._published_list, self._published = tokens, len(tokens)
            self._document = self.shared.open(tokens)
            return
        if len(tokens) > self._published:
            self.shared.extend(self._document, tokens[self._published :])
        self._published = len(tokens)

    def __repr__(self) -> str:
        return f"SharedLookupDrafter({super().__repr__()}, {self.shared!r})"


class TenantIndexes:
    """Cross-request indexes by tenant, for a server: ``sharing`` is ``"off"`` (no index),
    ``"per-tenant"`` (one index per tenant, :mod:`promptlookup.server.tenants`: a client's drafts
    never come from another client's outputs, whose acceptance speed could reveal them) or
    ``"global"`` (one index for all).
    At most ``max_tenants`` indexes of ``max_tokens`` each are kept, the least recently used
    one forgotten first.

    >>> indexes = TenantIndexes("per-tenant", max_tokens=1000)
    >>> indexes.for_tenant("key-a") is indexes.for_tenant("key-b")
    False
    >>> TenantIndexes("off").for_tenant("key-a") is None
    True
    """

    def __init__(
        self,
        sharing: str = "per-tenant",
        max_tokens: int = INDEX_TOKENS,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        if sharing not in SHARING:
            raise InvalidParameterError(
                f"cross-request sharing must be one of {', '.join(SHARING)}, got {sharing!r}"
            )
        self.sharing, self.max_tokens, self.max_tenants = sharing, max_tokens, max_tenants
        self._indexes: collections.OrderedDict[str | None, CrossRequestIndex] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def for_tenant(self, tenant: str | None) -> CrossRequestIndex | None:
        """The index a request of ``tenant`` (None: no keys) drafts from and adds to, or None
        when sharing is off."""
        if self.sharing == "off":
            return None
        key = None if self.sharing == "global" else tenant
        with self._lock:
            index = self._indexes.pop(key, None)
            if index is None:
                index = CrossRequestIndex(self.max_tokens)
            self._indexes[key] = index  # the most recently used last
            while len(self._indexes) > self.max_tenants:
                self._indexes.popitem(last=False)
            return index
