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
from pipelines.runtime.spec.definition import DEMO_DEFINITION, ELASTIC_DEFINITION, HFT_DEFINITION

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


def feed_rate(plan: calibration.StepPlan) -> tuple[dict[str, Any], int]:
    """The feeder's rate for the demo on a Redis stream, and the seconds of one
    repetition (``python -m pipelines.feed --repeat``): low, the step above one worker's
    capacity as long as in the generator's demo, low again for FEED_REST_S. A run
    started at any moment meets a step within ``up_at + FEED_REST_S`` seconds."""
    return plan.rate(1, 0), plan.down_at_s + FEED_REST_S


# The low stretch after a step in the fed demo: short, so that a run started just after
# a step meets the next one soon (its scale-down, which moves the state back, fits).
FEED_REST_S = 45
DEMO_STREAM = "elastic-demo"
DEMO_CONNECTION = "local-redis"


def seed_elastic_demo(user: Any, cal: calibration.Calibration,
                      stream: str | None = None) -> tuple[Pipeline, Policy]:
    """The demo that shows the product's main job: a rate that steps above one worker's
    measured capacity and back, under a Lat-Node MPC that scales the run 1 -> 2 -> 1
    workers (moving keyed state each time). With ``stream``, the run reads the records
    the feeder publishes there (``manage.py up`` starts it) through the connection
    ``DEMO_CONNECTION``, from the stream's end when it starts; else the generator makes
    them, the step timed from the run's start. Re-seeding after a new calibration makes
    a new pipeline version and updates the policy's bound."""
    plan = calibration.step_plan(cal)
    doc = json.loads(json.dumps(ELASTIC_DEFINITION))
    doc["source"]["rate"] = plan.rate(DEMO_CYCLES, DEMO_REST_S)
    description = (
        f"Keyed count over 1M uniform keys. Rate {plan.low_rps:,.0f} records/s, stepping to "
        f"{plan.high_rps:,.0f} (110 % of one worker's measured capacity, "
        f"{cal.capacity_rps:,.0f} records/s) from {plan.up_at_s} s to {plan.down_at_s} s "
        f"after start, then back; {DEMO_CYCLES} cycles.")
    if stream is not None:
        rate, period = feed_rate(plan)
        source = doc["source"]
        doc["source"] = {"type": "redis_stream", "connection": DEMO_CONNECTION,
                         "stream": stream, "start": "latest",
                         "partitions": source["partitions"], "keys": source["keys"],
                         "rate": rate}  # (modelled: what the feeder publishes)
        description = (
            f"Keyed count over 1M uniform keys, read from the Redis stream '{stream}' "
            f"(from its end when the run starts). The feeder publishes "
            f"{plan.low_rps:,.0f} records/s, stepping to {plan.high_rps:,.0f} (110 % of "
            f"one worker's measured capacity, {cal.capacity_rps:,.0f} records/s) for "
            f"{plan.down_at_s - plan.up_at_s} s every {period} s.")
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
