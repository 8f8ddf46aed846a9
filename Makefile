# The two commands of the README: `make demo` and `make test`. Both set up everything first.
# Benchmarks (one command each, see the README's results table): make bench-<name>.
.PHONY: setup demo test check lint types contracts fast bench-fetch bench-store bench-trace bench-image bench-deps bench-ckpt bench-e2e bench-scale

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/python -m bootseer.demo

test: setup
	.venv/bin/python -m pytest -q --durations=15

# The rules tools check, then the fast tier of the tests (marked `unit` by tests/conftest.py:
# no root, FUSE, netns, servers or torch, nothing slow). Each part runs even when an
# earlier one fails (-k), so one run reports them all; check fails if any part failed.
check: setup
	@$(MAKE) --no-print-directory -k lint types contracts fast

lint:
	.venv/bin/ruff check .

types:
	.venv/bin/mypy

contracts:
	.venv/bin/lint-imports

fast:
	.venv/bin/python -m pytest -q -m unit --timeout=60

bench-fetch: setup
	.venv/bin/python bench/fetch/run.py

bench-store: setup
	.venv/bin/python bench/store/run.py

bench-trace: setup
	.venv/bin/python bench/trace/run.py

bench-image: setup
	.venv/bin/python bench/image/run.py

bench-deps: setup
	.venv/bin/python bench/deps/run.py

bench-ckpt: setup
	.venv/bin/python bench/ckpt/run.py

bench-e2e: setup
	.venv/bin/python bench/e2e/run.py

bench-scale: setup
	.venv/bin/python bench/scale/run.py
