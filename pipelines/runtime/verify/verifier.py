"""Exactly-once verifier: recompute what the sink must hold from the deterministic
source and compare, batch by batch: no loss, no duplicate, same values across every
reconfiguration (thesis §6.4.2 R1 "gracefulness";
Megaphone, Hoffmann et al., VLDB 2019, §3.2 property 1 "correctness").

Inputs: the run's pipeline spec and schedule clock ``t0``, its checkpoint (the offset
log gives each committed batch's source range ``[end(b-1), end(b))``; the commit log
says which batches committed) and the sink's kept output (one Parquet file per batch,
``query.LatencySink(output_dir=…)``).

For every committed batch b the records of its range are regenerated (record i is a
pure function of (seed, i)), passed through the definition's stateless operators, and:

* ``keyed_aggregate`` (update mode): the batch must output exactly the keys that
  received records in b, each once, with the aggregate over *all* records of the key
  up to the end of b (count exact; sum/mean/max to 1e-9 relative);
* ``hft_window`` (append mode): the batch must output exactly the windows whose
  triggering quote lies in b, each once, with the values of the pure-pandas reference
  ``hft.reference`` (computed once over the whole stream).

Anything else is a problem: a batch without output (lost), a row twice (duplicated), a
missing expected row (lost), an extra row (unexpected), a wrong value (wrong).

    python -m pipelines.runtime.verify CHECKPOINT_DIR   # reads runner.json beside it
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from control import workload
from pipelines.runtime.spec import dataflow
from pipelines.runtime.verify import expressions as dataflow_pandas
from pipelines.runtime.spec import definition
from pipelines.runtime.operators import hft
from pipelines.runtime.replan import gloss as replan
from pipelines.runtime.query.compiler import output_path

MAX_PROBLEMS = 20
RTOL = 1e-9
Progress = Callable[[int, int], None]  # (batches checked, batches to check)


@dataclass
class VerifyReport:
    ok: bool = True
    batches: int = 0
    records: int = 0  # source records covered by the committed batches
    output_rows: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    wrong: int = 0
    compared_rows: int = 0  # result rows checked against a reference (dataflow)
    sink_rows: int | None = None  # rows in the pipeline's own sink (a PostgreSQL table)
    missing_batches: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, kind: str, count: int, message: str) -> None:
        setattr(self, kind, getattr(self, kind) + count)
        self.ok = False
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.ok:
            return (f"verifier: OK - {self.batches} batches, {self.records} records, "
                    f"{self.output_rows} output rows: nothing lost, nothing duplicated, "
                    "same values")
        return (f"verifier: FAILED - lost {self.lost}, duplicated {self.duplicated}, "
                f"unexpected {self.unexpected}, wrong {self.wrong}; "
                + "; ".join(self.problems[:3]))


def read_log(directory: Path) -> dict[int, str]:
    """Spark's metadata log (``offsets/``, ``commits/``): batch id -> file text."""
    out = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.isdigit():
                out[int(entry.name)] = entry.read_text()
    return out


def end_offsets(checkpoint: Path) -> dict[int, int]:
    """Batch id -> our source's end offset (its line in the offset log)."""
    ends = {}
    for batch, text in read_log(checkpoint / "offsets").items():
        end = replan.generator_offset(text)
        if end is not None:
            ends[batch] = end
    return ends


def epoch_ranges(run_dir: Path, report: VerifyReport
                 ) -> tuple[list[int], dict[int, int], dict[int, int]]:
    """A re-planned run's output batches (epochs) and each one's source range, from
    ``generations.json`` (``replan.Arbiter``) and each generation's offset log. The
    ranges must tile the input: each epoch starts where the one before ended."""
    doc = json.loads((run_dir / replan.GENERATIONS_FILE).read_text())
    epochs: list[int] = []
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for gen in doc["generations"]:
        checkpoint = run_dir / gen["checkpoint"]
        gen_ends = end_offsets(checkpoint)
        last = gen["last_batch"]
        if last is None:  # the generation still forwarding: up to its last commit
            committed = [b for b in read_log(checkpoint / "commits") if b in gen_ends]
            last = max(committed, default=gen["first_batch"] - 1)
        for b in range(gen["first_batch"], last + 1):
            epoch = b + gen["epoch_offset"]
            if b not in gen_ends:
                report.problem("lost", 0, f"generation {gen['generation']} has no offsets "
                               f"for its batch {b} (epoch {epoch})")
                continue
            epochs.append(epoch)
            starts[epoch] = gen_ends.get(b - 1, gen["start"]) if b > 0 else gen["start"]
            ends[epoch] = gen_ends[b]
    epochs.sort()
    for prev, epoch in zip(epochs, epochs[1:]):
        if epoch != prev + 1 or starts[epoch] != ends[prev]:
            kind = "duplicated" if starts[epoch] < ends[prev] else "lost"
            report.problem(kind, abs(starts[epoch] - ends[prev]),
                           f"epoch {epoch} reads from {starts[epoch]} but epoch {prev} "
                           f"ended at {ends[prev]}")
    return epochs, starts, ends


def apply_stateless(spec: definition.PipelineSpec, recs: workload.Records) -> pd.DataFrame:
    """The definition's filter/map steps on regenerated records (as ``query.py`` does
    with Spark column expressions)."""
    df = pd.DataFrame({"seq": recs.seq, "key": recs.key, "value": recs.value,
                       "emit_ts": recs.emit_ts})
    for op in spec.operators:
        if op.type == "filter":
            col = df[op.field].astype(np.float64)
            keep = {"<": col < op.value, "<=": col <= op.value, ">": col > op.value,
                    ">=": col >= op.value, "==": col == op.value, "!=": col != op.value}[op.op]
            df = df[keep.to_numpy()]
        elif op.type == "map":
            x = df[op.field].to_numpy(np.float64)
            if op.fn == "scale":
                y = x * op.arg
            elif op.fn == "add":
                y = x + op.arg
            elif op.fn == "abs":
                y = np.abs(x)
            elif op.fn == "square":
                y = x * x
            else:  # Spark's round is HALF_UP
                p = 10.0 ** int(op.arg)
                y = np.sign(x) * np.floor(np.abs(x) * p + 0.5) / p
            df = df.assign(**{op.field: y})
    return df


