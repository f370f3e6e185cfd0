"""Pipeline definitions: validated JSON -> typed spec.

A definition is a source, a chain of operators (exactly one keyed stateful operator,
optionally preceded by stateless ``filter``/``map`` steps) and a sink::

    {
      "source": {"type": "generator", "seed": 7, "partitions": 2,
                 "rate": {"kind": "constant", "records_per_s": 5000},
                 "keys": {"kind": "zipf", "n": 1000, "s": 1.1}},
      "operators": [
        {"type": "filter", "field": "value", "op": "<", "value": 990},
        {"type": "map", "field": "value", "fn": "scale", "arg": 1.5},
        {"type": "keyed_aggregate", "key": "key", "agg": "count", "field": "value"}
      ],
      "sink": {"type": "latency"},
      "key_groups": 8,
      "trigger_ms": 0
    }

Errors name the place in the document (``operators[1].arg``) and what is wrong, so the
form can show them next to the field and the runner can refuse a bad file with one line.
No Spark and no Django import: this is shared by the web app and the runner.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from control import jsonio
from control import workload as wl
from control.workload import resolve_data_path
from pipelines.runtime.spec import dataflow

RATE_KINDS = ("constant", "step", "sine", "random_walk", "trace")
KEY_KINDS = ("uniform", "zipf", "file")
FILTER_OPS = ("<", "<=", ">", ">=", "==", "!=")
MAP_FNS = ("scale", "add", "abs", "square", "round")
AGGREGATES = ("count", "sum", "max", "mean")
STATEFUL_TYPES = ("keyed_aggregate", "hft_window")
# A chain's sources: records from the deterministic generator, a Redis stream's entries
# or a NATS JetStream stream's messages (``connectors/``).
CHAIN_SOURCES = ("generator", "redis_stream", "jetstream", "files")
# Sources whose records are read again from outside (their offsets replayable).
BROKER_SOURCES = ("redis_stream", "jetstream", "files")
FILE_FORMATS = ("jsonl", "csv", "parquet")
# A connection's kinds and the URL schemes each takes; which kind a source or sink needs.
SERVER_SCHEMES = {"redis": ("redis", "rediss", "unix"), "nats": ("nats", "tls"),
                  "postgres": ("postgres", "postgresql")}
CONNECTION_KIND = {"redis_stream": "redis", "jetstream": "nats", "postgres": "postgres"}
CONNECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MAX_FILES_PER_TRIGGER = 10_000
# A chain's sinks: the latency sink (rows counted, or kept as Parquet for the verifier),
# a PostgreSQL table or a Parquet dataset, each written once per batch (``connectors/``).
CHAIN_SINKS = ("latency", "postgres", "parquet", "redis_stream")
# A Parquet sink's directory: relative, under the files root (``connectors.files_root``).
RELATIVE_PATH = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_./-]{1,200}$")
# A JetStream stream's name: no whitespace, ".", "*", ">" or path separators
# (docs.nats.io, "Naming Streams, Consumers, and Accounts"); kept to a safe alphabet.
JETSTREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
# The table of every PostgreSQL sink's written batches, which no pipeline may write to.
POSTGRES_LEDGER = "streamwise_sink_batches"
POSTGRES_TABLE = re.compile(r"^(?:[a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$")
FIELD_TYPES = ("long", "double", "string")
STATE_STORES = ("rocksdb", "hdfs")
FIELDS = ("key", "value")
MAX_RATE = 50_000_000.0
MAX_KEYS = 10_000_000
MAX_KEY_GROUPS = 1024

# What one run may ask of one executor (a 1-core executor, 512 MB of JVM heap, and its
# Python worker beside it): each number a definition carries is bounded here, and
# ``estimate_cost`` checks what they make together before the definition is stored and
# again before a run starts.
#
# A micro-batch is read whole into one Python worker per partition: a generator row is
# ≈70 bytes there (100 M rows took ≈7 GB), so 5 M rows stay near 350 MB.
MAX_RECORDS_PER_BATCH = 5_000_000
GENERATOR_ROW_BYTES = 70
# The largest batch a run may plan, in bytes (rows × their size).
MAX_BATCH_BYTES = 512 * 1024 * 1024
# NEXMark pads every event to its average byte size (``extra``); Beam's defaults are
# 200 (person), 500 (auction) and 100 (bid). 10 kB an event is 50-100x those.
MAX_NEXMARK_EVENT_BYTES = 10_000
# Beam's event mix: of every 50 events, 1 person, 3 auctions and 46 bids.
NEXMARK_MIX = {"avg_person_byte_size": 1 / 50, "avg_auction_byte_size": 3 / 50,
               "avg_bid_byte_size": 46 / 50}
NEXMARK_DEFAULT_BYTES = {"avg_person_byte_size": 200, "avg_auction_byte_size": 500,
                         "avg_bid_byte_size": 100}
# hft_window: every ``slide`` quotes of a symbol refit a polynomial over its last
# ``window`` quotes, so a quote costs window / slide points of fitting; the thesis'
# kernel is 1000 / 25 = 40.
MAX_HFT_POINTS_PER_QUOTE = 1_000
# hft_window keeps ``window`` quotes (value and time, 16 bytes) of every symbol.
HFT_QUOTE_BYTES = 16
MAX_STATE_BYTES = 1024 * 1024 * 1024


class DefinitionError(ValueError):
    """A definition problem at ``path`` (JSON-pointer-like, e.g. ``source.rate.kind``)."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


@dataclass(frozen=True)
class OperatorSpec:
    type: str
    field: str = "value"
    op: str = ""
    value: float = 0.0
    fn: str = ""
    arg: float = 0.0
    key: str = "key"
    agg: str = "count"
    window: int = 0  # hft_window: |W| quotes per symbol
    slide: int = 0  # hft_window: δ
    degree: int = 0  # hft_window: polynomial degree


