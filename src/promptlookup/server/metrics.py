"""``GET /metrics``: the server's Prometheus metrics, behind the API key when keys are set.

Names follow vLLM's where vLLM has the metric (``vllm:prompt_tokens_total``,
``vllm:time_to_first_token_seconds``, ...), so that its dashboards read this server; the
others are ``promptlookup:``. Every metric lives in the app's own
:class:`~prometheus_client.CollectorRegistry` (two apps in one process never share one).
The complete list is ``docs/server.md``.

Two places observe, for every API at once:

- :class:`RequestCounter`, an ASGI middleware, counts each HTTP request by API, status and
  tenant when its response begins (a stream's 200 when its first bytes go out);
- :meth:`Metrics.track` watches one generation job's events (its ``events`` queue) and, when
  the job ends, counts its tokens, drafts, forward passes and prefix cache hits and observes
  its latencies (from the statistics of its choices: the same for streamed and whole answers).

The queue (running, waiting) and the prefix cache's bytes per tenant are read when scraped.
Tenants are the names :mod:`.tenants` derives (a keys file's name, or ``key-`` and 12 hex
digits of the key's SHA-256): never a key; empty without keys.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "RequestCounter"]

#: The API of each path that is counted by name; any other path counts as ``other`` (so that
#: unknown paths cannot grow the metrics without bound).
APIS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages.count_tokens",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/health": "health",
    "/metrics": "metrics",
}
#: Histogram buckets (seconds) of time to first token and of whole requests: vLLM's.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def tenant_label(tenant: str | None) -> str:
    return tenant or ""


class Metrics:
    """The app's metrics (see the module doc); ``state``: its :class:`~.state.ServerState`,
    read when scraped."""

    def __init__(self, state) -> None:
        self.state = state
        self.registry = registry = CollectorRegistry()
        model, per_tenant = ["model_name"], ["model_name", "tenant"]

        def counter(name: str, help: str, labels=per_tenant) -> Counter:
            return Counter(name, help, labels, registry=registry)

        def histogram(name: str, help: str, buckets) -> Histogram:
            return Histogram(name, help, model, buckets=buckets, registry=registry)

        # Per request, by API, HTTP status and tenant.
        self.requests = counter(
            "promptlookup:http_requests", "HTTP requests answered", ["api", "status", "tenant"]
        )
        self.success = counter(
            "vllm:request_success",
            "Sequences that ended, by finish reason (stop, length; abort: cancelled; error)",
            ["model_name", "finished_reason"],
        )
        # Tokens, per tenant.
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of ended requests")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Generated tokens (usage.completion_tokens)"
        )
        self.cache_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache"
        )
        self.cache_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (not prefilled)"
        )
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed")
        self.accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted by the target"
        )
        self.forward_passes = counter(
            "promptlookup:forward_passes", "Target forward passes that produced tokens"
        )
        self.keepalives = counter(
            "promptlookup:stream_keepalives",
            "Keep-alive comments and pings sent on idle streams",
            model,
        )
        # Latencies.
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Seconds from arrival to leaving the queue",
            REQUEST_BUCKETS,
        )  # fmt: skip
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from arrival to the first generated token (queue and prefill included)",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between successive forward passes' tokens of a sequence",
            TOKEN_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Per request: seconds from its first to its last token over the tokens after the first",
            TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Seconds from arrival to the end of the generation",
            REQUEST_BUCKETS,
        )
        registry.register(_Gauges(state))

    @property
    def model(self) -> str:
        return self.state.model_id

    def scrape(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def kept_alive(self) -> None:
        """Count a keep-alive sent on an idle stream."""
        self.keepalives.labels(self.model).inc()

    def track(self, job, tenant: str | None) -> None:
        """Observe ``job`` (a queued :class:`~.worker.GenerationJob`, before it is submitted)
        until it ends: its events are watched as the worker puts them."""
        job.events = _Watched(_Job(self, tenant_label(tenant)).event)

    def finished(self, tenant: str, choices, arrived: float, started: float | None) -> None:
        """Count an ended job's ``choices`` (``arrived``, ``started``: its clock times)."""
        now, model = time.perf_counter(), self.model
        if not choices:
            return
        results = [c.result for c in choices]
        prompt, cached = len(results[0].prompt_ids), results[0].stats.cached_tokens
        self.prompt_tokens.labels(model, tenant).inc(prompt)
        self.generation_tokens.labels(model, tenant).inc(sum(c.tokens for c in choices))
        self.cache_queries.labels(model, tenant).inc(prompt)
        self.cache_hits.labels(model, tenant).inc(cached)
        for choice in choices:
            stats = choice.result.stats
            self.draft_tokens.labels(model, tenant).inc(stats.drafted_tokens)
            self.accepted_tokens.labels(model, tenant).inc(stats.accepted_tokens)
            self.forward_passes.labels(model, tenant).inc(stats.forward_passes)
            self.success.labels(model, choice.result.finish_reason).inc()
            times = sorted(set(stats.token_seconds))  # the passes' times: tokens of one together
            for before, after in zip(times, times[1:]):
                self.itl.labels(model).observe(after - before)
            if len(stats.token_seconds) > 1:
                span = stats.token_seconds[-1] - stats.token_seconds[0]
                self.tpot.labels(model).observe(span / (len(stats.token_seconds) - 1))
        first = results[0].stats.token_seconds[:1]
        if first and started is not None:
            self.ttft.labels(model).observe(started - arrived + first[0])
        self.e2e.labels(model).observe(now - arrived)

    def ended(self, reason: str) -> None:
        """Count a job that ended without its answer (``abort``: cancelled; ``error``)."""
        self.success.labels(self.model, reason).inc()


