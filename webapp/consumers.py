"""WebSocket consumer of a run page: a snapshot on connect, then pushed changes."""
from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from pipelines import actions
from webapp import messages
from pipelines.models import Run

SNAPSHOT_SAMPLES = 300
SNAPSHOT_EVENTS = 100
SNAPSHOT_DECISIONS = 100


@database_sync_to_async
def _snapshot(run_id: int) -> messages.SnapshotMessage | None:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return None
    samples = list(run.samples.order_by("-batch_id")[:SNAPSHOT_SAMPLES])[::-1]
    events = list(run.events.order_by("-at", "-id")[:SNAPSHOT_EVENTS])[::-1]
    decisions = list(run.decisions.order_by("-step")[:SNAPSHOT_DECISIONS])[::-1]
    return {"kind": "snapshot", "run": actions.run_state(run),
            "samples": [actions.sample_to_wire(s) for s in samples],
            "events": [e.as_dict() for e in events],
            "decisions": [d.as_dict() for d in decisions]}


class RunConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await database_sync_to_async(user.has_perm)("pipelines.view_run"):
            await self.close(code=4403)  # logged in, but in no role that may watch runs
            return
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        # Join the group before reading the snapshot: a change committed between the
        # read and the join would otherwise reach this client neither way (a verdict
        # pushed then leaves the exactly-once badge at "checking"). A push that
        # the snapshot already holds then arrives again after it; the page drops repeated
        # samples and events, and a repeated status is followed by any newer one.
        self.group = actions.group_name(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        snapshot = await _snapshot(self.run_id)
        if snapshot is None:
            await self.close(code=4404)
            return
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # One handler per group message type ("run.metrics" -> run_metrics); each sends one
    # kind of webapp.messages.
    async def run_metrics(self, message: dict[str, Any]) -> None:
        out: messages.MetricsMessage = {"kind": "metrics", "samples": message["samples"]}
        await self.send_json(out)

    async def run_event(self, message: dict[str, Any]) -> None:
        out: messages.EventMessage = {"kind": "event", "event": message["event"]}
        await self.send_json(out)

    async def run_decision(self, message: dict[str, Any]) -> None:
        out: messages.DecisionMessage = {"kind": "decision", "decision": message["decision"]}
        await self.send_json(out)

    async def run_status(self, message: dict[str, Any]) -> None:
        out: messages.StatusMessage = {"kind": "status", "run": message["run"]}
        await self.send_json(out)
