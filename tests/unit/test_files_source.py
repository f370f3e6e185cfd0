"""The files source without Spark: the folder's arrival manifest gives every reader the
same files at the same offsets (hidden and half-written files are not data), JSON
Lines, CSV and Parquet records are typed as the brokers' are, a file's dead letters are
written once, and a definition names a folder under the files root only."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.runtime.connectors import files
from pipelines.runtime.spec import definition

pytestmark = [pytest.mark.dbless]


@pytest.fixture()
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STREAMWISE_FILES_ROOT", str(tmp_path))
    return tmp_path


def _land(directory: Path, name: str, text: str, mtime: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    os.utime(directory / name, (mtime, mtime))


def test_files_get_offsets_in_arrival_order_once_whoever_looks(root: Path) -> None:
    source = files.FilesSource.from_params({"path": "in", "format": "jsonl"})
    _land(source.directory, "b.jsonl", '{"key": 1, "value": 1}\n', 200)
    _land(source.directory, "a.jsonl", '{"key": 2, "value": 2}\n', 100)
    _land(source.directory, ".hidden.jsonl", "x", 50)  # a writer's temporary name
    _land(source.directory, "_notes.jsonl", "x", 50)
    _land(source.directory, "c.csv", "key,value\n", 50)  # another format
    # Many readers at once (the query's driver, the runner's clock): one manifest.
    seen: list[list[str]] = []
    threads = [threading.Thread(target=lambda: seen.append(
        [f.name for f in files.landed(source)])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(names == ["a.jsonl", "b.jsonl"] for names in seen)
    # A later file comes after, whatever its modification time.
    _land(source.directory, "0-old.jsonl", '{"key": 3, "value": 3}\n', 1)
    assert [f.name for f in files.landed(source)] == ["a.jsonl", "b.jsonl", "0-old.jsonl"]
    assert files.end_offset(source, look=False) == 3
    parsed = files.read_range(source, 1, 3)
    assert parsed.columns["key"] == [1, 3]
    assert parsed.seq == [1 << files.LINE_BITS, 2 << files.LINE_BITS]


def test_csv_and_parquet_records_are_typed_and_bad_ones_say_why(root: Path) -> None:
    csv_source = files.FilesSource.from_params({"path": "csv", "format": "csv"})
    _land(csv_source.directory, "1.csv",
          "key,value,extra\n1,2.5,x\n2,abc,y\nz3,1,q\n4\n5,6,7\n", 10)
    got = files.read_range(csv_source, 0, files.end_offset(csv_source))
    assert got.columns == {"key": [1, 5], "value": [2.5, 6.0]}
    assert [r.split(":")[0] for _, _, r in got.dead] == [
        "field 'value' is not a double", "field 'key' is not a long", "no field 'value'"]
    pq_source = files.FilesSource.from_params({"path": "pq", "format": "parquet"})
    pq_source.directory.mkdir()
    pq.write_table(pa.table({"key": pa.array([1, None, 3], pa.int64()),
                             "value": pa.array([0.5, 1.0, 2.0])}),
                   pq_source.directory / "1.parquet")
    (pq_source.directory / "2.parquet").write_text("not parquet")
    got = files.read_range(pq_source, 0, files.end_offset(pq_source))
    assert got.columns == {"key": [1, 3], "value": [0.5, 2.0]}
    assert [r.split(":")[0] for _, _, r in got.dead] == ["no field 'key'",
                                                         "not a Parquet file"]


def test_a_files_dead_letters_are_written_once(root: Path) -> None:
    source = files.FilesSource.from_params({"path": "in"})
    _land(source.directory, "a.jsonl",
          '{"key": 1, "value": 1}\n{bad\n{"key": 2}\n', 10)
    (landed,) = files.landed(source)
    parsed = files.read_file(source, landed)
    assert files.write_dead_letters(source, landed, parsed.dead) == 2
    assert files.write_dead_letters(source, landed, parsed.dead) == 0  # read again
    letters = files.dead_letters(source)
    assert [(x["line"], x["raw"]) for x in letters] == [(1, "{bad"), (2, '{"key": 2}')]
    assert files.dead_letter_count(source) == 2
    # The dead letters are not data for the source.
    assert [f.name for f in files.landed(source)] == ["a.jsonl"]
    assert json.loads((source.dead_letter_dir / "0.jsonl").read_text().splitlines()[0])[
        "file"] == "a.jsonl"


@pytest.mark.parametrize(("src", "where", "message"), [
    ({"path": "/etc"}, "source.path", "relative"),
    ({"path": "../up"}, "source.path", "without .."),
    ({"path": "in", "format": "xml"}, "source.format", "jsonl"),
    ({"path": "in", "max_files_per_trigger": 0}, "source.max_files_per_trigger", "1 to"),
    ({"path": "in", "fields": {"key": "long"}}, "source.fields", "value"),
])
def test_a_files_source_that_is_wrong_is_a_field_error(src: dict, where: str,
                                                       message: str) -> None:
    with pytest.raises(definition.DefinitionError) as err:
        definition.validate({"source": {"type": "files", **src},
                             "operators": [{"type": "keyed_aggregate"}]})
    assert err.value.path == where and message in str(err.value)
