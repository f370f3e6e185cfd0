"""Hostile input: definitions that would exhaust a runner, input that raised a 500, the
Lab's bounds, private files and secrets, a WebSocket whose user lost the right to watch.
Property tests (Hypothesis) of the definition validator and the expression checker, and
a fuzz pass of every form and POST endpoint."""
from __future__ import annotations

import copy
import html
import json
import os
import stat
import subprocess
import time
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipelines.nexmark import queries
from pipelines.runtime.spec import dataflow
from pipelines.runtime.operators import catalogue as pyops
from pipelines.runtime.spec import definition as pdef
from tests.conftest import SMALL_DEFINITION, make_pipeline_and_policy, run_async
from tests.web.test_lab import FORM

# ------------------------------------------------------ definitions that exhaust a runner
Q5 = queries.definition("Q5", 1000)


def _nexmark(**knobs: int) -> dict[str, Any]:
    doc = copy.deepcopy(Q5)
    doc["nodes"][0]["nexmark"] = knobs
    return doc


def _sliding(size: int, slide: int) -> dict[str, Any]:
    doc = copy.deepcopy(Q5)
    for node in doc["nodes"]:
        if node.get("window", {}).get("kind") == "sliding":
            node["window"] = {"kind": "sliding", "size_s": size, "slide_s": slide}
    return doc


HFT = {**pdef.HFT_DEFINITION}


@pytest.mark.dbless
@pytest.mark.parametrize("doc, path, words", [
    (_nexmark(avg_bid_byte_size=10_000_000), "nodes[0] (events).nexmark.avg_bid_byte_size",
     "must be <= 10000"),
    ({**SMALL_DEFINITION, "max_records_per_batch": 100_000_000}, "max_records_per_batch",
     "must be <= 5e+06"),
    (_sliding(86_400, 1), "nodes[2] (counts).window.slide_s",
     "makes 86,400 windows of every row"),
    ({**HFT, "operators": [{"type": "hft_window", "window": 100_000, "slide": 1}]},
     "operators[0].slide", "window / slide = 100,000"),
    # Each number within its bound, together over one executor's batch (modelled):
    ({**_nexmark(avg_bid_byte_size=10_000, avg_auction_byte_size=10_000),
      "max_records_per_batch": 2_000_000}, "max_records_per_batch", "MiB (modelled)"),
    ({**HFT, "source": {**HFT["source"], "keys": {"kind": "uniform", "n": 1_000_000}},
      "operators": [{"type": "hft_window", "window": 100_000, "slide": 100}]},
     "operators[0].window", "of state (modelled)"),
])
def test_a_definition_past_what_one_executor_holds_is_refused(doc, path, words) -> None:
    with pytest.raises(pdef.DefinitionError) as err:
        pdef.validate(doc)
    assert err.value.path == path, err.value
    assert words in err.value.message, err.value


@pytest.mark.dbless
def test_the_shipped_definitions_stay_within_the_bounds() -> None:
    for doc in (pdef.DEMO_DEFINITION, pdef.HFT_DEFINITION, pdef.ELASTIC_DEFINITION,
                pyops.hft_split_definition(1000), pyops.nexmark_python_definition(1000),
                *(queries.definition(q, 1000) for q in queries.QUERIES)):
        cost = pdef.check_cost(pdef.validate(doc))
        assert cost.batch_bytes <= pdef.MAX_BATCH_BYTES


@pytest.mark.django_db
def test_a_stored_definition_past_the_bounds_cannot_start(local_operator) -> None:
    """A definition saved before a bound tightened: Start refuses it with the reason."""
    from pipelines.forms import StartRunForm
    from pipelines.models import Pipeline

    pipeline, policy = make_pipeline_and_policy(local_operator, name="old")
    Pipeline.objects.filter(pk=pipeline.pk).update(
        definition={**SMALL_DEFINITION, "max_records_per_batch": 100_000_000})
    form = StartRunForm({"pipeline": pipeline.pk, "policy": policy.pk})
    assert not form.is_valid()
    assert "cannot start" in form.errors["pipeline"][0]
    assert "max_records_per_batch" in form.errors["pipeline"][0]


