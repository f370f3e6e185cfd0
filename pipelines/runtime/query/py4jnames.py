"""Keep what py4j's name look-ups found in the JVM, for the life of this driver.

py4j resolves every ``jvm.a.b.C`` step by step, and every short name through the
view's imports (PySpark's ``jvm.functions``, ``jvm.PythonSQLUtils``), by asking the JVM
each time: its answer comes from ``Class.forName`` on each candidate name, and a name
that is not a class (``org``, ``org.apache``, ``java.lang.functions``, ...) makes the
class loader look it up in every jar on the classpath (~250 in PySpark's ``jars/``)
before it fails. PySpark's Python API makes several such look-ups per call, and a
run's driver makes many calls per micro-batch (the sink, the metrics, the placement
checks): a flight recording of a run's driver on a keyed sum (2 executors, batches
back to back) had 30 % of its CPU samples in ``ZipFile.getEntry`` under
``URLClassPath.getResource``, called from py4j's ``ReflectionCommand.getUnknownMember``.

What a look-up found stays true while the JVM lives: a class stays that class, a
package that package, a static method that method. So classes, packages and static
methods are kept here, per gateway connection and view; fields are not (their value
may change), nor failures, and a ``java_import`` empties what was kept (it changes what
a short name means). py4j answers "package" for any name that is no class; a jar added
to the driver while it runs could make such a name a class, which a kept answer would
hide: nothing here adds jars to a running driver. Python's own (dunder) names pass
through untouched. Measured in ``docs/benchmarks.md`` ("Name look-ups through py4j").
"""
from __future__ import annotations

import threading
from typing import Any

_installed = False
_lock = threading.Lock()
_kept: dict[tuple[int, str, str], Any] = {}


def install() -> None:
    """Wrap py4j's ``JVMView``, ``JavaPackage`` and ``JavaClass`` attribute look-ups in
    this process (once; later calls do nothing)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    from py4j import java_gateway as gw

    view_lookup = gw.JVMView.__getattr__
    package_lookup = gw.JavaPackage.__getattr__
    class_lookup = gw.JavaClass.__getattr__
    importer = gw.java_import

    def kept(kind: str, scope: str, owner: Any, name: str, lookup: Any,
             keep: tuple[type, ...]) -> Any:
        if name.startswith("__") and name.endswith("__"):
            return lookup(owner, name)
        # The kept objects hold the client, so its id is not reused while they live.
        key = (id(owner._gateway_client), kind + scope, name)
        found = _kept.get(key)
        if found is None:
            found = lookup(owner, name)
            if isinstance(found, keep):
                _kept[key] = found
        return found

    def view_getattr(self: Any, name: str) -> Any:
        return kept("v", self._id, self, name, view_lookup, (gw.JavaClass, gw.JavaPackage))

    def package_getattr(self: Any, name: str) -> Any:
        return kept("p", f"{self._jvm_id}:{self._fqn}", self, name, package_lookup,
                    (gw.JavaClass, gw.JavaPackage))

    def class_getattr(self: Any, name: str) -> Any:
        return kept("c", self._fqn, self, name, class_lookup,
                    (gw.JavaClass, gw.JavaMember))

    def java_import(jvm_view: Any, import_str: str) -> Any:
        _kept.clear()
        return importer(jvm_view, import_str)

    gw.JVMView.__getattr__ = view_getattr
    gw.JavaPackage.__getattr__ = package_getattr
    gw.JavaClass.__getattr__ = class_getattr
    gw.java_import = java_import
