"""Alert webhooks, sent so that a policy's URL cannot be turned against the machine.

A policy's ``alert_webhook`` is typed by any operator, and the Celery worker POSTs to
it from inside the cluster's network, where the Spark master and UI (with their kill
endpoints), Redis and cloud metadata services answer. So a webhook:

* is ``http`` or ``https``, nothing else;
* goes only to public addresses: every address the host resolves to must be global
  unicast, unless the host is in the administrator's allow-list (``WEBHOOK_ALLOWED_HOSTS``);
* is sent to the address that was checked (the connection is pinned to it, so a DNS
  answer that changes between the check and the connection gains nothing), with the
  URL's host name in ``Host`` and for TLS's server name and certificate check;
* is never redirected (a 3xx is reported, not followed);
* has one deadline for the whole exchange;
* is signed: ``X-Streamwise-Signature: sha256=<hex HMAC-SHA256 of the body>`` with the
  installation's webhook secret, so a receiver can tell it from a forgery.

No Django import: the Celery task passes the settings in.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SIGNATURE_HEADER = "X-Streamwise-Signature"
DEFAULT_DEADLINE_S = 10.0

Resolver = Callable[[str, int], list[str]]


class WebhookRefused(ValueError):
    """A webhook URL that may not be used; the message is one line for the form."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked address the connection is pinned to


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (IP literals resolve to themselves)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"cannot resolve {host!r}") from exc
    return sorted({str(info[4][0]) for info in infos})


# IPv6 forms that carry an IPv4 address a router or the host may reach: NAT64's
# well-known and local-use prefixes (RFC 6052, 8215: the last 32 bits) and the
# deprecated IPv4-compatible form (RFC 4291 2.5.5.1); 6to4, Teredo and IPv4-mapped
# the standard library reads itself.
_LAST_32_BITS = tuple(ipaddress.ip_network(n) for n in (
    "64:ff9b::/96", "64:ff9b:1::/48", "::/96"))


def embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address
                  ) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address embeds (none for an IPv4 address)."""
    if ip.version == 4:
        return []
    assert isinstance(ip, ipaddress.IPv6Address)
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if any(ip in net for net in _LAST_32_BITS) and int(ip) > 1:  # not :: or ::1
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return (ip.is_global and not ip.is_multicast
            and all(_public(inner) for inner in embedded_ipv4(ip)))


def redacted(url: str) -> str:
    """``url`` without what often carries a token (path, query, credentials), for logs."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a URL)"
    return f"{parts.scheme}://{host}{port}/…"


def check(url: str, allowed_hosts: Iterable[str] = (), resolver: Resolver = resolve
          ) -> Target:
    """The target of ``url`` if it may be POSTed to; else :class:`WebhookRefused`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"not a URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookRefused(f"webhooks are http or https, not {scheme or 'no scheme'}")
    host = (parts.hostname or "").lower()
    if not host:
        raise WebhookRefused("the URL names no host")
    if parts.username or parts.password:
        raise WebhookRefused("credentials in the URL are not allowed")
    port = port or (443 if scheme == "https" else 80)
    addresses = resolver(host, port)
    if not addresses:
        raise WebhookRefused(f"cannot resolve {host!r}")
    allowed = {h.strip().lower() for h in allowed_hosts if h.strip()}
    if host not in allowed:
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            if not _public(ip):
                raise WebhookRefused(
                    f"{host} resolves to {address}, not a public address (an administrator "
                    "may allow the host in WEBHOOK_ALLOWED_HOSTS)")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, path, addresses[0])


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self.address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout,
                         context=ssl.create_default_context())
        self.address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, payload: dict[str, Any], secret: bytes,
         allowed_hosts: Iterable[str] = (), deadline_s: float = DEFAULT_DEADLINE_S,
         resolver: Resolver = resolve) -> str:
    """POST ``payload`` as signed JSON; returns the outcome in a few words (never
    raises for the receiver's or the network's faults: an alert must not fail a tick)."""
    try:
        target = check(url, allowed_hosts, resolver)
    except WebhookRefused as exc:
        return f"refused: {exc}"
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "streamwise-alerts",
               SIGNATURE_HEADER: signature(secret, body)}
    kind = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    conn = kind(target, timeout=deadline_s)
    outcome: list[str] = []

    def exchange() -> None:
        try:
            conn.request("POST", target.path, body=body, headers=headers)
            status = conn.getresponse().status
            outcome.append(f"{status} (redirect not followed)" if 300 <= status < 400
                           else f"{status}")
        except TimeoutError:  # the socket's own timeout, which is the deadline too
            outcome.append(f"failed: no answer within {deadline_s:g} s")
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(f"failed: {exc or type(exc).__name__}")

    started = time.monotonic()
    worker = threading.Thread(target=exchange, daemon=True)
    worker.start()
    worker.join(deadline_s)
    # One deadline for connect, send and the answer together. On a loaded machine this
    # join can return after the socket's timeout (the same deadline) ended the exchange:
    # the outcome says the same either way.
    if worker.is_alive():
        conn.close()
        return f"failed: no answer within {deadline_s:g} s"
    return outcome[0] if outcome else f"failed after {time.monotonic() - started:.1f} s"