class _Job:
    """One tracked job's clock: when it arrived and left the queue."""

    def __init__(self, metrics: Metrics, tenant: str) -> None:
        self.metrics, self.tenant = metrics, tenant
        self.arrived, self.started = time.perf_counter(), None

    def event(self, kind: str, value) -> None:
        metrics = self.metrics
        if kind == "started":
            self.started = time.perf_counter()
            metrics.queue_time.labels(metrics.model).observe(self.started - self.arrived)
        elif kind == "done":
            metrics.finished(self.tenant, value, self.arrived, self.started)
        elif kind in ("error", "cancelled"):
            metrics.ended("abort" if kind == "cancelled" else "error")


class _Watched(asyncio.Queue):
    """A job's event queue that shows each event to ``watch(kind, value)`` as it is put (on
    the event loop: the worker puts them with ``call_soon_threadsafe``)."""

    def __init__(self, watch) -> None:
        super().__init__()
        self._watch = watch

    def put_nowait(self, item) -> None:
        super().put_nowait(item)
        self._watch(*item)


class _Gauges:
    """What is read when scraped: the queue, and the prefix cache's bytes per tenant."""

    def __init__(self, state) -> None:
        self.state = state

    def collect(self):
        state, model = self.state, self.state.model_id
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests generating now", labels=["model_name"]
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests in the queue", labels=["model_name"]
        )
        worker = state.worker
        running.add_metric([model], worker.running if worker is not None else 0)
        waiting.add_metric([model], worker.waiting if worker is not None else 0)
        yield running
        yield waiting
        cache = state.prefix_cache
        if cache is None:
            return
        budget = GaugeMetricFamily(
            "promptlookup:prefix_cache_budget_bytes",
            "The prefix cache's budget (--prefix-cache-mib)",
        )
        budget.add_metric([], cache.budget_bytes)
        used = GaugeMetricFamily(
            "promptlookup:prefix_cache_bytes",
            "Bytes of keys and values the prefix cache holds, by tenant (with "
            "--prefix-cache-scope global: one, empty)",
            labels=["tenant"],
        )
        for tenant, held in sorted(cache.bytes_by_tenant().items()):
            used.add_metric([tenant_label(tenant)], held)
        yield budget
        yield used


class RequestCounter:
    """ASGI middleware: counts each HTTP request by API, status and tenant
    (:attr:`Metrics.requests`) when its response starts, or as a 500 when the app raises."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = False

        def count(status: int) -> None:
            nonlocal counted
            counted = True
            tenant = tenant_label(scope.get("state", {}).get("tenant"))
            api = APIS.get(scope["path"].rstrip("/") or "/", "other")
            if scope["path"].startswith("/v1/models/"):
                api = "models"
            self.metrics.requests.labels(api, str(status), tenant).inc()

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start" and not counted:
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not counted:
                count(500)
            raise