@dataclass(frozen=True)
class PipelineSpec:
    seed: int
    partitions: int
    rate: dict[str, Any]
    keys: dict[str, Any]
    operators: tuple[OperatorSpec, ...]
    sink: dict[str, Any]
    key_groups: int
    trigger_ms: int
    max_records_per_batch: int
    state_store: str = "rocksdb"
    # On by default: the exactly-once check of every run reads it (pipelines.retention
    # prunes it); benchmarks of the engine alone turn it off.
    keep_output: bool = True
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    # A dataflow pipeline (``dataflow.py``): its DAG; ``operators`` is then empty.
    graph: dataflow.Graph | None = field(default=None, compare=False)
    source_type: str = "generator"  # or "nexmark", "redis_stream", "jetstream"
    nexmark: dict[str, Any] = field(default_factory=dict)  # NexmarkConfig overrides
    watermark_s: int = 0
    reference: str | None = None  # e.g. "nexmark:Q3": what the verifier compares with
    # A dataflow pipeline's Python operators grouped into processing elements.
    pe_plan: dataflow.PePlan | None = field(default=None, compare=False)

    @property
    def stateful(self) -> OperatorSpec:
        """The keyed stateful operator of a chain pipeline."""
        return next(o for o in self.operators if o.type in STATEFUL_TYPES)

    @property
    def keyed_state(self) -> bool:
        """False for a dataflow pipeline without a stateful operator: its tasks follow
        the source's partitions, there is no key group to place or move."""
        return self.graph is None or bool(self.graph.stateful)

    @property
    def output_mode(self) -> str:
        """Spark output mode: a keyed aggregate updates rows, fired windows append."""
        if self.graph is not None:
            return self.graph.output_mode
        return "append" if self.stateful.type == "hft_window" else "update"

    @property
    def source_doc(self) -> dict[str, Any]:
        """The source as the definition gives it (a chain's ``source``, a dataflow's
        source node): where a broker source reads, its fields, its start."""
        return source_doc_of(self.raw)

    @property
    def sink_key_columns(self) -> tuple[str, ...]:
        """The columns a sink upserts rows by: a keyed aggregate's key in update mode
        (a key's newest value replaces its row); none when the output is appended."""
        if self.output_mode != "update":
            return ()
        if self.graph is None:
            return ("key",)
        node = next(n for n in self.graph.nodes if n.type == "keyed_aggregate"
                    or (n.type == dataflow.APP_TYPE and n.params.get("key")))
        return tuple(node.params["key"])

    def schedule(self) -> wl.RateSchedule:
        return build_schedule(self.rate, self.seed)

    def key_distribution(self) -> wl.KeyDistribution:
        return build_keys(self.keys)


def source_doc_of(doc: Any) -> dict[str, Any]:
    """A definition document's source (a chain's ``source``, a dataflow's source node);
    {} where it has none (a document not validated yet)."""
    if not isinstance(doc, dict):
        return {}
    if isinstance(doc.get("nodes"), list):
        return next((n for n in doc["nodes"]
                     if isinstance(n, dict) and n.get("type") in dataflow.SOURCE_TYPES), {})
    source = doc.get("source")
    return source if isinstance(source, dict) else {}


