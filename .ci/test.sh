#!/usr/bin/env bash
# The whole test suite, with real Redis, Celery, Spark, WebSockets and Chromium, on
# PostgreSQL and then on SQLite. Exit non-zero on any failure.
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
echo "=== tests on PostgreSQL"
DATABASE_URL=${PG_TEST_URL:-postgres://postgres@127.0.0.1:5432/streamwise} \
  .venv/bin/python -m pytest --durations=12 "$@" || status=1
echo "=== tests on SQLite (tests marked dbless ran above and touch no database)"
DATABASE_URL=sqlite:///$STREAMWISE_VAR/db.sqlite3 .venv/bin/python -m pytest --durations=12 -m "not dbless" "$@" \
  || status=1
exit $status