# ------------------------------------------------------------ no 500 on bad input
def _dataflow(**node: Any) -> dict[str, Any]:
    nodes = [{"id": "events", "type": "nexmark", "rate": {"kind": "constant",
                                                          "records_per_s": 100}},
             {"id": "bids", "type": "filter", "input": "events", "where": "type == 'bid'"},
             {"id": "x", "input": "bids", **node},
             {"id": "out", "type": "sink", "input": "x"}]
    return {"nodes": nodes}


BAD_DEFINITIONS = [
    # (definition, words in the field's error)
    (_dataflow(type="filter", where="(" * 300 + "price" + ")" * 300), "nested parentheses"),
    (_dataflow(type="filter", where="price < " + "+".join(["1"] * 990)), "nests deeper"),
    (_dataflow(type="python", function=["bid_euro"]), "is not an installed operator"),
    (_dataflow(type="keyed_aggregate", key="auction", aggregates={"s": ["sum", ["price"]]}),
     "must be [function, column]"),
    (_dataflow(type="keyed_aggregate", key="auction", aggregates={"auction": ["count"]}),
     "is a key column"),
    (_dataflow(type="window_aggregate", window={"kind": "tumbling", "size_s": 10},
               aggregates={"emit_ts": ["max", "price"]}), "a column this node writes"),
    (_dataflow(type="filter", where="event_time > 5"), "is a timestamp"),
    (_dataflow(type="filter", where="('a' * 1000000000) == 'b'"), "not a string literal"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("doc, words", BAD_DEFINITIONS)
def test_bad_definitions_are_field_errors_through_the_form(local_operator, doc, words) -> None:
    from pipelines.models import Pipeline

    client = Client()
    client.force_login(local_operator)
    response = client.post("/pipelines/new/", {"name": "bad", "description": "",
                                               "definition": json.dumps(doc)})
    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    assert words in page, page[-3000:]
    assert not Pipeline.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_a_json_definition_nested_past_the_limit_is_a_field_error(local_operator) -> None:
    client = Client()
    client.force_login(local_operator)
    for text in ("[" * 50_000, json.dumps({"nodes": [[[[[[[[1]]]]]]]]} | {
            "deep": json.loads("[" * 100 + "]" * 100)})):
        response = client.post("/pipelines/new/", {"name": "deep", "description": "",
                                                   "definition": text})
        assert response.status_code == 200
        assert "nested deeper than 64 levels" in html.unescape(response.content.decode())


@pytest.mark.django_db
def test_a_plan_nested_past_the_limit_is_refused_with_a_message(local_operator) -> None:
    from pipelines.models import Run

    doc = pyops.nexmark_python_definition(1000)
    from pipelines import actions
    from pipelines.models import Pipeline

    pipeline = actions.save_pipeline(Pipeline(name="plan", definition=doc), local_operator)
    _p, policy = make_pipeline_and_policy(local_operator, name="plan-policy")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=local_operator)
    client = Client()
    client.force_login(local_operator)
    response = client.post(f"/runs/{run.pk}/plan/", {"plan": "[" * 50_000}, follow=True)
    assert response.status_code == 200
    assert "not a plan for this pipeline" in html.unescape(response.content.decode())
    assert not run.events.filter(kind__contains="requested").exists()


@pytest.mark.django_db
def test_a_login_with_a_user_name_past_its_column_is_a_form_error() -> None:
    """Found by the fuzz pass below: the login throttle's record of a failed login
    (a 255-character column) failed on PostgreSQL with a 300-character name."""
    response = Client().post("/login/", {"username": "u" * 300, "password": "x"})
    assert response.status_code == 200
    assert "at most 150 characters" in response.content.decode()


# ------------------------------------------------------------------------- the Lab
LAB_FORM = FORM  # the Lab tests' valid form


def _lab_form(data: dict, files: dict | None = None, user: Any = None):
    from control.forms import LabForm

    return LabForm(data, files or {}, user=user)


@pytest.mark.django_db
@pytest.mark.parametrize("changes, field, words", [
    ({"seed": "9" * 400}, "seed", "less than or equal to"),
    ({"rate_scale": "1e308"}, "rate_scale", "less than or equal to"),
])
def test_lab_numbers_past_their_bounds_are_field_errors(changes, field, words) -> None:
    form = _lab_form({**LAB_FORM, **changes})
    assert not form.is_valid()
    assert words in " ".join(form.errors.get(field, [])), form.errors


@pytest.mark.dbless
def test_a_scenario_whose_rates_overflow_is_refused_by_the_simulator() -> None:
    from control import sim

    doc = {"steps": 5, "workload": {"rate": {"kind": "constant", "rate": 5000,
                                             "scale": 1e308}}}
    with pytest.raises(sim.ScenarioError, match="workload.rate.scale: the rates reach"):
        sim.parse_scenario(doc)
    with pytest.raises(sim.ScenarioError, match="seed: must be <="):
        sim.parse_scenario({"seed": 2 ** 63})


@pytest.mark.django_db
def test_a_lab_trace_with_a_field_past_the_csv_limit_is_a_field_error() -> None:
    upload = SimpleUploadedFile("t.csv", b"rate\n" + b"1" * 140_000 + b"\n")
    form = _lab_form({**LAB_FORM, "workload": "trace"}, {"trace_file": upload})
    assert not form.is_valid()
    assert "not CSV" in form.errors["trace_file"][0], form.errors


@pytest.mark.django_db
def test_a_lab_trace_keeps_only_the_rates_the_comparison_reads() -> None:
    """A 4 MB upload of 1.3 M rates (one a second): the comparison reads one a step."""
    from control import sim

    n = 1_300_000
    text = "".join(f"{i % 100}\n" for i in range(n)).encode()
    form = _lab_form({**LAB_FORM, "workload": "trace", "steps": "40", "step_s": "2.5"},
                     {"trace_file": SimpleUploadedFile("t.csv", text)})
    assert form.is_valid(), form.errors
    rate = form.scenario["workload"]["rate"]
    assert len(rate["rates"]) == 40
    full = {**rate, "rates": [float(i % 100) for i in range(n)],
            "seconds_per_value": 1.0}
    kept = sim.parse_scenario(form.scenario).rates
    everything = sim.parse_scenario({**form.scenario, "workload": {
        **form.scenario["workload"], "rate": full}}).rates
    assert list(kept) == list(everything)  # the same comparison


@pytest.mark.django_db
def test_a_lab_comparison_that_would_outlast_the_limit_is_refused(settings) -> None:
    """The form measures a probe of the comparison: the limit is set just under what
    the probe measured, so that this holds on a machine of any speed."""
    from control import lab

    form = _lab_form(LAB_FORM)
    assert form.is_valid(), form.errors
    estimate = lab.estimate_seconds(form.scenario)
    assert estimate > 0
    settings.LAB_TIME_LIMIT_S = estimate / 100
    form = _lab_form(LAB_FORM)
    assert not form.is_valid()
    assert "over the Lab's limit" in form.errors["steps"][0]


@pytest.mark.django_db
def test_the_lab_estimate_stays_under_the_run_it_measures() -> None:
    """The probe's first steps cost more than a run's later ones: the estimate must
    not exceed the run (measured side by side, three times, the median ratio), or the
    form refuses comparisons that fit."""
    import statistics

    from control import lab, sim

    form = _lab_form({**LAB_FORM, "steps": "120"})
    assert form.is_valid(), form.errors
    ratios = []
    for _ in range(3):
        estimate = lab.estimate_seconds(form.scenario)
        started = time.perf_counter()
        sim.simulate(form.scenario)
        ratios.append(estimate / (time.perf_counter() - started))
    assert statistics.median(ratios) < 1.5, ratios


@pytest.mark.django_db
def test_a_lab_past_its_time_limit_is_marked_failed(local_operator) -> None:
    from control import lab
    from control.models import LabRun, LabStatus

    form = _lab_form(LAB_FORM)
    assert form.is_valid(), form.errors
    run = LabRun.objects.create(name="slow", scenario=form.scenario, created_by=local_operator,
                                total=80)
    message = lab.execute(run.pk, time_limit_s=0.0)
    run.refresh_from_db()
    assert run.status == LabStatus.FAILED and "time limit" in run.error, message
    assert run.result is None


@pytest.mark.django_db
def test_a_lab_whose_worker_died_is_marked_failed_after_the_limit(local_operator,
                                                                   settings) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from audit.models import AuditEntry
    from control import lab
    from control.models import LabRun, LabStatus

    settings.LAB_TIME_LIMIT_S = 10
    old = timezone.now() - timedelta(seconds=10 + lab.STALE_GRACE_S + 1)
    stale = LabRun.objects.create(name="lost", scenario={}, status=LabStatus.RUNNING,
                                  started_at=old, created_by=local_operator)
    fresh = LabRun.objects.create(name="busy", scenario={}, status=LabStatus.RUNNING,
                                  started_at=timezone.now(), created_by=local_operator)
    assert lab.fail_stale_labs() == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == LabStatus.FAILED and "worker stopped" in stale.error
    assert fresh.status == LabStatus.RUNNING
    assert AuditEntry.objects.filter(target_id=str(stale.pk),
                                     after__status="failed").exists()


@pytest.mark.django_db
def test_a_user_has_at_most_so_many_comparisons_queued(local_operator, settings) -> None:
    from control.models import LabRun, LabStatus

    settings.LAB_MAX_ACTIVE_PER_USER = 2
    for status in (LabStatus.PENDING, LabStatus.RUNNING):
        LabRun.objects.create(name="q", scenario={}, status=status, created_by=local_operator)
    form = _lab_form(LAB_FORM, user=local_operator)
    assert not form.is_valid()
    assert "2 comparisons queued or running" in " ".join(form.non_field_errors())
    other = User.objects.create_user("other-lab-user")
    assert _lab_form(LAB_FORM, user=other).is_valid()
    LabRun.objects.filter(status=LabStatus.PENDING).update(status=LabStatus.DONE)
    assert _lab_form(LAB_FORM, user=local_operator).is_valid()


# ------------------------------------------------------------ private files, secrets
@pytest.mark.django_db
def test_files_under_var_are_private_and_runner_json_holds_no_redis_password(
        tmp_path, monkeypatch) -> None:
    """The umask is set by the settings (every process of the product); runner.json
    leaves the Redis password to the runner's environment."""
    from pipelines import launch
    from pipelines.runtime import bus as busmod

    assert os.umask(0o077) == 0o077  # what the settings set (and put back as it was)
    made = tmp_path / "made-by-a-process"
    made.write_text("x")
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.VAR_DIR.stat().st_mode) == 0o700
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        db = settings.DATABASES["default"]["NAME"]
        assert stat.S_IMODE(os.stat(db).st_mode) & 0o077 == 0, db

    monkeypatch.setattr(settings, "REDIS_URL", "redis://:s3cret%2Fpw@127.0.0.1:6390/3")
    path = launch.write_runner_config({"run_id": 1, "redis_url": settings.REDIS_URL},
                                      tmp_path / "run")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "s3cret" not in path.read_text()
    assert json.loads(path.read_text())["redis_url"] == "redis://127.0.0.1:6390/3"
    env = launch._runner_env()
    assert env[busmod.PASSWORD_ENV] == "s3cret/pw"
    monkeypatch.setenv(busmod.PASSWORD_ENV, "s3cret/pw")
    kwargs = busmod.connect("redis://127.0.0.1:6390/3").connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cret/pw"


