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
	$(VENV)/bin/lensopt profile spaces/quickstart.toml --tp 1 --batch 4
	$(VENV)/bin/lensopt predict spaces/quickstart.toml --tp 1 --batch 4 --buckets 64,128,256,512 --input-len 30,100,200,300 --output-len 90,150,40,180
	$(VENV)/bin/lensopt measure spaces/quickstart.toml --tp 1 --batch 4 --buckets 64,128,256,512 --input-len 30,100,200,300 --output-len 90,150,40,180

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/accuracy.py

clean:
	rm -rf $(VENV) build *.egg-info
