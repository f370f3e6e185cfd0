#!/usr/bin/env bash
# The whole test suite, with real Redis, Celery, Spark, WebSockets and Chromium, on
# PostgreSQL and on SQLite. Exit non-zero on any failure.
#
# Each test runs on the engine(s) its outcome depends on (pytest.ini's markers):
# * PostgreSQL pass: every test that uses the database but not the single_pass ones. A
#   test that uses the database but not the engine's own behaviour (plain ORM, forms,
#   views) runs only here: PostgreSQL is the engine of a deployment.
# * SQLite pass: the single_pass tests (long end-to-end runs on the live stack, on the
#   engine `make run` uses, so the newcomer's path is the one tested) and the
#   both_engines tests (locking between the live stack's writers, a snapshot read
#   beside a write, the relay's savepoint on a duplicate, the audit log's guard: a
#   trigger on PostgreSQL, the model on SQLite).
# * dbless pass: the tests that touch no database, once.
#
# Two lanes run side by side, each with its own Redis database, var/ folder, Spark
# cluster and ports: the dbless pass, and the PostgreSQL then the SQLite pass. One
# lane alone leaves about a quarter of the two cores idle (a run's driver plans while
# its executor waits, the live stack waits for a rate step or a decision); the tests
# already hold with one core kept busy, which is what the other lane is to them.
# Each lane's output is printed whole when it ends. Then the alone tests run, with
# nothing beside them: they measure the machine and rely on the measure (the closed
# loop's rate step comes from a calibration; under the other lane's changing load the
# run met another machine than the one calibrated). STREAMWISE_TEST_LANES=1 runs the
# passes one after another instead.
set -uo pipefail
cd "$(dirname "$0")/.."
STREAMWISE_BOOTSTRAP_ARCHIVE=0 bash .ci/bootstrap.sh --test || exit 1
bash .ci/services.sh || exit 1
var=${STREAMWISE_VAR:-$PWD/var/test}
mkdir -p "$var"
# The class archive (bootstrap.sh) is made beside the tests that start no JVM, which
# run first (tests/conftest.py): the first Spark test waits for the file this writes
# (~35 s alone, on a clean clone the set-up's longest step).
export STREAMWISE_CLASS_ARCHIVE_DONE=$var/class-archive.done
rm -f "$STREAMWISE_CLASS_ARCHIVE_DONE"
(.venv/bin/python -m pipelines.runtime.runner.classarchive >"$var/class-archive.log" 2>&1
 echo $? >"$STREAMWISE_CLASS_ARCHIVE_DONE") &
redis_base=${TEST_REDIS_URL:-redis://127.0.0.1:6379/14}  # the dbless lane takes the next DB
export STREAMWISE_DATA_ROOT=${STREAMWISE_DATA_ROOT:-$PWD/../shared/data}
export SECRET_KEY=test-only
pytest=(.venv/bin/python -m pytest --durations=25)

status=0
make --no-print-directory lint || status=1  # ruff and the layer contracts (.importlinter)

database_lane() {
  export REDIS_URL=$redis_base STREAMWISE_VAR=$var
  local rc=0
  echo "=== tests on PostgreSQL (the database tests but the single_pass ones, and the"\
       "database_lane ones)"
  DATABASE_URL=${PG_TEST_URL:-postgres://postgres@127.0.0.1:5432/streamwise} \
    "${pytest[@]}" -m "(not single_pass and not dbless or database_lane) and not alone" "$@" \
    || rc=1
  echo "=== tests on SQLite (the single_pass and both_engines tests)"
  DATABASE_URL=sqlite:///$var/db.sqlite3 \
    "${pytest[@]}" -m "(single_pass or both_engines) and not dbless and not alone" "$@" \
    || rc=1
  return $rc
}

alone_pass() {
  export REDIS_URL=$redis_base STREAMWISE_VAR=$var
  echo "=== tests that calibrate the machine, alone (on SQLite)"
  # No standby either: its warm-up would run beside the calibration.
  STREAMWISE_TEST_LIVE_STANDBYS=0 DATABASE_URL=sqlite:///$var/db.sqlite3 \
    "${pytest[@]}" -m alone "$@"
}

dbless_lane() {
  local db=${redis_base##*/}
  export REDIS_URL=${redis_base%/*}/$((db + 1)) STREAMWISE_VAR=$var/dbless
  echo "=== tests without a database"
  # No test here opens a connection; SQLite under the lane's own folder in case one
  # ever did, so that it could not touch the other lane's database.
  DATABASE_URL=sqlite:///$var/dbless/db.sqlite3 \
    "${pytest[@]}" -m "dbless and not database_lane and not alone" "$@"
}

if [ "${STREAMWISE_TEST_LANES:-2}" = 1 ]; then
  database_lane "$@" || status=1
  dbless_lane "$@" || status=1
  alone_pass "$@" || status=1
  cat "$var/class-archive.log"
  exit $status
fi

mkdir -p "$var/dbless"
started=$SECONDS
declare -A lane_of
for lane in database dbless; do
  "${lane}_lane" "$@" >"$var/lane-$lane.log" 2>&1 &
  lane_of[$!]=$lane
done
echo "=== two lanes started: the database tests (PostgreSQL, then SQLite) and the dbless" \
     "tests; each lane's output follows when it ends"
for _ in 1 2; do
  wait -n -p ended "${!lane_of[@]}"
  rc=$?
  [ $rc = 0 ] || status=1
  lane=${lane_of[$ended]}
  unset "lane_of[$ended]"
  echo "=== lane '$lane' ended after $((SECONDS - started)) s (exit $rc)"
  cat "$var/lane-$lane.log"
done
alone_pass "$@" || status=1
cat "$var/class-archive.log"
exit $status