@pytest.mark.dbless
def test_up_starts_its_own_redis_with_a_password_off_the_command_line(tmp_path) -> None:
    import redis

    from pipelines.management.commands.up import private_redis, redis_answers
    from tests.conftest import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    command, secured = private_redis(tmp_path, url)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not redis_answers(secured):
            assert time.monotonic() < deadline and proc.poll() is None, "no Redis"
            time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url).ping()
        assert not redis_answers(url)
        password = (tmp_path / "redis_password").read_text().strip()
        assert password and password in secured
        cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read().decode()
        assert password not in cmdline
        for private in ("redis_password", "redis.conf"):
            assert stat.S_IMODE((tmp_path / private).stat().st_mode) == 0o600
        assert private_redis(tmp_path, url)[1] == secured  # the same on the next start
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------- the live WebSocket
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change, code", [("logout", 4401), ("demote", 4403),
                                          ("deactivate", 4401)])
def test_a_websocket_stops_pushing_to_a_user_logged_out_or_demoted(
        change, code, monkeypatch) -> None:
    from accounts.roles import sync_roles
    from pipelines import actions
    from pipelines.models import Run
    from webapp import consumers
    from webapp.asgi import application
    from channels.testing import WebsocketCommunicator

    monkeypatch.setattr(consumers, "RECHECK_S", 0.0)
    sync_roles(Group, Permission)
    watcher = User.objects.create_user("watcher", password="watcher-pass-123")
    watcher.groups.add(Group.objects.get(name="viewer"))
    owner = User.objects.create_superuser("owner", "o@example.com", "owner-pass-123")
    pipeline, policy = make_pipeline_and_policy(owner, name="ws-recheck")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=owner)
    client = Client()
    client.force_login(watcher)
    cookie = f"{settings.SESSION_COOKIE_NAME}=" \
             f"{client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    def push() -> None:
        actions.push(run.pk, {"type": "run.status", "run": actions.run_state(run)})

    def take_away() -> None:
        if change == "logout":
            client.logout()
        elif change == "demote":
            watcher.groups.clear()
        else:
            User.objects.filter(pk=watcher.pk).update(is_active=False)

    async def scenario() -> tuple[dict, dict]:
        from channels.db import database_sync_to_async

        comm = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=[
            (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)])
        connected, _ = await comm.connect(timeout=10)
        assert connected
        await comm.receive_json_from(timeout=10)  # the snapshot
        await database_sync_to_async(push)()
        before = await comm.receive_json_from(timeout=10)
        await database_sync_to_async(take_away)()
        await database_sync_to_async(push)()
        after = await comm.receive_output(timeout=10)
        await comm.disconnect()
        return before, after

    before, after = run_async(scenario())
    assert before["kind"] == "status"
    assert after == {"type": "websocket.close", "code": code}


