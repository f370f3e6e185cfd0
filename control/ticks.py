"""The product's side of the control loop: its adapters around
``control.controlloop.ControlLoop`` (Redis stream, database, Celery) and its domain
actions.

``due_runs`` + ``tick`` are what celery beat runs every second (``control.tasks``):

* every running run whose policy has a strategy (not ``manual``) gets one tick per
  ``control_step_s``; a tick takes a per-run Redis lock, so one tick never overlaps the
  previous one for the same run (a slow tick makes the next one wait, never run twice);
* the tick is one step of ``control.controlloop.ControlLoop`` (the same loop the closed-loop
  benchmark runs) over this module's adapters: it reads the runner's metrics records
  since its cursor straight from the run's Redis stream (fresher than the database, and
  with every field), restores the run's ``LiveController`` (forecaster, fitted model,
  feedback, model error) from its JSON state in Redis, decides, stores a
  :class:`Decision`, pushes it to the run page, raises alerts (RunEvent, push, optional
  webhook), and — unless the run is in dry-run or a reconfiguration is still pending —
  queues ``control.tasks.apply_decision``, which sends the commands, waits for the
  runner's acknowledgements and records when the change took effect.
"""
from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from control import fleet, gates, live, plugins
from control.controlloop import ControlLoop, GateVerdict, Outcome
from control.models import Decision, DecisionOutcome, FleetSettings, Policy
from control.strategies.mpc import Config
from pipelines import actions, launch
from pipelines.models import ACTIVE_STATUSES, EventKind, MetricSample, Run, RunStatus
from pipelines.queue import Task, enqueue
from pipelines.runtime import bus as busmod
from pipelines.runtime.host import power

log = logging.getLogger(__name__)
ACTOR = "controller"
STATE_TTL_S = 24 * 3600


def _key(run: Run, what: str) -> str:
    return f"control:{run.bus_key}:{what}"


def _policy_version(run: Run) -> str:
    """Names keys that another policy version must not inherit (its controller, its
    refusal); a run from before versions is keyed by its policy row's last edit."""
    if run.policy_version is not None:
        return f"v{run.policy_version}"
    return f"{run.policy.updated_at.timestamp():.6f}"


def replannable(run: Run) -> bool:
    """Whether the run's key groups can change live (runtime/replan.py): then the
    controller may want more workers than it has groups, and re-plans first."""
    from pipelines.runtime.spec import definition
    from pipelines.runtime.replan import gloss as replan

    try:
        spec = definition.validate(run.pipeline_version.definition)
    except definition.DefinitionError:
        return False
    return replan.replan_refusal(spec) is None


def loop_policy(policy: Policy, run: Run) -> live.LoopPolicy:
    freqs = tuple(run.frequencies or ()) or (run.frequency_ghz or power.NOMINAL_GHZ,)
    # Without a live re-plan a worker beyond the key groups would idle: cap there.
    cap = policy.max_workers if replannable(run) else min(
        policy.max_workers, run.key_groups or policy.max_workers)
    return live.LoopPolicy(
        strategy=policy.strategy, latency_bound_s=policy.latency_bound_ms / 1000.0,
        min_workers=policy.min_workers,
        max_workers=cap,
        freqs_ghz=tuple(float(f) for f in freqs), power=power.power_model(),
        power_budget_w=policy.power_budget_w, throughput_floor=policy.throughput_floor_rps,
        control_step_s=policy.control_step_s, params=dict(policy.strategy_params or {}),
        violation_steps=policy.violation_steps)


# Half the period of celery beat's control-tick (1 s): a step due within it is taken now,
# not a whole beat later. Without it a 2 s step ran every 3 s (its tick landed a few ms
# short of 2 s after the last one, and waited for the next beat).
TICK_TOLERANCE_S = 0.5


def due_runs(now: float | None = None) -> list[Run]:
    """Running runs under a controlled policy whose control step has elapsed."""
    now = time.time() if now is None else now
    due = []
    for run in Run.objects.filter(status=RunStatus.RUNNING).select_related("policy"):
        policy = run.policy_in_force  # the run's version: its strategy may differ
        if policy.strategy == "manual":
            continue
        last = launch.run_bus(run).r.get(_key(run, "last"))
        if last is None or now - float(last) >= policy.control_step_s - TICK_TOLERANCE_S:
            due.append(run)
    return due


def next_slot(last: float | None, now: float, step_s: float) -> float:
    """The time a tick taken ``now`` stands for: the step after the previous one, so the
    steps keep the policy's period on average; ``now`` after a gap of a step or more
    (a tick missed: the schedule restarts rather than catching up)."""
    if last is None or now - (last + step_s) >= step_s:
        return now
    return last + step_s


