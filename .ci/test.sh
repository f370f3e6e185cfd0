#!/usr/bin/env bash
# The whole test suite, with real Redis, Celery, Spark, WebSockets and Chromium, on
# PostgreSQL and then on SQLite. Exit non-zero on any failure.
#
# Tests marked dbless touch no database: they run once, in the PostgreSQL pass. Tests
# marked single_pass are long end-to-end runs whose database use is the plain ORM that
# the other tests cover on both engines: they run once, in the SQLite pass (the engine
# `make run` uses, so the newcomer's path is the one tested).
set -uo pipefail
cd "$(dirname "$0")/.."
bash .ci/bootstrap.sh --test || exit 1
bash .ci/services.sh || exit 1
export REDIS_URL=${TEST_REDIS_URL:-redis://127.0.0.1:6379/14}
export STREAMWISE_VAR=${STREAMWISE_VAR:-$PWD/var/test}
export STREAMWISE_DATA_ROOT=${STREAMWISE_DATA_ROOT:-$PWD/../shared/data}
export SECRET_KEY=test-only
status=0
make --no-print-directory lint || status=1  # ruff and the layer contracts (.importlinter)
echo "=== tests on PostgreSQL (all but the single_pass tests)"
DATABASE_URL=${PG_TEST_URL:-postgres://postgres@127.0.0.1:5432/streamwise} \
  .venv/bin/python -m pytest --durations=25 -m "not single_pass" "$@" || status=1
echo "=== tests on SQLite (all but the dbless tests)"
DATABASE_URL=sqlite:///$STREAMWISE_VAR/db.sqlite3 .venv/bin/python -m pytest --durations=25 -m "not dbless" "$@" \
  || status=1
exit $status
