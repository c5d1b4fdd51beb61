# Two entry points: `make demo` runs the main job on the embedded default (no cluster),
# `make test` runs every check CI runs. Both install what they need into .venv first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test class-archive lint typecheck unit mutation-coordinator images-tools images images-test

# The runtime dependencies are installed at the images' pins (the Dockerfile's deps stage is
# the lock): what the tests run is what ships, and an upstream release cannot change a run.
# uv (at the dev extra's pin) installs them: pip spent 75 s of one core here resolving 150
# pinned packages against PyPI's pages, before any test could start; uv takes 2 s from its
# cache (offline) and fetches only when its cache lacks something.
UV := $(BIN)/uv
# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine), no
# process writes it, and every one compiled what it imports (CI took 9 minutes of CPU more).
UV_INSTALL := $(UV) pip install --quiet --compile-bytecode --python $(BIN)/python \
	--constraint $(VENV)/runtime-pins.txt -e '.[dev,spark]'
$(INSTALLED): pyproject.toml Dockerfile Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "$$(grep -oE 'uv==[0-9.]+' pyproject.toml)"
	grep -oE '^[[:space:]]+[A-Za-z0-9._-]+==[^[:space:]\\]+' Dockerfile | tr -d ' ' \
		> $(VENV)/runtime-pins.txt
	$(UV_INSTALL) --offline 2> /dev/null || $(UV_INSTALL)
	touch $@

demo: $(INSTALLED)
	$(BIN)/python examples/wordcount/demo.py

test: class-archive lint typecheck unit

# The tests' Spark drivers start faster with a class archive (docs/testing.md), whose build
# pytest's start (tests/conftest.py) sets off when it is missing: this runs pytest only that
# far (it shows the cache and exits), so that the build runs beside lint and typecheck, which
# leave a core idle, and the archive is there for the first drivers.
class-archive: $(INSTALLED)
	$(BIN)/python -m pytest --cache-show=spark-class-archive -q

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(INSTALLED)
	$(BIN)/mypy -p spark_checkpoint_operator -p spark_checkpoint

# The image smoke tests (marker `images`: both images build, each starts and answers) are
# part of it, so it needs the image tools (installed here when missing; root, as CI has).
# Four workers (pytest-xdist) on the machine's two cores: many tests mostly wait (the
# operator's simulated jobs use a quarter of a core), so more workers than cores fill what
# fewer leave idle (once: 18.5 minutes of tests with three, 22 to 27 with two). 2026-12-02,
# the suite grown: a fresh clone's CI took 31.5 minutes with four and with three, both cores
# 99% busy throughout (CPU-bound: more workers gain nothing now). tests/conftest.py collects
# the modules that run Spark first, so that the longest tests do not end the run on one
# worker while the others idle (21.3 -> 16.9 minutes).
# compileall: an editable install's own modules are not in site-packages, so no process
# wrote their bytecode (PYTHONDONTWRITEBYTECODE, above) and each of the suite's ~1,000
# Python processes compiled what it imported again (~0.15 s of CPU each).
# The `containers` tests run after, alone: about 2 minutes idle; they hold Podman
# containers that the CPU-bound run beside them would slow past their waits. They broke
# once unnoticed while only `make images-test` ran them (ba7afad).
unit: images-tools $(INSTALLED)
	$(BIN)/python -m compileall -q operator spark_app examples tests/helpers
	$(BIN)/python -m pytest -n 4 --dist worksteal -m "not containers"
	$(BIN)/python -m pytest -m containers tests/image

# The images, built here without Docker: Buildah builds the Dockerfile's targets on a stand-in
# for the official Python image assembled from Debian's packages, Podman runs them
# (tests/helpers/containers.py; caches outside the clone, shared by checkouts and xdist
# workers under a file lock). `make test` runs the smoke tests (marker `images`) and the
# slow ones (marker `containers`: the operator image driving a job, the whole story with
# every pod a container, executors, a pipeline image); this target runs only those
# (README, "The images"). Needs root, as CI has.
IMAGE_TOOLS := podman buildah mmdebstrap runc
images-tools:
	@(for tool in $(IMAGE_TOOLS); do command -v $$tool > /dev/null || exit 1; done) \
		|| { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(IMAGE_TOOLS); }

images: images-tools $(INSTALLED)
	$(BIN)/python tests/helpers/containers.py build

images-test: images-tools $(INSTALLED)
	$(BIN)/python -m pytest -m "containers or images" tests/image

# Mutation testing of the coordinator core (docs/testing.md; CI does not run it: it takes
# many minutes). mutmut names modules after their paths, so it runs in build/mutation,
# where src/ holds the coordinator under its import name; `mutmut results` and
# `mutmut show NAME` there explain a run.
MUTATION := build/mutation
mutation-coordinator: $(INSTALLED)
	rm -rf $(MUTATION)
	mkdir -p $(MUTATION)/src/spark_checkpoint_operator
	cp -r operator/spark_checkpoint_operator/coordinator $(MUTATION)/src/spark_checkpoint_operator/
	rm -rf $(MUTATION)/src/spark_checkpoint_operator/coordinator/__pycache__
	ln -s ../../tests $(MUTATION)/tests
	cp pyproject.toml $(MUTATION)/
	cd $(MUTATION) && ../../$(BIN)/mutmut run --max-children 2
	cd $(MUTATION) && ../../$(BIN)/mutmut results

# Mutation testing of spark_app/spark_checkpoint/storage/ with mutmut (docs/testing.md,
# "Mutation testing: storage"); not part of `make test`. mutmut names mutants by file path, so
# it runs in a staging directory under build/ with the package at the top; the checkout is
# never mutated. Prints the score; the surviving mutants are listed in survivors.txt there.
MUTATION_STORAGE := build/mutation-storage
.PHONY: mutation-storage
mutation-storage: $(INSTALLED)
	rm -rf $(MUTATION_STORAGE)
	mkdir -p $(MUTATION_STORAGE)/tests
	cp -r spark_app/spark_checkpoint $(MUTATION_STORAGE)/spark_checkpoint
	cp -r tests/storage tests/helpers tests/conftest.py $(MUTATION_STORAGE)/tests/
	cp tests/storage/mutmut.toml $(MUTATION_STORAGE)/pyproject.toml
	cd $(MUTATION_STORAGE) && $(abspath $(BIN))/mutmut run --max-children 2 > run.log 2>&1 \
		&& $(abspath $(BIN))/mutmut results > survivors.txt \
		&& $(abspath $(BIN))/mutmut export-cicd-stats \
		&& cat mutants/mutmut-cicd-stats.json && echo && cat survivors.txt