def _read_output(output_dir: Path, batch: int) -> pd.DataFrame | None:
    path = output_path(output_dir, batch)
    if not path.exists():
        return None
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()


def _outputs(committed: list[int], output_dir: Path, report: VerifyReport,
             progress: Progress | None) -> Iterator[pd.DataFrame]:
    """Each committed batch's kept output; a missing one is reported lost."""
    for b in _tracked(committed, progress):
        df = _read_output(output_dir, b)
        if df is None:
            report.missing_batches.append(b)
            report.problem("lost", 0, f"batch {b} committed but its output is missing")
            continue
        yield df


def _tracked(committed: list[int], progress: Progress | None) -> Iterator[int]:
    """The committed batches, telling ``progress`` (done, of) as each is checked."""
    for done, batch in enumerate(committed):
        if progress is not None:
            progress(done, len(committed))
        yield batch
    if progress is not None:
        progress(len(committed), len(committed))


def verify(spec: definition.PipelineSpec, t0: float, checkpoint: Path | str,
           output_dir: Path | str, progress: Progress | None = None) -> VerifyReport:
    """Check a run's kept output batch by batch; ``progress(done, of)`` hears of each."""
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    report = VerifyReport()
    if (checkpoint.parent / replan.GENERATIONS_FILE).exists():
        epochs, starts, epoch_ends = epoch_ranges(checkpoint.parent, report)
        if not epochs or epochs[0] != 0:
            report.problem("lost", 0, "the re-planned run's output does not start at epoch 0")
            return report
        if spec.graph is not None:
            # The watermark the last epoch ran with: the generation forwarding it.
            doc = json.loads((checkpoint.parent / replan.GENERATIONS_FILE).read_text())
            gen = doc["generations"][-1]
            watermark = batch_watermark_ms(checkpoint.parent / gen["checkpoint"],
                                           epochs[-1] - gen["epoch_offset"])
            _verify_reference(spec, t0, epochs, epoch_ends[epochs[-1]], watermark,
                              output_dir, report, progress)
        elif spec.stateful.type == "hft_window":
            _verify_hft(spec, t0, epochs, starts, epoch_ends, output_dir, report,
                        spec.schedule(), spec.key_distribution(), progress)
        else:
            _verify_aggregate(spec, t0, epochs, starts, epoch_ends, output_dir, report,
                              spec.schedule(), spec.key_distribution(), progress)
        return report
    ends = end_offsets(checkpoint)
    committed = sorted(b for b in read_log(checkpoint / "commits") if b in ends)
    if not committed:
        report.problem("lost", 0, f"no committed batch in {checkpoint}")
        return report
    if committed[0] != 0 or any(b - 1 not in ends for b in committed[1:]):
        first = committed[0] if committed[0] != 0 else next(
            b for b in committed[1:] if b - 1 not in ends)
        report.problem("lost", 0, f"the checkpoint's offset log no longer holds batch "
                       f"{first - 1} (Spark purged it): the run cannot be checked from its "
                       "start; runs that keep output keep their whole log")
        return report
    if spec.graph is not None:
        _verify_reference(spec, t0, committed, ends[committed[-1]],
                          batch_watermark_ms(checkpoint, committed[-1]), output_dir,
                          report, progress)
        return report
    schedule, keys = spec.schedule(), spec.key_distribution()
    from pipelines.runtime import connectors

    first = connectors.start_offset(spec)  # (a stream read from its end at the start)
    starts = {b: ends.get(b - 1, first) for b in committed}
    stateful = spec.stateful
    if stateful.type == "hft_window":
        _verify_hft(spec, t0, committed, starts, ends, output_dir, report, schedule, keys,
                    progress)
    else:
        _verify_aggregate(spec, t0, committed, starts, ends, output_dir, report, schedule,
                          keys, progress)
    return report


def batch_watermark_ms(checkpoint: Path, batch: int) -> int:
    """The event-time watermark batch ``batch`` ran with (its offset log's metadata)."""
    text = read_log(checkpoint / "offsets")[batch]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return int(json.loads(lines[1]).get("batchWatermarkMs", 0))


def _result_key(row: dict[str, Any], columns: tuple[str, ...] | None) -> str:
    """A row as the reference states it: its columns (Q0: the event's own fields)."""
    if columns is None:
        row = {k: v for k, v in row.items()
               if v is not None and k not in ("seq", "emit_ts", "event_time")}
    else:
        row = {k: row.get(k) for k in columns}
    # A nullable long column reads back from Parquet as float64 (1187.0): whole numbers
    # compare as integers on both sides.
    row = {k: int(v) if isinstance(v, float) and v.is_integer() else v
           for k, v in row.items()}
    return json.dumps(row, sort_keys=True)