# ------------------------------------------------------------------------- helpers
def _obj(doc: Any, path: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise DefinitionError(path, "must be an object")
    return doc


def _allowed(doc: dict[str, Any], path: str, allowed: set[str]) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise DefinitionError(where, f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _choice(doc: dict[str, Any], key: str, path: str, choices: tuple[str, ...],
            default: str | None = None) -> str:
    where = f"{path}.{key}" if path else key
    if key not in doc:
        if default is not None:
            return default
        raise DefinitionError(where, f"is required (one of: {', '.join(choices)})")
    val = doc[key]
    if val not in choices:
        raise DefinitionError(where,
                              f"{json.dumps(val)} is not one of: {', '.join(choices)}")
    return str(val)


def _finite(val: float) -> bool:
    try:
        return math.isfinite(val)
    except OverflowError:  # a whole number past a double's range
        return False


def _number(doc: dict[str, Any], key: str, path: str, *, lo: float | None = None,
            hi: float | None = None, default: float | None = None, integer: bool = False,
            lo_open: bool = False) -> float:
    where = f"{path}.{key}" if path else key
    if key not in doc:
        if default is not None:
            return default
        raise DefinitionError(where, "is required")
    val = doc[key]
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not _finite(val):
        raise DefinitionError(where, f"must be a number, got {json.dumps(val)[:40]}")
    if integer and int(val) != val:
        raise DefinitionError(where, f"must be a whole number, got {val}")
    if lo is not None and (val <= lo if lo_open else val < lo):
        raise DefinitionError(where, f"must be {'>' if lo_open else '>='} {lo:g}, got {val:g}")
    if hi is not None and val > hi:
        raise DefinitionError(where, f"must be <= {hi:g}, got {val:g}")
    return int(val) if integer else float(val)


# -------------------------------------------------------------------------- builders
def build_schedule(rate: dict[str, Any], seed: int) -> wl.RateSchedule:
    """The rate schedule of a validated ``source.rate`` object."""
    kind = rate["kind"]
    if kind == "constant":
        return wl.RateSchedule((float(rate["records_per_s"]),))
    if kind == "step":
        seconds: list[float] = []
        steps = sorted(rate["steps"], key=lambda s: s[0])
        for (at, r), nxt in zip(steps, steps[1:] + [None]):
            length = (nxt[0] - at) if nxt else 1
            seconds.extend([float(r)] * int(length))
        first = steps[0][0]
        return wl.RateSchedule(tuple([float(steps[0][1])] * int(first) + seconds))
    if kind == "sine":
        return wl.RateSchedule(tuple(wl.sine_rates(rate["base"], rate["amplitude"],
                                                   int(rate["period_s"]))), tail="loop")
    if kind == "random_walk":
        return wl.RateSchedule(tuple(wl.random_walk_rates(
            seed, rate["start"], rate["sigma"], rate["low"], rate["high"])), tail="loop")
    # trace
    scale = float(rate.get("scale", 1.0))
    rates = [r * scale for r in wl.read_rate_trace(resolve_data_path(rate["file"]))]
    return wl.RateSchedule(tuple(rates), tail="loop" if rate.get("repeat", True) else "hold")


def build_keys(keys: dict[str, Any]) -> wl.KeyDistribution:
    kind = keys["kind"]
    if kind == "uniform":
        return wl.uniform_keys(int(keys["n"]))
    if kind == "zipf":
        return wl.zipf_keys(int(keys["n"]), float(keys["s"]))
    return wl.read_key_distribution(resolve_data_path(keys["file"]))


# ------------------------------------------------------------------------ validation
def _validate_rate(rate: dict[str, Any], path: str) -> dict[str, Any]:
    kind = _choice(rate, "kind", path, RATE_KINDS)
    out: dict[str, Any] = {"kind": kind}
    if kind == "constant":
        _allowed(rate, path, {"kind", "records_per_s"})
        out["records_per_s"] = _number(rate, "records_per_s", path, lo=0, hi=MAX_RATE,
                                       lo_open=True)
    elif kind == "step":
        _allowed(rate, path, {"kind", "steps"})
        steps = rate.get("steps")
        if not isinstance(steps, list) or not steps:
            raise DefinitionError(f"{path}.steps", "must be a non-empty list of [second, rate]")
        seen: set[float] = set()
        clean = []
        for i, step in enumerate(steps):
            where = f"{path}.steps[{i}]"
            if (not isinstance(step, list) or len(step) != 2
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                               for x in step)):
                raise DefinitionError(where, "must be [second, rate] with two numbers")
            at, r = step
            if at < 0 or int(at) != at or at > 86_400:
                raise DefinitionError(where, "second must be a whole number in 0..86400")
            if at in seen:
                raise DefinitionError(where, f"second {at} appears twice")
            if not (0 <= r <= MAX_RATE) or not math.isfinite(r):
                raise DefinitionError(where, f"rate must be in 0..{MAX_RATE:g}")
            seen.add(at)
            clean.append([int(at), float(r)])
        if max(clean, key=lambda s: s[0])[1] <= 0:
            raise DefinitionError(f"{path}.steps", "the last step's rate must be > 0")
        out["steps"] = clean
    elif kind == "sine":
        _allowed(rate, path, {"kind", "base", "amplitude", "period_s"})
        out["base"] = _number(rate, "base", path, lo=0, hi=MAX_RATE, lo_open=True)
        out["amplitude"] = _number(rate, "amplitude", path, lo=0, hi=MAX_RATE)
        out["period_s"] = _number(rate, "period_s", path, lo=2, hi=86_400, integer=True)
    elif kind == "random_walk":
        _allowed(rate, path, {"kind", "start", "sigma", "low", "high"})
        out["low"] = _number(rate, "low", path, lo=0, hi=MAX_RATE, lo_open=True)
        out["high"] = _number(rate, "high", path, lo=out["low"], hi=MAX_RATE)
        out["start"] = _number(rate, "start", path, lo=out["low"], hi=out["high"])
        out["sigma"] = _number(rate, "sigma", path, lo=0, hi=0.5)
    else:
        _allowed(rate, path, {"kind", "file", "scale", "repeat"})
        name = rate.get("file")
        if not isinstance(name, str) or not name:
            raise DefinitionError(f"{path}.file", "must name a trace file ('SECOND RATE' lines)")
        out["file"] = name
        out["scale"] = _number(rate, "scale", path, lo=0, hi=1e6, lo_open=True, default=1.0)
        repeat = rate.get("repeat", True)
        if not isinstance(repeat, bool):
            raise DefinitionError(f"{path}.repeat", "must be true or false")
        out["repeat"] = repeat
        try:
            build_schedule(out, 0)
        except wl.WorkloadError as exc:
            raise DefinitionError(f"{path}.file", str(exc)) from exc
    return out


def _validate_keys(keys: dict[str, Any], path: str) -> dict[str, Any]:
    kind = _choice(keys, "kind", path, KEY_KINDS)
    out: dict[str, Any] = {"kind": kind}
    if kind == "uniform":
        _allowed(keys, path, {"kind", "n"})
        out["n"] = _number(keys, "n", path, lo=1, hi=MAX_KEYS, integer=True)
    elif kind == "zipf":
        _allowed(keys, path, {"kind", "n", "s"})
        out["n"] = _number(keys, "n", path, lo=1, hi=MAX_KEYS, integer=True)
        out["s"] = _number(keys, "s", path, lo=0, hi=10)
    else:
        _allowed(keys, path, {"kind", "file"})
        name = keys.get("file")
        if not isinstance(name, str) or not name:
            raise DefinitionError(f"{path}.file", "must name a key distribution file")
        out["file"] = name
        try:
            build_keys(out)
        except wl.WorkloadError as exc:
            raise DefinitionError(f"{path}.file", str(exc)) from exc
    return out


def _validate_operator(op: Any, path: str) -> OperatorSpec:
    op = _obj(op, path)
    kind = _choice(op, "type", path, ("filter", "map") + STATEFUL_TYPES)
    if kind == "filter":
        _allowed(op, path, {"type", "field", "op", "value"})
        return OperatorSpec(type=kind, field=_choice(op, "field", path, FIELDS),
                            op=_choice(op, "op", path, FILTER_OPS),
                            value=_number(op, "value", path))
    if kind == "map":
        _allowed(op, path, {"type", "field", "fn", "arg"})
        field_ = _choice(op, "field", path, ("value",), default="value")
        fn = _choice(op, "fn", path, MAP_FNS)
        arg = _number(op, "arg", path, default=0.0) if fn in ("scale", "add", "round") else 0.0
        if fn == "round" and not (0 <= arg <= 12 and int(arg) == arg):
            raise DefinitionError(f"{path}.arg", "round takes a whole number of digits 0..12")
        return OperatorSpec(type=kind, field=field_, fn=fn, arg=arg)
    if kind == "hft_window":
        _allowed(op, path, {"type", "key", "field", "window", "slide", "degree"})
        window = int(_number(op, "window", path, lo=2, hi=100_000, integer=True, default=1000))
        slide = int(_number(op, "slide", path, lo=1, hi=window, integer=True, default=25))
        if window / slide > MAX_HFT_POINTS_PER_QUOTE:
            raise DefinitionError(f"{path}.slide", (
                f"refits {window:,} quotes every {slide} (window / slide = "
                f"{window / slide:,.0f} points of fitting per quote); at most "
                f"{MAX_HFT_POINTS_PER_QUOTE}: slide by at least "
                f"{-(-window // MAX_HFT_POINTS_PER_QUOTE)}"))
        return OperatorSpec(type=kind, key=_choice(op, "key", path, ("key",), default="key"),
                            field=_choice(op, "field", path, ("value",), default="value"),
                            window=window, slide=slide,
                            degree=int(_number(op, "degree", path, lo=0, hi=5, integer=True,
                                               default=2)))
    _allowed(op, path, {"type", "key", "agg", "field"})
    return OperatorSpec(type=kind, key=_choice(op, "key", path, ("key",), default="key"),
                        agg=_choice(op, "agg", path, AGGREGATES, default="count"),
                        field=_choice(op, "field", path, ("value",), default="value"))


def _source_fields(src: dict[str, Any], path: str) -> dict[str, Any]:
    """A source's seed, partitions and rate (a chain's ``source``, a dataflow source
    node), and a generator's keys."""
    out: dict[str, Any] = {
        "seed": int(_number(src, "seed", path, lo=0, hi=2**62, integer=True, default=0)),
        "partitions": int(_number(src, "partitions", path, lo=1, hi=64, integer=True,
                                  default=2)),
    }
    if "rate" not in src:
        raise DefinitionError(f"{path}.rate", "is required")
    out["rate"] = _validate_rate(_obj(src["rate"], f"{path}.rate"), f"{path}.rate")
    if src.get("type", "generator") == "generator":
        out["keys"] = _validate_keys(_obj(src.get("keys", {"kind": "uniform", "n": 100}),
                                          f"{path}.keys"), f"{path}.keys")
    return out


def _run_options(doc: dict[str, Any]) -> dict[str, Any]:
    """What every pipeline sets for its query: state store, key groups, trigger, read
    limit."""
    return {
        "state_store": _choice(doc, "state_store", "", STATE_STORES, default="rocksdb"),
        "key_groups": int(_number(doc, "key_groups", "", lo=1, hi=MAX_KEY_GROUPS,
                                  integer=True, default=8)),
        "trigger_ms": int(_number(doc, "trigger_ms", "", lo=0, hi=3_600_000, integer=True,
                                  default=0)),
        "max_records_per_batch": int(_number(doc, "max_records_per_batch", "", lo=1,
                                             hi=MAX_RECORDS_PER_BATCH, integer=True,
                                             default=2_000_000)),
    }


REFERENCES = tuple(f"nexmark:Q{i}" for i in range(9))
NEXMARK_KNOBS = ("hot_auction_ratio", "hot_sellers_ratio", "hot_bidders_ratio",
                 "num_in_flight_auctions", "num_active_people", "avg_person_byte_size",
                 "avg_auction_byte_size", "avg_bid_byte_size")


# A stream of NEXMark events (``"events": "nexmark"``, as ``pipelines.feed --events
# nexmark`` publishes them): each record one of Beam's events, its fields those of its
# kind (a person's, an auction's or a bid's), so all but these may be absent.
NEXMARK_EVENT_FIELDS = {c: t for c, t in dataflow.NEXMARK_COLUMNS.items()
                        if c not in ("seq", *dataflow.TIME_COLUMNS)}
NEXMARK_EVENT_REQUIRED = ("type", "dateTime")


def record_schema(source: dict[str, Any]) -> tuple[dict[str, str], frozenset[str]]:
    """A broker source's record fields with their types, and those a record may lack
    (a NEXMark event's other kinds' fields); a chain's default is ``key``, ``value``."""
    if source.get("events") == "nexmark":
        return (dict(NEXMARK_EVENT_FIELDS),
                frozenset(NEXMARK_EVENT_FIELDS) - set(NEXMARK_EVENT_REQUIRED))
    return dict(source.get("fields") or {"key": "long", "value": "double"}), frozenset()


def _validate_source_node(src: dict[str, Any], path: str) -> dict[str, Any]:
    """A dataflow source node's own fields (``dataflow.validate_graph`` calls it)."""
    kind = src["type"]
    common = {"id", "type", "seed", "partitions", "rate", "watermark_s"}
    if kind in dataflow.BROKER_SOURCE_TYPES:
        _allowed(src, path, (common - {"seed"}) | {"url", "connection", "stream", "fields",
                                                   "events", "start", "start_offset"})
        if "events" in src and "fields" in src:
            raise DefinitionError(f"{path}.events", "give the records' fields or "
                                  '"events": "nexmark", not both')
        broker = _validate_broker_stream(src, path, kind, chain=False)
        broker.update(_start_position(src, path))
        if "events" in src:
            _choice(src, "events", path, ("nexmark",))
            broker["events"] = "nexmark"
            del broker["fields"]
        out = _source_fields({"rate": {"kind": "constant", "records_per_s": 1000},
                              **{k: v for k, v in src.items() if k in ("partitions", "rate")}},
                             path)
        out.update(broker)
    else:
        _allowed(src, path, common | ({"keys"} if kind == "generator" else {"nexmark"}))
        out = _source_fields(src, path)
    out["watermark_s"] = int(_number(src, "watermark_s", path, lo=0, hi=86_400,
                                     integer=True, default=0))
    if kind == "nexmark":
        knobs = _obj(src.get("nexmark", {}), f"{path}.nexmark")
        _allowed(knobs, f"{path}.nexmark", set(NEXMARK_KNOBS))
        out["nexmark"] = {k: int(_number(
            knobs, k, f"{path}.nexmark", lo=1, integer=True,
            hi=MAX_NEXMARK_EVENT_BYTES if k in NEXMARK_MIX else 10_000_000))
            for k in knobs}
    return out


def nexmark_events(spec: PipelineSpec) -> bool:
    """Whether the pipeline reads NEXMark events (generated, or from a stream)."""
    return spec.source_type == "nexmark" or spec.source_doc.get("events") == "nexmark"


def _validate_dataflow(doc: dict[str, Any]) -> PipelineSpec:
    _allowed(doc, "", {"nodes", "key_groups", "trigger_ms", "max_records_per_batch",
                       "state_store", "reference", "plan"})
    try:
        graph = dataflow.validate_graph(doc["nodes"], _validate_source_node)
        pe_plan = dataflow.validate_plan(doc.get("plan"), graph)
    except dataflow.GraphError as exc:
        raise DefinitionError(exc.path, exc.message) from None
    source = graph.source.params
    options = _run_options(doc)
    keep_output = bool(graph.sink.params["keep_output"])
    reference = doc.get("reference")
    if reference is not None and reference not in REFERENCES:
        raise DefinitionError("reference", f"{json.dumps(reference)} is not one of: "
                              f"{', '.join(REFERENCES)} (the result the verifier checks "
                              "the kept output against)")
    if reference is not None and not (graph.source.type == "nexmark"
                                      or source.get("events") == "nexmark"):
        raise DefinitionError("reference", "a NEXMark reference needs NEXMark events (the "
                              'nexmark source, or a stream\'s "events": "nexmark")')
    sink_doc: dict[str, Any] = {"type": "latency", "keep_output": keep_output}
    target = graph.sink.params.get("to")
    if target is not None:
        where = f"{graph.sink.path}.to"
        kind = _choice(target, "type", where, tuple(SINK_FIELDS))
        _allowed(target, where, {"type"} | SINK_FIELDS[kind])
        sink_doc = {"type": kind, "keep_output": keep_output,
                    **_sink_target(target, where, kind)}
    tws = [n for n in graph.stateful if n.type == "moving_mean"]
    if tws and options["state_store"] != "rocksdb":
        raise DefinitionError("state_store", f"{tws[0].id} (moving_mean, a "
                              "transformWithStateInPandas operator) needs the rocksdb "
                              "state store")
    clean = {"nodes": doc["nodes"], **options}
    if "plan" in doc:
        clean["plan"] = pe_plan.as_dict()
    if reference is not None:
        clean["reference"] = reference
    return PipelineSpec(seed=source["seed"], partitions=source["partitions"],
                        rate=source["rate"], keys=source.get("keys",
                                                             {"kind": "uniform", "n": 1}),
                        operators=(), sink=sink_doc, **options, keep_output=keep_output, raw=clean, graph=graph,
                        source_type=graph.source.type, nexmark=source.get("nexmark", {}),
                        watermark_s=source["watermark_s"], reference=reference,
                        pe_plan=pe_plan)


@dataclass(frozen=True)
class Cost:
    """What a run of a definition asks of its executors at most (modelled from the
    bounds above, not measured)."""

    batch_rows: int  # the most rows one micro-batch reads
    row_bytes: float  # a source row's size in a Python worker
    state_bytes: float  # the largest keyed state whose size the definition fixes

    @property
    def batch_bytes(self) -> float:
        return self.batch_rows * self.row_bytes


def estimate_cost(spec: PipelineSpec) -> Cost:
    """The largest batch and state ``spec`` can make (see the bounds above)."""
    row_bytes = float(GENERATOR_ROW_BYTES)
    if nexmark_events(spec):
        sizes = {**NEXMARK_DEFAULT_BYTES, **{k: v for k, v in spec.nexmark.items()
                                             if k in NEXMARK_MIX}}
        row_bytes += sum(NEXMARK_MIX[k] * sizes[k] for k in NEXMARK_MIX)
    state = 0.0
    if spec.graph is None and spec.stateful.type == "hft_window":
        state = float(spec.stateful.window * spec.key_distribution().n * HFT_QUOTE_BYTES)
    return Cost(batch_rows=spec.max_records_per_batch, row_bytes=row_bytes,
                state_bytes=state)


def check_cost(spec: PipelineSpec) -> Cost:
    """``estimate_cost`` against what one executor holds; DefinitionError names the
    field to lower."""
    cost = estimate_cost(spec)
    if cost.batch_bytes > MAX_BATCH_BYTES:
        fits = max(1, int(MAX_BATCH_BYTES // cost.row_bytes))
        raise DefinitionError("max_records_per_batch", (
            f"a batch of {cost.batch_rows:,} rows of ≈{cost.row_bytes:,.0f} bytes is "
            f"{cost.batch_bytes / 2**20:,.0f} MiB (modelled), over the "
            f"{MAX_BATCH_BYTES // 2**20} MiB one executor's Python worker holds: at most "
            f"{fits:,} rows at this event size"))
    if cost.state_bytes > MAX_STATE_BYTES:
        i = next(i for i, o in enumerate(spec.operators) if o.type == "hft_window")
        raise DefinitionError(f"operators[{i}].window", (
            f"keeps {spec.stateful.window:,} quotes of each of "
            f"{spec.key_distribution().n:,} symbols, {cost.state_bytes / 2**20:,.0f} MiB "
            f"of state (modelled); at most {MAX_STATE_BYTES // 2**20} MiB"))
    return cost


def validate(doc: Any) -> PipelineSpec:
    """Validate a parsed definition; raise :class:`DefinitionError` on the first problem
    (and on a definition whose cost, ``check_cost``, one executor cannot carry).

    A definition with ``nodes`` is a dataflow pipeline (``dataflow.py``); one with
    ``app`` a pipeline module of an installed package (``operators/base.py``), i.e. the
    dataflow source -> app -> sink (``app_nodes``); one with ``source``/``operators``
    is a chain (one keyed stateful operator)."""
    spec = _validate(doc)
    check_cost(spec)
    return spec


# A pipeline module's definition (``{"app": ..., "params": ..., "source": ...,
# "sink": ...}``) is the dataflow source -> app -> sink; its errors name the shorthand's
# fields, not the nodes it stands for.
APP_FIELDS = {"app", "params", "source", "sink", "key_groups", "trigger_ms",
              "max_records_per_batch", "state_store"}
_APP_NODE_PATHS = (("nodes[0] (source)", "source"), ("nodes[1] (app).input", "app"),
                   ("nodes[1] (app)", ""), ("nodes[2] (sink)", "sink"))


def app_nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The dataflow nodes a pipeline module's definition stands for."""
    source = doc.get("source", {"type": "generator"})
    sink = doc.get("sink", {})
    app = {"id": "app", "type": dataflow.APP_TYPE, "input": "source", "app": doc.get("app")}
    if "params" in doc:
        app["params"] = doc["params"]
    return [{"type": "generator", **(source if isinstance(source, dict) else {}),
             "id": "source"}, app,
            {**(sink if isinstance(sink, dict) else {}), "id": "sink", "type": "sink",
             "input": "app"}]


def _validate_app(doc: dict[str, Any]) -> PipelineSpec:
    _allowed(doc, "", APP_FIELDS)
    if "source" not in doc:
        raise DefinitionError("source", "is required: where the module's records come "
                              "from (a generator, a Redis or JetStream stream, a folder)")
    for part in ("source", "sink"):
        if part in doc:
            _obj(doc[part], part)
            if "id" in doc[part] or (part == "sink" and {"type", "input"} & set(doc[part])):
                bad = next(k for k in ("id", "type", "input") if k in doc[part])
                raise DefinitionError(f"{part}.{bad}", "is not a field here (the "
                                      "pipeline is source -> app -> sink)")
    try:
        spec = _validate_dataflow({"nodes": app_nodes(doc),
                                   **{k: v for k, v in doc.items()
                                      if k not in ("app", "params", "source", "sink")}})
    except DefinitionError as exc:
        for prefix, short in _APP_NODE_PATHS:
            if exc.path.startswith(prefix):
                rest = exc.path[len(prefix):].lstrip(".")
                raise DefinitionError(".".join(p for p in (short, rest) if p) or "app",
                                      exc.message) from None
        raise
    # Kept as the user wrote it (cleaned): the form shows it again, and a re-plan or a
    # source's pin validates it again (``app_nodes``).
    source_node, app, sink_node = (dict(n) for n in spec.raw["nodes"])
    short = {"app": app["app"], "params": spec.graph.node("app").params["params"],
             "source": {k: v for k, v in source_node.items() if k != "id"},
             "sink": {k: v for k, v in sink_node.items() if k not in ("id", "type", "input")},
             **{k: v for k, v in spec.raw.items() if k != "nodes"}}
    return replace(spec, raw=short)


def _validate(doc: Any) -> PipelineSpec:
    doc = _obj(doc, "")
    if "nodes" in doc:
        return _validate_dataflow(doc)
    if "app" in doc:
        return _validate_app(doc)
    _allowed(doc, "", {"source", "operators", "sink", "key_groups", "trigger_ms",
                       "max_records_per_batch", "state_store"})
    if "source" not in doc:
        raise DefinitionError("source", "is required")
    src = _obj(doc["source"], "source")
    source_type = _choice(src, "type", "source", CHAIN_SOURCES, default="generator")
    if source_type == "files":
        _allowed(src, "source", {"type", "path", "format", "fields", "max_files_per_trigger",
                                 "partitions", "rate", "keys"})
        broker = _validate_files_source(src, "source")
    elif source_type in BROKER_SOURCES:
        _allowed(src, "source", {"type", "url", "connection", "stream", "fields",
                                 "partitions", "rate", "keys", "start", "start_offset"})
        broker = _validate_broker_stream(src, "source", source_type)
        broker.update(_start_position(src, "source"))
    if source_type in BROKER_SOURCES:
        # The rate and key space a stream is expected to carry (modelled: what a run
        # plans with before it has measured the stream), as a generator's.
        source = _source_fields({"rate": {"kind": "constant", "records_per_s": 1000},
                                 **{k: v for k, v in src.items()
                                    if k in ("partitions", "rate", "keys")}}, "source")
    else:
        _allowed(src, "source", {"type", "seed", "partitions", "rate", "keys"})
        broker = {}
        source = _source_fields(src, "source")

    ops_doc = doc.get("operators")
    if not isinstance(ops_doc, list) or not ops_doc:
        raise DefinitionError("operators", "must be a non-empty list")
    ops = tuple(_validate_operator(op, f"operators[{i}]") for i, op in enumerate(ops_doc))
    stateful = [i for i, o in enumerate(ops) if o.type in STATEFUL_TYPES]
    if len(stateful) != 1:
        raise DefinitionError("operators", "needs exactly one keyed_aggregate or hft_window "
                              f"(the keyed stateful operator); found {len(stateful)}")
    if stateful[0] != len(ops) - 1:
        raise DefinitionError(f"operators[{stateful[0]}]",
                              f"{ops[stateful[0]].type} must be the last operator before "
                              "the sink")

    sink = _obj(doc.get("sink", {"type": "latency"}), "sink")
    sink_type = _choice(sink, "type", "sink", CHAIN_SINKS, default="latency")
    _allowed(sink, "sink", {"type", "keep_output"} | SINK_FIELDS.get(sink_type, set()))
    keep_output = sink.get("keep_output", True)
    if not isinstance(keep_output, bool):
        raise DefinitionError("sink.keep_output", "must be true or false")
    sink_doc: dict[str, Any] = {"type": sink_type, "keep_output": keep_output,
                                **_sink_target(sink, "sink", sink_type)}
    options = _run_options(doc)
    if source_type in BROKER_SOURCES and ops[stateful[0]].type != "keyed_aggregate":
        raise DefinitionError(f"operators[{stateful[0]}]", f"a {source_type} source feeds a "
                              "keyed_aggregate so far (its verifier and re-plan read the "
                              "stream again); hft_window reads the generator")
    if ops[stateful[0]].type == "hft_window" and options["state_store"] != "rocksdb":
        raise DefinitionError("state_store", "hft_window (transformWithStateInPandas) needs "
                              "the rocksdb state store")

    # (a stream has no seed: its records are the broker's)
    kept = {k: v for k, v in source.items() if not (broker and k == "seed")}
    clean = {"source": {"type": source_type, **kept, **broker},
             "operators": ops_doc, "sink": sink_doc, **options}
    return PipelineSpec(**source, operators=ops, sink=sink_doc, **options,
                        keep_output=keep_output, raw=clean, source_type=source_type)


def _server(doc: dict[str, Any], path: str, schemes: tuple[str, ...],
            example: str) -> dict[str, str]:
    """Where a source or sink connects: ``{"connection": name}`` (a connection an admin
    keeps, with its URL and password, resolved when a run starts) or ``{"url": url}``
    (a URL without credentials, :func:`server_url`)."""
    if "connection" in doc:
        name = doc["connection"]
        if "url" in doc:
            raise DefinitionError(f"{path}.connection", "give a url or a connection, not "
                                  "both")
        if not isinstance(name, str) or not CONNECTION_NAME.match(name):
            raise DefinitionError(f"{path}.connection", "must be a connection's name "
                                  "(lower-case letters, digits, - and _, at most 63)")
        return {"connection": name}
    return {"url": server_url(doc, path, schemes, example)}


def server_url(doc: dict[str, Any], path: str, schemes: tuple[str, ...],
               example: str) -> str:
    """A server's URL (``doc["url"]``) with one of ``schemes``, at most 500 characters
    and without a password, in its user part or its query: credentials never live in a
    definition (a connection holds them)."""
    from urllib.parse import parse_qs, urlsplit

    url = doc.get("url")
    if not isinstance(url, str) or not url:
        raise DefinitionError(f"{path}.url", f"is required (e.g. {example}), or a "
                              "connection's name as connection")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise DefinitionError(f"{path}.url", f"is not a URL: {exc}") from None
    if parts.scheme not in schemes or len(url) > 500:
        named = [s + "://" for s in schemes]
        either = ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else named[0]
        raise DefinitionError(f"{path}.url", f"must be a {either} URL of at most 500 "
                              "characters")
    if (parts.password or "password=" in parts.query
            or "password" in parse_qs(parts.query, keep_blank_values=True)):
        raise DefinitionError(f"{path}.url", "holds a password: credentials never live in "
                              "a definition")
    return url


SINK_FIELDS = {"postgres": {"url", "connection", "table"}, "parquet": {"path"},
               "redis_stream": {"url", "connection", "stream"}}


def _sink_target(sink: dict[str, Any], path: str, sink_type: str) -> dict[str, Any]:
    """Where a ``postgres``, ``parquet`` or ``redis_stream`` sink writes (a chain's
    ``sink``, a dataflow sink node's ``to``); nothing for the latency sink."""
    if sink_type == "postgres":
        return _validate_postgres_sink(sink, path)
    if sink_type == "parquet":
        return {"path": _relative_path(sink, path)}
    if sink_type == "redis_stream":
        stream = sink.get("stream")
        if not isinstance(stream, str) or not 0 < len(stream) <= 256:
            raise DefinitionError(f"{path}.stream", "must be a stream name of 1-256 "
                                  "characters")
        return {**_server(sink, path, SERVER_SCHEMES["redis"], "redis://127.0.0.1:6379/0"),
                "stream": stream}
    return {}


def _validate_postgres_sink(sink: dict[str, Any], path: str) -> dict[str, Any]:
    """A ``postgres`` sink: the database (a URL without a password) and the table,
    ``[schema.]name`` in PostgreSQL's plain identifiers."""
    server = _server(sink, path, SERVER_SCHEMES["postgres"],
                     "postgres://streamwise@127.0.0.1:5432/streamwise")
    table = sink.get("table")
    if not isinstance(table, str) or not POSTGRES_TABLE.match(table):
        raise DefinitionError(f"{path}.table", "must be a table name, [schema.]name in "
                              "lower-case letters, digits and _ (at most 63 each)")
    if table.split(".")[-1] == POSTGRES_LEDGER:
        raise DefinitionError(f"{path}.table", "is the sinks' ledger table")
    return {**server, "table": table}


def _relative_path(doc: dict[str, Any], path: str) -> str:
    """A folder under the files root (``connectors.files_root``): a definition never
    names a place outside it."""
    value = doc.get("path")
    if not isinstance(value, str) or not RELATIVE_PATH.match(value):
        raise DefinitionError(f"{path}.path", "must be a relative directory (under the "
                              "files root) of letters, digits, _ . - and /, without ..")
    return value


def _start_position(src: dict[str, Any], path: str) -> dict[str, Any]:
    """Where a new run starts reading a stream: at its oldest record (``earliest``, the
    default) or at its end when the run starts (``latest``: what came before is not
    the run's). ``start_offset`` is that end, pinned by the runner on the run's first
    start (``connectors.pin_start``) so that a restart, a re-plan and the verifier
    start from the same offset."""
    out: dict[str, Any] = {"start": _choice(src, "start", path, ("earliest", "latest"),
                                            default="earliest")}
    if "start_offset" in src:
        out["start_offset"] = int(_number(src, "start_offset", path, lo=0, hi=2**63 - 1,
                                          integer=True))
    return out


def _validate_files_source(src: dict[str, Any], path: str) -> dict[str, Any]:
    """A ``files`` source: the folder, its files' format, the fields the records take,
    and how many files a batch reads at most."""
    folder = _relative_path(src, path)
    fmt = _choice(src, "format", path, FILE_FORMATS, default="jsonl")
    most = src.get("max_files_per_trigger", 10)
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_FILES_PER_TRIGGER:
        raise DefinitionError(f"{path}.max_files_per_trigger",
                              f"must be an integer from 1 to {MAX_FILES_PER_TRIGGER}")
    return {"path": folder, "format": fmt, "max_files_per_trigger": most,
            "fields": _record_fields(src, path)}


def _validate_broker_stream(src: dict[str, Any], path: str, kind: str,
                            chain: bool = True) -> dict[str, Any]:
    """A broker source's own fields: the server (a URL without credentials: a password
    belongs in a connection, never in a definition), the stream, and the record fields
    the records take with their types (a Redis entry's fields, a JetStream message's
    JSON keys). A chain's operators read ``key`` (long) and ``value`` (double)."""
    stream = src.get("stream")
    if kind == "jetstream":
        server = _server(src, path, SERVER_SCHEMES["nats"], "nats://127.0.0.1:4222")
        if not isinstance(stream, str) or not JETSTREAM_NAME.match(stream):
            raise DefinitionError(f"{path}.stream", "must be a JetStream stream name of "
                                  "1-200 letters, digits, _ and -")
    else:
        server = _server(src, path, SERVER_SCHEMES["redis"], "redis://127.0.0.1:6379/0")
        if not isinstance(stream, str) or not 0 < len(stream) <= 256:
            raise DefinitionError(f"{path}.stream", "must be a stream name of 1-256 "
                                  "characters")
    return {**server, "stream": stream, "fields": _record_fields(src, path, chain)}


def _record_fields(src: dict[str, Any], path: str, chain: bool = True) -> dict[str, str]:
    """The fields a source's records take, with their types (``FIELD_TYPES``); a
    chain's operators read ``key`` (long) and ``value`` (double)."""
    fields = _obj(src.get("fields", {"key": "long", "value": "double"}), f"{path}.fields")
    if not fields or len(fields) > 64:
        raise DefinitionError(f"{path}.fields", "must name 1-64 entry fields")
    for name, kind in fields.items():
        if not name.isidentifier() or name in ("seq", "emit_ts", "event_time") \
                or len(name) > 64:
            raise DefinitionError(f"{path}.fields.{name}", "must be an identifier of at most "
                                  "64 characters other than seq, emit_ts and event_time")
        if kind not in FIELD_TYPES:
            raise DefinitionError(f"{path}.fields.{name}", f"{json.dumps(kind)} is not one "
                                  f"of: {', '.join(FIELD_TYPES)}")
    for name, kind in (("key", "long"), ("value", "double")) if chain else ():
        if fields.get(name) != kind:
            raise DefinitionError(f"{path}.fields", f"needs {name!r}: {json.dumps(kind)} "
                                  "(what the operators read)")
    return dict(fields)


def with_source_doc(spec: PipelineSpec, source: dict[str, Any]) -> PipelineSpec:
    """``spec`` with its source (``source_doc``) replaced, validated again."""
    if spec.graph is None or "app" in spec.raw:
        return validate({**spec.raw, "source": source})
    nodes = [source if isinstance(n, dict) and n.get("type") in dataflow.SOURCE_TYPES
             else n for n in spec.raw["nodes"]]
    return validate({**spec.raw, "nodes": nodes})


def picture(spec: PipelineSpec) -> dataflow.Picture:
    """The pipeline as a DAG drawing: a dataflow pipeline's nodes, or a chain's source,
    steps and sink in a row."""
    if spec.graph is not None:
        return dataflow.graph_picture(spec.graph)
    nodes = [("source", "generator", f"{spec.rate['kind']} rate", ())]
    for i, op in enumerate(spec.operators):
        label = {"filter": f"{op.field} {op.op} {op.value:g}", "map": f"{op.fn} {op.field}",
                 "keyed_aggregate": f"{op.agg} by {op.key}",
                 "hft_window": f"|W| {op.window}, slide {op.slide}"}[op.type]
        nodes.append((f"op{i}", op.type, label, (nodes[-1][0],)))
    nodes.append(("sink", "sink", "kept" if spec.keep_output else "latency", (nodes[-1][0],)))
    return dataflow.picture(nodes)


def parse(text: str) -> PipelineSpec:
    """Parse JSON text and validate it; JSON syntax errors name line and column."""
    try:
        doc = jsonio.loads(text)
    except jsonio.InputError as exc:
        raise DefinitionError("", str(exc)) from exc
    return validate(doc)


DEMO_DEFINITION: dict[str, Any] = {
    "source": {"type": "generator", "seed": 7, "partitions": 2,
               "rate": {"kind": "sine", "base": 2000, "amplitude": 1000, "period_s": 60},
               "keys": {"kind": "file", "file": "elastic-hft/probability_distribution"}},
    "operators": [
        {"type": "filter", "field": "value", "op": "<", "value": 995},
        {"type": "map", "field": "value", "fn": "scale", "arg": 1.01},
        {"type": "keyed_aggregate", "key": "key", "agg": "count", "field": "value"},
    ],
    "sink": {"type": "latency"},
    "key_groups": 8,
    "trigger_ms": 0,
}

# The thesis' HFT kernel (§7.1) on the artifact's symbols and its random-walk rate trace,
# scaled 1:100 (135K-458K tuples/s -> 1.35K-4.6K/s) for a 2-core machine.
HFT_DEFINITION: dict[str, Any] = {
    "source": {"type": "generator", "seed": 11, "partitions": 2,
               "rate": {"kind": "trace", "file": "elastic-hft/random_walk_rates",
                        "scale": 0.01},
               "keys": {"kind": "file", "file": "elastic-hft/probability_distribution"}},
    "operators": [{"type": "hft_window", "window": 1000, "slide": 25, "degree": 2}],
    "sink": {"type": "latency"},
    "key_groups": 8,
    "state_store": "rocksdb",
}

# The elastic demo (and the closed-loop test): a keyed count over 1M uniform keys, the
# closed-loop benchmark's workload. Its state makes a record cost enough (~7 µs on one
# 2-GHz core) that one worker saturates at a rate the generator makes easily; with the
# 2,836 HFT symbols Spark folds a batch to a few rows per key and one worker serves any
# rate. The rate here is a placeholder: the demo's rate steps around one worker's
# capacity as measured on the machine that runs it (pipelines.runtime.runner.calibration).
ELASTIC_DEFINITION: dict[str, Any] = {
    "source": {"type": "generator", "seed": 41, "partitions": 2,
               "rate": {"kind": "constant", "records_per_s": 1000},
               "keys": {"kind": "uniform", "n": 1_000_000}},
    "operators": [{"type": "keyed_aggregate", "key": "key", "agg": "count",
                   "field": "value"}],
    "sink": {"type": "latency", "keep_output": True},
    "key_groups": 4,
}

# The elastic demo as ``manage.py up`` seeds it: the same keyed count, read from the
# Redis stream ``elastic-demo`` of the product's own Redis (the connection
# ``local-redis``), which the feeder fills on the calibrated step, from the stream's
# end when a run starts. Its rate is the one it is expected to carry (modelled).
ELASTIC_STREAM_DEFINITION: dict[str, Any] = {
    **ELASTIC_DEFINITION,
    "source": {"type": "redis_stream", "connection": "local-redis", "stream": "elastic-demo",
               "start": "latest", "partitions": 2,
               "rate": ELASTIC_DEFINITION["source"]["rate"],
               "keys": ELASTIC_DEFINITION["source"]["keys"]},
}
