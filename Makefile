# `make demo` runs the main job on a local SLURM cluster; `make test` runs every test. Both install what they need:
# the local cluster's Debian packages (SLURM, munge, MariaDB) and the tool in .venv. `make venv` installs the tool
# alone; `make wheel` builds the package a site installs (docs/deploy.md), which never touches the site's SLURM.
PYTHON ?= python3
VENV := .venv
SYSTEM_PACKAGES := slurm-wlm slurm-client munge libslurm-dev slurmdbd mariadb-server
TEST_PACKAGES := chromium postgresql systemd debootstrap iproute2 procps  # headless browser the HTML report test
# renders the page in; the server the PostgreSQL store tests start; the journald the kernel-log tests run privately
# (tests/journald.py); the root file systems of test-slurm-versions; network namespaces and the process tools of the
# deployment test's emulated hosts
BENCH_PACKAGES := prometheus-node-exporter debootstrap  # bench/telemetry.py's baseline; bench/cluster.py's root
# file systems for the other Slurm releases
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install venv wheel system-packages test soak soak-full unit integration demo bench gpu-check clean cluster-down \
	rootfs test-slurm-versions

install: system-packages $(VENV)/.installed

venv: $(VENV)/.installed

wheel: $(VENV)/.installed
	$(VENV)/bin/pip wheel -q --no-deps -w dist .

system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES) $(EXTRA_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

test unit: EXTRA_PACKAGES = $(TEST_PACKAGES)
bench: EXTRA_PACKAGES = $(BENCH_PACKAGES)

test: install
	$(VENV)/bin/python -m pytest -q --durations=25 tests

# The SLURM-level integration tests on the Slurm of Debian 13 (24.11, with the cgroup file systems mounted) and of
# Debian unstable (26.05, without them), each in a root file system built once by debootstrap from Debian's packages
# and kept under $(ROOTFS_DIR) for the next run (docs/slurm-versions.md).
ROOTFS_DIR ?= /var/cache/sigma/rootfs
SLURM_SUITES ?= trixie sid
SLURM_VERSION_TESTS ?= tests/integration/test_cluster.py tests/integration/test_prolog.py \
	tests/integration/test_controller.py::test_xid79_drains_requeues_reboots_validates_and_resumes

rootfs: EXTRA_PACKAGES = debootstrap
rootfs: install
	@for s in $(SLURM_SUITES); do $(VENV)/bin/python -m sigma.slurm.rootfs --dir $(ROOTFS_DIR) build $$s || exit 1; done

test-slurm-versions: rootfs
	@failed=""; offset=0; for s in $(SLURM_SUITES); do echo "== Slurm of Debian $$s"; offset=$$((offset + 1000)); \
	  case $$s in sid) flags=--no-cgroup;; *) flags=;; esac; \
	  SIGMA_TEST_PORT_OFFSET=$$offset $(VENV)/bin/python -m sigma.slurm.rootfs --dir $(ROOTFS_DIR) run $$flags $$s \
	    -- python -m pytest -q -p no:cacheprovider $(SLURM_VERSION_TESTS) || failed="$$failed $$s"; \
	done; if [ -n "$$failed" ]; then echo "SLURM-level tests failed on:$$failed"; exit 1; fi

soak: install
	$(VENV)/bin/python bench/chaos_soak.py --minutes 20 --seed 3 --signatures 2

# every fault kind once and every catalogue signature once (over an hour; `--shard I/N` splits it)
soak-full: install
	$(VENV)/bin/python bench/chaos_soak.py --minutes 0 --seed 0 --signatures all

unit: install
	$(VENV)/bin/python -m pytest -q tests -m "not integration"

integration: install
	$(VENV)/bin/python -m pytest -q tests -m integration

demo: install
	$(VENV)/bin/sigma demo

# the third-party data sets (loghub, NAB, ASD) some benches read in place; they name it when it is missing
SIGMA_DATA ?= $(abspath ..)/shared/data

bench: install
	@failed=""; for b in bench/*.py; do echo "== $$b"; \
	  SIGMA_DATA=$(SIGMA_DATA) $(VENV)/bin/python $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "benches that failed:$$failed"; exit 1; fi

# every GPU path (trainer bf16 + MFU, MoE layer vs HF, JIT checkpoint, NVML, health checks, numerics) in at most
# 8 minutes, one report in gpu-check/; on a machine without a GPU it lists each part as skipped, in seconds
gpu-check: install
	$(VENV)/bin/python bench/gpu_check.py --out gpu-check

cluster-down:
	$(VENV)/bin/sigma cluster down

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build dist