@pytest.mark.dbless
def test_the_viewers_of_one_session_share_one_permission_read_per_recheck(
        monkeypatch) -> None:
    """A thousand tabs of one session cost one read of the session and role per
    RECHECK_S, and the read's own time is what each socket counts from."""
    import asyncio

    from webapp import consumers

    reads: list[tuple[str | None, int]] = []

    async def counted(session_key: str | None, user_id: int) -> int | None:
        reads.append((session_key, user_id))
        await asyncio.sleep(0.05)  # a read under way: the others wait for it
        return None if session_key == "good" else 4401

    monkeypatch.setattr(consumers, "_still_allowed", counted)
    monkeypatch.setattr(consumers, "_checks", {})
    monkeypatch.setattr(consumers, "RECHECK_S", 0.3)

    async def scenario() -> tuple[list, list, list]:
        first = await asyncio.gather(*(consumers.allowed_now("good", 1) for _ in range(200)))
        other = await asyncio.gather(consumers.allowed_now("gone", 2),
                                     consumers.allowed_now("gone", 2))
        await asyncio.sleep(0.35)
        later = await asyncio.gather(*(consumers.allowed_now("good", 1) for _ in range(5)))
        return first, other, later

    first, other, later = run_async(scenario())
    assert reads == [("good", 1), ("gone", 2), ("good", 1)]
    assert {code for code, _at in first} == {None} and len({at for _c, at in first}) == 1
    assert [code for code, _at in other] == [4401, 4401]
    assert later[0][1] > first[0][1] + 0.3


