# mirage-rs developer entry points. Needs only python3, cargo (rustup) and gcc.
#   make demo   - set up .venv, build + install the extension, run examples/quickstart.py
#   make test   - lint, then cargo tests (release) and pytest
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test
.NOTPARALLEL:

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check

# Stamp files: a second `make test` neither reinstalls nor rebuilds needlessly.
VENV_STAMP    := $(VENV)/.installed
DEVELOP_STAMP := $(VENV)/.develop
WHEEL_STAMP   := wheels/.built

# Everything that ends up in the wheel (Rust crates + pure-Python package).
SOURCES := Cargo.toml pyproject.toml $(wildcard Cargo.lock) \
	$(shell find src crates python -type f -not -name '*.pyc' -not -name '*.so' 2>/dev/null)
PY_DIRS := $(wildcard python tests examples benches)

.PHONY: venv develop wheel demo lint test bench clean distclean

venv: $(VENV_STAMP)
$(VENV_STAMP): requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -r requirements-test.txt
	touch $@

wheel: $(WHEEL_STAMP)
$(WHEEL_STAMP): $(VENV_STAMP) $(SOURCES)
	rm -rf wheels
	$(VENV)/bin/maturin build --release -o wheels
	touch $@

develop: $(DEVELOP_STAMP)
$(DEVELOP_STAMP): $(WHEEL_STAMP)
	$(PIP) install -q --force-reinstall --no-deps wheels/*.whl
	touch $@

demo: develop
	$(PY) examples/quickstart.py

lint: $(VENV_STAMP)
	cargo clippy --version >/dev/null 2>&1 && cargo fmt --version >/dev/null 2>&1 \
		|| rustup component add clippy rustfmt
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)

test: lint develop
	cargo test --workspace --release
	$(PY) -m pytest -q

bench:
	cargo bench

clean:
	cargo clean
	rm -rf wheels $(DEVELOP_STAMP) .pytest_cache .ruff_cache .hypothesis

distclean: clean
	rm -rf $(VENV)
