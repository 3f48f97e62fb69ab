# Every target bootstraps .venv from nothing: a fresh clone needs only python3.11 and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1

.PHONY: install export-tools demo test-deps test test-fast lint typecheck reports bench bench-quick validate clean

# What pip installs from: pyproject.toml less its [tool.ruff], [tool.mypy] and [tool.pytest] tables,
# setup.py and constraints.txt. Their digest is rewritten only when it changes, so editing the lint,
# type-check or test configuration does not reinstall the venv.
INSTALL_INPUTS := $(VENV)/.install-inputs
$(INSTALL_INPUTS): pyproject.toml setup.py constraints.txt
	mkdir -p $(VENV)
	$(PY) -c 'import hashlib, json, tomllib; d = tomllib.load(open("pyproject.toml", "rb")); \
	  [d.get("tool", {}).pop(k, None) for k in ("ruff", "mypy", "pytest")]; \
	  t = json.dumps(d, sort_keys=True) + open("setup.py").read() + open("constraints.txt").read(); \
	  print(hashlib.sha256(t.encode()).hexdigest())' > $@.new
	if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(STAMP): $(INSTALL_INPUTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# torchvision for tests/test_stock_models.py only, in a folder of its own that no sys.path names:
# PyPI's torchvision is a CUDA build whose C++ ops (libtorch_cuda) do not load beside the CPU torch,
# and on sys.path it breaks `import transformers`. --no-deps keeps pip from touching the venv's torch;
# the test fixture (tests/fixtures/user_models/stock_torchvision.py) imports the classifiers' pure-Python
# code from here. Each torchvision release requires one torch release: 0.28.0 is 2.13.0's (constraints.txt).
TORCHVISION_DIR := $(VENV)/torchvision
TORCHVISION_STAMP := $(TORCHVISION_DIR)/.installed
$(TORCHVISION_STAMP): $(STAMP) Makefile
	$(BIN)/pip install -q --no-deps --upgrade --target $(TORCHVISION_DIR) torchvision==0.28.0 pillow
	touch $(TORCHVISION_STAMP)

# The real DeepSpeed, accelerate, Megatron-Core and torchtitan that tests/test_export_parsers.py feeds every
# export to, in a venv of their own (their pins, tests/export-tools.txt, are not the project's dependencies);
# torchtitan 0.2.2 beside it for the 0.2 TOML export. About a minute with a warm pip cache.
EXPORT_VENV := .venv-exports
EXPORT_STAMP := $(EXPORT_VENV)/.installed
$(EXPORT_STAMP): tests/export-tools.txt constraints.txt
	test -x $(EXPORT_VENV)/bin/python || $(PY) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(EXPORT_VENV)/bin/pip install -q -c constraints.txt torch -r tests/export-tools.txt
	$(EXPORT_VENV)/bin/pip install -q --no-deps --upgrade --target $(EXPORT_VENV)/torchtitan-0.2 torchtitan==0.2.2
	touch $(EXPORT_STAMP)

export-tools: $(EXPORT_STAMP)

# The demo writes only under build/demo (ignored by git): a fresh clone stays clean, and nothing
# outside the repository changes. `make reports` regenerates the checked-in reports/demo.
demo: $(STAMP)
	$(BIN)/python -m meshplan.demo --out build/demo

# System packages for two optional test groups, on the test/CI path only (.ci/run calls this;
# install and demo never touch the system): iproute2 (ip netns, tc) for benchmarks/slow_link.py and
# its tests, chromium for tests/test_report_browser.py. Installs only the missing ones, with
# apt-get as root, saying which; otherwise says which tests will skip. Never fatal.
SYSTEM_TEST_PACKAGES_MISSING = $(strip $(if $(shell command -v tc),,iproute2) $(if $(shell command -v chromium),,chromium))

test-deps:
	@missing="$(SYSTEM_TEST_PACKAGES_MISSING)"; \
	if [ -z "$$missing" ]; then echo "test-deps: iproute2 and chromium are installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "test-deps: installing system packages with apt-get: $$missing (and their dependencies)"; \
	  DEBIAN_FRONTEND=noninteractive timeout 900 sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing" \
	    >/dev/null 2>&1 || echo "test-deps: apt-get could not install $$missing: the slow-link and browser tests will skip"; \
	else echo "test-deps: not installing $$missing (needs root and apt-get): the slow-link and browser tests will skip"; fi

# Two pytest workers, a test file each at a time (pytest-xdist --dist loadfile: a file's module-scoped
# launches run once): the multi-rank tests wait on timeouts and signals while single-process ones
# compute, 23 -> 16 min on 2 cores. TEST_WORKERS=0 runs them in one process. The 30 slowest tests are listed
# at the end (where CI time goes).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30

test: $(STAMP) $(EXPORT_STAMP) $(TORCHVISION_STAMP)
	$(PYTEST) tests

test-fast: $(STAMP) $(TORCHVISION_STAMP)
	$(PYTEST) -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy sees the installed layout: planner/, profiler/, executor/, models/ under meshplan/ (setup.py)
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/meshplan
	for f in meshplan/*; do ln -s "$(CURDIR)/$$f" build/typecheck/meshplan/; done
	for d in planner profiler executor models; do ln -s "$(CURDIR)/$$d" build/typecheck/meshplan/$$d; done
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p meshplan

reports: $(STAMP)
	$(BIN)/python -m meshplan.examples --out reports
	$(BIN)/meshplan validate -o reports/validation.md
	$(BIN)/python -m benchmarks.heldout_runs --out reports > /dev/null

validate: $(STAMP)
	$(BIN)/meshplan validate -o reports/validation.md

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run --out reports

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick --out reports

clean:
	rm -rf $(VENV) $(EXPORT_VENV) build *.egg-info
