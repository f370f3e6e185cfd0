"""The runner's reconfigurations: workers up/down, key-group moves, rebalancing, CPU
frequency, and the placement work between micro-batches.

Commands arrive from the runner's command thread (``runner.Runner``) and run one at a
time on the reconfiguration thread (:meth:`Reconfigurer.loop`); a long migration never
delays a stop. State moves only between micro-batches (:meth:`between_batches`, called
inside ``foreachBatch``), paced by the planners' schedules (``elastic.py``): the
group-at-a-time migration of Megaphone (Hoffmann et al., §3–4) and the placement
planners of the thesis (§6.4). Each command returns ``(ok, message, payload)`` for its
acknowledgement.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.runtime.elastic import migration as elastic
from pipelines.runtime.host import frequency
from pipelines.runtime.bus import (
    RECONFIGURATIONS,
    Command,
    RunnerBus,
    RunnerCommand,
    RunnerEvent,
    expired,
)
from pipelines.runtime.spec.definition import PipelineSpec
from pipelines.runtime.query.session import EXECUTOR_WAIT_S

if TYPE_CHECKING:
    from pipelines.runtime.elastic.executors import ExecutorControl

MIGRATION_TIMEOUT_S = 600.0

Outcome = tuple[bool, str, dict[str, Any]]


NO_KEYED_STATE = ("this pipeline keeps no keyed state (no stateful operator): its tasks "
                  "follow the source's partitions, there is no key group to place")


class ElasticDefaults(Protocol):
    """The run's defaults for reconfigurations (``runner.RunnerConfig``)."""

    max_workers: int
    planner: str
    tau: float
    migration_schedule: str
    gap_batches: int
    enforce_placement: bool


class PlacementMetrics(Protocol):
    """What a reconfiguration reads and records in the batch metrics
    (``runner.metrics.BatchMetrics``)."""

    placed_for: dict[int, list[str | None]]
    group_bytes: list[int]
    boundary_ms: float | None
    repinned: int


class RunnerHandle(Protocol):
    """What a reconfiguration needs of the running runner (``runner.Runner``)."""

    workers: int
    stop_event: threading.Event
    executors: ExecutorControl
    coord: Any  # placement.StateStoreCoordinatorView, once the query runs
    rest: Any  # placement.SparkRest, once the session runs

    def executors_now(self) -> list[str]: ...

    def replan(self, args: dict[str, Any]) -> Outcome: ...


@dataclass
class _Scaling:
    """How a scaling places the groups: the target placement, the planner's facts, the
    executors to release, the migration run (if any) or why it stopped."""

    target: list[Any]
    info: dict[str, Any]
    released: list[str]
    migration: elastic.Migration | None = None
    refusal: Outcome | None = None


