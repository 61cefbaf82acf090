# Everything a fresh machine needs: `make test` and `make demo` create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first: the CPU 2.13.0 wheel on this machine; otherwise pip pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# --durations: the slowest tests, to keep the suite inside CI's budget (~30 min on 2 cores)
test: $(STAMP)
	$(PY) -m pytest tests --durations=25

test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow"

# The demo, on an embedded local Ray: (1) the heuristics in the simulator at N=16 and 48, and
# the workflow-first order (fifo, realistic.yaml's default) against the paper's hop order;
# (2) the same stream of agent DAGs on a local heterogeneous multi-node Ray cluster, placed by
# the scheduler and by Ray's own placement, with the comparison printed; (3) the scheduler service
# (Ray Serve) shared by two agent processes while a node is killed, vs Ray's own placement.
DEMO_POLICY ?= scale
demo: $(STAMP)
	$(VENV)/bin/scale-ray eval --policy random round-robin least-loaded fastest-idle eft eft-wait heft \
		--servers 16 48 --episodes 4 --seed 0
	$(VENV)/bin/scale-ray eval --env-config configs/env/realistic.yaml --policy eft@hop eft \
		--servers 16 --episodes 10 --seed 0 --paired-vs eft@hop --metric workflow workflow_p95
	$(VENV)/bin/scale-ray run-workflows --nodes 16 --servers-per-node 4 --workflows 100 \
		--policy $(DEMO_POLICY) ray-default
	$(VENV)/bin/scale-ray bench service --nodes 16 --servers-per-node 4 --clients 2 --workflows 50 \
		--policy $(DEMO_POLICY)

clean:
	rm -rf $(VENV) build *.egg-info
