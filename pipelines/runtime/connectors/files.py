"""A directory of files as they land, as a replayable source: JSON Lines, CSV or Parquet.

No Spark here (the Spark reader is ``query/broker_source.py``); the runner's clock, the
verifier and the feeder share it.

**Arrival order and offsets.** Spark's file source keeps the files it has seen in its
own checkpoint log (``FileStreamSourceLog``), one per query: two generations of a live
re-plan, or the verifier, could not agree on which batch read which file. This source
keeps the arrival order in the directory instead, in an append-only manifest
``_streamwise-manifest.jsonl``: whoever looks first at a new file (a query's driver, a
runner's clock) appends it, under an exclusive lock, in the order of the files'
modification times. A file's offset is its line in the manifest, so every reader of
the directory, now or later, sees the same files at the same offsets; a batch
``[start, end)`` reads files ``start .. end - 1`` whole, at most
``max_files_per_trigger`` of them (Spark's option of the same name).

As with Spark's file source, a file must appear whole (written elsewhere, then moved or
renamed in: a rename is atomic), and names starting with ``.`` or ``_`` are not data
(Spark's hidden-file rule). The directory must be writable by the runner (the manifest
and the dead letters live there).

**Records.** A JSON Lines line is a JSON object; a CSV file has a header row naming its
columns; a Parquet file's columns are the fields. The declared fields are converted as
the brokers' are (``records``); a record that does not fit is a dead letter, written
to ``_dead-letter/<offset>.jsonl`` once per source file (an atomic write of the whole
file's letters: read again, the file gives the same letters and the same name). A
record's identity is ``offset * 2**LINE_BITS + line`` and its emission time the moment
the manifest took its file in: latency runs from the file's arrival to the sink's
commit.
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.runtime import connectors
from pipelines.runtime.connectors.records import (
    Parsed,
    convert_text,
    fields_of,
    parse_object,
)
from pipelines.runtime.spec import definition

MANIFEST = "_streamwise-manifest.jsonl"
DEAD_LETTERS = "_dead-letter"
SUFFIXES = {"jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",),
            "parquet": (".parquet",)}
LINE_BITS = 24  # records within one file: 16.7 million
MAX_LINES = 1 << LINE_BITS


@dataclass(frozen=True)
class Landed:
    """A file in the manifest: its offset, name, size and when the manifest took it."""

    offset: int
    name: str
    size: int
    seen: float


@dataclass(frozen=True)
class FilesSource:
    directory: Path
    format: str = "jsonl"
    fields: Mapping[str, str] = field(default_factory=lambda: {"key": "long",
                                                              "value": "double"})
    max_files_per_trigger: int = 10

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> FilesSource:
        return cls(directory=connectors.files_root() / str(params["path"]),
                   format=str(params.get("format", "jsonl")),
                   fields=dict(params.get("fields") or {"key": "long", "value": "double"}),
                   max_files_per_trigger=int(params.get("max_files_per_trigger", 10)))

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST

    @property
    def dead_letter_dir(self) -> Path:
        return self.directory / DEAD_LETTERS


def files_source(spec: definition.PipelineSpec) -> FilesSource:
    return FilesSource.from_params(spec.source_doc)


def _read_manifest(path: Path) -> list[Landed]:
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(Landed(int(d["offset"]), str(d["name"]), int(d["size"]),
                              float(d["seen"])))
    return out


def landed(source: FilesSource, look: bool = True) -> list[Landed]:
    """The manifest's files in offset order; with ``look``, first taking in the files
    that landed since (in modification-time order, under the manifest's lock)."""
    if not look:
        return _read_manifest(source.manifest)
    source.directory.mkdir(parents=True, exist_ok=True)
    with open(source.manifest, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            known = [Landed(**json.loads(line)) for line in handle.read().splitlines()
                     if line.strip()]
            names = {f.name for f in known}
            new = []
            with os.scandir(source.directory) as entries:
                for entry in entries:
                    if (entry.name in names or entry.name[0] in "._"
                            or not entry.name.endswith(SUFFIXES[source.format])
                            or not entry.is_file()):
                        continue
                    st = entry.stat()
                    new.append((st.st_mtime_ns, entry.name, st.st_size))
            if new:
                now = time.time()
                lines = []
                for mtime_ns, name, size in sorted(new):
                    f = Landed(len(known), name, size, now)
                    known.append(f)
                    lines.append(json.dumps(f.__dict__) + "\n")
                handle.seek(0, os.SEEK_END)
                handle.write("".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return known


def end_offset(source: FilesSource, look: bool = True) -> int:
    """How many files the manifest holds (taking in new ones first)."""
    return len(landed(source, look))


def records_of(source: FilesSource, path: Path) -> Iterator[tuple[Any, str | None, Any]]:
    """(row or None, reason, raw) for each record of a file."""
    if source.format == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - a file that is not Parquet
            yield None, f"not a Parquet file: {str(exc)[:120]}", path.name
            return
        for doc in table.to_pylist():
            row, reason = fields_of(doc, source.fields)
            yield row, reason, doc
        return
    data = path.read_bytes()
    if source.format == "jsonl":
        for line in data.splitlines():
            if line.strip():
                row, reason = parse_object(line, source.fields)
                yield row, reason, line
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield None, f"not UTF-8: {exc}", path.name
        return
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None) or []
    for cells in reader:
        if not cells:
            continue
        doc = dict(zip(header, cells))
        raw = ",".join(cells)
        row: dict[str, Any] | None = {}
        reason = None
        for name, kind in source.fields.items():
            if name not in doc:
                row, reason = None, f"no field {name!r}"
                break
            try:
                row[name] = convert_text(doc[name], kind)  # type: ignore[index]
            except ValueError as exc:
                row, reason = None, f"field {name!r} is not a {kind}: {str(exc)[:120]}"
                break
        yield row, reason, raw


_ARROW_TYPES = {"long": "int64", "double": "float64", "string": "string"}


def _columns(source: FilesSource, path: Path) -> dict[str, Any] | None:
    """The declared fields of a file whose every record fits them, read by Arrow's own
    readers (columnar, in C++: a tenth of parsing line by line in Python), or None:
    a file with a record that does not fit is read line by line (``_rows``) for its
    dead letters. The typing rules are the line-by-line ones: an integer for a long (a
    JSON 1.5 or true fails the read), any number for a double, no missing value."""
    import pyarrow as pa

    types = {n: getattr(pa, _ARROW_TYPES[k])() for n, k in source.fields.items()}
    try:
        if source.format == "jsonl":
            from pyarrow import json as pajson

            table = pajson.read_json(path, parse_options=pajson.ParseOptions(
                explicit_schema=pa.schema(types), unexpected_field_behavior="ignore"))
        elif source.format == "csv":
            from pyarrow import csv as pacsv

            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                column_types=types, include_columns=list(types)))
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=list(types))
            for name, kind in source.fields.items():
                column = table.column(name)
                if kind == "long" and not pa.types.is_integer(column.type):
                    return None
                if kind == "double" and not (pa.types.is_integer(column.type)
                                             or pa.types.is_floating(column.type)):
                    return None
                if kind == "string" and not pa.types.is_string(column.type):
                    return None
            table = table.cast(pa.schema(types))
    except Exception:  # noqa: BLE001 - any record that does not fit: read line by line
        return None
    if table.num_rows >= MAX_LINES or any(table.column(n).null_count for n in types):
        return None
    out = {}
    for name, kind in source.fields.items():
        column = table.column(name)
        if kind == "double":
            import numpy as np

            values = column.to_numpy()
            if not np.isfinite(values).all():
                return None
            out[name] = values
        else:
            out[name] = column.to_numpy(zero_copy_only=False) if kind == "long" \
                else column.to_pylist()
    return out