def tick(run: Run) -> Decision | None:
    """One control step of ``run``; None when it is not due or has no new batch."""
    run = Run.objects.select_related("policy").get(pk=run.pk)  # fresh version, dry-run flag
    policy = run.policy_in_force
    r = launch.run_bus(run).r
    lock = _key(run, "lock")
    if not r.set(lock, "1", nx=True, ex=max(int(policy.control_step_s * 5), 30)):
        return None  # the previous tick of this run is still running
    try:
        last = r.get(_key(run, "last"))
        r.set(_key(run, "last"), next_slot(None if last is None else float(last), time.time(),
                                           policy.control_step_s), ex=STATE_TTL_S)
        return _tick(run, policy, r)
    finally:
        r.delete(lock)


class _RunMetrics:
    """The runner's records since the tick cursor, straight from the run's Redis stream
    (fresher than the database, and with every field)."""

    def __init__(self, run: Run, r: Any) -> None:
        self.run, self.r, self.last_id = run, r, None

    def collect(self) -> list[dict[str, Any]]:
        cursor = self.r.get(_key(self.run, "cursor")) or "0-0"
        entries = self.r.xrange(busmod.metrics_key(self.run.bus_key),
                                min=f"({cursor}" if cursor != "0-0" else "-")
        self.last_id = entries[-1][0] if entries else None
        return [json.loads(fields["m"]) for _id, fields in entries]

    def consumed(self) -> None:
        if self.last_id is not None:
            self.r.set(_key(self.run, "cursor"), self.last_id, ex=STATE_TTL_S)


class _RunConfiguration:
    def __init__(self, run: Run) -> None:
        self.run = run

    def current(self, records: list[dict[str, Any]], f_max: float) -> Config:
        return Config(self.run.workers or records[-1].get("workers") or 1,
                      float(records[-1].get("frequency_ghz") or f_max))


class _RedisControllers:
    """The run's controller state as JSON in Redis; an edited policy starts a fresh
    controller (its strategy or limits changed), so the key names the policy's version."""

    def __init__(self, run: Run, r: Any) -> None:
        self.r = r
        self.key = _key(run, f"controller:{_policy_version(run)}")

    def load(self) -> dict[str, Any] | None:
        try:
            raw = self.r.get(self.key)
            return json.loads(raw) if raw else None
        except ValueError:  # not JSON text (a pickle from older code): start afresh
            return None

    def save(self, state: dict[str, Any]) -> None:
        self.r.set(self.key, json.dumps(state), ex=STATE_TTL_S)


class _DatabaseDecisions:
    """A Decision row per tick, pushed to the run page, its alerts audited; a pending
    one holds the run's ``pending`` key until ``finish`` clears it."""

    def __init__(self, run: Run, r: Any) -> None:
        self.run, self.r = run, r

    def pending(self) -> str | None:
        pending = self.r.get(_key(self.run, "pending"))
        return f"decision {pending}" if pending else None

    def store(self, d: live.LiveDecision, outcome: Outcome, message: str) -> Decision:
        run = self.run
        first = d.predictions[0]
        decision = Decision.objects.create(
            run=run, t=d.t, step=_next_step(run), strategy=d.strategy, action=d.action,
            outcome=DecisionOutcome(outcome.value), outcome_message=message,
            current_workers=d.current["workers"], current_freq_ghz=d.current["freq_ghz"],
            chosen_workers=d.chosen["workers"], chosen_freq_ghz=d.chosen["freq_ghz"],
            measured_latency_ms=_ms(d.inputs.get("latency_s")),
            predicted_latency_ms=_ms(first.get("latency_s")),
            predicted_power_w=first.get("power_w"), solve_ms=d.solve_ms, reason=d.reason,
            alerts=d.alerts, inputs=live.json_safe(d.inputs),
            predictions=live.json_safe(d.predictions), cost=live.json_safe(d.cost),
            model_error=live.json_safe(d.model_error))
        actions.push(run.pk, {"type": "run.decision", "decision": decision.as_dict()})
        if outcome in HELD_OUTCOMES:
            before = Decision.objects.filter(run=run, step__lt=decision.step) \
                .order_by("-step").values_list("outcome", flat=True).first()
            if before != outcome.value:  # once per streak, not every step
                actions.record_event(run, EventKind.HELD, ACTOR,
                                     f"decision {decision.step} ({d.action} to "
                                     f"{d.chosen['workers']} workers) {outcome.value}: "
                                     f"{message}", {"decision": decision.step,
                                                    "outcome": outcome.value})
        for alert in d.alerts:
            raise_alert(run, alert, decision)
        if outcome is Outcome.PENDING:
            self.r.set(_key(run, "pending"), decision.pk,
                       ex=int(settings.COMMAND_ACK_TIMEOUT_S) * 2 + 30)
        return decision