class Reconfigurer:
    def __init__(self, cfg: ElasticDefaults, spec: PipelineSpec, bus: RunnerBus,
                 routing: elastic.RoutingTable, metrics: PlacementMetrics,
                 runner: RunnerHandle, f_max_ghz: float, freq_source: str) -> None:
        self.cfg = cfg
        self.spec = spec
        self.bus = bus
        self.routing = routing
        self.metrics = metrics
        self.busy: str | None = None  # the command being applied, if any
        self.runner = runner
        self.queue: queue.Queue[Command | None] = queue.Queue()
        self.decommission_due: list[str] = []
        self.hosts: dict[str, str] = {}
        self.freq_ghz = f_max_ghz
        self.freq_source = freq_source  # how the frequency is read when none is set
        self.f_max_ghz = f_max_ghz
        self.actuator: Any = None  # frequency.choose_actuator, once the session runs
        # Every reconfiguration the runner takes (bus.RECONFIGURATIONS), by name.
        self.commands: dict[str, Callable[[dict[str, Any]], Outcome]] = {
            RunnerCommand.SET_WORKERS: self.cmd_set_workers,
            RunnerCommand.MOVE_GROUPS: self.cmd_move_groups,
            RunnerCommand.REBALANCE: self.cmd_rebalance,
            RunnerCommand.SET_FREQUENCY: self.cmd_set_frequency,
            RunnerCommand.REPLAN: self.cmd_replan}
        assert set(self.commands) == set(RECONFIGURATIONS), "a command without a handler"

    # ------------------------------------------------------- between micro-batches
    def between_batches(self, batch_id: int) -> None:
        """In the sink, after batch ``batch_id`` wrote its output and before the next
        batch can start: repair, migration step, decommission, then enforce the table."""
        started = time.perf_counter()
        if not self.keyed_state:
            # No key group to place: no state-store location to read or pin (each read
            # is an RPC to the coordinator); only decommissions are due here.
            self._decommission_due()
            self.metrics.boundary_ms = round((time.perf_counter() - started) * 1000, 1)
            return
        alive = self.runner.executors_now()
        coord = self.runner.coord
        if (batch_id == 0 or all(e is None for e in self.routing.table)
                or not self.cfg.enforce_placement):
            self.routing.adopt(coord.locations())  # Spark's own placement
        repaired = self.routing.repair(alive)
        if repaired and batch_id > 0:
            self.bus.publish_event(RunnerEvent.GROUPS_REASSIGNED, groups=repaired,
                                   reason="their executor is gone", after_batch=batch_id)
        step = self.routing.due_moves(batch_id)
        if step is not None:
            self.bus.publish_event(RunnerEvent.MIGRATION_STEP_APPLIED, after_batch=batch_id,
                                   step=step.index, moves=step.moves, bytes=step.bytes,
                                   migration_id=self.routing.active.id
                                   if self.routing.active else None)
        self._decommission_due()
        table = self.routing.snapshot()
        repinned = 0
        for g, owner in enumerate(table):
            if not self.cfg.enforce_placement:
                break
            if owner is not None and coord.location(g) != owner:
                coord.pin(g, owner, self._host(owner))
                repinned += 1
        placed_for = self.metrics.placed_for
        placed_for[batch_id + 1] = table
        for old in [b for b in placed_for if b < batch_id - 20]:
            del placed_for[old]
        self.metrics.boundary_ms = round((time.perf_counter() - started) * 1000, 1)
        self.metrics.repinned = repinned

    def _decommission_due(self) -> None:
        if not self.decommission_due:
            return
        victims, self.decommission_due = self.decommission_due, []
        owned = set(self.routing.snapshot())
        for victim in victims:
            if victim in owned:  # never kill an executor that still holds state
                self.bus.publish_event(RunnerEvent.DECOMMISSION_REFUSED, executor=victim,
                                       reason="it still owns key groups")
                continue
            self.runner.executors.decommission(victim, "streamwise: scale down after "
                                               "migrating its key groups away")

    def _host(self, executor: str) -> str:
        if executor not in self.hosts:
            try:
                for e in self.runner.rest.executors():
                    self.hosts[str(e["id"])] = str(e["hostPort"]).rsplit(":", 1)[0]
            except OSError:
                pass
        return self.hosts.get(executor, "127.0.0.1")

    # ------------------------------------------------------------- command thread
    def submit(self, command: Command | None) -> None:
        """Queue a reconfiguration (``None`` ends :meth:`loop`)."""
        self.queue.put(command)

    def loop(self) -> None:
        """Run queued reconfigurations one at a time and acknowledge each."""
        while not self.runner.stop_event.is_set():
            cmd = self.queue.get()
            if cmd is None:
                break
            name, args, cid = cmd.get("name"), cmd.get("args") or {}, cmd.get("id", "")
            late = expired(cmd)
            if late is not None:  # waited behind a long reconfiguration
                self.bus.ack(cid, False, f"{name} refused: it expired {late:.0f} s ago while "
                             "queued behind another reconfiguration", expired=True)
                continue
            self.busy = name  # in the heartbeat: batches may pause while state moves
            try:
                ok, message, payload = self.commands[name](args)
            except elastic.ElasticError as exc:
                ok, message, payload = False, str(exc), {}
            except Exception as exc:
                traceback.print_exc()
                ok, message, payload = False, f"{type(exc).__name__}: {exc}", {}
            finally:
                self.busy = None
            self.bus.ack(cid, ok, message, **payload)

    def _options(self, args: dict[str, Any]) -> tuple[str, int, str, float]:
        schedule = args.get("schedule", self.cfg.migration_schedule)
        gap = args.get("gap_batches", self.cfg.gap_batches)
        planner = args.get("planner", self.cfg.planner)
        tau = args.get("tau", self.cfg.tau)
        if schedule not in elastic.STRATEGIES:
            raise elastic.ElasticError(f"schedule must be one of "
                                       f"{', '.join(elastic.STRATEGIES)}, got {schedule!r}")
        if not isinstance(gap, int) or not 0 <= gap <= 100:
            raise elastic.ElasticError(f"gap_batches must be a whole number 0..100, got {gap!r}")
        if planner not in elastic.PLANNERS:
            raise elastic.ElasticError(f"planner must be one of {', '.join(elastic.PLANNERS)}")
        if not isinstance(tau, (int, float)) or not 0 <= tau <= 10:
            raise elastic.ElasticError(f"tau must be a number 0..10, got {tau!r}")
        return schedule, gap, planner, float(tau)

    def _planner_options(self, args: dict[str, Any], planner: str) -> dict[str, Any]:
        """``mtm-table``'s Markov transition matrix of worker counts ({"n": {"n'": p}},
        each row summing to 1) and its discount ``mtm_gamma`` in [0, 1)."""
        if planner != "mtm-table":
            return {}
        raw, gamma = args.get("mtm"), args.get("mtm_gamma", 0.8)
        if not isinstance(raw, dict):
            raise elastic.ElasticError('mtm-table needs "mtm": {"n": {"n2": probability}}')
        try:
            mtm = {int(n): {int(m): float(prob) for m, prob in row.items()}
                   for n, row in raw.items()}
        except (AttributeError, TypeError, ValueError):
            raise elastic.ElasticError("mtm: worker counts map to {worker count: "
                                       "probability}") from None
        for n, row in mtm.items():
            if any(not 0 <= prob <= 1 for prob in row.values()) or (
                    row and abs(sum(row.values()) - 1) > 1e-6):
                raise elastic.ElasticError(f"mtm[{n}]: probabilities in [0, 1] summing to 1")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) \
                or not 0 <= gamma < 1:
            raise elastic.ElasticError(f"mtm_gamma must be in [0, 1), got {gamma!r}")
        return {"mtm": mtm, "gamma": float(gamma)}

    def _migrate(self, target: list[str], reason: str, schedule: str,
                 gap: int) -> elastic.Migration:
        """Start a paced migration to ``target`` and wait for it (verified or failed)."""
        current = self.routing.snapshot()
        if any(e is None for e in current):
            raise elastic.ElasticError("the first micro-batch has not placed every group yet")
        steps = elastic.plan_steps([str(e) for e in current], target, schedule,
                                   self.metrics.group_bytes)
        migration = elastic.Migration(reason=reason, strategy=schedule, gap_batches=gap,
                                      target=list(target), steps=steps)
        self.routing.start(migration)
        self.bus.publish_event(RunnerEvent.MIGRATION_STARTED, migration_id=migration.id,
                               reason=reason, strategy=schedule, gap_batches=gap,
                               steps=len(steps), groups=migration.groups_moved,
                               bytes=migration.bytes_moved, target=target)
        deadline = time.monotonic() + MIGRATION_TIMEOUT_S
        stop = self.runner.stop_event
        while not migration.done.wait(0.25):
            if stop.is_set() or time.monotonic() > deadline:
                self.routing.abort("stopped" if stop.is_set() else
                                   f"not finished after {MIGRATION_TIMEOUT_S:.0f}s")
                break
        if not migration.steps:
            self.bus.publish_event(RunnerEvent.MIGRATION_DONE, **migration.summary())
        return migration

    @property
    def keyed_state(self) -> bool:
        return self.spec.keyed_state

    # ------------------------------------------------------------------ commands
    def cmd_set_workers(self, args: dict[str, Any]) -> Outcome:
        """Scale to ``args['workers']``: planned (state moved off an executor before it
        is released, onto a new one after it registers) or, as the baseline, ``kill``."""
        n = args.get("workers")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.cfg.max_workers:
            return False, (f"workers must be a whole number in 1..{self.cfg.max_workers} (the "
                           f"policy's maximum), got {n!r}"), {}
        if n > self.spec.key_groups:
            return False, (f"{n} workers but only {self.spec.key_groups} key groups: every "
                           "worker must own at least one group"), {}
        mode = args.get("mode", "planned")
        if mode not in ("planned", "kill"):
            return False, f"mode must be 'planned' or 'kill', got {mode!r}", {}
        schedule, gap, planner, tau = self._options(args)
        options = self._planner_options(args, planner)
        started = time.time()
        before = self.runner.executors_now()
        if mode == "kill":
            return self._set_workers_spark_default(n, before, started)
        if self.keyed_state and n != len(before) and None in self.routing.snapshot():
            # Spark places the groups in the first batch (RoutingTable.adopt): until
            # then there is no placement to plan a migration from.
            return False, ("the query has not placed its key groups yet (no batch has "
                           "run): ask again after its first batch"), {}
        if not self.keyed_state:
            plan = self._scale_stateless(n, before)
        elif n > len(before):
            plan = self._scale_up(n, before, schedule, gap, planner, tau, options)
        elif n < len(before):
            plan = self._scale_down(n, before, schedule, gap, planner, tau, options)
        else:
            plan = _Scaling(self.routing.snapshot(), {}, [])
        if plan.refusal is not None:
            return plan.refusal
        return self._scaled(n, before, plan, schedule, started)

    def _scale_stateless(self, n: int, before: list[str]) -> _Scaling:
        """More or fewer executors; Spark spreads the tasks (no group to place)."""
        released: list[str] = []
        if n > len(before):
            self.runner.executors.request_total(n)
        elif n < len(before):
            released = list(reversed(before))[:len(before) - n]
            self.decommission_due = released
        return _Scaling(self.routing.snapshot(), {}, released)

    def _scale_up(self, n: int, before: list[str], schedule: str, gap: int, planner: str,
                  tau: float, options: dict[str, Any]) -> _Scaling:
        """Ask for the executors, wait for them to register, then move their groups."""
        self.runner.executors.request_total(n)
        deadline = time.monotonic() + EXECUTOR_WAIT_S
        while len(ids := self.runner.executors_now()) < n and time.monotonic() < deadline:
            time.sleep(0.25)
        if len(ids) < n:
            return _Scaling([], {}, [], refusal=(
                False, f"asked for {n} workers, {len(ids)} registered after "
                f"{EXECUTOR_WAIT_S:.0f}s", {"workers": len(ids)}))
        self.runner.workers = len(ids)
        new = [e for e in ids if e not in before]
        target, info = elastic.plan_target(self.routing.snapshot(), self.metrics.loads(),
                                           self.metrics.group_bytes, n, new, planner, tau,
                                           options)
        migration = self._migrate(target, f"scale up to {n} workers", schedule, gap)
        return _Scaling(target, info, [], migration)

    def _scale_down(self, n: int, before: list[str], schedule: str, gap: int, planner: str,
                    tau: float, options: dict[str, Any]) -> _Scaling:
        """Move the state off the executors to release, then release them (never one
        that still holds a group)."""
        target, info = elastic.plan_target(self.routing.snapshot(), self.metrics.loads(),
                                           self.metrics.group_bytes, n, [], planner, tau,
                                           options)
        migration = self._migrate(target, f"scale down to {n} workers", schedule, gap)
        if not migration.done.is_set() or migration.failed:
            return _Scaling(target, info, [], migration, refusal=(
                False, f"scale down to {n} stopped: migration {migration.id} "
                f"{migration.failed or 'did not finish'}", {"migration": migration.summary()}))
        keep = set(target)
        released = [e for e in before if e not in keep][:len(before) - n]
        assert not set(released) & keep, "never decommission an executor holding state"
        self.decommission_due = released
        return _Scaling(target, info, released, migration)

    def _scaled(self, n: int, before: list[str], plan: _Scaling, schedule: str,
                started: float) -> Outcome:
        """Wait for exactly ``n`` executors and acknowledge the scaling."""
        ids = self.runner.executors.wait_for(n, EXECUTOR_WAIT_S, exact=True)
        self.runner.workers = len(ids)
        migration = plan.migration
        ok = len(ids) == n and (migration is None or not migration.failed)
        summary = migration.summary() if migration else None
        if ok:
            message = f"{len(before)} -> {len(ids)} workers" + (
                f"; {summary['groups_moved']} groups moved in {summary['steps']} "
                f"{schedule} steps, verified={summary['verified']}" if summary else "")
        else:
            message = (f"asked for {n} workers, {len(ids)} registered after "
                       f"{EXECUTOR_WAIT_S:.0f}s"
                       + (f"; {migration.failed}" if migration and migration.failed else ""))
        payload = {"workers": len(ids), "executors": ids, "released": plan.released,
                   "took_s": round(time.time() - started, 2), "plan": plan.info,
                   "migration": summary, "mode": "planned"}
        self.bus.publish_event(RunnerEvent.WORKERS_CHANGED, workers=len(ids), requested=n,
                               executors=ids, released=plan.released, mode="planned")
        return ok, message, payload

    def _set_workers_spark_default(self, n: int, before: list[str], started: float) -> Outcome:
        """The baseline (no planned migration): scale up by raising the target only
        (a new executor gets state only if Spark's scheduler moves some by itself);
        scale down by killing the newest executors at once, mid-batch or not, as a
        cluster manager or dynamic allocation would."""
        executors = self.runner.executors
        released: list[str] = []
        if n > len(before):
            executors.request_total(n)
        elif n < len(before):
            released = list(reversed(before))[:len(before) - n]
            executors.kill(released)
        ids = executors.wait_for(n, EXECUTOR_WAIT_S, exact=True)
        self.runner.workers = len(ids)
        self.bus.publish_event(RunnerEvent.WORKERS_CHANGED, workers=len(ids), requested=n,
                               executors=ids, released=released, mode="kill")
        return len(ids) == n, f"{len(before)} -> {len(ids)} workers (Spark default: no " \
            "planned migration)", {"workers": len(ids), "executors": ids,
                                   "released": released, "mode": "kill",
                                   "took_s": round(time.time() - started, 2)}

    def cmd_move_groups(self, args: dict[str, Any]) -> Outcome:
        moves = args.get("moves")
        if not isinstance(moves, dict) or not moves:
            return False, "moves must be an object {group: executor id}", {}
        if not self.keyed_state:
            return False, NO_KEYED_STATE, {}
        schedule, gap, _planner, _tau = self._options(args)
        alive = set(self.runner.executors_now())
        target = [str(e) for e in self.routing.snapshot()]
        for group, executor in moves.items():
            try:
                g = int(group)
            except ValueError:
                return False, f"group {group!r} is not a number", {}
            if not 0 <= g < self.spec.key_groups:
                return False, f"group {g} is outside 0..{self.spec.key_groups - 1}", {}
            if str(executor) not in alive:
                return False, (f"executor {executor!r} is not registered (have "
                               f"{', '.join(sorted(alive))})"), {}
            target[g] = str(executor)
        migration = self._migrate(target, f"move {len(moves)} groups", schedule, gap)
        summary = migration.summary()
        ok = migration.done.is_set() and not migration.failed
        return ok, (f"{summary['groups_moved']} groups moved in {summary['steps']} {schedule}"
                    f" steps, verified={summary['verified']}" if ok else
                    f"migration {migration.id} failed: {migration.failed}"), \
            {"migration": summary, "placement": self.routing.snapshot()}

    def cmd_rebalance(self, args: dict[str, Any]) -> Outcome:
        schedule, gap, planner, tau = self._options(args)
        if not self.keyed_state:
            return True, f"nothing to rebalance: {NO_KEYED_STATE}", {"migration": None}
        # Over every registered executor: one that holds no group yet (e.g. added
        # without a planned migration) is where a rebalance should put some.
        current = [str(e) for e in self.routing.snapshot()]
        alive = self.runner.executors_now()
        empty = [e for e in alive if e not in current]
        workers = min(len(set(current) | set(alive)), self.spec.key_groups)
        target, info = elastic.plan_target(current, self.metrics.loads(),
                                           self.metrics.group_bytes, workers, empty,
                                           planner, tau)
        migration = self._migrate(target, f"rebalance ({info['planner']}, tau {tau})",
                                  schedule, gap)
        summary = migration.summary()
        ok = migration.done.is_set() and not migration.failed
        return ok, (f"rebalanced: {summary['groups_moved']} groups moved in "
                    f"{summary['steps']} {schedule} steps" if ok else
                    f"migration {migration.id} failed: {migration.failed}"), \
            {"migration": summary, "plan": info, "placement": self.routing.snapshot()}

    def cmd_replan(self, args: dict[str, Any]) -> Outcome:
        """A live re-plan (new key groups): the runner starts a new query generation
        beside this one and hands over (``replan.py``)."""
        return self.runner.replan(args)

    def cmd_set_frequency(self, args: dict[str, Any]) -> Outcome:
        ghz = args.get("ghz")
        if not isinstance(ghz, (int, float)) or isinstance(ghz, bool) or ghz <= 0:
            return False, f"ghz must be a positive number, got {ghz!r}", {}
        try:
            applied = self.actuator.set(float(ghz))
        except frequency.FrequencyError as exc:
            return False, str(exc), {}
        self.freq_ghz = applied
        label = self.frequency_label()
        # Both actuators act on this machine only (cpufreq files, signalled pids): an
        # executor on another host keeps its clock, and the answer says which.
        remote = {e: self._host(e) for e in self.runner.executors_now()
                  if not frequency.is_local_address(self._host(e))}
        self.bus.publish_event(RunnerEvent.FREQUENCY_CHANGED, ghz=applied, requested=ghz,
                               source=label, unavailable_on=remote)
        message = f"CPU frequency {applied} GHz ({label})"
        if remote:
            message += ("; unavailable on other hosts, where executors keep their clock: " +
                        ", ".join(f"executor {e} on {h}" for e, h in sorted(remote.items())))
        return True, message, {"ghz": applied, "source": label, "unavailable_on": remote}

    def frequency_label(self) -> str:
        """Where the reported frequency comes from: the DVFS actuator or the emulation
        when one is active, else the read-only reading (cpufreq/cpuinfo/nominal)."""
        if isinstance(self.actuator, frequency.DutyCycleThrottle) and self.actuator.duty < 1:
            return "emulated"
        if isinstance(self.actuator, frequency.CpufreqActuator) and self.actuator._saved:
            return "cpufreq"
        return self.freq_source
