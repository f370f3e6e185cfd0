import json
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError

from control.models import Policy
from accounts.roles import ADMIN, sync_roles
from pipelines import actions
from pipelines.models import Pipeline
from pipelines.nexmark import queries as nexmark_queries
from pipelines.runtime.runner import calibration
from pipelines.runtime.spec.definition import (
    DEMO_DEFINITION,
    ELASTIC_DEFINITION,
    ELASTIC_STREAM_DEFINITION,
    HFT_DEFINITION,
)

DEMO_PIPELINE = "hft-demo"
HFT_PIPELINE = "hft-kernel"
DEMO_POLICY = "demo-2s"
MPC_POLICY = "demo-mpc"
ELASTIC_PIPELINE = "elastic-demo"
ELASTIC_POLICY = "demo-elastic"
# Rate cycles in the demo pipeline (low, high, low), so that a run started at any time
# shows a scale-up and a scale-down within its first cycle.
DEMO_CYCLES, DEMO_REST_S = 6, 120


NEXMARK_RATE = 500  # events/s: well within one 1-core executor here


# The stream demo: the feeder (started by ``manage.py up``) publishes orders into a
# Redis stream of the product's own Redis, a few malformed on purpose; a pipeline reads
# them through a connection.
STREAM_PIPELINE = "orders-from-redis"
STREAM_NAME = "orders"
STREAM_CONNECTION = "local-redis"
STREAM_RATE = 2000  # records/s
STREAM_KEYS = {"kind": "zipf", "n": 1000, "s": 1.1}
STREAM_MALFORMED = 0.005


def seed_stream_demo(user: Any) -> Pipeline:
    """The pipeline that reads the feeder's Redis stream (``STREAM_CONNECTION`` must
    exist: ``manage.py up`` keeps it)."""
    doc = {"source": {"type": "redis_stream", "connection": STREAM_CONNECTION,
                      "stream": STREAM_NAME, "start": "latest", "partitions": 2,
                      "rate": {"kind": "constant", "records_per_s": STREAM_RATE},
                      "keys": STREAM_KEYS},
           "operators": [{"type": "filter", "field": "value", "op": "<", "value": 990},
                         {"type": "keyed_aggregate", "key": "key", "agg": "sum",
                          "field": "value"}],
           "sink": {"type": "latency", "keep_output": True},
           "key_groups": 8}
    pipeline = Pipeline.objects.filter(name=STREAM_PIPELINE).first() or Pipeline(
        name=STREAM_PIPELINE)
    pipeline.definition = doc
    pipeline.description = (
        f"Order values summed per customer, read from the Redis stream '{STREAM_NAME}' "
        f"(from its end when the run starts) that the feeder fills at {STREAM_RATE:,} "
        f"records/s, {STREAM_MALFORMED:.1%} of them malformed on purpose: the run page "
        "counts its dead letters.")
    return actions.save_pipeline(pipeline, user)


# The elastic demo on its stream: the feeder repeats the calibrated step, this long at
# low between high phases, so that a run started at any moment meets a high phase
# after its controller's warm-up and within 3 minutes of Start.
ELASTIC_REST_S = 60


def elastic_feed(cal: calibration.Calibration) -> tuple[dict[str, Any], int]:
    """What the feeder publishes into the elastic demo's stream: the step's cycle (its
    rate schedule and length, repeated) from the calibration."""
    return calibration.step_plan(cal).feeder_cycle(ELASTIC_REST_S)


