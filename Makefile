# Two entry points for a fresh machine with Python 3.11 and make: `make demo` and `make test`.
# Each creates its environment and installs what it needs on first use (`make demo`: .venv-demo, `make test`:
# .venv). `make test` also builds the TPU stack's own environment (.venv-tpu: Python 3.12, tensorflow-tpu) and
# runs the TPU-relevant tests there on the CPU.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
REQUIREMENTS := $(wildcard tpu_pretrain/requirements/*.txt)
STAMP := $(VENV)/.installed
TPU_VENV := .venv-tpu
# What the TPU stack job runs with the TPU build (TensorFlow 2.19's tensorflow-tpu; the main suite has 2.21), and
# only there: the environment checks, the model and checkpoints; the demo before them (40 steps: the path, not the
# figures) trains, evaluates and exports end to end. Training, resume and compilation run in the main suite: they
# were run here again (about 10 minutes) and found nothing the demo does not reach; so do evaluation and export
# (70 s of this job's 131; four of their tests need torch or MiniLM, which this environment lacks).
# Every suite runs on TEST_WORKERS pytest-xdist workers, each test file whole on one (its module fixtures made once):
# the tests wait on processes, sockets and files about a third of their time, so two workers on two cores took the
# main suite from 38 to 24 minutes, and a third fills the waits two leave (docs/development.md).
TEST_WORKERS ?= 3
PYTEST := -m pytest -q -ra --durations=20 -n $(TEST_WORKERS) --dist loadfile
TPU_STACK_TESTS := tests/test_tpu_stack.py tests/tf_backend/test_model.py tests/core/test_checkpoints.py

.PHONY: install test test-main install-tpu-stack test-tpu-stack tpu-stack-demo tpu-stack-tests lint demo clean \
	install-jax-stack test-jax-stack install-tpu-images test-tpu-images

install: $(STAMP)

# The test environments install with uv, from the same index and pip's local wheels (PIP_FIND_LINKS, where set):
# `.venv` took 141 s instead of pip's 488 s here, which `make test` waits for before its first test. Bytecode is
# written by the first process that imports a module, not compiled at install: the tests import a fraction of what
# the environments hold (compiling all of `.venv-jax` takes 92 s of CPU, what a JAX and torch process imports 14 s).
# Hence PYTHONDONTWRITEBYTECODE is not passed on (these machines set it: with it and no bytecode compiled at
# install, every process compiled what it imported again, and the main suite took 2,240 s instead of 1,619).
unexport PYTHONDONTWRITEBYTECODE
UV = $(1)/bin/python -m uv pip install --quiet --python $(1)/bin/python \
	$(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

$(STAMP): setup.cfg pyproject.toml Makefile $(REQUIREMENTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel uv
	# [cpu]: the pinned standard TensorFlow with its tf-keras (tpu_pretrain/requirements/cpu_gpu.txt).
	$(call UV,$(VENV)) -e ".[cpu,dev,beam]"
	# bert4keras 0.11.5 pins keras<=2.3.1, which would pull an ancient Keras: install without deps.
	$(call UV,$(VENV)) --no-deps -r tpu_pretrain/requirements/no_deps.txt
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

# `make test`: the main suite, then the JAX job (each CPU-bound on two cores: the two side by side took longer, see
# docs/development.md), while the next jobs' environments install in the background; then the TPU images' tests, the
# TPU stack's demo and its tests side by side (each mostly one process at a time: three keep both cores busy, 242 s
# instead of 270 with the demo and the tests one after the other), each one's output whole when it ends.
# An install that fails prints its log.
test:
	@$(MAKE) --no-print-directory install-jax-stack install-tpu-images > .install-jax-images.log 2>&1 & \
	$(MAKE) --no-print-directory test-main; rc=$$?; \
	wait $$! || { cat .install-jax-images.log; exit 1; }; exit $$rc
	@$(MAKE) --no-print-directory install-tpu-stack > .install-tpu-stack.log 2>&1 & \
	$(MAKE) --no-print-directory test-jax-stack; rc=$$?; \
	wait $$! || { cat .install-tpu-stack.log; exit 1; }; exit $$rc
	$(MAKE) --no-print-directory -j3 --output-sync=target test-tpu-images tpu-stack-demo tpu-stack-tests

# The TPU stack's test files run in its job only (their tests of the standard build, of released weights and of
# evaluation and export are in files of their own, here).
test-main: lint
	$(BIN)/python $(PYTEST) $(addprefix --ignore=,$(TPU_STACK_TESTS)); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

# The TPU environment, built by the code the notebooks run on a TPU VM (reused while its files are unchanged),
# then the demo and the tests with the TPU build on the CPU (the package sets TPU_LOAD_LIBRARY=0 off a TPU VM).
install-tpu-stack: $(STAMP)
	$(BIN)/tpu-pretrain tpu-env --venv $(TPU_VENV) --extras test

test-tpu-stack: tpu-stack-demo tpu-stack-tests

tpu-stack-demo: install-tpu-stack
	rm -rf $(TPU_VENV)/demo_run
	$(TPU_VENV)/bin/python -c "from tpu_pretrain.demo import run_demo; run_demo('$(TPU_VENV)/demo_run', steps=40)"

tpu-stack-tests: install-tpu-stack
	$(TPU_VENV)/bin/python $(PYTEST) -p no:cacheprovider $(TPU_STACK_TESTS)

# -- The JAX backend without TensorFlow or bert4keras, with the newest JAX: .venv-jax ----------------------------
# Keras 3 + JAX (CPU) and what the package's training and export need; the package itself with --no-deps
# (its notebook dependencies are not needed here). `make test` runs these tests after the main suite (about 9 min),
# and installs this environment while the main suite runs. Its Python is a 3.12 where one is found (on PATH or
# pyenv's), as JAX 0.11 and later need one: the JAX a GPU user's `pip install` gets (the H200 ran 0.11.2), where the
# main suite's Python 3.11 stops at 0.10.2 (one bound failed under 0.12.0.1 that 0.10.2 passed); the free TPU images'
# own JAX releases are the images' environments' (below). Found as the TPU environment finds its Python (3.12 first).
JAX_VENV := .venv-jax
JAX_STAMP := $(JAX_VENV)/.installed
JAX_PYTHON ?= $(or $(shell $(PYTHON) -c 'from tpu_pretrain.tf_backend.setup.tpu_env import find_python; \
	print(find_python() or "")' 2>/dev/null),$(PYTHON))
VERSION_OF = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
JAX_STACK_PACKAGES := "jax[cpu]>=0.4.30" "keras>=3.5" numpy "sentencepiece>=0.2" "tokenizers>=0.20" "jieba>=0.42" \
	"google-cloud-storage>=2.14" "google-crc32c>=1.5" tqdm pyyaml psutil setuptools matplotlib "numba>=0.59" \
	pytest pytest-xdist safetensors "transformers>=4.40" torch==2.13.0

install-jax-stack: $(JAX_STAMP)

$(JAX_STAMP): setup.cfg pyproject.toml Makefile
	test "$(call VERSION_OF,$(JAX_VENV)/bin/python)" = "$(call VERSION_OF,$(JAX_PYTHON))" || \
		$(JAX_PYTHON) -m venv --clear $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel uv
	$(call UV,$(JAX_VENV)) $(JAX_STACK_PACKAGES)
	$(call UV,$(JAX_VENV)) --no-deps -e .
	! $(JAX_VENV)/bin/python -c "import tensorflow" 2>/dev/null  # the point of this environment
	touch $@

test-jax-stack: $(JAX_STAMP)
	$(JAX_VENV)/bin/python $(PYTEST) tests/jax_backend


# -- The free TPUs' images, package for package, on the CPU: .venv-colab (Python 3.13) and .venv-kaggle (3.12) -------
# Each built from its pins (tests/environments/*.txt) with the project installed into it as a user would; there the
# training step is compiled for v5e-1, v5e-8 and v6e-1 by the image's own TPU compiler (the plan command), and the
# TPU notebook of that platform runs on a simulated TPU runtime (CPU devices standing in for the chips).
IMAGE_TESTS := tests/jax_backend/test_plan.py tests/test_notebooks.py -m tpu_image

.venv-%/.installed: tests/environments/%_tpu.txt scripts/build_image_env.py setup.cfg pyproject.toml
	$(PYTHON) scripts/build_image_env.py .venv-$* $<
	touch $@

install-tpu-images: .venv-colab/.installed .venv-kaggle/.installed

test-tpu-images: install-tpu-images
	TPU_PRETRAIN_IMAGE=colab .venv-colab/bin/python $(PYTEST) -p no:cacheprovider $(IMAGE_TESTS)
	TPU_PRETRAIN_IMAGE=kaggle .venv-kaggle/bin/python $(PYTEST) -p no:cacheprovider $(IMAGE_TESTS)


# -- The demo's own environment, .venv-demo: the package and the JAX backend (Keras 3 on JAX, CPU), nothing else ----
# (no TensorFlow, PyTorch, transformers, Beam, ruff or storage emulator: the demo uses none of them; `make test` keeps
# its complete .venv).
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): setup.cfg pyproject.toml Makefile
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(DEMO_VENV)/bin/python -m pip install --quiet -e ".[jax]"
	touch $@

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/tpu-pretrain demo --output_dir demo_run

clean:
	rm -rf $(VENV) $(TPU_VENV) $(JAX_VENV) $(DEMO_VENV) .venv-colab .venv-kaggle demo_run .pytest_cache .ruff_cache *.egg-info