# -------------------------------------------------- the verifier on event_time filters
@pytest.mark.dbless
def test_the_verifier_computes_a_filter_on_event_time_and_is_not_none() -> None:
    from pipelines.runtime.verify import verifier as verify

    doc = pyops.hft_split_definition(1000)
    doc["nodes"].insert(1, {"id": "known", "type": "filter", "input": "quotes",
                            "where": "event_time is not None and value is not None "
                                     "and value < 500"})
    doc["nodes"][2]["input"] = "known"
    spec = pdef.validate(doc)
    frames = verify.python_frames(spec, 1_700_000_000.0, 0, 400)
    kept = frames["known"]
    assert 0 < len(kept) < 400 and (kept["value"] < 500).all()
    assert kept["event_time"].notna().all()


# ------------------------------------------------------------------ property tests
def _json(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8), st.sampled_from(["", "key", "value", "price", "events",
                                              "bids", "out", "count", "sum", "tumbling",
                                              "sliding", "nexmark", "generator"]))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                     max_size=4)), max_leaves=max_leaves)


BASES = [SMALL_DEFINITION, pdef.HFT_DEFINITION, pdef.DEMO_DEFINITION, Q5,
         queries.definition("Q3", 1000), queries.definition("Q6", 1000),
         queries.definition("Q8", 1000), pyops.nexmark_python_definition(1000)]


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_definitions(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return draw(_json())
        path = draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        how = draw(st.sampled_from(["replace", "delete", "number", "deep", "wide"]))
        if how == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "number":
            parent[path[-1]] = draw(st.one_of(
                st.integers(-(10 ** 400), 10 ** 400), st.floats(),
                st.sampled_from([0, -1, 10 ** 7, 10 ** 8, 2 ** 63, 1e308, 86_400])))
        elif how == "deep":
            parent[path[-1]] = json.loads("[" * 70 + "1" + "]" * 70)
        elif how == "wide":
            parent[path[-1]] = [draw(_json(3))] * draw(st.integers(50, 300))
        else:
            parent[path[-1]] = draw(_json())
    return doc


def _accepted_within_bounds(spec: pdef.PipelineSpec) -> None:
    assert spec.max_records_per_batch <= pdef.MAX_RECORDS_PER_BATCH
    assert 1 <= spec.key_groups <= pdef.MAX_KEY_GROUPS
    assert pdef.estimate_cost(spec).batch_bytes <= pdef.MAX_BATCH_BYTES
    assert pdef.estimate_cost(spec).state_bytes <= pdef.MAX_STATE_BYTES
    for size in spec.nexmark.values():
        assert 1 <= size <= 10_000_000
    for key in pdef.NEXMARK_MIX:
        assert spec.nexmark.get(key, 0) <= pdef.MAX_NEXMARK_EVENT_BYTES
    for op in spec.operators:
        if op.type == "hft_window":
            assert op.window / op.slide <= pdef.MAX_HFT_POINTS_PER_QUOTE
    if spec.graph is not None:
        assert len(spec.graph.nodes) <= dataflow.MAX_NODES
        for node in spec.graph.nodes:
            window = node.params.get("window") or {}
            if window.get("kind") == "sliding":
                assert window["size_s"] // window["slide_s"] <= dataflow.MAX_WINDOWS_PER_ROW


PROPERTY = hsettings(max_examples=400, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.data_too_large])