def seed_elastic_demo(user: Any, cal: calibration.Calibration, stream: bool = False
                      ) -> tuple[Pipeline, Policy]:
    """The demo that shows the product's main job: a rate that steps above one worker's
    measured capacity and back, under a Lat-Node MPC that scales the run 1 -> 2 -> 1
    workers (moving keyed state each time). Re-seeding after a new calibration makes a
    new pipeline version and updates the policy's bound. ``stream``: the records come
    from the Redis stream the feeder fills on the step (``ELASTIC_STREAM_DEFINITION``,
    ``elastic_feed``), else from the generator on the step (tests, benchmarks)."""
    plan = calibration.step_plan(cal)
    if stream:
        doc = json.loads(json.dumps(ELASTIC_STREAM_DEFINITION))
        doc["source"]["rate"] = {"kind": "constant", "records_per_s": round(plan.high_rps)}
        _schedule, cycle_s = elastic_feed(cal)
        description = (
            f"Keyed count over 1M uniform keys, read from the Redis stream "
            f"'{doc['source']['stream']}' that the feeder fills at {plan.low_rps:,.0f} "
            f"records/s, stepping to {plan.high_rps:,.0f} (110 % of one worker's measured "
            f"capacity, {cal.capacity_rps:,.0f} records/s) for "
            f"{plan.down_at_s - plan.up_at_s} s every {cycle_s} s; a run reads it from "
            "the stream's end when it starts.")
    else:
        doc = json.loads(json.dumps(ELASTIC_DEFINITION))
        doc["source"]["rate"] = plan.rate(DEMO_CYCLES, DEMO_REST_S)
        description = (
            f"Keyed count over 1M uniform keys. Rate {plan.low_rps:,.0f} records/s, "
            f"stepping to {plan.high_rps:,.0f} (110 % of one worker's measured capacity, "
            f"{cal.capacity_rps:,.0f} records/s) from {plan.up_at_s} s to "
            f"{plan.down_at_s} s after start, then back; {DEMO_CYCLES} cycles.")
    pipeline = Pipeline.objects.filter(name=ELASTIC_PIPELINE).first()
    if pipeline is None:
        pipeline = Pipeline(name=ELASTIC_PIPELINE)
    pipeline.definition, pipeline.description = doc, description
    pipeline = actions.save_pipeline(pipeline, user)
    policy, _ = Policy.objects.update_or_create(name=ELASTIC_POLICY, defaults={
        "description": (f"Lat-Node MPC (Sw, h=2): p95 under {plan.bound_ms} ms (one worker's "
                        "modelled p95 at 60 % utilisation, from the calibration) on 1-2 "
                        "workers; scales the elastic demo up while its rate is high and "
                        "back down after. transition_weight 0: it does not weigh the "
                        "latency of moving the 1M keys' state back (with 1, the default, "
                        "it keeps 2 workers rather than break the bound while the state "
                        "reloads)"),
        "latency_bound_ms": plan.bound_ms, "throughput_floor_rps": 0, "power_budget_w": 40,
        "control_step_s": 4, "min_workers": 1, "initial_workers": 1, "max_workers": 2,
        "strategy": "lat-node", "strategy_params": {"horizon": 2, "transition_weight": 0},
        "created_by": user})
    return pipeline, policy


class Command(BaseCommand):
    help = "Create the demo pipeline, the demo policy and an admin user (prints its password)."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin")
        parser.add_argument("--password", default=None,
                            help="admin password (default: a new random one, printed)")
        parser.add_argument("--calibration", default=None,
                            help="a stored calibration (JSON, from manage.py up): also seed "
                                 f"the '{ELASTIC_PIPELINE}' demo from it")

    def handle(self, *args, **options):
        User = get_user_model()
        password = options["password"] or secrets.token_urlsafe(12)
        user, created = User.objects.get_or_create(
            username=options["admin"], defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        sync_roles(Group, Permission)
        user.groups.add(Group.objects.get(name=ADMIN))  # shown as its role in the header
        if not Pipeline.objects.filter(name=DEMO_PIPELINE).exists():
            actions.save_pipeline(Pipeline(
                name=DEMO_PIPELINE, definition=DEMO_DEFINITION,
                description="Quotes of the 2,836 NASDAQ symbols (thesis artifact key "
                            "frequencies), sine-shaped rate, running count per symbol."), user)
        if not Pipeline.objects.filter(name=HFT_PIPELINE).exists():
            actions.save_pipeline(Pipeline(
                name=HFT_PIPELINE, definition=HFT_DEFINITION,
                description="The thesis' HFT kernel (§7.1): per-symbol count window |W| = 1000, "
                            "slide 25, 1 ms bucket averages and a quadratic fit, on the "
                            "artifact's random-walk rate scaled 1:100."), user)
        for query, model in nexmark_queries.QUERIES.items():
            name = f"NEXMark {query}"
            if not Pipeline.objects.filter(name=name).exists():
                actions.save_pipeline(Pipeline(
                    name=name, definition=nexmark_queries.definition(query, NEXMARK_RATE),
                    description=(model.__doc__ or "").strip().splitlines()[0]
                    + f" Beam's NEXMark events at {NEXMARK_RATE} events/s; the verifier "
                      "checks the kept output against the reference."), user)
        Policy.objects.get_or_create(name=DEMO_POLICY, defaults={
            "description": "p95 under 5 s on 1-2 workers; manual control",
            "latency_bound_ms": 5000, "throughput_floor_rps": 1000, "power_budget_w": 40,
            "control_step_s": 2, "min_workers": 1, "initial_workers": 1, "max_workers": 2,
            "strategy": "manual", "created_by": user})
        Policy.objects.get_or_create(name=MPC_POLICY, defaults={
            "description": "Lat-Node MPC (Sw, h=2): p95 under 4 s on 1-2 workers, at most "
                           "40 W (modelled); the controller scales the run by itself",
            "latency_bound_ms": 4000, "throughput_floor_rps": 0, "power_budget_w": 40,
            "control_step_s": 4, "min_workers": 1, "initial_workers": 1, "max_workers": 2,
            "strategy": "lat-node", "strategy_params": {"horizon": 2, "transition_weight": 0},
        "created_by": user})
        if options["calibration"]:
            cal = calibration.load(Path(options["calibration"]), ELASTIC_DEFINITION)
            if cal is None:
                raise CommandError(f"{options['calibration']}: no recent calibration of "
                                   "the elastic demo's pipeline there")
            seed_elastic_demo(user, cal)
        verb = "created" if created else "password reset"
        self.stdout.write(f"admin user '{user.username}' {verb}; password: {password}")
