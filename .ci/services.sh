#!/usr/bin/env bash
# Make sure the local Redis and PostgreSQL the tests use answer on 127.0.0.1; start
# them if they do not (they are left running, like the machine's own services).
set -euo pipefail
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "services: starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --logfile /tmp/streamwise-redis.log
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "services: starting PostgreSQL"
  version=$(ls /etc/postgresql | sort -V | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 100); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
fi
# Trust auth on loopback is how this machine's PostgreSQL is set up; if a password is
# needed, set PG_TEST_URL.
# NATS with JetStream (the jetstream source): the machine's own server, or one of ours
# with its store in /tmp.
if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
  if command -v nats-server >/dev/null 2>&1; then
    echo "services: starting nats-server -js on 127.0.0.1:4222"
    mkdir -p /tmp/streamwise-nats
    setsid nats-server -js -a 127.0.0.1 -p 4222 -sd /tmp/streamwise-nats \
      -l /tmp/streamwise-nats/nats.log >/dev/null 2>&1 < /dev/null &
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break; sleep 0.1; done
  else
    echo "services: no NATS on 127.0.0.1:4222 and no nats-server (the jetstream tests fail)"
  fi
fi
