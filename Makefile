# Two commands on a fresh machine:  make demo   (main job)   and   make test   (the suite)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
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
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/accuracy.py
	$(PY) benchmarks/search_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
