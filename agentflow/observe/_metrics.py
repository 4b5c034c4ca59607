"""`Metrics`: agentflow's Prometheus metrics, and the event subscriber that keeps them.

Every figure comes from an event a run already emits (`agentflow._events`); nothing here
reads a store or touches a run. Labels are bounded sets: a flow's name, a tool's name, a
status, a cause. Never a run id or a call id (one series per run would grow without end).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from agentflow._app import FlowApp
from agentflow._events import Event, Events
from agentflow._run_types import RunKind
from agentflow.exec.checkpoints.forwarding import StoreHook
from agentflow.observe._store import OPS, StoreTimer

#: How a run that ended may end.
FINISHED = ("done", "failed", "cancelled")
#: Signed claims that carry a person's decision, and the ``decision`` label each counts under.
DECISIONS = {"resume": "approval", "decision": "in_doubt", "retry": "retry", "cancel": "cancel"}
#: What a refused control message can be (``control.refused``); anything else counts as ``other``,
#: so a forged message cannot invent label values.
REFUSED = ("cancel", "start", "next", "recover", "recheck", "rerun", "resume", "retry", "other")
#: A superstep: a fast one is a few ms on a local store, a long one waits on slow tools.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: A tool call: from in-process functions to model calls and human-speed APIs.
TOOL_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: One store operation: tens of µs in memory, a round trip or a commit elsewhere.
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def column(data: dict[str, Any]) -> str:
    """The run's ``flow`` label: a flow's name, or ``loop:<name>`` for a tool loop."""
    if "loop" in data:
        return RunKind.LOOP.column(str(data["loop"]))
    return str(data.get("flow", ""))


class Metrics:
    """agentflow's metrics on one registry, fed by `watch`ing an `Events` hub (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, register: bool = True) -> None:
        """Define the metrics.

        Args:
            registry: where they are registered (a new `CollectorRegistry` by default;
                `registry` attribute).
            register: False in a process of a multiprocess set-up (Celery's prefork pool):
                the values go to the files of ``PROMETHEUS_MULTIPROC_DIR`` and the exporter
                reads them from there (`agentflow.observe.serve_worker_metrics`).
        """
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry if register else None

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"agentflow_{name}", doc, labels, registry=reg)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"agentflow_{name}", doc, labels, registry=reg, multiprocess_mode="mostrecent")

        self.runs_started = counter("runs_started", "Runs whose step 0 was saved here (started or forked).", ("flow",))
        self.runs_finished = counter("runs_finished", "Runs that ended: done, failed or cancelled.", ("flow", "status"))
        self.runs_paused = counter("runs_paused", "Times a run paused for an approval.", ("flow",))
        self.recoveries = counter("recoveries", "Runs claimed to go on after their worker died.", ("flow",))
        self.decisions = counter(
            "decisions", "Signed decisions saved: approval, in_doubt, retry, cancel.", ("flow", "decision")
        )
        self.calls_replayed = counter("calls_replayed", "Calls whose logged result was replayed.", ("tool",))
        self.calls_rerun = counter("calls_rerun", "Calls in doubt that were run again.", ("tool",))
        self.calls_in_doubt = counter("calls_in_doubt", "Calls in doubt a run was parked on.", ("tool",))
        self.control_refused = counter("control_refused", "Control messages or requests refused.", ("kind",))
        self.leases_lost = counter("leases_lost", "Leases a holder found lost when it renewed them.")
        self.superstep_seconds = Histogram(
            "agentflow_superstep_seconds",
            "One superstep (a tool loop's stage): from taking up the run to its checkpoint.",
            ("flow",),
            registry=reg,
            buckets=STEP_BUCKETS,
        )
        self.tool_call_seconds = Histogram(
            "agentflow_tool_call_seconds",
            "One attempt of a tool call that ended (ok or failed).",
            ("tool", "outcome"),
            registry=reg,
            buckets=TOOL_BUCKETS,
        )
        self.store_seconds = Histogram(
            "agentflow_store_seconds",
            "One checkpoint store operation (`store_hook`).",
            ("op",),
            registry=reg,
            buckets=STORE_BUCKETS,
        )
        self.runs_waiting = gauge(
            "runs_waiting_for_decision", "Runs waiting for a person, at the last sweep.", ("flow", "why")
        )
        self.oldest_wait = gauge(
            "decision_wait_oldest_seconds", "The longest wait for a person, at the last sweep.", ("flow", "why")
        )
        self.runs_unfinished = gauge(
            "runs_unfinished", "Unfinished runs (running or paused) with a known start, at the last sweep.", ("flow",)
        )
        self.oldest_run = gauge(
            "unfinished_run_oldest_seconds", "The age of the oldest unfinished run, at the last sweep.", ("flow",)
        )
        self.swept_at = gauge("sweep_timestamp_seconds", "When this process last swept the unfinished runs.")
        self._handlers: dict[str, Callable[[Event], None]] = {
            "checkpoint.saved": self._saved,
            "tool.finished": self._tool_ok,
            "tool.failed": self._tool_failed,
            "tool.replayed": lambda e: self._of(self.calls_replayed, e.data["tool"]).inc(),
            "tool.rerun": lambda e: self._of(self.calls_rerun, e.data["tool"]).inc(),
            "run.parked": self._parked,
            "control.refused": self._refused,
            "lease.lost": lambda e: self.leases_lost.inc(),
            "runs.swept": self._swept,
        }
        #: Each series' child, once looked up: `labels()` costs more than the increment itself.
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def watch(self, events: Events) -> Callable[[], None]:
        """Keep the metrics from the events of `events` from now on; returns the unsubscribe function.

        Only the events the metrics use are subscribed to, so the hub builds no other.
        """
        return events.subscribe(self.observe, names=self._handlers)

    @functools.cached_property
    def store_hook(self) -> StoreHook:
        """The store hook that observes each operation's duration in `store_seconds` (label ``op``).

        ``ForwardingStore(store, [metrics.store_hook])`` is the store timed.
        """
        children = {op: self.store_seconds.labels(op) for op in OPS}  # resolved once, not per call
        return StoreTimer(lambda op, took: children[op].observe(took / 1e9))

    def _of(self, family: MetricWrapperBase, *labels: str) -> Any:
        """The child of `family` for `labels` (cached)."""
        key = (family, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def observe(self, event: Event) -> None:
        """Count one event (the `Events` subscriber)."""
        handler = self._handlers.get(event.name)
        if handler is not None:
            handler(event)

    def prime(self, app: FlowApp) -> None:
        """Give every series of the app's flows and tools a 0, so a rule sees a counter's first increase."""
        flows = [*app.flows, *(RunKind.LOOP.column(name) for name in app.loops)]
        tools = {tool.name for tool in app.registry}
        tools.update(tool.name for spec in app.loops.values() for tool in spec.registry)
        for flow in flows:
            for family in (self.runs_started, self.runs_paused, self.recoveries):
                family.labels(flow)
            for status in FINISHED:
                self.runs_finished.labels(flow, status)
            for decision in DECISIONS.values():
                self.decisions.labels(flow, decision)
        for tool in sorted(tools):
            for family in (self.calls_replayed, self.calls_rerun, self.calls_in_doubt):
                family.labels(tool)
        for kind in REFUSED:
            self.control_refused.labels(kind)

    def _saved(self, event: Event) -> None:
        data = event.data
        flow, status, claim = column(data), data["status"], data.get("claim")
        if claim is not None:
            if claim == "recovery":
                self._of(self.recoveries, flow).inc()
            elif claim in DECISIONS:
                self._of(self.decisions, flow, DECISIONS[claim]).inc()
        elif data["step"] == 0:
            self._of(self.runs_started, flow).inc()
        else:  # a checkpoint that ends a superstep
            self._of(self.superstep_seconds, flow).observe(data["seconds"])
        if status in FINISHED:
            self._of(self.runs_finished, flow, status).inc()
        elif status == "paused":
            self._of(self.runs_paused, flow).inc()

    def _tool_ok(self, event: Event) -> None:
        self._of(self.tool_call_seconds, event.data["tool"], "ok").observe(event.data["ms"] / 1000)

    def _tool_failed(self, event: Event) -> None:
        self._of(self.tool_call_seconds, event.data["tool"], "failed").observe(event.data["ms"] / 1000)

    def _parked(self, event: Event) -> None:
        for tool in event.data["tools"]:
            self._of(self.calls_in_doubt, tool).inc()

    def _refused(self, event: Event) -> None:
        kind = str(event.data.get("cause") or event.data.get("kind"))
        self._of(self.control_refused, kind if kind in REFUSED else "other").inc()

    def _swept(self, event: Event) -> None:
        for entry in event.data["waiting"]:
            self._of(self.runs_waiting, entry["flow"], entry["why"]).set(entry["runs"])
            self._of(self.oldest_wait, entry["flow"], entry["why"]).set(entry["oldest_s"])
        for entry in event.data.get("unfinished", []):
            self._of(self.runs_unfinished, entry["flow"]).set(entry["runs"])
            self._of(self.oldest_run, entry["flow"]).set(entry["oldest_s"])
        self.swept_at.set(event.at)
