import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from control.models import Policy
from pipelines import actions
from pipelines.models import Pipeline
from pipelines.runtime.definition import DEMO_DEFINITION, HFT_DEFINITION

DEMO_PIPELINE = "hft-demo"
HFT_PIPELINE = "hft-kernel"
DEMO_POLICY = "demo-2s"
MPC_POLICY = "demo-mpc"


class Command(BaseCommand):
    help = "Create the demo pipeline, the demo policy and an admin user (prints its password)."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin")
        parser.add_argument("--password", default=None,
                            help="admin password (default: a new random one, printed)")

    def handle(self, *args, **options):
        User = get_user_model()
        password = options["password"] or secrets.token_urlsafe(12)
        user, created = User.objects.get_or_create(
            username=options["admin"], defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
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
            "strategy": "lat-node", "strategy_params": {"horizon": 2}, "created_by": user})
        verb = "created" if created else "password reset"
        self.stdout.write(f"admin user '{user.username}' {verb}; password: {password}")