def _verify_reference(spec: definition.PipelineSpec, t0: float, committed: list[int],
                      end: int, last_watermark_ms: int, output_dir: Path,
                      report: VerifyReport, progress: Progress | None = None) -> None:
    """A dataflow pipeline with a ``reference`` (NEXMark): the rows kept over every
    committed batch (a re-planned run's epochs) must be, as a multiset, the reference's
    final result over the events those batches read (up to ``end``), behind the
    watermark the last batch ran with. Rows of windows still open then (a windowed join
    emits matches at once) are left out of both."""
    import collections

    from pipelines.nexmark import queries, reference
    from pipelines.runtime.query.nexmark_source import scheduled_events

    if any(n.type == dataflow.APP_TYPE for n in spec.graph.nodes):
        _verify_app(spec, t0, committed, end, output_dir, report, progress)
        return
    if spec.reference is None and python_checkable(spec) is None:
        _verify_python(spec, t0, committed, end, output_dir, report, progress)
        return
    if spec.reference is None and keyed_checkable(spec) is not None:
        _verify_keyed(spec, t0, committed, end, output_dir, report, progress)
        return
    if spec.reference is None:
        report.problem("unexpected", 0, "this dataflow pipeline names no reference result "
                       "to check its output against")
        return
    query = spec.reference.split(":", 1)[1]
    # Behind the watermark the sink's producer has passed (chained operators lag).
    watermark = last_watermark_ms - spec.graph.output_lag_ms()
    if spec.source_type in definition.BROKER_SOURCES:
        events = _stream_events(spec, end)
        report.records = len(events)
    else:
        events, _ = scheduled_events(json.dumps(spec.raw, sort_keys=True), 0, end, t0)
        report.records = end
    report.batches = len(committed)
    columns = queries.RESULT_COLUMNS[query]
    window_ms = reference.WINDOW_S * 1000
    rows: list[dict[str, Any]] = []
    if spec.sink["type"] in connectors_sinks():
        # The pipeline's own sink (a PostgreSQL table ...) is what is checked: each
        # committed epoch written once, none else, its rows the reference's.
        name, table, written = _sink_contents(spec, t0)
        _check_sink_batches(name, committed, written, report)
        table = table.drop(columns=[c for c in ("epoch",) if c in table.columns])
        report.sink_rows = report.output_rows = len(table)
        rows = json.loads(table.to_json(orient="records"))
    else:
        for df in _outputs(committed, output_dir, report, progress):
            report.output_rows += len(df)
            rows.extend(json.loads(df.to_json(orient="records")))
    if query == "Q6":
        _verify_running_means(events, watermark, rows, report)
        return
    got: collections.Counter[str] = collections.Counter()
    for row in rows:
        start = row.get("windowStart")
        if start is not None and start + window_ms > watermark:
            continue
        got[_result_key(row, columns)] += 1
    want = collections.Counter(_result_key(r, columns)
                               for r in reference.expected(query, events, watermark))
    report.compared_rows = sum(want.values())
    for key, n in (want - got).items():
        report.problem("lost", n, f"{query}: missing {n}x {key[:300]}")
    for key, n in (got - want).items():
        kind = "duplicated" if key in want else "unexpected"
        report.problem(kind, n, f"{query}: {kind} {n}x {key[:300]}")


def python_checkable(spec: definition.PipelineSpec) -> str | None:
    """Why a dataflow pipeline without a reference cannot be checked row by row, or None:
    a stateless chain of filters and Python operators is (each source record passes or
    not, and its row is a pure function of the record: ``pyops.py``)."""
    assert spec.graph is not None
    others = [n for n in spec.graph.nodes
              if n.type not in ("generator", "nexmark", "filter", "python", "sink")]
    if others:
        return f"{others[0].id} ({others[0].type}) is not a filter or a Python operator"
    if not any(n.type == "python" for n in spec.graph.nodes):
        return "it has no Python operator"
    return None


def keyed_checkable(spec: definition.PipelineSpec) -> dataflow.Node | None:
    """The keyed_aggregate of a pipeline that is a stateless chain of filters and Python
    operators into one keyed_aggregate into the sink (checked against pandas' groupby
    over the records the chain computes), or None."""
    assert spec.graph is not None
    stateful = [n for n in spec.graph.nodes if n.stateful]
    if len(stateful) != 1 or stateful[0].type != "keyed_aggregate":
        return None
    node = stateful[0]
    upstream = [n for n in spec.graph.ancestors(node.id)
                if n.type not in (*dataflow.SOURCE_TYPES, "filter", "python")]
    readers = [n for n in spec.graph.nodes if node.id in n.inputs]
    if upstream or any(n.type != "sink" for n in readers):
        return None
    return node


def _keyed_expected(frame: pd.DataFrame, node: dataflow.Node) -> pd.DataFrame:
    """Spark's groupBy(key).agg(...) of ``dataflow_spark._aggregate``, in pandas: count
    counts rows, the others skip nulls and are doubles."""
    key = list(node.params["key"])
    groups = frame.groupby(key, dropna=False)
    out = groups.size().rename("_rows").reset_index()
    for name, (fn, column, *order) in node.params["aggregates"].items():
        if fn == "count":
            values = groups.size()
        elif fn == "max_by":
            # The value at the largest order, null or not (groupby's last() would skip
            # a null value).
            ranked = frame.dropna(subset=[order[0]]).sort_values(order[0], kind="stable")
            values = ranked.groupby(key, dropna=False).tail(1).set_index(key)[column]
        else:
            values = getattr(groups[column], {"mean": "mean"}.get(fn, fn))()
        values = values.rename(name).reset_index()
        out = out.merge(values, on=key, how="left")
        if fn != "count":
            out[name] = out[name].astype("float64")
    return out.drop(columns=["_rows"])