HELD_OUTCOMES = (Outcome.EXCLUDED, Outcome.VETOED, Outcome.REFUSED)


class _CeleryActuator:
    def realise(self, decision: live.LiveDecision, stored: Decision) -> None:
        # apply_decision sends the commands, waits for the acks and calls ``finish``.
        enqueue(Task.APPLY_DECISION, stored.pk)


def control_loop(run: Run, policy: Policy, r: Any) -> ControlLoop:
    """The product's adapters around the one control loop (``control.controlloop``), under
    ``policy``: the run's version of it (``Run.policy_in_force``)."""
    looped = loop_policy(policy, run)
    return ControlLoop(policy=looped, metrics=_RunMetrics(run, r),
                       configuration=_RunConfiguration(run),
                       controllers=_RedisControllers(run, r),
                       decisions=_DatabaseDecisions(run, r), actuator=_CeleryActuator(),
                       dry_run=run.dry_run,
                       gate=gates.Gates([policy_gate(run, policy, looped),
                                         ArbiterGate(run, policy)]))


# ------------------------------------------------------------------ the fleet's gate
def guards_of(policy: Policy) -> fleet.Guards:
    """The policy's guards and the cluster's excluded periods (``FleetSettings``)."""
    return fleet.Guards(
        excluded_periods=tuple(FleetSettings.current().excluded_periods or ())
        + tuple(policy.excluded_periods or ()),
        max_reconfigurations_per_hour=policy.max_reconfigurations_per_hour,
        cooldown_up_s=policy.cooldown_up_s or 0.0, cooldown_down_s=policy.cooldown_down_s or 0.0)


def applied_history(run: Run, within_s: float) -> list[fleet.Applied]:
    """The run's reconfigurations that took effect in the last ``within_s`` seconds."""
    since = timezone.now() - timezone.timedelta(seconds=within_s)
    rows = Decision.objects.filter(run=run, outcome=DecisionOutcome.APPLIED,
                                   applied_at__gte=since).values_list(
        "applied_at", "current_workers", "chosen_workers")
    return [fleet.Applied(at.timestamp(), fleet.direction(current, chosen))
            for at, current, chosen in rows]


def policy_gate(run: Run, policy: Policy, looped: live.LoopPolicy) -> gates.PolicyGate:
    guards = guards_of(policy)
    window = max(3600.0, guards.cooldown_up_s, guards.cooldown_down_s)
    try:
        chosen = plugins.load(policy.decision_plugins or [])
    except plugins.PluginError as exc:  # uninstalled since the policy was saved
        log.warning("run %s: %s", run.pk, exc)
        chosen = []
    return gates.PolicyGate(run=str(run.pk), policy=policy.name, guards=guards,
                            plugins=chosen, history=lambda: applied_history(run, window),
                            min_workers=looped.min_workers, max_workers=looped.max_workers)


def _claim(run: Run, policy: Policy, asked: int | None = None,
           costs: dict[str, float] | None = None, asked_at: float | None = None
           ) -> fleet.Claim:
    """A run's claim on the cluster: what it holds, and what its latest decision (of the
    last few control steps) asked and predicted."""
    held = int(run.workers or 0)
    if asked is None:
        recent = timezone.now() - timezone.timedelta(seconds=3 * policy.control_step_s + 5)
        last = Decision.objects.filter(run=run, at__gte=recent).order_by("-step").first()
        # What it will hold: a reconfiguration under way counts at its target, anything
        # else (a hold, a refusal, a dry run, one applied since) at what it holds now.
        asked = last.chosen_workers if last is not None and \
            last.outcome == DecisionOutcome.PENDING else held
        costs = (last.inputs or {}).get("violation_by_workers") if last else None
        asked_at = last.at.timestamp() if last else 0.0
    guaranteed = int(policy.guaranteed_workers if policy.guaranteed_workers is not None
                     else policy.min_workers)
    if run.status != RunStatus.RUNNING or not MetricSample.objects.filter(run=run).exists():
        # Only a running run whose query has placed its key groups (a batch has run)
        # can move them off a core: the others keep what they hold.
        guaranteed = max(guaranteed, held)
    return fleet.Claim(
        run=str(run.pk), priority=max(1, int(policy.priority or 1)),
        guaranteed=guaranteed,
        held=held, asked=int(asked),
        cost_by_workers={int(n): float(c) for n, c in (costs or {}).items()},
        max_share=policy.max_share_workers, asked_at=asked_at or 0.0)


