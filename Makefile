# Two entry points for a fresh machine with Python 3.11 and make: `make demo` and `make test`.
# Each creates .venv and installs everything it needs on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TF_VERSION ?= 2.21.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TF_VERSION)

.PHONY: install test lint demo clean install-jax-stack test-jax-stack

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	# TensorFlow and tf-keras must share a minor version (Keras 2 for bert4keras).
	$(BIN)/python -m pip install --quiet "tensorflow==$(TF_VERSION)" "tf-keras==$(TF_VERSION)" -e ".[dev]"
	# bert4keras 0.11.5 pins keras<=2.3.1, which would pull an ancient Keras: install without deps.
	$(BIN)/python -m pip install --quiet --no-deps "bert4keras==0.11.5"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -ra; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# -- The JAX backend without TensorFlow or bert4keras, as on Colab's TPU image: .venv-jax --------------
# Keras 3 + JAX (CPU) and the package's other dependencies; the package itself with --no-deps, since
# install_requires still names TensorFlow. `make test` runs these tests too (they add ~2 min of install on a
# fresh clone and ~4 min of tests).
JAX_VENV := .venv-jax
JAX_STAMP := $(JAX_VENV)/.installed
JAX_STACK_PACKAGES := "jax[cpu]>=0.4.30" "keras>=3.5" numpy "sentencepiece>=0.2" "tokenizers>=0.20" "jieba>=0.42" \
	"google-cloud-storage>=2.14" "google-crc32c>=1.5" tqdm pyyaml psutil setuptools matplotlib \
	pytest safetensors "transformers>=4.40" torch==2.13.0

install-jax-stack: $(JAX_STAMP)

$(JAX_STAMP): setup.cfg pyproject.toml Makefile
	test -x $(JAX_VENV)/bin/python || $(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(JAX_VENV)/bin/python -m pip install --quiet $(JAX_STACK_PACKAGES)
	$(JAX_VENV)/bin/python -m pip install --quiet --no-deps -e .
	! $(JAX_VENV)/bin/python -c "import tensorflow" 2>/dev/null  # the point of this environment
	touch $@

test-jax-stack: $(JAX_STAMP)
	$(JAX_VENV)/bin/python -m pytest -q -ra tests/jax_backend

test: test-jax-stack

demo: $(STAMP)
	$(BIN)/tpu-pretrain demo --output_dir demo_run

clean:
	rm -rf $(VENV) $(JAX_VENV) demo_run .pytest_cache .ruff_cache *.egg-info