def _verify_keyed(spec: definition.PipelineSpec, t0: float, committed: list[int], end: int,
                  output_dir: Path, report: VerifyReport,
                  progress: Progress | None = None) -> None:
    """Update mode over a keyed_aggregate: no batch writes a key twice, and each key's
    latest row equals the aggregate of every record the chain passed (to 1e-9 relative
    for doubles: Spark sums in another order)."""
    node = keyed_checkable(spec)
    assert node is not None
    report.batches, report.records = len(committed), end
    frame = python_frames(spec, t0, 0, end)[node.inputs[0]]
    want = _keyed_expected(frame, node)
    key = list(node.params["key"])
    columns = [*key, *node.params["aggregates"]]
    got = _batches_rows(committed, output_dir, report, progress, columns)
    _compare_keyed(_latest_per_key(got, key, report)[columns], want[columns], key, report)


def _batches_rows(committed: list[int], output_dir: Path, report: VerifyReport,
                  progress: Progress | None, columns: list[str]) -> pd.DataFrame:
    """Every committed batch's kept rows (``columns``), each with its batch's index."""
    parts = []
    for i, df in enumerate(_outputs(committed, output_dir, report, progress)):
        report.output_rows += len(df)
        parts.append(df[[c for c in columns if c in df.columns]].assign(_batch=i))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=[*columns, "_batch"])


def _latest_per_key(got: pd.DataFrame, key: list[str], report: VerifyReport) -> pd.DataFrame:
    """Update mode: a key written twice in one batch is a duplicate; the latest batch's
    row of each key is the one to compare."""
    twice = got.duplicated([*key, "_batch"])
    if twice.any():
        report.problem("duplicated", int(twice.sum()), f"{int(twice.sum())} rows repeat a "
                       f"key in the same batch (first: {_row_text(got[twice].iloc[0], key)})")
    return got.sort_values("_batch", kind="stable").drop_duplicates(key, keep="last")


def python_frames(spec: definition.PipelineSpec, t0: float, start: int, end: int
                  ) -> dict[str, pd.DataFrame]:
    """Every node's rows for the source records ``[start, end)``, computed in pandas
    (filters by ``dataflow_pandas``, operators by ``pyops``): the reference of a
    pipeline of filters and Python operators."""
    from pipelines.runtime.operators import packages

    assert spec.graph is not None
    if spec.source_type == "nexmark":
        from pipelines.runtime.query.nexmark_source import scheduled_events, to_arrow

        events, emit = scheduled_events(json.dumps(spec.raw, sort_keys=True), start, end,
                                        t0)
        frame = to_arrow(start, events, emit).to_pandas()
    elif spec.source_type in definition.BROKER_SOURCES:
        from pipelines.runtime.connectors import redis_stream as rs

        if definition.nexmark_events(spec):
            raise RunDirError("a stream of NEXMark events is checked against a NEXMark "
                              "reference (the definition's reference), not row by row")
        source, parsed = _read_source(spec, start, end)
        frame = pd.DataFrame(rs.as_arrays(parsed, source.fields))
        frame["event_time"] = pd.to_datetime(frame["emit_ts"], unit="s")
    else:
        r = workload.generate(spec.seed, start, end, spec.schedule(),
                              spec.key_distribution(), t0)
        frame = pd.DataFrame({"seq": r.seq, "key": r.key, "value": r.value,
                              "emit_ts": r.emit_ts,
                              # as the Spark source stamps it: timestamp_seconds(emit_ts)
                              "event_time": pd.to_datetime(r.emit_ts, unit="s")})
    frames: dict[str, pd.DataFrame] = {}
    for node in spec.graph.nodes:
        if node.type in dataflow.SOURCE_TYPES:
            frames[node.id] = frame
            continue
        if node.type == dataflow.APP_TYPE or node.inputs[0] not in frames:
            continue  # a pipeline module and what follows it: _verify_app's
        df = frames[node.inputs[0]]
        if node.type == "filter":  # from the checked tree, as Spark ran it
            condition = dataflow.parse_expression(
                node.params["where"], spec.graph.node(node.inputs[0]).columns, node.id)
            df = dataflow_pandas.keep(df, condition)
        elif node.type == "python":
            df = packages.operator(node.params["function"]).fn(df.copy(),
                                                               node.params["params"])
        frames[node.id] = df
    return frames


def _python_expected(spec: definition.PipelineSpec, t0: float, end: int) -> pd.DataFrame:
    """What the sink must hold for the source records ``[0, end)``."""
    assert spec.graph is not None
    return python_frames(spec, t0, 0, end)[spec.graph.sink.id]


def _verify_python(spec: definition.PipelineSpec, t0: float, committed: list[int],
                   end: int, output_dir: Path, report: VerifyReport,
                   progress: Progress | None = None) -> None:
    """Every source record that passes the filters is in the output exactly once, with
    every column the pandas reference computes (doubles to 1e-9 relative)."""
    report.batches, report.records = len(committed), end
    parts = list(_outputs(committed, output_dir, report, progress))
    got = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"seq": []})
    report.output_rows = len(got)
    want = _python_expected(spec, t0, end)
    counts = got["seq"].value_counts()
    dup = counts[counts > 1]
    if len(dup):
        report.problem("duplicated", int((dup - 1).sum()),
                       f"records {', '.join(map(str, dup.index[:5]))} are in the output "
                       "more than once")
    lost = sorted(set(want["seq"]) - set(got["seq"]))
    if lost:
        report.problem("lost", len(lost), f"records {', '.join(map(str, lost[:5]))} are "
                                          "missing")
    extra = sorted(set(got["seq"]) - set(want["seq"]))
    if extra:
        report.problem("unexpected", len(extra), f"records {', '.join(map(str, extra[:5]))}"
                                                 " should not be in the output")
    both = want.merge(got.drop_duplicates("seq"), on="seq", suffixes=("", "_got"))
    report.compared_rows = len(both)
    for column in [c for c in got.columns if c != "seq" and c in want.columns]:
        a, b = both[column], both[f"{column}_got"]
        if pd.api.types.is_float_dtype(a):
            # Vectorised sums may run in another order for another batch split: values
            # near zero differ in their last bits, so the tolerance is relative to the
            # column.
            x, y = a.to_numpy(np.float64), b.to_numpy(np.float64)
            finite = np.abs(x[np.isfinite(x)])
            scale = float(np.median(finite)) if len(finite) else 1.0
            bad = ~np.isclose(x, y, rtol=1e-9, atol=1e-9 * max(scale, 1e-300),
                              equal_nan=True)
        else:
            bad = (a.astype(str).to_numpy() != b.astype(str).to_numpy())
        if bad.any():
            first = both.loc[bad, "seq"].iloc[0]
            report.problem("wrong", int(bad.sum()), f"{column} differs on {int(bad.sum())} "
                                                    f"rows (first: record {first})")