class ArbiterGate:
    """The cluster's arbiter (``control.fleet``, ``FleetSettings.arbiter``) on a decision
    that asks for more workers: granted when the cluster's free cores allow; otherwise the
    arbiter decides over the claims of every run that holds cores. The cores it takes
    back from lower-priority runs are released by a planned scale-down of theirs (a
    Decision of strategy ``arbiter``, its key groups moved first), and the grant goes out
    in the same step; a take-back that cannot start now (the run is busy or has run no
    batch) leaves this step refused, and the next step tries again."""

    def __init__(self, run: Run, policy: Policy) -> None:
        self.run, self.policy = run, policy

    def review(self, decision: live.LiveDecision, acting: bool) -> GateVerdict | None:
        held, asked = decision.current["workers"], decision.chosen["workers"]
        if asked <= held:
            return None
        shared = FleetSettings.current()
        capacity, _source = fleet_capacity(shared)
        # Every run that holds cores counts, not only the running ones: a stalled run
        # (a slow batch) still holds its executors, and one starting or stopping too.
        others = list(Run.objects.filter(status__in=ACTIVE_STATUSES, workers__gt=0)
                      .exclude(pk=self.run.pk).select_related("policy", "pipeline_version"))
        mine = _claim(self.run, self.policy, asked,
                      decision.inputs.get("violation_by_workers"), time.time())
        claims = [mine] + [_claim(o, o.policy_in_force) for o in others]
        allocation = fleet.arbiter(shared.arbiter).allocate(capacity, claims)
        share = allocation.shares[mine.run]
        # The cores the others will hold: a reconfiguration of theirs under way counts at
        # its target (their claim asks for it), a core taken back now at what is left.
        # The new executor is requested at once: the cluster manager starts it as the
        # released core comes free (the victim's key groups move off it first).
        others_after, released, names = 0, 0, []
        for other, claim in zip(others, claims[1:]):
            their = allocation.shares[claim.run]
            if their.preempted and acting and preempt(other, their, self.run,
                                                      shared.arbiter) is not None:
                others_after += their.granted
                released += claim.held - their.granted
                names.append(f"run {other.pk}")
            elif their.preempted:
                others_after += claim.asked
                names.append(f"run {other.pk}")
            else:
                others_after += claim.asked
        free = capacity - others_after - held
        granted = min(share.granted, held + max(free, 0))
        if granted >= asked:
            if released:
                return GateVerdict(f"arbiter: {share.reason}; {released} core(s) being "
                                   f"released by {', '.join(names)}",
                                   decision=decision)
            return None
        if granted > held:
            return GateVerdict(f"arbiter: {share.reason}; {max(free, 0)} core(s) free",
                               decision=gates.with_workers(decision, granted))
        if share.granted > held:
            verb = "taking back" if acting else "would take back"
            return GateVerdict(f"arbiter: waiting for a core: {verb} "
                               f"{share.granted - held - max(free, 0)} from "
                               f"{', '.join(names) or 'other runs'} (priority "
                               f"{mine.priority}); {share.reason}", Outcome.REFUSED)
        return GateVerdict(f"arbiter: {share.reason}", Outcome.REFUSED)


def fleet_shares() -> list[dict[str, Any]]:
    """Each running run's share of the cluster for the Cluster and fleet pages: its
    policy's priority and guarantee, the workers it holds, what its latest decision asked
    and how that ended."""
    rows = []
    for run in Run.objects.filter(status=RunStatus.RUNNING).select_related(
            "policy", "pipeline_version__pipeline").order_by("pk"):
        policy = run.policy_in_force
        last = Decision.objects.filter(run=run).order_by("-step").first()
        rows.append({"run": run, "priority": policy.priority,
                     "guaranteed": policy.guaranteed_workers,
                     "max_share": policy.max_share_workers, "holds": run.workers,
                     "asked": last.chosen_workers if last else run.workers,
                     "last": last})
    return rows


def fleet_capacity(shared: FleetSettings | None = None) -> tuple[int, str]:
    """The cores the arbiter shares: the master's alive cores (``cluster_cores``), or
    fewer where the fleet settings keep some for other applications."""
    from pipelines.cluster_status import cluster_cores

    shared = shared or FleetSettings.current()
    cores, source = cluster_cores()
    if shared.cores_limit is not None and shared.cores_limit < cores:
        return shared.cores_limit, f"the fleet settings' limit ({cores} alive: {source})"
    return cores, source


