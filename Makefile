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

## The test suite (starts one prefect server for every pytest-xdist worker, and moto and
## fake-gcs-server on 127.0.0.1; one worker per core, at most 4). --dist loadfile keeps each
## module on one worker, so a module's fixtures (its demo runs) are made once, not per worker;
## --no-loadscope-reorder hands modules out longest first (tests/conftest.py LONGEST_FIRST).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(BIN)/python -m bench --suite

lint: $(STAMP)
	$(BIN)/ruff check evalsnap storage flows tasks tests
	$(BIN)/mypy evalsnap storage tasks flows

clean:
	rm -rf .evalsnap examples/shop_agent/.adk