def _verify_app(spec: definition.PipelineSpec, t0: float, committed: list[int], end: int,
                output_dir: Path, report: VerifyReport,
                progress: Progress | None = None) -> None:
    """A pipeline module's output against its own ``build`` over a static DataFrame of
    the same records (``app_reference.py``). Update mode (the module declares a key):
    no batch writes a key twice, and each key's latest row equals the batch query's;
    append mode: the rows, as a multiset, equal the batch query's — for a module that
    keeps state (windows), a subset of it, since windows still open at the last batch
    have not been emitted yet (counted in ``problems`` as information, not an error)."""
    from pipelines.runtime.verify import app_reference

    assert spec.graph is not None
    app = next(n for n in spec.graph.nodes if n.type == dataflow.APP_TYPE)
    upstream = [n for n in spec.graph.ancestors(app.id)
                if n.type not in (*dataflow.SOURCE_TYPES, "filter", "python")]
    if upstream:
        raise RunDirError(f"{app.id} reads {upstream[0].id} ({upstream[0].type}), which "
                          "the verifier does not recompute outside Spark")
    report.batches = len(committed)
    frame = python_frames(spec, t0, 0, end)[app.inputs[0]]
    report.records = end
    job = {"app": app.params["app"], "params": app.params["params"],
           "columns": app.columns, "key_groups": spec.key_groups,
           "watermark_s": spec.watermark_s, "trigger_ms": spec.trigger_ms,
           "nexmark_events": definition.nexmark_events(spec)}
    try:
        want = app_reference.expected(frame, job)
    except (app_reference.ReferenceError, OSError) as exc:
        raise RunDirError(str(exc)) from None
    columns = list(app.columns)
    got = _batches_rows(committed, output_dir, report, progress, columns)
    key = list(app.params["key"])
    if key:
        _compare_keyed(_latest_per_key(got, key, report)[columns], want, key, report)
    else:
        _compare_rows(got[columns], want, app.stateful, report)