@pytest.mark.dbless
@PROPERTY
@given(st.one_of(_json(), mutated_definitions()))
def test_the_validator_raises_only_its_own_error_and_accepts_only_within_bounds(doc) -> None:
    try:
        spec = pdef.validate(doc)
    except pdef.DefinitionError:
        return
    _accepted_within_bounds(spec)


COLUMNS = {"a": "double", "b": "long", "s": "string", "event_time": "timestamp"}


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> str:
    leaf = st.one_of(st.sampled_from(["a", "b", "s", "event_time", "None", "True",
                                      "'x'", "ghost", "1e999", "-0.0"]),
                     st.integers(-(10 ** 30), 10 ** 30).map(str),
                     st.floats(allow_nan=False, allow_infinity=False).map(repr))
    if depth > 6 or draw(st.booleans()):
        return draw(leaf)
    sub = expressions(depth + 1)
    kind = draw(st.sampled_from(["bin", "cmp", "bool", "not", "neg", "if", "in", "is",
                                 "call", "chain", "deep", "wide"]))
    a, b = draw(sub), draw(sub)
    return {
        "bin": f"({a} {draw(st.sampled_from(['+', '-', '*', '/', '//', '%', '**']))} {b})",
        "cmp": f"({a} {draw(st.sampled_from(['<', '<=', '==', '!=', '>', '>=']))} {b})",
        "bool": f"({a} {draw(st.sampled_from(['and', 'or']))} {b})",
        "not": f"(not {a})", "neg": f"(-{a})", "if": f"({a} if {b} else None)",
        "in": f"({a} in ('x', 1, {b}))", "is": f"({a} is not None)",
        "call": f"len({a})", "chain": f"({a} < {b} < 3)",
        "deep": "(" * 40 + a + ")" * 40, "wide": " + ".join([a] * 300),
    }[kind]


