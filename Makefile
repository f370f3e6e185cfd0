# The two commands of the README: `make run` and `make test`.
.PHONY: run test bench lint

run:            ## install what is missing, then start everything and print the URL
	bash .ci/bootstrap.sh
	.venv/bin/python manage.py up

test:           ## the whole suite, on PostgreSQL and on SQLite
	bash .ci/test.sh

BENCH_ENV = STREAMWISE_VAR=$(CURDIR)/var/bench REDIS_URL=redis://127.0.0.1:6379/13 \
	DATABASE_URL=sqlite:///$(CURDIR)/var/bench/db.sqlite3

bench:          ## push latency, start-up time, sink vs Spark, MPC, planners, simulator, elastic runtime
	bash .ci/bootstrap.sh --test
	bash .ci/services.sh
	$(BENCH_ENV) .venv/bin/python manage.py bench

lint:
	.venv/bin/ruff check .
	PYTHONPATH=. .venv/bin/lint-imports
