"""Alert webhooks (control/webhooks.py): only http(s) to public addresses unless an
administrator allows the host, pinned to the checked address, never redirected, one
deadline, signed. The sends go to real HTTP servers on loopback, allowed by name."""
from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from control import webhooks

pytestmark = pytest.mark.dbless

SECRET = b"test-secret"


@pytest.mark.parametrize("url, words", [
    ("http://127.0.0.1:8080/api/v1/kill", "not a public address"),
    ("http://localhost/", "not a public address"),
    ("http://[::1]:6066/v1/submissions/kill", "not a public address"),
    ("http://169.254.169.254/latest/meta-data/", "not a public address"),
    ("http://10.0.0.1/", "not a public address"),
    ("https://192.168.1.5/hook", "not a public address"),
    ("http://0.0.0.0:8000/", "not a public address"),
    ("http://224.0.0.1/", "not a public address"),
    # IPv6 forms embedding a non-public IPv4 address (issue 48): NAT64 of the metadata
    # service, 6to4 of loopback, IPv4-compatible loopback, Teredo, IPv4-mapped
    ("http://[64:ff9b::a9fe:a9fe]/", "not a public address"),
    ("http://[64:ff9b:1::a9fe:a9fe]/", "not a public address"),
    ("http://[2002:7f00:1::]/", "not a public address"),
    ("http://[::127.0.0.1]/", "not a public address"),
    ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", "not a public address"),
    ("http://[::ffff:10.0.0.1]/", "not a public address"),
    ("ftp://203.0.113.9/hook", "http or https, not ftp"),
    ("file:///etc/passwd", "http or https, not file"),
    ("http://user:pw@8.8.8.8/", "credentials"),
    ("http://:80/", "names no host"),
])
def test_a_webhook_to_a_non_public_or_non_http_target_is_refused(url: str, words: str
                                                                 ) -> None:
    with pytest.raises(webhooks.WebhookRefused) as exc:
        webhooks.check(url)
    assert words in str(exc.value)
    assert webhooks.post(url, {"a": 1}, SECRET).startswith("refused:")


def test_a_public_address_passes_and_a_host_resolving_to_any_private_address_does_not(
        ) -> None:
    target = webhooks.check("https://8.8.8.8/hook?x=1")
    assert (target.scheme, target.port, target.path, target.address) == \
        ("https", 443, "/hook?x=1", "8.8.8.8")
    # A name is judged by every address it resolves to (one private one is enough).
    both = {"alerts.example.com": ["93.184.215.14", "10.1.2.3"]}
    with pytest.raises(webhooks.WebhookRefused, match="10.1.2.3"):
        webhooks.check("https://alerts.example.com/", resolver=lambda h, p: both[h])
    assert webhooks.check("https://alerts.example.com/", ["Alerts.Example.com"],
                          resolver=lambda h, p: both[h]).address == "93.184.215.14"


def test_an_ipv6_address_is_public_only_with_every_ipv4_address_it_embeds_public() -> None:
    assert webhooks.check("http://[64:ff9b::808:808]/").address == "64:ff9b::808:808"
    assert webhooks.check("http://[2002:808:808::1]/").address == "2002:808:808::1"
    assert webhooks.check("http://[2606:4700:4700::1111]/")  # no IPv4 inside


def test_a_failed_webhook_is_logged_without_its_path_and_query() -> None:
    assert webhooks.redacted("https://hooks.example.com:8443/services/T0/B1/s3cr3t?token=x"
                             ) == "https://hooks.example.com:8443/…"
    assert webhooks.redacted("http://user:pw@[::1]/x") == "http://::1/…"
    assert webhooks.redacted("http://[::1") == "(not a URL)"


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, dict(self.headers), body))
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
        else:
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_allowed_host_gets_a_signed_post_and_a_redirect_is_not_followed(
        receiver: str) -> None:
    assert webhooks.post(receiver + "/hook", {"kind": "alert"}, SECRET).startswith(
        "refused:")  # loopback, not allowed
    assert _Receiver.received == []
    assert webhooks.post(receiver + "/hook", {"kind": "alert", "run": 3}, SECRET,
                         ["127.0.0.1"]) == "204"
    path, headers, body = _Receiver.received[0]
    assert path == "/hook" and headers["Content-Type"] == "application/json"
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    assert headers[webhooks.SIGNATURE_HEADER] == expected
    assert webhooks.post(receiver + "/moved", {"kind": "alert"}, SECRET, ["127.0.0.1"]) \
        == "302 (redirect not followed)"
    assert [p for p, _h, _b in _Receiver.received] == ["/hook", "/moved"]


def test_a_receiver_that_never_answers_is_given_up_at_the_deadline() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection (the kernel does), never answers
    try:
        started = time.monotonic()
        outcome = webhooks.post(f"http://127.0.0.1:{silent.getsockname()[1]}/", {}, SECRET,
                                ["127.0.0.1"], deadline_s=1.0)
        took = time.monotonic() - started
    finally:
        silent.close()
    assert outcome == "failed: no answer within 1 s"
    assert took < 1.0 + 2.0  # the deadline and thread hand-over, not a socket timeout each
