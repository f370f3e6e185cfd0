"""Every message a run page receives over its WebSocket (``webapp.consumers``), typed.

A message is a JSON object whose ``kind`` names its type in :data:`KINDS`. The run
page's script (static/js/run.js) reads exactly these fields; ``problems`` checks a
received message against its type (the schema test runs it on every kind, over a real
WebSocket). Numbers that a run has not measured yet are null.
"""
# No "from __future__ import annotations": TypedDict reads NotRequired from evaluated
# annotations only.
import types
import typing
from typing import Any, Literal, NotRequired, TypedDict, Union


class Verification(TypedDict):
    """The exactly-once check of a run's kept output (``pipelines.runtime.verify``)."""

    state: str  # queued, running, done, error
    ok: bool | None  # done: nothing lost, duplicated or wrong
    line: str  # one line for the badge's title
    done: int  # batches checked so far
    of: int  # batches to check
    badge: str  # the badge's text and css class (pipelines.models.verification_badge)
    css: str


class RunState(TypedDict):
    id: int
    status: str
    reason: str
    workers: int
    frequency_ghz: float | None
    frequency_source: str
    dry_run: bool
    key_groups: int | None
    spark_app_id: str
    verification: Verification | None


class OperatorBytes(TypedDict):
    """One stateful operator's state per key group (named by its dataflow node)."""

    operator: str
    bytes: list[int]


class Groups(TypedDict):
    """Per key group (index = group): where it lives, where it ran, its size and load."""

    placement: list[str | None] | None
    ran_on: list[str | None] | None
    group_bytes: list[int | None] | None
    group_ms: list[float | None] | None
    group_records: list[int | None] | None
    operator_bytes: list[OperatorBytes] | None
    executor_hosts: NotRequired[dict[str, str] | None]  # executor id -> its host


class Sample(TypedDict):
    """One micro-batch (``pipelines.actions.SAMPLE_FIELDS``); latencies are measured,
    power is modelled unless ``power_measured``."""

    batch_id: int
    t: float
    input_rows: int | None
    records: int | None
    input_rate: float | None
    scheduled_rate: float | None
    output_rate: float | None
    batch_duration_ms: int | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    workers: int | None
    frequency_ghz: float | None
    power_w: float | None
    power_measured: bool
    state_rows: int | None
    frequency_source: str | None
    drift: int | None
    group_moves: int | None
    failed_tasks: int | None
    groups: Groups | None
    migration: dict[str, Any] | None
    written_at: NotRequired[float | None]  # pushed live only: when the runner wrote it


class Event(TypedDict):
    id: int
    at: str
    kind: str
    actor: str
    message: str
    payload: dict[str, Any] | None


class Setting(TypedDict):
    workers: int
    freq_ghz: float | None


class Decision(TypedDict):
    id: int
    step: int
    t: float
    at: str
    strategy: str
    action: str
    outcome: str
    outcome_message: str
    current: Setting
    chosen: Setting
    measured_latency_ms: float | None
    predicted_latency_ms: float | None
    predicted_power_w: float | None
    solve_ms: float | None
    cost: dict[str, Any] | None
    reason: str
    alerts: list[str]
    rebalance: dict[str, Any] | None
    mape: dict[str, Any]


class SnapshotMessage(TypedDict):
    kind: Literal["snapshot"]
    run: RunState
    samples: list[Sample]
    events: list[Event]
    decisions: list[Decision]


class MetricsMessage(TypedDict):
    kind: Literal["metrics"]
    samples: list[Sample]


class EventMessage(TypedDict):
    kind: Literal["event"]
    event: Event


class DecisionMessage(TypedDict):
    kind: Literal["decision"]
    decision: Decision


class StatusMessage(TypedDict):
    kind: Literal["status"]
    run: RunState


KINDS: dict[str, type] = {"snapshot": SnapshotMessage, "metrics": MetricsMessage,
                          "event": EventMessage, "decision": DecisionMessage,
                          "status": StatusMessage}


def problems(message: dict[str, Any]) -> list[str]:
    """What makes ``message`` differ from its kind's type: missing or unknown fields,
    values of the wrong type (paths like ``samples[0].latency_p95_ms``); [] if none."""
    kind = message.get("kind")
    if kind not in KINDS:
        return [f"kind: {kind!r} is not one of {', '.join(KINDS)}"]
    return _check(message, KINDS[kind], "")


def _check(value: Any, expected: Any, path: str) -> list[str]:
    origin = typing.get_origin(expected)
    if expected is Any:
        return []
    if expected is None or expected is type(None):
        return [] if value is None else [f"{path or 'message'}: expected null, got {value!r}"]
    if origin in (Union, types.UnionType):
        options = typing.get_args(expected)
        results = [_check(value, option, path) for option in options]
        return [] if any(not r for r in results) else min(results, key=len)
    if origin is Literal:
        allowed = typing.get_args(expected)
        return [] if value in allowed else [f"{path}: {value!r} is not one of {allowed}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item,) = typing.get_args(expected)
        return [p for i, v in enumerate(value) for p in _check(v, item, f"{path}[{i}]")]
    if origin is dict or expected is dict:
        return [] if isinstance(value, dict) else [f"{path}: expected an object"]
    if typing.is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{path or 'message'}: expected an object, got {type(value).__name__}"]
        hints = typing.get_type_hints(expected)
        out = [f"{(path + '.' + k).lstrip('.')}: missing" for k in expected.__required_keys__
               if k not in value]
        out += [f"{(path + '.' + k).lstrip('.')}: unknown field" for k in value if k not in hints]
        for key, hint in hints.items():
            if key in value:
                if typing.get_origin(hint) is NotRequired:
                    hint = typing.get_args(hint)[0]
                out += _check(value[key], hint, (path + "." + key).lstrip("."))
        return out
    if expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    return [] if ok else [f"{path}: expected {expected.__name__}, got {value!r}"]