@pytest.mark.dbless
@PROPERTY
@given(st.one_of(expressions(), st.text(max_size=50), _json(4)))
def test_the_expression_checker_raises_only_its_error_and_the_verifier_evaluates_all_it_accepts(
        text) -> None:
    import numpy as np
    import pandas as pd

    from pipelines.runtime.verify import expressions as dataflow_pandas

    try:
        tree = dataflow.parse_expression(text, COLUMNS, "where")
    except dataflow.GraphError:
        return
    depth, nodes, stack = 0, 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        depth, nodes = max(depth, d), nodes + 1
        stack.extend((c, d + 1) for c in __import__("ast").iter_child_nodes(node))
    assert depth <= dataflow.MAX_EXPRESSION_DEPTH and nodes <= dataflow.MAX_EXPRESSION_NODES
    frame = pd.DataFrame({"a": [np.nan, 1.5, -2.0], "b": [3, 0, -1], "s": ["x", None, "y"],
                          "event_time": pd.to_datetime([0, 1, None], unit="s")})
    with np.errstate(all="ignore"):
        dataflow_pandas.evaluate(tree, frame)


# ------------------------------------------------------------ a fuzz pass of the POSTs
POLICY_FIELDS = ("name", "description", "latency_bound_ms", "throughput_floor_rps",
                 "power_budget_w", "control_step_s", "min_workers", "initial_workers",
                 "max_workers", "strategy", "strategy_params", "violation_steps",
                 "alert_webhook")