def preempt(run: Run, share: fleet.Share, taker: Run, arbiter: str) -> Decision | None:
    """Take cores back from ``run`` by a planned scale-down to ``share.granted`` (the
    runner migrates its key groups off the released workers first), unless the run's
    own tick or a reconfiguration of it is under way (the next step tries again)."""
    r = launch.run_bus(run).r
    lock = _key(run, "lock")
    if r.get(_key(run, "pending")) or not r.set(lock, "arbiter", nx=True, ex=30):
        return None
    try:
        run.refresh_from_db()
        if run.status != RunStatus.RUNNING or run.workers <= share.granted:
            return None
        freq = run.frequency_ghz or power.NOMINAL_GHZ
        decision = Decision.objects.create(
            run=run, t=time.time(), step=_next_step(run), strategy="arbiter",
            action="scale", outcome=DecisionOutcome.PENDING,
            outcome_message=f"preempted for run {taker.pk}; sent to the runner",
            current_workers=run.workers, current_freq_ghz=freq,
            chosen_workers=share.granted, chosen_freq_ghz=freq, solve_ms=0.0,
            reason=share.reason, inputs={"arbiter": arbiter, "taker": taker.pk})
        r.set(_key(run, "pending"), decision.pk,
              ex=int(settings.COMMAND_ACK_TIMEOUT_S) * 2 + 30)
        actions.record_event(run, EventKind.PREEMPTED, ACTOR,
                             f"{run.workers} -> {share.granted} workers for run {taker.pk}: "
                             f"{share.reason}",
                             {"decision": decision.step, "taker": taker.pk})
        actions.push(run.pk, {"type": "run.decision", "decision": decision.as_dict()})
        enqueue(Task.APPLY_DECISION, decision.pk)
        return decision
    finally:
        r.delete(lock)


def _tick(run: Run, policy: Policy, r: Any) -> Decision | None:
    control = control_loop(run, policy, r)
    try:
        done = control.tick()
    except live.LoopError as exc:
        control.metrics.consumed()
        # Once per policy version: the next ticks would only repeat it.
        if r.set(_key(run, f"refused:{_policy_version(run)}"), "1", nx=True, ex=STATE_TTL_S):
            actions.record_event(run, EventKind.CONTROLLER_REFUSED, ACTOR,
                                 f"policy {run.policy.name} v{run.policy_version}: {exc}")
        return None
    return done.stored if done is not None else None


def _ms(seconds: float | None) -> float | None:
    """Milliseconds, or None for no value or a saturated (infinite) prediction."""
    return None if seconds is None or not math.isfinite(seconds) else seconds * 1000.0


def _next_step(run: Run) -> int:
    last = Decision.objects.filter(run=run).order_by("-step").values_list("step", flat=True)
    return (last.first() or 0) + 1


def raise_alert(run: Run, message: str, decision: Decision | None = None) -> None:
    """A controller's alert (``actions.raise_alert``), naming its decision."""
    actions.raise_alert(run, ACTOR, message, {"decision": decision.step if decision else None})


def finish(decision_id: int, ok: bool, message: str) -> None:
    """Record how a pending decision ended (called by ``apply_decision``)."""
    decision = Decision.objects.select_related("run").get(pk=decision_id)
    gate = (decision.inputs or {}).get("gate")  # why the fleet changed it: still said
    Decision.objects.filter(pk=decision_id).update(
        outcome=DecisionOutcome.APPLIED if ok else DecisionOutcome.FAILED,
        outcome_message=f"{message} ({gate})" if gate else message,
        applied_at=timezone.now() if ok else None)
    decision.refresh_from_db()
    launch.run_bus(decision.run).r.delete(_key(decision.run, "pending"))
    actions.push(decision.run_id, {"type": "run.decision", "decision": decision.as_dict()})


def set_dry_run(run: Run, on: bool, user: Any) -> None:
    was = run.dry_run
    Run.objects.filter(pk=run.pk).update(dry_run=on)
    run.refresh_from_db()
    kind, message = ((EventKind.DRY_RUN_ON, "controller decides and shows, does not act")
                     if on else (EventKind.DRY_RUN_OFF, "controller acts on its decisions"))
    actions.record_event(run, kind, actions.actor_for(user), message,
                         before={"dry_run": was}, after={"dry_run": on})
    actions.push(run.pk, {"type": "run.status", "run": actions.run_state(run)})
