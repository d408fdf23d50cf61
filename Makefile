# The README's two commands are `make demo` and `make test`; both bootstrap .venv on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit twin ssh slurm checks lint build checkov bench chaos clean lifecycle docs

# pip stays quiet, so each bootstrap step says what it starts, "N s so far" every 15 s, and its
# seconds when it ends: a fresh clone would otherwise sit silent for a minute. The ticker's sleep
# writes to /dev/null, so once the ticker is killed nothing holds a pipe (make ... | tee) open.
STEP_FUNCTION = step() { \
	  what=$$1; shift; echo "$$what ..."; start=$$(date +%s); \
	  ( while sleep 15 >/dev/null 2>&1; do echo "  ... $$(( $$(date +%s) - start )) s so far"; done ) & ticker=$$!; \
	  "$$@"; status=$$?; kill $$ticker 2>/dev/null; \
	  if [ $$status -ne 0 ]; then echo "$$what: failed after $$(( $$(date +%s) - start )) s"; exit $$status; fi; \
	  echo "$$what: done in $$(( $$(date +%s) - start )) s"; \
	}

# The direct requirements pip is about to resolve, read from the pyproject files it installs.
REQUIREMENTS = $(PYTHON) -c 'import re, tomllib; \
	main = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	twin = tomllib.load(open("twin/pyproject.toml", "rb"))["project"]; \
	wanted = main["dependencies"] + main["optional-dependencies"]["dev"] + twin["dependencies"]; \
	print(", ".join(n for n in (re.split(r"[^A-Za-z0-9_.-]", r)[0] for r in wanted) if n != main["name"]))'

$(STAMP): pyproject.toml twin/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@$(STEP_FUNCTION); began=$$(date +%s); \
	step "venv: creating $(VENV) with $(PYTHON)" $(PYTHON) -m venv $(VENV) && \
	step "venv: upgrading pip" $(BIN)/pip install --quiet --upgrade pip && \
	echo "venv: hpops[dev] and ./twin need $$($(REQUIREMENTS))" && \
	step "venv: installing them and what they depend on (pip install -e '.[dev]' -e ./twin)" \
	  $(BIN)/pip install --quiet -e '.[dev]' -e ./twin && \
	echo "venv: ready in $$(( $$(date +%s) - began )) s, $$($(BIN)/pip list --format=freeze 2>/dev/null | wc -l) packages in $(VENV)"
	@touch $(STAMP)

# Unbuffered (python -u): through a pipe or a CI log the demo's steps and the bench's sections
# would otherwise arrive in blocks, or only at the end.
demo bench: export PYTHONUNBUFFERED = 1

demo: $(STAMP)
	@echo "hpops demo: loading the twin (moto); each step prints as it starts, with the seconds since the start"
	$(BIN)/hpops demo $(if $(JSON),--json $(JSON))

# The suite runs over the machine's CPUs (pytest-xdist): a test that uses a resource of the whole
# machine (real sshd users, Slurm's daemons, network namespaces) carries its marker and runs in that
# resource's xdist group, one at a time (tests/conftest.py, tests/README.md). WORKERS=0: one process.
# PYTEST_ARGS: more pytest options, e.g. a shuffled order (tests/README.md).
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST_ARGS ?=
PYTEST := $(BIN)/pytest -q -n $(WORKERS) --dist loadgroup $(PYTEST_ARGS)

# sam build first (tests/unit/test_footprint.py measures the layers it builds); the other template
# checks (sam validate --lint, cfn-lint, checkov with its venv) run beside the tests, which read
# nothing they write and wait on moto's threads and real daemons as much as they compute; their
# output follows the tests'. The summary names the 20 slowest tests, then each directory's share
# and each worker's CPU and peak memory (--suite-times: bench-results/suite-times.json keeps them; a pytest
# that a test runs inside the suite is not given the option, so it cannot overwrite them).
test: $(STAMP) build
	@began=$$(date +%s); mkdir -p bench-results; \
	$(MAKE) --no-print-directory lint checkov > bench-results/checks.log 2>&1 & checks=$$!; \
	$(PYTEST) --durations=20 --suite-times=bench-results/suite-times.json; tested=$$?; \
	wait $$checks; checked=$$?; \
	echo "make lint checkov (beside the tests), exit $$checked:"; cat bench-results/checks.log; \
	echo "make test: tests exit $$tested, checks exit $$checked, $$(( $$(date +%s) - began )) s after sam build"; \
	[ $$tested -eq 0 ] && [ $$checked -eq 0 ]

unit: $(STAMP)
	$(PYTEST) tests/unit

twin: $(STAMP)
	$(PYTEST) tests/twin

ssh: $(STAMP)
	$(BIN)/pytest -q -m realssh

# A real one-node Slurm with slurmdbd accounting (needs root; .ci/run installs the packages).
slurm: $(STAMP)
	$(BIN)/pytest -q -m realslurm

# Template and state machine checks, all offline.
checks: lint build checkov

lint: $(STAMP)
	$(BIN)/sam validate --lint --template template.yaml
	$(BIN)/cfn-lint template.yaml
	$(BIN)/cfn-lint -t docs/deployer-role.json

build: $(STAMP)
	$(BIN)/sam build --template template.yaml --build-dir .aws-sam/build

# checkov has its own venv: its pins would fight aws-sam-cli's. Skips are justified in
# .checkov.yaml (every function) and in template.yaml (each resource's Metadata).
CHECKOV := .venv-checkov
$(CHECKOV)/.installed:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@$(STEP_FUNCTION); \
	step "checkov venv: creating $(CHECKOV) with $(PYTHON)" $(PYTHON) -m venv $(CHECKOV) && \
	step "checkov venv: installing checkov==3.3.30 and what it depends on" \
	  $(CHECKOV)/bin/pip install --quiet checkov==3.3.30
	@touch $@

checkov: $(CHECKOV)/.installed
	$(CHECKOV)/bin/checkov --config-file .checkov.yaml

# Progress (each section as it starts, its seconds when it ends) goes to stderr; the tables to stdout.
# make bench JSON=docs/bench.json refreshes the figures the README quotes (tests/unit/test_readme.py).
bench: $(STAMP)
	$(BIN)/hpops bench $(if $(JSON),--json $(JSON))

# Hostile inputs, injected AWS faults, duplicate/reordered/burst delivery: make chaos [JSON=file]
chaos: $(STAMP)
	$(BIN)/python -m hpops_twin.chaos $(if $(JSON),--json $(JSON))

# The node agent bundle for the cluster's lifecycle scripts: make lifecycle STACK=<stack-name>
lifecycle: $(STAMP)
	$(BIN)/hpops lifecycle --stack-name $(STACK) --out dist/lifecycle

# The docs/ pages generated from template.yaml (tests/unit/test_generated_docs.py holds them to it).
docs: $(STAMP)
	$(BIN)/python -m hpops_twin.generated_docs parameters > docs/parameters.md
	$(BIN)/python -m hpops_twin.generated_docs deployer-policy > docs/deployer-policy.json
	$(BIN)/python -m hpops_twin.generated_docs deployer-role > docs/deployer-role.json

clean:
	rm -rf .aws-sam .pytest_cache bench-results dist .venv-checkov