LAB_FIELDS = tuple(LAB_FORM) + ("calibrate_from",)
# Each POST endpoint (``{run}`` etc. filled in) with the fields its form reads.
ENDPOINTS = {
    "/pipelines/new/": ("name", "description", "definition"),
    "/pipelines/{pipeline}/edit/": ("name", "description", "definition"),
    "/runs/start/": ("pipeline", "policy"),
    "/runs/{run}/stop/": (),
    "/runs/{run}/workers/": ("workers", "schedule"),
    "/runs/{run}/rebalance/": ("planner", "schedule", "tau"),
    "/runs/{run}/frequency/": ("ghz",),
    "/runs/{run}/replan/": ("key_groups", "scheme"),
    "/runs/{run}/plan/": ("plan",),
    "/runs/{run}/move-groups/": ("groups", "executor", "schedule"),
    "/runs/{run}/dry-run/": ("dry_run",),
    "/runs/{run}/verify/": (),
    "/runs/{run}/policy-version/": ("version",),
    "/policies/new/": POLICY_FIELDS,
    "/policies/{policy}/edit/": POLICY_FIELDS,
    "/lab/new/": LAB_FIELDS,
    "/lab/{lab}/policy/": ("label",),
    "/retention/": (),
    "/login/": ("username", "password"),
}
JSON_FIELDS = ("definition", "strategy_params", "parameters", "plan")

SCALARS = st.one_of(
    st.text(max_size=30), st.integers(-(10 ** 400), 10 ** 400).map(str),
    st.floats().map(repr),
    st.sampled_from(["", "-1", "0", "1", "2", "1e308", "nan", "inf", "-inf", "[", "{",
                     "[" * 5000, "{\"a\": " * 3000, "null", "[]", "{}", "\x00",
                     "9" * 400, "1,2,3", "0-99999", "javascript:alert(1)",
                     "http://[::127.0.0.1]/", "seamless", "stop-restart", "batched",
                     "ding-table", "lat-node", "lat-node Sw h=1", "th-rule", "queue",
                     "trace", "step", "on", "true", "executor-0"]))
JSON_TEXT = st.one_of(_json().map(json.dumps), mutated_definitions().map(json.dumps),
                      st.sampled_from(["[" * 50_000, '{"pes": [["x"]], "partitions": 1e999}',
                                       '{"pes": "all"}', '{"horizon": 99}']))


@st.composite
def posts(draw: st.DrawFn, ids: dict[str, int]) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    data: dict[str, Any] = {}
    for name in ENDPOINTS[path]:
        if draw(st.integers(0, 9)) == 0:
            continue  # a field left out
        values = st.one_of(JSON_TEXT, SCALARS) if name in JSON_FIELDS else SCALARS
        if name == "strategies":
            data[name] = draw(st.lists(st.sampled_from(["lat-node Sw h=1", "th-rule",
                                                        "ghost"]), max_size=3))
        else:
            data[name] = draw(values)
    return path.format(**ids), data


@pytest.mark.django_db
def test_every_form_and_post_answers_random_fields_without_a_500(local_operator) -> None:
    """Random values in every field of every POST endpoint's form, as an operator:
    every answer is a page, a redirect or a refusal, never a server error."""
    from django.db import transaction

    from control.models import LabRun
    from pipelines.models import Run

    pipeline, policy = make_pipeline_and_policy(local_operator, name="fuzz")
    run = Run.objects.create(pipeline_version=pipeline.current_version, policy=policy,
                             status="running", created_by=local_operator, key_groups=4)
    lab = LabRun.objects.create(name="l", scenario={}, created_by=local_operator)
    ids = {"run": run.pk, "pipeline": pipeline.pk, "policy": policy.pk, "lab": lab.pk}
    client = Client(raise_request_exception=False)
    client.force_login(local_operator)
    seen: set[str] = set()

    @hsettings(max_examples=300, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
    @given(posts(ids))
    def post(example: tuple[str, dict[str, Any]]) -> None:
        path, data = example
        seen.add(path)
        with transaction.atomic():  # every POST's writes undone: the next sees the same
            response = client.post(path, data)
            transaction.set_rollback(True)
        assert response.status_code < 500, (path, data, response.status_code)

    post()
    assert seen == {p.format(**ids) for p in ENDPOINTS}
