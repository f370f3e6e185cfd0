"""A run's live pages in one process: one channel-layer membership per run, fanned out
to the process's sockets of that run.

Channels' default is a channel per socket, each socket waiting on the layer for its own
messages. channels_redis wakes its waiting sockets through one lock and a buffer per
channel, and every socket a group message reaches cancels a wait queued behind all the
others: at 300 viewers of 10 runs a push's p95 was 212 ms (15 ms at 100), and at 1,000
the sockets' handshakes did not finish within daphne's connect timeout at all
(``manage.py bench_push --viewers 1000 --runs 10``; docs/benchmarks.md). Here a process
joins a run's group once, through a channel of its own (``RunFeed``), whatever the
number of its sockets on the run; a message read there is handed to each socket in turn,
as the same object (so ``RunConsumer.push`` encodes it once).

The membership is renewed every ``RENEW_S`` (channels_redis expires a group membership
after a day, and a Redis that restarted without its data has forgotten it) and after a
failed read of the layer.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Protocol

from channels.layers import get_channel_layer

from pipelines import actions

log = logging.getLogger(__name__)

RENEW_S = 60.0
RETRY_S = 1.0


class Socket(Protocol):
    async def deliver(self, message: dict[str, Any]) -> None: ...


class RunFeed:
    """One run's group, read once for this process's sockets on it."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.group = actions.group_name(run_id)
        self.sockets: dict[Socket, None] = {}  # in join order; a dict as an ordered set
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        """Join the group (before the first socket reads its snapshot: a change
        committed in between reaches it either way) and start reading."""
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        self.task = asyncio.ensure_future(self._read())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        try:
            await self.layer.group_discard(self.group, self.channel)
        except Exception:  # Redis away: the membership expires, the channel is gone
            log.warning("leaving %s failed", self.group, exc_info=True)

    async def _read(self) -> None:
        # No asyncio.wait_for around the read: on Python 3.11 it returns the inner
        # result when its own cancellation meets a read that has just finished, and a
        # feed that lives on past its loop's end holds that end for ever (seen as a
        # test's event loop that never closed).
        renewing = asyncio.ensure_future(self._renew())
        try:
            while True:
                try:
                    message = await self.layer.receive(self.channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # Redis away: read again, joining again first
                    log.warning("reading %s failed; joining again", self.group,
                                exc_info=True)
                    await asyncio.sleep(RETRY_S)
                    await self._join()
                    continue
                for socket in list(self.sockets):
                    try:
                        await socket.deliver(message)
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # one socket's failure is not the others'
                        log.warning("a push to a viewer of %s failed", self.group,
                                    exc_info=True)
        finally:
            renewing.cancel()

    async def _join(self) -> None:
        try:
            await self.layer.group_add(self.group, self.channel)
        except asyncio.CancelledError:
            raise
        except Exception:  # the next renewal or read tries again
            log.warning("joining %s failed", self.group, exc_info=True)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await self._join()


class Feeds:
    """The event loop's run feeds (daphne runs one loop; a test may run several)."""

    def __init__(self) -> None:
        self.feeds: dict[int, RunFeed] = {}
        self.lock = asyncio.Lock()

    async def join(self, run_id: int, socket: Socket) -> None:
        async with self.lock:
            feed = self.feeds.get(run_id)
            if feed is None:
                feed = RunFeed(run_id)
                await feed.start()
                self.feeds[run_id] = feed
            feed.sockets[socket] = None

    async def leave(self, run_id: int, socket: Socket) -> None:
        async with self.lock:
            feed = self.feeds.get(run_id)
            if feed is None:
                return
            feed.sockets.pop(socket, None)
            if not feed.sockets:
                del self.feeds[run_id]
                await feed.stop()


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Feeds] = (
    weakref.WeakKeyDictionary())


def feeds() -> Feeds:
    """This event loop's feeds."""
    loop = asyncio.get_running_loop()
    found = _per_loop.get(loop)
    if found is None:
        found = _per_loop[loop] = Feeds()
    return found
