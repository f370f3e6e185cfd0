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
# Each pass's output is printed whole when it ends.
#
# The alone tests measure the machine and rely on the measure (the closed loop's rate
# step comes from a calibration; under a load that changes between the two, the run
# meets another machine than the one calibrated). Where this machine lets us make a
# CPU control group (cgroup v1's cpu controller, as root), they run from the start
# beside the lanes in a group that outweighs everything else (cpu.shares 262144
# against 1024 for each session of the root group, which the kernel shares the CPU
# between first: autogroup): whatever CPU they want, they get, and the lanes take what
# they leave (alone, the closed loop kept 1.3 of the 2 cores busy, so its wait for a
# rate step or a decision is the lanes' time). The lanes stay in the root group, where
# a re-plan's state transfer at idle priority still gets its session's share. The
# class archive is made in that group too: every pass's first JVM waits for it.
# Elsewhere (STREAMWISE_TEST_ALONE=after, or no such group) the alone tests run after
# the lanes, with nothing beside them. STREAMWISE_TEST_LANES=1 runs every pass one
# after another.
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
ALONE_SHARES=262144  # cgroup v1's largest weight
alone_group=""
if [ "${STREAMWISE_TEST_LANES:-2}" != 1 ] && [ "${STREAMWISE_TEST_ALONE:-beside}" = beside ] \
    && [ -w /sys/fs/cgroup/cpu/cgroup.procs ] \
    && mkdir "/sys/fs/cgroup/cpu/streamwise-alone-$$" 2>/dev/null; then
  alone_group=/sys/fs/cgroup/cpu/streamwise-alone-$$
  echo $ALONE_SHARES >"$alone_group/cpu.shares"
fi
join_alone_group() {  # the calling (sub)shell, and all it starts from now on
  if [ -n "$alone_group" ]; then echo "$BASHPID" >"$alone_group/cgroup.procs"; fi
}
(join_alone_group
 .venv/bin/python -m pipelines.runtime.runner.classarchive >"$var/class-archive.log" 2>&1
 echo $? >"$STREAMWISE_CLASS_ARCHIVE_DONE") &
# The dbless lane takes the next Redis database, the alone pass the one two below.
redis_base=${TEST_REDIS_URL:-redis://127.0.0.1:6379/14}
export STREAMWISE_DATA_ROOT=${STREAMWISE_DATA_ROOT:-$PWD/../shared/data}
export SECRET_KEY=test-only
pytest=(.venv/bin/python -m pytest --durations=25)

status=0
# ruff and the layer contracts (.importlinter), beside the tests; their verdict at the end
make --no-print-directory lint >"$var/lint.log" 2>&1 &
lint_pid=$!
lint_verdict() {
  wait $lint_pid || status=1
  echo "=== lint"
  cat "$var/lint.log"
}

database_lane() {
  export REDIS_URL=$redis_base STREAMWISE_VAR=$var
  local rc=0
  echo "=== tests on PostgreSQL (the database tests but the single_pass ones, and the"\
       "database_lane ones)"
  # No standby for the live stack here: its one run (started, then stopped while it
  # starts) does not need a warm application, and a standby's warm-up (a driver, an
  # executor, two micro-batches) would be the pass's costliest start-up. Its Spark
  # tests run through the harness, on the standby pool (tests/conftest.py).
  STREAMWISE_TEST_LIVE_STANDBYS=0 \
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
  local db=${redis_base##*/}
  export REDIS_URL=${redis_base%/*}/$((db - 2)) STREAMWISE_VAR=$var/alone
  if [ -n "$alone_group" ]; then
    echo "=== tests that calibrate the machine, beside the lanes in $alone_group" \
         "(cpu.shares $ALONE_SHARES; on SQLite)"
  else
    echo "=== tests that calibrate the machine, alone (on SQLite)"
  fi
  # No standby either: its warm-up would run beside the calibration.
  STREAMWISE_TEST_LIVE_STANDBYS=0 DATABASE_URL=sqlite:///$var/alone/db.sqlite3 \
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

mkdir -p "$var/dbless" "$var/alone"
if [ "${STREAMWISE_TEST_LANES:-2}" = 1 ]; then
  database_lane "$@" || status=1
  dbless_lane "$@" || status=1
  alone_pass "$@" || status=1
  cat "$var/class-archive.log"
  lint_verdict
  exit $status
fi

started=$SECONDS
declare -A pass_of
for lane in database dbless; do
  "${lane}_lane" "$@" >"$var/lane-$lane.log" 2>&1 &
  pass_of[$!]=$lane
done
if [ -n "$alone_group" ]; then
  (join_alone_group; alone_pass "$@") >"$var/lane-alone.log" 2>&1 &
  pass_of[$!]=alone
  echo "=== the alone tests (in a CPU group that outweighs the rest) and two lanes" \
       "started: the database tests (PostgreSQL, then SQLite) and the dbless tests;" \
       "each pass's output follows when it ends"
else
  echo "=== two lanes started: the database tests (PostgreSQL, then SQLite) and the" \
       "dbless tests; each lane's output follows when it ends"
fi
while [ ${#pass_of[@]} -gt 0 ]; do
  wait -n -p ended "${!pass_of[@]}"
  rc=$?
  [ $rc = 0 ] || status=1
  lane=${pass_of[$ended]}
  unset "pass_of[$ended]"
  echo "=== '$lane' ended after $((SECONDS - started)) s (exit $rc)"
  cat "$var/lane-$lane.log"
done
if [ -n "$alone_group" ]; then
  rmdir "$alone_group" 2>/dev/null || true  # refused while a process is left in it
else
  alone_pass "$@" || status=1
fi
cat "$var/class-archive.log"
lint_verdict
exit $status
