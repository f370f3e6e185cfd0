"""WebSocket consumer of a run page: a snapshot on connect, then pushed changes."""
from __future__ import annotations

import time
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.utils.crypto import constant_time_compare

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


# How often a connected page's session and role are read again: a user logged out,
# deactivated or taken out of every role that may watch runs stops receiving pushes
# within this many seconds (at the next push after it).
RECHECK_S = 5.0


@database_sync_to_async
def _still_allowed(session_key: str | None, user_id: int) -> int | None:
    """None while the session still logs in ``user_id`` and the user may still watch
    runs; else the close code (4401: logged out, 4403: no longer in such a role)."""
    if not session_key:
        return 4401
    store: SessionBase = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if not store.exists(session_key) or str(store.get(SESSION_KEY)) != str(user_id):
        return 4401
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not constant_time_compare(store.get(HASH_SESSION_KEY, ""),
                                                 user.get_session_auth_hash()):
        return 4401  # a changed password ends its other sessions, as Django's own check
    return None if user.has_perm("pipelines.view_run") else 4403


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
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.user_id = user.pk
        self.checked_at = time.monotonic()
        await self.accept()
        await self.send_json(snapshot)

    async def push(self, message: dict[str, Any]) -> None:
        """Send one pushed message, first reading the session and role again if the last
        check is older than RECHECK_S: the snapshot's permission is not for ever."""
        if time.monotonic() - self.checked_at >= RECHECK_S:
            code = await _still_allowed(self.session_key, self.user_id)
            if code is not None:
                await self.close(code=code)
                return
            self.checked_at = time.monotonic()
        await self.send_json(message)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # One handler per group message type ("run.metrics" -> run_metrics); each sends one
    # kind of webapp.messages.
    async def run_metrics(self, message: dict[str, Any]) -> None:
        out: messages.MetricsMessage = {"kind": "metrics", "samples": message["samples"]}
        await self.push(dict(out))

    async def run_event(self, message: dict[str, Any]) -> None:
        out: messages.EventMessage = {"kind": "event", "event": message["event"]}
        await self.push(dict(out))

    async def run_decision(self, message: dict[str, Any]) -> None:
        out: messages.DecisionMessage = {"kind": "decision", "decision": message["decision"]}
        await self.push(dict(out))

    async def run_status(self, message: dict[str, Any]) -> None:
        out: messages.StatusMessage = {"kind": "status", "run": message["run"]}
        await self.push(dict(out))