def read_file(source: FilesSource, f: Landed, into: Parsed | None = None) -> Parsed:
    """A landed file's records, parsed (its dead letters in ``dead``); columns are
    numpy arrays where the whole file fits (lists when added ``into`` another)."""
    import numpy as np

    out = into if into is not None else Parsed()
    for name in source.fields:
        out.columns.setdefault(name, [])
    base = f.offset << LINE_BITS
    columns = _columns(source, source.directory / f.name)
    if columns is not None:
        n = len(next(iter(columns.values())))
        seq = base | np.arange(n, dtype=np.int64)
        if into is None:
            out.seq = seq  # type: ignore[assignment]
            out.emit_ts = np.full(n, f.seen)  # type: ignore[assignment]
            out.columns = columns
        else:
            out.seq.extend(seq.tolist())
            out.emit_ts.extend([f.seen] * n)
            for name in source.fields:
                values = columns[name]
                out.columns[name].extend(values.tolist() if hasattr(values, "tolist")
                                         else values)
        return out
    for line, (row, reason, raw) in enumerate(records_of(source, source.directory / f.name)):
        if line >= MAX_LINES:
            raise ValueError(f"{f.name} holds more than {MAX_LINES} records")
        if row is None:
            out.dead.append((base | line, raw, str(reason)))
            continue
        out.seq.append(base | line)
        out.emit_ts.append(f.seen)
        for name in source.fields:
            out.columns[name].append(row[name])
    return out


def read_range(source: FilesSource, start: int, end: int) -> Parsed:
    """Every record of the files at offsets ``[start, end)``."""
    files = landed(source, look=False)
    parsed = Parsed()
    for f in files[start:end]:
        read_file(source, f, parsed)
    return parsed


def write_dead_letters(source: FilesSource, f: Landed, dead: list[tuple[Any, Any, str]]
                       ) -> int:
    """The file's dead letters as ``_dead-letter/<offset>.jsonl`` (its name, each
    record's identity, line, reason and raw text), written once; returns how many were
    new."""
    if not dead:
        return 0
    final = source.dead_letter_dir / f"{f.offset}.jsonl"
    if final.exists():
        return 0
    source.dead_letter_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for seq, raw, reason in dead:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (
            raw if isinstance(raw, str) else json.dumps(raw, default=str))
        lines.append(json.dumps({"file": f.name, "seq": seq, "line": seq & (MAX_LINES - 1),
                                 "reason": reason, "raw": text}) + "\n")
    tmp = final.with_name(f".{f.offset}.{os.getpid()}.tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, final)
    return len(dead)


def dead_letters(source: FilesSource) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not source.dead_letter_dir.is_dir():
        return out
    for path in sorted(source.dead_letter_dir.glob("*.jsonl"),
                       key=lambda p: int(p.stem)):
        out += [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


def dead_letter_count(source: FilesSource) -> int:
    if not source.dead_letter_dir.is_dir():
        return 0
    return sum(p.read_bytes().count(b"\n") for p in source.dead_letter_dir.glob("*.jsonl"))
