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

# Everything but the long Ray tests (`ray_long`); the Ray tests in it share one local cluster.
test: $(STAMP)
	$(PY) -m pytest -m "not ray_long"

# The long Ray tests: training on a two-node Ray cluster (ray.cluster_utils.Cluster) joined through rl.ray_address.
test-ray-long: $(STAMP)
	$(PY) -m pytest -m ray_long

# The full suite less the `slow` tests (the fault-injection suite and the end-to-end training runs), for the edit loop.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
