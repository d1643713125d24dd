# Two entry points that set up everything on a fresh machine:
#   make demo   run the example suite on the embedded default (local engine) and print scores
#   make test   install what the tests need, start their services, run every check and test
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: setup grader-env sandboxes demo test nightly check lint typecheck crds-check system-deps native-proxy images
setup:
	bash .ci/python.sh
	bash .ci/grader-env.sh >/dev/null
	bash .ci/wordnet.sh

# The grader environment (packages graders may import: sandbox_image/evalkube_sandbox/
# grader-env.lock.txt, and nltk-data.lock.txt's corpora) in a cache outside the work tree; prints its
# folder. Cached by the two locks.
grader-env:
	bash .ci/grader-env.sh | tail -1

# The isolating sandboxes `evalkube run --sandbox auto` chooses from: gVisor's runsc at the
# project's pin (built from Go modules by .ci/gvisor.sh, cached), bubblewrap, nsjail.
sandboxes: setup
	EVALKUBE_PYTHON=$(VENV)/python bash .ci/sandboxes.sh

demo:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup sandboxes && \
	  $(VENV)/evalkube run examples/recipes/suite.yaml --output results.json && \
	  echo "make demo: done in $$(( $$(date +%s) - start )) s"

# The native model bridge proxy (needs Go); `evalkube proxy` uses it when it is on PATH.
native-proxy: setup
	cp "$$(bash .ci/proxy.sh | tail -1)" .venv/bin/evalkube-proxy

# The evalkube and grader images from their Dockerfiles, without a registry or Docker engine
# (buildah, local Debian bases); prints the folder of the docker-archive tars.
images:
	bash .ci/images.sh

system-deps: sandboxes
	bash .ci/postgres.sh
	bash .ci/browser.sh

lint: setup
	$(VENV)/ruff check operator sandbox_image tests benchmarks
	$(VENV)/ruff format --check operator sandbox_image tests benchmarks
	$(VENV)/lint-imports --no-cache

typecheck: setup
	$(VENV)/mypy

crds-check: setup
	$(VENV)/evalkube crds --check

test: setup system-deps lint typecheck crds-check
	bash .ci/test.sh

# The tests too slow for every CI run (marker nightly: real-node faults, docs/operator.md,
# "What survives what"), for a nightly job: the same set-up as `make test`, then only them.
nightly: setup system-deps
	EVALKUBE_NIGHTLY=1 bash .ci/test.sh -m nightly tests/realnode

# The inner loop: lint, types, CRD drift, every test module collected (mypy reads operator/
# only: a test importing a moved name fails here, not an hour into `make test`) and the unit
# tests (no services, no sandboxes, no cluster). CI always runs `make test`.
check: lint typecheck crds-check
	@out=$$($(VENV)/python -m pytest -q --collect-only tests 2>&1) || { echo "$$out" | tail -40; exit 1; }
	$(VENV)/python -m pytest -q tests/unit
