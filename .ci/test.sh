#!/usr/bin/env bash
# The whole test suite, with real Redis, Celery, Spark, WebSockets and Chromium, on
# PostgreSQL and then on SQLite. Exit non-zero on any failure.
#
# Each test runs on the engine(s) its outcome depends on (pytest.ini's markers):
# * PostgreSQL pass: every test but the single_pass ones. A test that uses the database
#   but not the engine's own behaviour (plain ORM, forms, views) runs only here:
#   PostgreSQL is the engine of a deployment.
# * SQLite pass: the single_pass tests (long end-to-end runs on the live stack, on the
#   engine `make run` uses, so the newcomer's path is the one tested) and the
#   both_engines tests (locking between the live stack's writers, a snapshot read
#   beside a write, the relay's savepoint on a duplicate, the audit log's guard: a
#   trigger on PostgreSQL, the model on SQLite).
# Tests marked dbless touch no database and run in the PostgreSQL pass.
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
echo "=== tests on SQLite (the single_pass and both_engines tests)"
DATABASE_URL=sqlite:///$STREAMWISE_VAR/db.sqlite3 .venv/bin/python -m pytest --durations=25 \
  -m "(single_pass or both_engines) and not dbless" "$@" \
  || status=1
exit $status