def _shown(value: Any) -> Any:
    """A value as a message shows it: a whole number (an outer merge made it a float)
    as an integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _row_text(row: pd.Series, columns: list[str]) -> str:
    return ", ".join(f"{c}={_shown(row[c])}" for c in columns)


def _normalised(df: pd.DataFrame) -> pd.DataFrame:
    """Doubles to 12 significant digits (a sum in another order differs in its last
    bits), whole numbers as integers (a nullable long reads back as float64)."""
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = out[c].map(lambda v: v if pd.isna(v) else float(f"{v:.12g}"))
    return out


def _compare_keyed(got: pd.DataFrame, want: pd.DataFrame, key: list[str],
                   report: VerifyReport) -> None:
    report.compared_rows = len(want)
    both = _normalised(want).merge(_normalised(got), on=key, how="outer",
                                   suffixes=("", "_got"), indicator=True)
    lost = both[both["_merge"] == "left_only"]
    if len(lost):
        report.problem("lost", len(lost), f"{len(lost)} keys are missing from the output "
                       f"(first: {_row_text(lost.iloc[0], key)})")
    extra = both[both["_merge"] == "right_only"]
    if len(extra):
        report.problem("unexpected", len(extra), f"{len(extra)} keys should not be in the "
                       f"output (first: {_row_text(extra.iloc[0], key)})")
    matched = both[both["_merge"] == "both"]
    for column in [c for c in want.columns if c not in key]:
        a, b = matched[column], matched[f"{column}_got"]
        bad = ~((a == b) | (a.isna() & b.isna()))
        if pd.api.types.is_float_dtype(a) and bad.any():
            bad = ~np.isclose(a.to_numpy(np.float64), b.to_numpy(np.float64),
                              rtol=1e-9, equal_nan=True)
        if bad.any():
            first = matched[bad].iloc[0]
            report.problem("wrong", int(bad.sum()), f"{column} differs on {int(bad.sum())} "
                           f"keys (first: {_row_text(first, key)}: "
                           f"{_shown(first[f'{column}_got'])} where the batch query gives "
                           f"{_shown(first[column])})")


def _compare_rows(got: pd.DataFrame, want: pd.DataFrame, stateful: bool,
                  report: VerifyReport) -> None:
    import collections

    def rows(df: pd.DataFrame) -> collections.Counter[str]:
        return collections.Counter(_result_key(r, tuple(df.columns)) for r in
                                   json.loads(_normalised(df).to_json(orient="records")))

    have, should = rows(got), rows(want)
    report.compared_rows = sum(should.values())
    for text, n in (have - should).items():
        kind = "duplicated" if text in should else "unexpected"
        report.problem(kind, n, f"{kind} {n}x {text[:300]}")
    pending = should - have
    if pending and not stateful:
        for text, n in pending.items():
            report.problem("lost", n, f"missing {n}x {text[:300]}")
    elif pending and len(report.problems) < MAX_PROBLEMS:
        # (not a problem: rows of windows the run's watermark had not closed yet)
        report.problems.append(f"{sum(pending.values())} rows of the batch query are not "
                               "emitted yet (windows still open at the last batch)")


def _verify_running_means(events: list[dict[str, Any]], watermark: int,
                          rows: list[dict[str, Any]], report: VerifyReport) -> None:
    """NEXMark Q6: Beam emits a seller's mean after each of their winning auctions (in
    closing order); a run emits it after a micro-batch's last one, with ``count``, the
    seller's winners so far. Every row must be Beam's value after ``count`` winners
    (auctions closed by the last event read: an auction's bids all come before it
    closes), no (seller, count) twice, and every seller's rows must reach the winners
    that closed behind the watermark."""
    from pipelines.nexmark import reference

    running = reference.q6_running(events)
    final = {s: len(v) for s, v in reference.q6_running(events, watermark).items()}
    seen: set[tuple[int, int]] = set()
    reached: dict[int, int] = {}
    for row in rows:
        seller, count, price = int(row["seller"]), int(row["count"]), int(row["price"])
        values = running.get(seller, [])
        if (seller, count) in seen:
            report.problem("duplicated", 1, f"Q6: seller {seller} after {count} winners "
                                            "emitted twice")
        elif not 1 <= count <= len(values) or values[count - 1] != price:
            want = values[count - 1] if 1 <= count <= len(values) else "no such row"
            report.problem("unexpected", 1, f"Q6: seller {seller} after {count} winners: "
                                            f"{price}, reference {want}")
        seen.add((seller, count))
        reached[seller] = max(reached.get(seller, 0), count)
    report.compared_rows = len(rows)
    for seller, n in sorted(final.items()):
        if reached.get(seller, 0) < n:
            report.problem("lost", n - reached.get(seller, 0),
                           f"Q6: seller {seller} reached {reached.get(seller, 0)} of the "
                           f"{n} winners closed behind the watermark")


def _read_source(spec: definition.PipelineSpec, start: int, end: int) -> tuple[Any, Any]:
    """A broker or folder source and its records of offsets ``[start, end)``, read
    again (parsed, dead letters left out as the source leaves them out)."""
    from pipelines.runtime.connectors import files
    from pipelines.runtime.connectors import jetstream as jsc
    from pipelines.runtime.connectors import redis_stream as rs

    if spec.source_type == "redis_stream":
        source: Any = rs.stream_source(spec)
        return source, rs.read_range(source, start, end)
    if spec.source_type == "files":
        source = files.files_source(spec)
        return source, files.read_range(source, start, end)
    source = jsc.stream_source(spec)
    return source, jsc.read_range(source, start, end)


def _records(spec: definition.PipelineSpec, t0: float, start: int, end: int,
             schedule: workload.RateSchedule, keys: workload.KeyDistribution) -> pd.DataFrame:
    """The records of offsets ``[start, end)`` after the stateless steps: generated again,
    or read again from the broker (the entries the batch read; dead letters left out
    as the source leaves them out)."""
    if spec.source_type in definition.BROKER_SOURCES:
        from pipelines.runtime.connectors import redis_stream as rs

        source, parsed = _read_source(spec, start, end)
        cols = rs.as_arrays(parsed, source.fields)
        recs = workload.Records(seq=cols["seq"], key=cols["key"], value=cols["value"],
                                emit_ts=cols["emit_ts"])
        out = apply_stateless(spec, recs)
        out.attrs["read_rows"] = len(recs.seq)  # before the filter: what the batch read
        return out
    return apply_stateless(spec, workload.generate(spec.seed, start, end, schedule, keys, t0))


class _KeyTable:
    """Dense indices for the keys met so far: a generator's keys are 0..n-1 already; a
    broker's are any longs."""

    def __init__(self, n: int | None) -> None:
        self.dense = n is not None
        self.size = n or 0
        self.index = pd.Index(np.empty(0, dtype=np.int64))

    def ids(self, keys: np.ndarray) -> np.ndarray:
        if self.dense:
            return keys
        pos = self.index.get_indexer(keys)
        if (pos < 0).any():
            new = np.unique(keys[pos < 0])
            self.index = pd.Index(np.concatenate([self.index.to_numpy(np.int64), new]))
            self.size = len(self.index)
            pos = self.index.get_indexer(keys)
        return pos


def _grown(a: np.ndarray, size: int, fill: float) -> np.ndarray:
    if len(a) >= size:
        return a
    return np.concatenate([a, np.full(max(size, 2 * len(a)) - len(a), fill, dtype=a.dtype)])


