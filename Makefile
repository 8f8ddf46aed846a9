# The two commands of the README: `make demo` and `make test`. Both set up everything first.
.PHONY: setup demo test bench-fetch check

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/python -m bootseer.demo

test: setup
	.venv/bin/python -m pytest -q

bench-fetch: setup
	.venv/bin/python bench/fetch/run.py

check: setup
	.venv/bin/python -m pytest -q -x tests/unit
