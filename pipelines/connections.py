"""Connections: the servers definitions name instead of URLs, resolved for a run, and
"Test connection" — what a source holds before a run reads it.

A definition's source or sink says ``"connection": "<name>"``; :func:`resolve` turns
the names a definition uses into what its runner needs (kind, URL, password), refusing
a name that does not exist or is of the wrong kind (a Redis connection for a
PostgreSQL sink). :func:`probe` reads a sample of a source — through the same
connectors the runner uses — and says what it found: the fields and their types, the
backlog, the current rate; or why it cannot reach it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pipelines.models import Connection
from pipelines.runtime import connectors
from pipelines.runtime.spec import definition as pdef

SAMPLE = 200  # records a probe reads
RATE_WINDOW_S = 1.0  # how long a probe watches a stream grow


class ConnectionProblem(ValueError):
    """A definition names a connection that is missing or of the wrong kind."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


def named(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(path, connection name, kind it must be) for each connection a definition names:
    a chain's source and sink, a dataflow's source node and its sink node's ``to``."""
    sections: list[tuple[str, Any]] = []
    if isinstance(doc, dict) and isinstance(doc.get("nodes"), list):
        for i, node in enumerate(doc["nodes"]):
            if not isinstance(node, dict):
                continue
            where = f"nodes[{i}] ({node.get('id')})"
            if node.get("type") == "sink":
                sections.append((f"{where}.to", node.get("to")))
            else:
                sections.append((where, node))
    elif isinstance(doc, dict) and "app" in doc:  # a pipeline module's: its sink's "to"
        sink = doc.get("sink")
        sections = [("source", doc.get("source")),
                    ("sink.to", sink.get("to") if isinstance(sink, dict) else None)]
    elif isinstance(doc, dict):
        sections = [(part, doc.get(part)) for part in ("source", "sink")]
    out = []
    for path, section in sections:
        if isinstance(section, dict) and section.get("connection"):
            kind = pdef.CONNECTION_KIND.get(str(section.get("type")), "")
            out.append((f"{path}.connection", str(section["connection"]), kind))
    return out


def resolve(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The connections a definition names, as its runner gets them (name -> kind, URL,
    password); ConnectionProblem names the field of one missing or of the wrong kind."""
    out: dict[str, dict[str, str]] = {}
    for path, name, kind in named(doc):
        conn = Connection.objects.filter(name=name).first()
        if conn is None:
            raise ConnectionProblem(path, f"no connection is named {name!r}")
        if kind and conn.kind != kind:
            raise ConnectionProblem(path, f"{name!r} is a {conn.get_kind_display()} "
                                    f"connection; this needs {kind}")
        out[name] = conn.runtime()
    return out


def use(doc: dict[str, Any]) -> None:
    """Make the connections a definition names known to this process's connectors (the
    web app's own reads: Test connection, a verification)."""
    connectors.register_connections(resolve(doc))


@dataclass
class ProbeResult:
    ok: bool
    message: str
    fields: dict[str, str] = field(default_factory=dict)  # found: name -> type
    sample: list[dict[str, Any]] = field(default_factory=list)
    backlog: int | None = None  # records (files: files) held
    rate_per_s: float | None = None  # measured over RATE_WINDOW_S
    dead_in_sample: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "fields": self.fields,
                "sample": self.sample[:5], "backlog": self.backlog,
                "rate_per_s": self.rate_per_s, "dead_in_sample": self.dead_in_sample}


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        try:
            int(value)
            return "long"
        except ValueError:
            pass
        try:
            float(value)
            return "double"
        except ValueError:
            return "string"
    return type(value).__name__


def _infer(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each field's type over the sample (a field both long and double is double)."""
    kinds: dict[str, set[str]] = {}
    for rec in records:
        for k, v in rec.items():
            kinds.setdefault(k, set()).add(_kind_of(v))
    out = {}
    for k, seen in kinds.items():
        out[k] = ("double" if seen <= {"long", "double"} and "double" in seen
                  else seen.pop() if len(seen) == 1 else "string")
    return out


def probe(source: dict[str, Any]) -> ProbeResult:
    """Read a sample of a definition's source section and say what it holds."""
    kind = source.get("type")
    try:
        if source.get("connection"):
            use({"source": source})
        if kind == "redis_stream":
            return _probe_redis(source)
        if kind == "jetstream":
            return _probe_jetstream(source)
        if kind == "files":
            return _probe_files(source)
    except ConnectionProblem as exc:
        return ProbeResult(False, str(exc))
    except Exception as exc:  # noqa: BLE001 - any client's refusal, shown as the reason
        return ProbeResult(False, f"cannot read the source: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}")
    return ProbeResult(False, f"a {kind or 'generator'} source has nothing to test: its "
                              "records are the product's own")


def _probe_redis(source: dict[str, Any]) -> ProbeResult:
    from pipelines.runtime.connectors import redis_stream as rs

    src = rs.StreamSource.from_params({"fields": None, **source})
    r = src.connect()
    r.ping()
    held = int(r.xlen(src.stream))
    if not r.exists(src.stream):
        return ProbeResult(True, f"connected; the stream {src.stream!r} does not exist "
                                 "yet (a run waits for its first entry)", backlog=0)
    before = rs.end_offset(r, src.stream)
    entries = r.xrevrange(src.stream, count=SAMPLE)
    records = [{k.decode(errors="replace"): v.decode(errors="replace")
                for k, v in fields.items()} for _id, fields in entries]
    time.sleep(RATE_WINDOW_S)
    after_entries = r.xrange(src.stream, min=rs.unpack(before), count=100_000)
    parsed = rs.parse(entries, src.fields)
    return ProbeResult(True, f"read {len(records)} of {held:,} entries",
                       fields=_infer(records), sample=records, backlog=held,
                       rate_per_s=len(after_entries) / RATE_WINDOW_S,
                       dead_in_sample=len(parsed.dead))


def _probe_jetstream(source: dict[str, Any]) -> ProbeResult:
    import json

    from pipelines.runtime.connectors import jetstream as jsc

    src = jsc.JetStreamSource.from_params({"fields": None, **source})
    client = jsc.connection(src.url)
    end = jsc.end_offset(client, src.stream)
    first = jsc.first_offset(client, src.stream)
    held = jsc.message_count(client, src.stream)
    if first is None:
        return ProbeResult(True, f"connected; the stream {src.stream!r} holds no message "
                                 "yet", backlog=0)
    messages = jsc.read(client, src.stream, max(first, end - SAMPLE), end)
    records = []
    for m in messages:
        try:
            doc = json.loads(m.data)
            if isinstance(doc, dict):
                records.append(doc)
        except ValueError:
            pass
    time.sleep(RATE_WINDOW_S)
    grown = jsc.end_offset(client, src.stream) - end
    return ProbeResult(True, f"read {len(messages)} of {held:,} messages",
                       fields=_infer(records), sample=records, backlog=held,
                       rate_per_s=grown / RATE_WINDOW_S,
                       dead_in_sample=len(jsc.parse(messages, src.fields).dead))


def _probe_files(source: dict[str, Any]) -> ProbeResult:
    from pipelines.runtime.connectors import files

    src = files.FilesSource.from_params({"fields": None, **source})
    if not src.directory.is_dir():
        return ProbeResult(False, f"no folder {source.get('path')!r} under the files root")
    suffixes = files.SUFFIXES[src.format]
    landed = sorted((p for p in src.directory.iterdir()
                     if p.is_file() and p.name[0] not in "._" and p.name.endswith(suffixes)),
                    key=lambda p: p.stat().st_mtime)
    if not landed:
        return ProbeResult(True, f"the folder holds no {src.format} file yet", backlog=0)
    seen = files.landed(src, look=False)
    newest = files.Landed(len(seen), landed[-1].name, landed[-1].stat().st_size, time.time())
    records: list[dict[str, Any]] = []
    for row, _reason, raw in files.records_of(src, src.directory / newest.name):
        if isinstance(raw, dict):
            records.append(raw)
        elif isinstance(raw, bytes):
            try:
                import json

                doc = json.loads(raw)
                if isinstance(doc, dict):
                    records.append(doc)
            except ValueError:
                pass
        elif row is not None:
            records.append(row)
        if len(records) >= SAMPLE:
            break
    before = len(landed)
    time.sleep(RATE_WINDOW_S)
    now = sum(1 for p in src.directory.iterdir()
              if p.is_file() and p.name[0] not in "._" and p.name.endswith(suffixes))
    return ProbeResult(True, f"{len(landed)} files, {len(landed) - len(seen)} not yet read "
                             "by any run; sampled the newest",
                       fields=_infer(records), sample=records,
                       backlog=len(landed) - len(seen),
                       rate_per_s=(now - before) / RATE_WINDOW_S)


def reach(conn: Connection) -> ProbeResult:
    """Can the server be reached with the connection's URL and password?"""
    url = connectors.with_password(conn.runtime()["url"], conn.password)
    try:
        if conn.kind == "redis":
            import redis

            client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
            info = client.info("server")
            return ProbeResult(True, f"Redis {info.get('redis_version', '?')} answered")
        if conn.kind == "nats":
            from pipelines.runtime.connectors import jetstream as jsc

            client = jsc.JetStreamClient(url)
            try:
                account = client.call(client.js.account_info(), timeout=10)
                streams = getattr(account, "streams", None)
            finally:
                client.close()
            return ProbeResult(True, f"NATS JetStream answered ({streams} streams)")
        import psycopg

        with psycopg.connect(url, connect_timeout=5) as pg:
            version = pg.execute("SHOW server_version").fetchone()
        return ProbeResult(True, f"PostgreSQL {version[0] if version else '?'} answered")
    except Exception as exc:  # noqa: BLE001 - the client's reason, shown as is
        text = str(exc).replace(conn.password, "***") if conn.password else str(exc)
        return ProbeResult(False, f"cannot reach {conn.url}: {type(exc).__name__}: "
                                  f"{text[:300]}")
