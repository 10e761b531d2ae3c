# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,langgraph]'
	touch $(STAMP)

## Evaluate the offline example agent: Prefect's ephemeral API, local store ./.evalsnap
demo: $(STAMP)
	$(BIN)/evalsnap run examples/shop_agent examples/shop_agent/shop.evalset.json --store ./.evalsnap; \
	code=$$?; echo "evalsnap exited $$code (0 passed, 1 quality failure, 3 incomplete; the demo has cases designed to fail)"; \
	test $$code -le 3

## The test suite (starts one prefect server for every pytest-xdist worker, a second one that
## records events and task runs for the tests that read them, and moto and fake-gcs-server on
## 127.0.0.1). One worker more than there are cores, at most 4: the suite is CPU-bound, but
## its tests also wait (on subprocesses, deadlines, a grace period), and a third worker on 2
## cores fills those waits (measured: 10 min 55 s with 3 workers, 12 min 55 s with 2 and a CPU sampler).
## --dist loadfile keeps each module on one worker, so a module's fixtures (its demo runs)
## are made once, not per worker; --no-loadscope-reorder hands modules out longest first
## (tests/conftest.py LONGEST_FIRST).
WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) + 1))")
## compileall first: the hundreds of processes the suite starts (the CLI, scoring processes,
## servers) import compiled modules even where PYTHONDONTWRITEBYTECODE is set, instead of
## each compiling the project again (measured: ~30 % of a CLI process's imports).
test: $(STAMP)
	$(BIN)/python -m compileall -q evalsnap storage flows tasks examples bench tests
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(BIN)/python -m bench --suite

lint: $(STAMP)
	$(BIN)/ruff check evalsnap storage flows tasks tests bench
	$(BIN)/mypy evalsnap storage tasks flows bench

clean:
	rm -rf .evalsnap examples/shop_agent/.adk
