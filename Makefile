# The two entry points of the README. Each creates .venv if missing and installs what it needs:
# torch==2.13.0 first (the CPU build; a bare `torch` requirement would pull CUDA packages), then rewardlab.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-ray-long install clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# --overwrite: the demo replaces runs/quickstart, so `make demo` can be run again.
demo: $(STAMP)
	$(VENV)/bin/rewardlab quickstart --overwrite

# Everything but the long Ray tests (`ray_long`), on TEST_WORKERS pytest-xdist worker processes. --dist loadgroup
# keeps the tests of one xdist_group on one worker (tests/conftest.py): the Ray tests (group "ray") share that worker's
# one local cluster, the sandboxed programs (group "sandbox") run one at a time. TEST_WORKERS=0: this one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -m "not ray_long" -n $(TEST_WORKERS) --dist loadgroup

# The long Ray tests: training on a two-node Ray cluster (ray.cluster_utils.Cluster) joined through rl.ray.address.
test-ray-long: $(STAMP)
	$(PY) -m pytest -m ray_long

# The full suite less the `slow` tests (the fault-injection suite and the end-to-end training runs), for the edit loop.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache

# verl's own environment (verl 0.9.1 pins transformers<5.11, so it cannot share .venv): torch==2.13.0 (CPU) first,
# then rewardlab with its test-base and verl extras (verl, and cachetools, uvicorn and fastapi, which verl imports but lists
# only in its GPU extra). `make test-verl` runs the interop tests (the verl ones skip where verl is not installed) and the
# policy tests under verl's transformers.
VERL_VENV := .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed

.PHONY: test-verl

$(VERL_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV) || python3 -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install --quiet torch==2.13.0
	$(VERL_PY) -m pip install --quiet -e ".[test-base,verl]"
	touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_PY) -m pytest tests/integrations tests/policy -p no:cacheprovider
