#!/usr/bin/env bash
# Install what Streamwise needs on a fresh Debian machine: Java, Redis, the Python venv
# (and, with --test, Chromium + ChromeDriver, PostgreSQL and iproute2). Idempotent and quiet when
# everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

pkgs=()
command -v java >/dev/null 2>&1 || pkgs+=(openjdk-17-jre-headless)
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv)
if [ "$want_test" = 1 ]; then
  [ -x /usr/bin/chromium ] || pkgs+=(chromium)
  [ -x /usr/bin/chromedriver ] || pkgs+=(chromium-driver)
  command -v pg_ctlcluster >/dev/null 2>&1 || pkgs+=(postgresql)
  # NATS with JetStream: the jetstream source's tests and the feeder
  command -v nats-server >/dev/null 2>&1 || pkgs+=(nats-server)
  # `ip netns`: the multi-host test's extra hosts (tests/netns.py)
  command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
fi
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "bootstrap: installing ${pkgs[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

# The venv is rebuilt only when requirements.txt (or how it is installed) changes.
UV_VERSION=0.13.9
stamp=.venv/.requirements.sha256
sum=$( (cat requirements.txt; echo "uv $UV_VERSION --compile-bytecode") | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  echo "bootstrap: installing Python dependencies into .venv"
  python3 -m venv .venv
  # uv installs the requirements: it downloads and unpacks in parallel (a fresh venv
  # in 21 s with nothing cached, where pip took 44 s with everything cached).
  .venv/bin/pip install -q "uv==$UV_VERSION"
  # Bytecode compiled once, here: with PYTHONDONTWRITEBYTECODE set (as on the CI
  # machines) no process writes its own .pyc, and every one compiled Django, Celery,
  # PySpark and pandas again as it started (a runner's imports 1.6 s of CPU against
  # 0.5 s, Celery beat's start 3.7 against 1.4: runners, standbys, executors' Python
  # daemons, each query's source process, the Celery processes, every CLI call).
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -r requirements.txt
  echo "$sum" > "$stamp"
fi

# The example operator package (examples/streamwise-example-ops): the test setup
# installs it into the venv as an admin installs a team's package (an entry point in
# the group streamwise.operators), so the tests run its operators under Streamwise.
# Installed again when its pyproject.toml changes (its entry points are read from the
# metadata the install writes, not from the source).
example_stamp=.venv/.example-ops.sha256
example_sum=$(sha256sum examples/streamwise-example-ops/pyproject.toml | cut -d' ' -f1)
if [ "$want_test" = 1 ] && { ! .venv/bin/python -c "import streamwise_example_ops" 2>/dev/null \
    || [ "$(cat "$example_stamp" 2>/dev/null)" != "$example_sum" ]; }; then
  echo "bootstrap: installing the example operator package"
  .venv/bin/uv pip install -q --python .venv/bin/python -e examples/streamwise-example-ops
  echo "$example_sum" > "$example_stamp"
fi
# The project's own modules, for the same reason (quick when they are up to date; a
# module edited since is compiled in memory as it is imported, never run stale).
.venv/bin/python -m compileall -q -j 0 pipelines control webapp accounts audit api \
  examples >/dev/null

# Spark's classes as one shared archive that every run's JVMs map instead of loading
# them (pipelines/runtime/cluster/classarchive.py): made once per venv (~1 min),
# checked in a moment after that. .ci/test.sh makes it itself, beside the first tests
# (STREAMWISE_BOOTSTRAP_ARCHIVE=0).
if [ "${STREAMWISE_BOOTSTRAP_ARCHIVE:-1}" != 0 ]; then
  .venv/bin/python -m pipelines.runtime.runner.classarchive
fi
