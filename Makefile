# The README's two commands are `make demo` and `make test`; both bootstrap .venv on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit twin ssh slurm checks lint build checkov bench chaos clean lifecycle

$(STAMP): pyproject.toml twin/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./twin
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hpops demo $(if $(JSON),--json $(JSON))

test: $(STAMP) checks
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

twin: $(STAMP)
	$(BIN)/pytest -q tests/twin

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

build: $(STAMP)
	$(BIN)/sam build --template template.yaml --build-dir .aws-sam/build

# checkov has its own venv: its pins would fight aws-sam-cli's. Skips are justified in
# .checkov.yaml (every function) and in template.yaml (each resource's Metadata).
CHECKOV := .venv-checkov
$(CHECKOV)/.installed:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(CHECKOV)
	$(CHECKOV)/bin/pip install --quiet checkov==3.3.30
	@touch $@

checkov: $(CHECKOV)/.installed
	$(CHECKOV)/bin/checkov --config-file .checkov.yaml

bench: $(STAMP)
	$(BIN)/hpops bench $(if $(JSON),--json $(JSON))

# Hostile inputs, injected AWS faults, duplicate/reordered/burst delivery: make chaos [JSON=file]
chaos: $(STAMP)
	$(BIN)/python -m hpops_twin.chaos $(if $(JSON),--json $(JSON))

# The node agent bundle for the cluster's lifecycle scripts: make lifecycle STACK=<stack-name>
lifecycle: $(STAMP)
	$(BIN)/hpops lifecycle --stack-name $(STACK) --out dist/lifecycle

clean:
	rm -rf .aws-sam .pytest_cache bench-results dist .venv-checkov
