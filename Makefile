# Two entry points for a fresh machine with Python 3.11 and make: `make demo` and `make test`.
# Each creates .venv and installs everything it needs on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TF_VERSION ?= 2.21.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TF_VERSION)

.PHONY: install test lint demo clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	# TensorFlow and tf-keras must share a minor version (Keras 2 for bert4keras).
	$(BIN)/python -m pip install --quiet "tensorflow==$(TF_VERSION)" "tf-keras==$(TF_VERSION)" -e ".[dev,beam]"
	# bert4keras 0.11.5 pins keras<=2.3.1, which would pull an ancient Keras: install without deps.
	$(BIN)/python -m pip install --quiet --no-deps "bert4keras==0.11.5"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -ra; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

demo: $(STAMP)
	$(BIN)/tpu-pretrain demo --output_dir demo_run

clean:
	rm -rf $(VENV) demo_run .pytest_cache .ruff_cache *.egg-info
