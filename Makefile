# Every target makes and fills the virtualenv itself, so a fresh clone needs nothing else.
# Two stamps: `make run` installs only what a server needs (`pip install -e .`); the targets that
# develop DMQ (test, lint, proto, bench) add the `test` and `spark` extras (PySpark alone is ~1 GB).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
DMQ_PORT ?= 9091
DMQ_DATA_DIR ?= ./dmq-data

.PHONY: run test check proto bench lint clean venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP) $(DEV_STAMP)

## venv: the full development virtualenv (server, tests, tools, PySpark)
venv: $(DEV_STAMP)

## run: start the embedded server (coordinator + broker on port 9091, data in ./dmq-data); installs no extras
run: $(STAMP)
	exec $(VENV)/bin/dmq server --port $(DMQ_PORT) --data-dir $(DMQ_DATA_DIR)

## test: install the test and Spark extras, lint, and run the whole suite
# In TEST_WORKERS pytest-xdist workers: most tests wait on servers, timers and child processes,
# so three share two cores well. --dist loadgroup: tests are handed out one by one (the longest
# folders first), the Spark tests as one group sharing a SparkSession (tests/conftest.py).
TEST_WORKERS ?= 3
test: lint
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests

## check: the fast inner loop (under 3 minutes): ruff, then the unit, integration, asyncio and
## security tests that start no process of their own (real servers on loopback ports inside the
## test process) and are not marked slow; `make test` runs everything.
CHECK_MARKS := not processes and not slow
check: $(DEV_STAMP)
	$(VENV)/bin/ruff check proto broker coordinator client tests bench
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "$(CHECK_MARKS)" \
		tests/unit tests/integration tests/aio tests/security

## proto: regenerate the committed gRPC stubs from proto/dmq.proto
proto: $(DEV_STAMP)
	$(PY) -m dmq.proto.generate

## bench: run the benchmark scripts (figures go into bench/RESULTS.md by hand)
bench: $(DEV_STAMP)
	$(PY) bench/codec_bench.py
	$(PY) bench/log_bench.py --size 268435456
	$(PY) bench/produce_consume.py
	$(PY) bench/consumer_bench.py
	$(PY) bench/rebalance_bench.py
	$(PY) bench/spark_bench.py
	$(PY) bench/spark_small_ranges.py

## lint: ruff, then mypy ([tool.mypy] in pyproject.toml: strict for the whole tree, bar the checks it relaxes per module)
# mypy reads `dmq` under its import names from build/mypy/dmq/, links to the top-level folders
# (the editable install maps them through an import hook mypy cannot follow).
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check proto broker coordinator client tests bench
	rm -rf build/mypy && mkdir -p build/mypy/dmq
	for part in proto broker coordinator client; do ln -s ../../../$$part build/mypy/dmq/$$part; done
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist *.egg-info
