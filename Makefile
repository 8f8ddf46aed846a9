# The two commands of the README: `make demo` and `make test`. Both set up everything first.
# Benchmarks (one command each, see the README's results table): make bench-<name>.
.PHONY: setup demo test check bench-fetch bench-store bench-trace bench-image bench-deps bench-ckpt bench-e2e bench-scale

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/python -m bootseer.demo

test: setup
	.venv/bin/python -m pytest -q

check: setup
	.venv/bin/python -m pytest -q -x tests/unit

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
