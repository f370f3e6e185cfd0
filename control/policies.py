"""Policy versions (domain actions): saving a policy makes a new version when what it
fixes changed; a run keeps the version it started with until an operator switches it.

A run's Spark application is started with ``spark.cores.max`` = its version's
``max_workers``: a version that allows more workers than that cannot be reached by the
running application and is refused with the reason (start a new run to use it)."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from control.models import Policy
from pipelines import actions
from pipelines.models import EventKind, Run


@transaction.atomic
def save_policy(policy: Policy, user: Any) -> Policy:
    """Save ``policy``; a new version when its versioned fields changed (the first save
    is version 1). Running runs keep theirs. The audit log records the save."""
    if policy.created_by_id is None:
        policy.created_by = user
    policy.save()
    policy.current_version(user)
    return policy


def run_cap(run: Run) -> int:
    """The most workers the run's Spark application can have (``spark.cores.max``, set
    from the max_workers of the version it started with)."""
    return int(run.max_workers_cap or run.policy_in_force.max_workers)


@transaction.atomic
def switch_version(run: Run, version: int, user: Any) -> tuple[bool, str]:
    """Make ``run`` use ``version`` of its policy from its next control step; audited as
    a run event. Refused (nothing changes) for an unknown version, a run that has ended,
    or a version whose worker limit the run's application cannot reach."""
    target = run.policy.version_row(version)
    if target is None:
        return False, f"policy {run.policy.name} has no version {version}"
    if run.is_terminal:
        return False, f"run {run.pk} has ended ({run.status}): nothing to switch"
    was = run.policy_version
    if was == version:
        return False, f"run {run.pk} already uses {run.policy.name} v{version}"
    cap = run_cap(run)
    wanted = int(target.values["max_workers"])
    if wanted > cap:
        return False, (f"v{version} allows up to {wanted} workers, but this run's Spark "
                       f"application was started with at most {cap} (spark.cores.max); "
                       f"start a new run to use v{version}")
    Run.objects.filter(pk=run.pk).update(policy_version=version)
    run.policy_version = version
    actions.record_event(run, EventKind.POLICY_SWITCHED, actions.actor_for(user),
                         f"policy {run.policy.name} v{was} -> v{version}",
                         {"from": was, "to": version, "values": target.values})
    return True, f"run {run.pk} now uses {run.policy.name} v{version}"
