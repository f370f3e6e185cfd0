"""Every message a run page receives over its WebSocket (``webapp.consumers``), typed.

A message is a JSON object whose ``kind`` names its type in :data:`KINDS`. The run
page's script (static/js/run.js) reads exactly these fields; ``problems`` checks a
received message against its type (the schema test runs it on every kind, over a real
WebSocket). Numbers that a run has not measured yet are null.
"""
# No "from __future__ import annotations": TypedDict reads NotRequired from evaluated
# annotations only.
from functools import cache
from typing import Any, Literal, NotRequired

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
# pydantic reads a TypedDict's fields on Python < 3.12 from typing_extensions' only.
from typing_extensions import TypedDict

# Every message type checked as the page reads it: no unknown field, no value of another
# type (no number for a string, no true for a number).
_strict = with_config(ConfigDict(extra="forbid", strict=True))


@_strict
class Verification(TypedDict):
    """The exactly-once check of a run's kept output (``pipelines.runtime.verify``)."""

    state: str  # queued, running, done, error
    ok: bool | None  # done: nothing lost, duplicated or wrong
    line: str  # one line for the badge's title
    done: int  # batches checked so far
    of: int  # batches to check
    badge: str  # the badge's text and css class (pipelines.models.verification_badge)
    css: str


@_strict
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


@_strict
class OperatorBytes(TypedDict):
    """One stateful operator's state per key group (named by its dataflow node)."""

    operator: str
    bytes: list[int]


@_strict
class Groups(TypedDict):
    """Per key group (index = group): where it lives, where it ran, its size and load."""

    placement: list[str | None] | None
    ran_on: list[str | None] | None
    group_bytes: list[int | None] | None
    group_ms: list[float | None] | None
    group_records: list[int | None] | None
    operator_bytes: list[OperatorBytes] | None
    executor_hosts: NotRequired[dict[str, str] | None]  # executor id -> its host


@_strict
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
    dead_letters: int | None  # a broker source's entries that did not convert
    backlog_s: NotRequired[float | None]  # a broker source's newest entry ahead (s)
    groups: Groups | None
    migration: dict[str, Any] | None
    written_at: NotRequired[float | None]  # pushed live only: when the runner wrote it


@_strict
class Event(TypedDict):
    id: int
    at: str
    kind: str
    actor: str
    message: str
    payload: dict[str, Any] | None


@_strict
class Setting(TypedDict):
    workers: int
    freq_ghz: float | None


@_strict
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


@_strict
class SnapshotMessage(TypedDict):
    kind: Literal["snapshot"]
    run: RunState
    samples: list[Sample]
    events: list[Event]
    decisions: list[Decision]


@_strict
class MetricsMessage(TypedDict):
    kind: Literal["metrics"]
    samples: list[Sample]


@_strict
class EventMessage(TypedDict):
    kind: Literal["event"]
    event: Event


@_strict
class DecisionMessage(TypedDict):
    kind: Literal["decision"]
    decision: Decision


@_strict
class StatusMessage(TypedDict):
    kind: Literal["status"]
    run: RunState


KINDS: dict[str, type] = {"snapshot": SnapshotMessage, "metrics": MetricsMessage,
                          "event": EventMessage, "decision": DecisionMessage,
                          "status": StatusMessage}


def problems(message: dict[str, Any]) -> list[str]:
    """What makes ``message`` differ from its kind's type (pydantic's validation of the
    TypedDict): missing or unknown fields, values of the wrong type, each as one line
    with its path (``samples[0].latency_p95_ms: expected float, got 'x'``); [] if none."""
    kind = message.get("kind")
    if kind not in KINDS:
        return [f"kind: {kind!r} is not one of {', '.join(KINDS)}"]
    try:
        _adapter(kind).validate_python(message)
    except ValidationError as exc:
        return _lines(message, exc)
    return []


@cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    return TypeAdapter(KINDS[kind])


_EXPECTED = {"int_type": "int", "float_type": "float", "string_type": "str",
             "bool_type": "bool", "list_type": "a list", "dict_type": "an object",
             "model_type": "an object", "none_required": "null", "typed_dict_type":
             "an object"}


def _lines(message: dict[str, Any], exc: ValidationError) -> list[str]:
    """One line per path; a union's members' errors at one path joined ("expected float
    or null")."""
    expected: dict[str, list[str]] = {}
    found: dict[str, Any] = {}
    out: dict[str, str] = {}
    for error in exc.errors():
        path, value = _path(message, error["loc"])
        if error["type"] == "missing":
            out[path] = f"{path}: missing"
        elif error["type"] == "extra_forbidden":
            out[path] = f"{path}: unknown field"
        else:
            want = _EXPECTED.get(error["type"], error["msg"])
            expected.setdefault(path, [])
            if want not in expected[path]:
                expected[path].append(want)
            found[path] = value
    for path, wants in expected.items():
        out.setdefault(path, f"{path}: expected {' or '.join(wants)}, got {found[path]!r}")
    return list(out.values())


def _path(message: Any, loc: tuple[Any, ...]) -> tuple[str, Any]:
    """``loc`` as ``a.b[0].c``, leaving out the union members' tags pydantic puts in it
    (a step that is neither a key of the value there nor an index into it)."""
    path, value = "", message
    for step in loc:
        if isinstance(value, dict) and isinstance(step, str) and (
                step in value or step == loc[-1]):
            path = f"{path}.{step}" if path else step
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int):
            path, value = f"{path}[{step}]", value[step] if step < len(value) else None
    return path or "message", value
