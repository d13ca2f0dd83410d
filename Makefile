# Two commands on a fresh machine:  make demo   (main job)   and   make test   (the suite)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# test workers (pytest-xdist); 1 runs the suite in this process, one test after another
TEST_WORKERS ?= 2
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lensopt run spaces/quickstart.toml

test: $(STAMP)
ifeq ($(TEST_WORKERS),1)
	$(PY) -m pytest -q
else
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal
endif

bench: $(STAMP)
	$(PY) benchmarks/accuracy.py
	$(PY) benchmarks/search_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
