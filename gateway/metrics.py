"""Prometheus metrics, in a registry of Herald's own (no process-global state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.store.stats import StoreStats


class Metrics:
    """Every metric Herald exports. One instance per daemon."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.turns = Counter(
            "herald_turns", "Finished turns by status", ["status"], registry=self.registry
        )
        self.turn_seconds = Histogram(
            "herald_turn_duration_seconds",
            "Time from a turn's start to its end",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.turn_overhead_seconds = Histogram(
            "herald_turn_overhead_seconds",
            "Herald's own time in an API answer: arrival to response, less the model calls",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
            registry=self.registry,
        )
        self.running_turns = Gauge(
            "herald_running_turns", "Turns running now", registry=self.registry
        )
        self.waiting_turns = Gauge(
            "herald_waiting_turns", "Turns waiting for their session lane", registry=self.registry
        )
        self.refused_turns = Counter(
            "herald_refused_turns",
            "HTTP API turns refused (503) because sessions.max_waiting_turns were waiting",
            registry=self.registry,
        )
        self.http_requests = Counter(
            "herald_http_requests",
            "HTTP requests by route and status code",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.model_failures = Counter(
            "herald_model_failures",
            "Turns that failed, by kind: unreachable (retried later), rejected (key or request "
            "refused), timeout (past sessions.turn_timeout), internal",
            ["kind"],
            registry=self.registry,
        )
        self.model_calls_failed = Counter(
            "herald_model_call_failures",
            "Model calls that failed after the client's retries, by kind (unreachable, rejected)",
            ["kind"],
            registry=self.registry,
        )
        self.adapter_restarts = Counter(
            "herald_adapter_restarts",
            "Adapter restarts after an error",
            ["adapter"],
            registry=self.registry,
        )

        self.deliveries = Counter(
            "herald_deliveries",
            "Outbound chunk send attempts by outcome (sent, retry, rate_limited, dead)",
            ["outcome"],
            registry=self.registry,
        )
        self.inbound = Counter(
            "herald_inbound_messages",
            "Inbound messages accepted, by platform and account",
            ["platform", "account"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "herald_message_outcomes",
            "Final outcomes of inbound messages",
            ["outcome"],
            registry=self.registry,
        )
        self.memory_recall_failures = Counter(
            "herald_memory_recall_failures",
            "Recalls from the memory provider that failed (timeout, error); the turn went on",
            ["kind"],
            registry=self.registry,
        )
        self.memory_recall_seconds = Histogram(
            "herald_memory_recall_seconds",
            "Time a turn waited for the memory provider's recall",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.memory_syncs = Counter(
            "herald_memory_syncs",
            "Tries to sync to the memory provider by result (sent, retried, dead)",
            ["result"],
            registry=self.registry,
        )
        self.trigger_requests = Counter(
            "herald_trigger_requests",
            "Requests to /hooks/<trigger> by outcome (new, duplicate, skipped, unverified, "
            "rate_limited, full, too_large, unknown)",
            ["trigger", "outcome"],
            registry=self.registry,
        )
        self.signals_ignored = Counter(
            "herald_signals_ignored",
            "Cluster signals not acted upon: malformed, or unconfirmed by the database (forged)",
            ["reason"],
            registry=self.registry,
        )

    def watch_store(self, stats: StoreStats) -> None:
        """Export the store's counters (`herald_store_*_total`), read at each scrape."""
        self.registry.register(_StoreCollector(stats))

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    """`StoreStats` as Prometheus counters."""

    def __init__(self, stats: StoreStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        """One counter per figure, as it is now."""
        s = self.stats
        yield CounterMetricFamily(
            "herald_store_statements",
            "SQL statements the store sent to the database (SQLite's BEGINs included)",
            value=s.statements,
        )
        yield CounterMetricFamily(
            "herald_store_transactions", "Transactions the store began", value=s.transactions
        )
        yield CounterMetricFamily(
            "herald_store_handoffs",
            "Trips from the event loop to the database driver: calls run on a SQLite "
            "connection's thread, or round trips to PostgreSQL (BEGIN, statements, COMMIT)",
            value=s.handoffs,
        )
        yield CounterMetricFamily(
            "herald_store_pings",
            "Liveness checks of pooled PostgreSQL connections before use",
            value=s.pings,
        )
