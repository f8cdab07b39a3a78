# The portal's two commands are `make demo` and `make test`; the rest are the steps they are made of.
SHELL := /bin/bash
PY := .venv/bin/python
DB_NAME ?= gpuportal

.PHONY: demo test venv services cluster database migrate seed portal prometheus stop lint bench browser drills load nginx oidc oidc-install

# The demo is production on one machine, with one convenience: plain HTTP on loopback, so no TLS certificate
# is needed (README, "Configuration": PORTAL_HTTPS). Everything else runs with the production defaults.
demo: export PORTAL_HTTPS = false
# Single sign-on through the demo's own OpenID provider (scripts/oidc.sh), unless PORTAL_OIDC_PROVIDERS names others.
demo: export PORTAL_OIDC_PROVIDERS ?= $(shell bash scripts/oidc.sh providers)
demo: cluster database seed oidc portal prometheus ## Everything, with demo data, on http://127.0.0.1:8000
	@$(PY) manage.py shell -v 0 -c "from clusters.tasks import cluster_sync_all, slurm_reconcile_all; cluster_sync_all.delay(); slurm_reconcile_all.delay()"
	@bash scripts/portal.sh wait-healthy
	@echo
	@echo "The portal is running on http://127.0.0.1:8000/"
	@echo "  Django admin:   http://127.0.0.1:8000/admin/   health: http://127.0.0.1:8000/healthz"
	@echo "  Prometheus:     http://127.0.0.1:9090/ (alerts: /alerts), scraping http://127.0.0.1:8000/metrics"
	@echo "  Logins (password '$${DEMO_PASSWORD:-demo}'): admin (portal admin), alice (acme admin),"
	@echo "          bob (member of acme/vision), carol (globex admin)"
	@echo "  Or 'Sign in with Demo identity provider' (http://127.0.0.1:$${OIDC_PROVIDER_PORT:-8300}, same password):"
	@echo "          alice, bob, carol, and dana, whose portal account is made at her first sign-in"
	@echo "  Stop everything with: make stop"

test: lint cluster database browser oidc-install ## The whole suite against the real local cluster, PostgreSQL and Redis
	@bash scripts/test.sh $(PYTEST_ARGS)

venv: ## .venv with exactly the versions in requirements.lock
	@bash scripts/bootstrap.sh

# Re-resolves requirements.lock from pyproject.toml (dev extra included), keeping the pins that still fit; run it
# after changing a dependency there, and `make lock LOCK_ARGS=--upgrade` to move every pin to its newest release.
.PHONY: lock
lock:
	@[[ -x var/lock-tools/bin/python ]] || python3 -m venv var/lock-tools
	@var/lock-tools/bin/pip install --quiet uv==0.13.9
	var/lock-tools/bin/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 --generate-hashes \
		--custom-compile-command 'make lock' --quiet $(LOCK_ARGS) -o requirements.lock

browser: ## Debian's Chromium, for the browser journeys in the tests
	@bash scripts/browser.sh

oidc-install: ## The demo's OpenID provider from npm, for the sign-in tests (the tests start their own)
	@bash scripts/oidc.sh install

oidc: venv ## The demo's OpenID provider on 127.0.0.1:8300 (scripts/oidc.sh)
	@bash scripts/oidc.sh up

services: ## PostgreSQL, Redis and MariaDB: installed and started if absent
	@bash scripts/services.sh up

nginx: ## Debian's nginx, installed if absent (the portal's processes and the benchmarks start their own)
	@bash scripts/services.sh nginx

cluster: venv services ## The local GPU Slurm cluster
	@bash scripts/cluster.sh up

database: venv services
	@psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$(DB_NAME)'" | grep -q 1 \
		|| psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $(DB_NAME)"
	@$(PY) manage.py migrate --noinput -v0

migrate: database

seed: database
	@$(PY) manage.py seed_demo

# nginx (installed if missing), gunicorn, uvicorn, a Celery worker and beat; see README, "Processes".
portal: venv
	@bash scripts/portal.sh up

# Debian's Prometheus (installed if missing) on 127.0.0.1:9090, scraping the portal with the project's alerting
# rules (deploy/prometheus/); see README, "Metrics and alerts".
prometheus:
	@bash scripts/prometheus.sh up

stop: ## Stop everything the project started
	-@bash scripts/prometheus.sh down
	-@bash scripts/portal.sh down
	-@bash scripts/oidc.sh down
	-@bash scripts/cluster.sh down
	-@bash scripts/services.sh down

# makemigrations --check reads the migration history from the database, so it wants it up and migrated.
lint: venv database
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy .
	.venv/bin/lint-imports --no-cache
	$(PY) manage.py makemigrations --check --dry-run
	@# promtool (Debian's prometheus package, installed if missing): the alerting rules and their unit tests.
	bash scripts/prometheus.sh check

# Each portal benchmark recreates its own database (gpuportal_bench), uses Redis databases 10-12 and port 8100,
# and cancels its jobs; see bench/portal_stack.py.
# The client and submission benchmarks and the sync benchmark run on each local cluster (BENCH_CLUSTERS).
BENCH_CLUSTERS ?= local north south
bench: cluster database nginx
	$(PY) bench/slurm_client.py
	@set -e; for cluster in $(BENCH_CLUSTERS); do echo "== job submission on $$cluster"; \
		BENCH_CLUSTER=$$cluster $(PY) bench/job_submission.py; done
	@set -e; for cluster in $(BENCH_CLUSTERS); do echo "== job sync on $$cluster"; \
		BENCH_CLUSTER=$$cluster $(PY) bench/job_sync.py; done
	@set -e; for cluster in $(BENCH_CLUSTERS); do echo "== job state latency on $$cluster"; \
		BENCH_CLUSTER=$$cluster $(PY) bench/state_latency.py; done
	$(PY) bench/log_latency.py
	$(PY) bench/invoice.py
	$(PY) bench/cluster_page.py
	$(PY) bench/history.py
	$(PY) bench/http_topology.py

# The history routes (job lists, spend, burn-down, billing) with 10k and 1M finished jobs bulk-loaded into a
# database of their own (<DATABASE_URL's name>_history_bench_<jobs>); see README, "Benchmarks", and bench/history.py.
# `make history-bench HISTORY_ARGS="--jobs 10000,1000000 --reuse"` keeps the loaded databases and migrates them.
.PHONY: history-bench
history-bench: database
	$(PY) bench/history.py $(HISTORY_ARGS)

# How the web tier should run: uvicorn alone versus gunicorn beside uvicorn, with and without nginx in front
# (requests/s, p50/p95 of a GET and a POST at 4 clients, PostgreSQL connections; about 13 minutes). See README,
# "Processes"; `make http-topology TOPOLOGY_ARGS="--rounds 1"` for a quicker look.
.PHONY: http-topology
http-topology: cluster database nginx
	$(PY) bench/http_topology.py $(TOPOLOGY_ARGS)

# Fault drills on the real local stack (own database gpuportal_bench_drills, own Redis, port 8101); each ends
# with a ledger check. `make drills DRILLS="slurmrestd worker"` runs some of them; see scripts/drills/.
drills: cluster database nginx
	$(PY) scripts/drills/run.py $(DRILLS)

# 50 users browsing, listing and submitting for two minutes against the portal as scripts/portal.sh runs it
# (nginx, gunicorn, uvicorn); see bench/load.py.
load: cluster database nginx
	$(PY) bench/load.py