def _verify_aggregate(spec: definition.PipelineSpec, t0: float, committed: list[int],
                      starts: dict[int, int], ends: dict[int, int], output_dir: Path,
                      report: VerifyReport, schedule: workload.RateSchedule,
                      keys: workload.KeyDistribution, progress: Progress | None = None
                      ) -> None:
    agg = spec.stateful.agg
    table = _KeyTable(keys.n if spec.source_type == "generator" else None)
    count = np.zeros(table.size, dtype=np.int64)
    total = np.zeros(table.size, dtype=np.float64)
    peak = np.full(table.size, -np.inf)
    for b in _tracked(committed, progress):
        df = _records(spec, t0, starts[b], ends[b], schedule, keys)
        report.batches += 1
        # (a broker's offsets are packed IDs, not a count: its records are the rows read,
        # dead letters left out)
        report.records += (ends[b] - starts[b] if table.dense
                           else int(df.attrs.get("read_rows", len(df))))
        k = df["key"].to_numpy(np.int64)
        v = df[spec.stateful.field].to_numpy(np.float64)
        ids = table.ids(k)
        count, total, peak = (_grown(count, table.size, 0), _grown(total, table.size, 0.0),
                              _grown(peak, table.size, -np.inf))
        np.add.at(count, ids, 1)
        np.add.at(total, ids, v)
        np.maximum.at(peak, ids, v)
        out = _read_output(output_dir, b)
        if out is None:
            report.missing_batches.append(b)
            report.problem("lost", len(np.unique(k)), f"batch {b}: no output kept")
            continue
        report.output_rows += len(out)
        dup = out["key"].duplicated()
        if dup.any():
            report.problem("duplicated", int(dup.sum()),
                           f"batch {b}: key {int(out['key'][dup].iloc[0])} output twice")
            out = out[~dup]
        expected_keys = np.unique(k)
        got = out.set_index("key")
        missing = np.setdiff1d(expected_keys, got.index.to_numpy(np.int64))
        extra = np.setdiff1d(got.index.to_numpy(np.int64), expected_keys)
        if len(missing):
            report.problem("lost", len(missing), f"batch {b}: {len(missing)} updated keys "
                           f"missing (e.g. key {int(missing[0])})")
        if len(extra):
            report.problem("unexpected", len(extra), f"batch {b}: {len(extra)} keys output "
                           f"without records in the batch (e.g. key {int(extra[0])})")
        common = np.intersect1d(expected_keys, got.index.to_numpy(np.int64))
        if not len(common):
            continue
        at = table.ids(common)
        want_agg = _aggregate(agg, count[at], total[at], peak[at])
        rows = got.loc[common]
        bad = _mismatched(rows["records"], rows["agg"], count[at], want_agg)
        if bad.any():
            i = int(np.argmax(bad))
            report.problem("wrong", int(bad.sum()),
                           f"batch {b}: key {int(common[i])} has records="
                           f"{int(rows['records'].iloc[i])}, agg={rows['agg'].iloc[i]!r}; "
                           f"expected {int(count[at][i])}, {want_agg[i]!r}")
    if spec.sink.get("type") in connectors_sinks():
        final = _aggregate(agg, count, total, peak)
        _verify_sink_table(spec, t0, committed, table, count, final, report)


def connectors_sinks() -> tuple[str, ...]:
    from pipelines.runtime import connectors

    return tuple(connectors.SINKS)


def _aggregate(agg: str, count: np.ndarray, total: np.ndarray, peak: np.ndarray
               ) -> np.ndarray:
    """The definition's aggregate from the per-key records, sum and max."""
    return {"count": count.astype(np.float64), "sum": total, "max": peak,
            "mean": total / np.maximum(count, 1)}[agg]


def _mismatched(records: pd.Series, agg: pd.Series, want_records: np.ndarray,
                want_agg: np.ndarray) -> np.ndarray:
    """Rows whose record count or aggregate is not the expected one."""
    return ((records.to_numpy(np.int64) != want_records)
            | ~np.isclose(agg.to_numpy(np.float64), want_agg, rtol=RTOL, atol=RTOL))


def _sink_contents(spec: definition.PipelineSpec, t0: float
                   ) -> tuple[str, pd.DataFrame, dict[int, int]]:
    """The run's own sink as it stands: its name, each key's current row, and the
    output batches it holds (epoch -> rows)."""
    from pipelines.runtime import connectors

    sink = connectors.sink_for_run(spec, t0)
    if spec.sink["type"] == "postgres":
        with sink.connect() as conn:
            names, rows = sink.read(conn)
            written = sink.written_epochs(conn)
        return spec.sink["table"], pd.DataFrame(rows, columns=names), written
    if spec.sink["type"] == "redis_stream":
        return f"the Redis stream {spec.sink['stream']}", sink.latest(), sink.written_epochs()
    return f"Parquet {sink.directory}", sink.latest(), sink.written_epochs()


def _check_sink_batches(name: str, committed: list[int], written: dict[int, int],
                        report: VerifyReport) -> None:
    """The output batches a sink's ledger holds: every committed one, none else."""
    missing_batches = sorted(set(committed) - set(written))
    if missing_batches:
        report.problem("lost", len(missing_batches), f"{name} lacks output batch "
                       f"{missing_batches[0]} ({len(missing_batches)} in all)")
    extra_batches = sorted(set(written) - set(committed))
    if extra_batches:
        report.problem("unexpected", len(extra_batches), f"{name} holds output batch "
                       f"{extra_batches[0]} that the run never committed "
                       f"({len(extra_batches)} in all)")


def _stream_events(spec: definition.PipelineSpec, end: int) -> list[dict[str, Any]]:
    """The NEXMark events a stream holds from the run's first offset up to ``end``, in
    the stream's order, as the generator makes them (a field an event lacks absent):
    what the run's batches read, dead letters left out as the source leaves them."""
    from pipelines.runtime import connectors

    _source, parsed = _read_source(spec, connectors.start_offset(spec), end)
    names = list(parsed.columns)
    return [{n: v for n, v in zip(names, values) if v is not None}
            for values in zip(*(parsed.columns[n] for n in names))]


