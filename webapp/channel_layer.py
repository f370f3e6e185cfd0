"""The channel layer: channels_redis' Redis layer, with a connection pool that waits.

channels_redis builds a plain redis-py pool per Redis host, which *fails* a command
(``MaxConnectionsError``) when its connections (100 by default) are all in use. Every
socket that connects calls ``group_add``: 1,000 viewers (re)connecting at once after a
daphne restart, or opening a wall of run pages, failed most of their connections
(measured with ``manage.py bench_push --viewers 1000 --runs 10``: 2 of 1,000 connected).
A blocking pool of the same size makes the rest wait their turn for a connection, which
each holds for one round trip.
"""
from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer
from redis import asyncio as aioredis

# Connections per Redis host and process, and how long a command waits for one.
POOL_SIZE = 100
POOL_WAIT_S = 30.0


class RedisChannelLayer(_RedisChannelLayer):
    def create_pool(self, index: int) -> Any:
        host = dict(self.hosts[index])
        if "address" not in host:  # a sentinel or keyword configuration: channels_redis'
            return super().create_pool(index)
        address = host.pop("address")
        host.setdefault("max_connections", POOL_SIZE)
        host.setdefault("timeout", POOL_WAIT_S)
        return aioredis.BlockingConnectionPool.from_url(address, **host)
