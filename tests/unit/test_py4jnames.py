"""py4jnames keeps what py4j's look-ups found: the same answers as py4j alone, with one
round trip to the JVM per name instead of one per use. On a real JVM (py4j's own
gateway, no Spark) with PySpark's jars on its classpath, where a name that is not a
class costs a look-up in each of them."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from py4j import java_gateway as py4j_gateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    import pyspark

    from pipelines.runtime.query import py4jnames

    jars = Path(pyspark.__file__).parent / "jars"
    jar = next(jars.glob("py4j-*.jar"))
    port = py4j_gateway.launch_gateway(jarpath=str(jar), classpath=f"{jars}/*",
                                       die_on_exit=True)
    gw = py4j_gateway.JavaGateway(gateway_parameters=py4j_gateway.GatewayParameters(
        port=port, auto_convert=True))
    py4jnames.install()
    try:
        yield gw
    finally:
        gw.shutdown()


class _Counted:
    """Counts the reflection commands (name look-ups) sent on a gateway's client."""

    def __init__(self, gw: Any) -> None:
        self.client, self.sent = gw._gateway_client, 0
        self._send = self.client.send_command

    def __enter__(self) -> _Counted:
        def send(command: str, *args: Any, **kw: Any) -> Any:
            self.sent += command.startswith("r\n")
            return self._send(command, *args, **kw)
        self.client.send_command = send
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.send_command = self._send


def test_a_name_is_looked_up_once_and_answers_as_before(gateway: Any) -> None:
    jvm = gateway.jvm
    with _Counted(gateway) as first:
        math = jvm.java.lang.Math
        assert math.max(3, 7) == 7
    with _Counted(gateway) as again:
        for _ in range(5):
            assert jvm.java.lang.Math.max(3, 7) == 7
            assert jvm.java.lang.Math is math
    assert first.sent >= 3 and again.sent == 0
    # A short name through the view's imports (java.lang.*), and a class's constructor.
    assert jvm.StringBuilder("ab").append("c").toString() == "abc"
    assert jvm.StringBuilder is jvm.StringBuilder
    # An inner class is kept as the class it is.
    assert jvm.java.util.Map.Entry is jvm.java.util.Map.Entry


def test_fields_and_failures_are_asked_each_time(gateway: Any) -> None:
    jvm = gateway.jvm
    # What a static method returns, and a static field's value, are asked each time.
    jvm.java.lang.System.setProperty("streamwise.py4jnames", "a")
    assert jvm.java.lang.System.getProperty("streamwise.py4jnames") == "a"
    jvm.java.lang.System.setProperty("streamwise.py4jnames", "b")
    assert jvm.java.lang.System.getProperty("streamwise.py4jnames") == "b"
    integer = jvm.java.lang.Integer
    with _Counted(gateway) as fields:
        assert integer.MAX_VALUE == integer.MAX_VALUE == 2**31 - 1
    assert fields.sent == 2
    # py4j takes a name that is no class for a package; an import can make it a class.
    assert isinstance(jvm.ArrayList, py4j_gateway.JavaPackage)
    py4j_gateway.java_import(jvm, "java.util.*")
    assert jvm.ArrayList().size() == 0
    # What the JVM refused is asked again.
    math = jvm.java.lang.Math
    for _ in range(2):
        with _Counted(gateway) as refused, pytest.raises(py4j_gateway.Py4JError):
            math.noSuchMethod(1)
        assert refused.sent == 1