def _verify_sink_table(spec: definition.PipelineSpec, t0: float, committed: list[int],
                       table: _KeyTable, count: np.ndarray, final: np.ndarray,
                       report: VerifyReport) -> None:
    """The run's own sink (a PostgreSQL table, a Parquet dataset) against the aggregate
    over every committed record (a key's current row holds its last update), and the
    batches it holds: each output batch written once (the ledger's key; one file per
    epoch) and none missing or extra."""
    name, got, written = _sink_contents(spec, t0)
    _check_sink_batches(name, committed, written, report)
    if got.empty:
        expected_n = int((count > 0).sum())
        if expected_n:
            report.problem("lost", expected_n, f"{name} holds no row")
        return
    keys = got["key"].to_numpy(np.int64)
    seen = table.ids(keys)
    # Rows of keys that have records (a key never read has no index, or none counted).
    ok = (seen >= 0) & (seen < len(count))
    ok[ok] = count[seen[ok]] > 0
    have = np.zeros(len(count), dtype=bool)
    have[seen[ok]] = True
    lost = int(((count > 0) & ~have).sum())
    if lost:
        report.problem("lost", lost, f"{name}: {lost} keys with records "
                       "have no row")
    extra = int((~ok).sum())
    if extra:
        report.problem("unexpected", extra, f"{name}: {extra} rows for keys "
                       "without records")
    at = seen[ok]
    wrong = _mismatched(got["records"][ok], got["agg"][ok], count[at], final[at])
    if wrong.any():
        i = int(np.argmax(wrong))
        report.problem("wrong", int(wrong.sum()),
                       f"{name}: key {int(keys[ok][i])} holds "
                       f"records={int(got['records'].to_numpy()[ok][i])}; expected "
                       f"{int(count[at][i])}")
    report.sink_rows = len(got)


def _verify_hft(spec: definition.PipelineSpec, t0: float, committed: list[int],
                starts: dict[int, int], ends: dict[int, int], output_dir: Path,
                report: VerifyReport, schedule: workload.RateSchedule,
                keys: workload.KeyDistribution, progress: Progress | None = None) -> None:
    op = spec.stateful
    last = ends[committed[-1]]
    everything = _records(spec, t0, 0, last, schedule, keys)
    expected = hft.reference(everything, op.window, op.slide, op.degree)
    bounds = np.array([ends[b] for b in committed])
    batch_of = np.array(committed)[np.searchsorted(bounds, expected["last_seq"].to_numpy(),
                                                   side="right")]
    expected = expected.assign(batch=batch_of)
    for b in _tracked(committed, progress):
        report.batches += 1
        report.records += ends[b] - starts[b]
        want = expected[expected["batch"] == b].set_index(["key", "window_end"])
        out = _read_output(output_dir, b)
        if out is None:
            report.missing_batches.append(b)
            report.problem("lost", len(want), f"batch {b}: no output kept")
            continue
        report.output_rows += len(out)
        dup = out.duplicated(["key", "window_end"])
        if dup.any():
            report.problem("duplicated", int(dup.sum()), f"batch {b}: a window output twice")
            out = out[~dup]
        got = out.set_index(["key", "window_end"])
        missing = want.index.difference(got.index)
        extra = got.index.difference(want.index)
        if len(missing):
            report.problem("lost", len(missing), f"batch {b}: window {missing[0]} missing")
        if len(extra):
            report.problem("unexpected", len(extra), f"batch {b}: window {extra[0]} not "
                           "expected in this batch")
        _compare_hft_windows(b, want, got, report)


def _compare_hft_windows(batch: int, want: pd.DataFrame, got: pd.DataFrame,
                         report: VerifyReport) -> None:
    """Each window both hold, compared field by field (all windows at once)."""
    both = want.join(got, how="inner", lsuffix="_w", rsuffix="_g")
    if both.empty:
        return

    width = max(len(c) for column in ("coefficients_w", "coefficients_g")
                for c in both[column])

    def coefficients(column: str) -> np.ndarray:
        """One row per window, NaN-padded: a window with fewer coefficients differs."""
        out = np.full((len(both), width), np.nan)
        for i, c in enumerate(both[column]):
            out[i, :len(c)] = np.asarray(c, dtype=float)
        return out

    same = ((both["first_seq_w"] == both["first_seq_g"])
            & (both["last_seq_w"] == both["last_seq_g"])
            & (both["buckets_w"] == both["buckets_g"])
            & np.isclose(both["price_mean_w"], both["price_mean_g"], rtol=RTOL)).to_numpy()
    same &= np.isclose(coefficients("coefficients_g"), coefficients("coefficients_w"),
                       rtol=1e-6, atol=1e-9).all(axis=1)
    for idx in both.index[~same]:
        report.problem("wrong", 1, f"batch {batch}: window {idx} differs from the "
                       f"reference: {dict(got.loc[idx])} vs {dict(want.loc[idx])}")


class RunDirError(ValueError):
    """A run directory the verifier cannot check (unreadable, or no kept output)."""


def verify_run_dir(run_dir: Path | str, progress: Progress | None = None) -> VerifyReport:
    """Verify the run whose runner config, schedule clock, checkpoint and kept output
    are in ``run_dir`` (RunDirError when it cannot be checked)."""
    run_dir = Path(run_dir)
    try:
        cfg = json.loads((run_dir / "runner.json").read_text())
        spec = definition.validate(cfg["definition"])
        from pipelines.runtime import connectors

        connectors.register_connections(cfg.get("connections"))
        spec = connectors.pin_start(spec, run_dir, create=False)
        t0 = float(json.loads((run_dir / "t0").read_text())["t0"])
    except (OSError, KeyError, ValueError) as exc:
        raise RunDirError(f"cannot read the run in {run_dir}: {exc}") from exc
    trimmed = connectors.trimmed_from_run(spec, run_dir)
    if trimmed:
        raise RunDirError(
            f"the stream {spec.source_doc.get('stream')!r} no longer holds {trimmed:,} of "
            "the entries this run read (trimmed since it started: a feeder's --maxlen, an "
            "XTRIM), so what they were cannot be read again to check the output")
    if not spec.keep_output:
        raise RunDirError("this run kept no output (its sink's keep_output is off), so "
                          "there is nothing to check")
    return verify(spec, t0, run_dir / "checkpoint", run_dir / "output", progress)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipelines.runtime.verify RUN_DIR  (holding runner.json)",
              file=sys.stderr)
        return 2
    try:
        report = verify_run_dir(argv[0])
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict()))
    print(report.line(), file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
