# hpnlab: two commands do everything on a fresh Debian 12 / Ubuntu 22.04+ machine.
#   sudo make demo   installs what is missing, then runs the default experiment
#   sudo make test   installs what is missing, then runs the whole test suite
# Every install step is idempotent: it checks first and only does what is missing.

SHELL      := /bin/bash
PYTHON     ?= /usr/bin/python3
VENV       ?= .venv
VPY        := $(VENV)/bin/python
HPNLAB     := $(VENV)/bin/hpnlab
PYTEST     := $(VENV)/bin/pytest
# apt packages the project uses at run time and in its tests.
APT_PKGS   := mininet openvswitch-switch iperf3 iputils-ping ethtool iproute2 procps strace \
              python3-venv python3-dev clang llvm libbpf-dev bpftool make chromium
PIP_EXTRAS := emulation,controller,report,test,lint
# The pure tests run in this many pytest-xdist workers (0: in one process); the emulation
# tests always run one at a time (they share Open vSwitch and the machine's packet budget).
PURE_JOBS  ?= 2
DEMO_SCENARIO ?= mini-hpn

.PHONY: all install apt venv ovs demo test test-unit test-emulation test-kernel lint docs bench clean-venv help

all: help

help:
	@echo "sudo make demo    install what is missing, run the default experiment ($(DEMO_SCENARIO))"
	@echo "sudo make test    install what is missing, run the whole test suite"
	@echo "make test-unit    pure tests only (no root)"
	@echo "make lint         ruff and mypy over the code and tests; fails on any finding"
	@echo "make docs         the documentation site into site/ (mkdocs build --strict)"
	@echo "make bench        benchmarks (ratios measured side by side)"

install: apt venv ovs

apt:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "hpnlab: missing apt packages:$$missing; run 'sudo make install'" >&2; exit 2; fi; \
	  echo "installing apt packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel
	$(VPY) -m pip install -q -e ".[$(PIP_EXTRAS)]"
	@touch $@

# Open vSwitch must be running for emulation; start it only if it is not.
ovs:
	@if ovs-vsctl --timeout=5 show >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" != 0 ]; then echo "hpnlab: Open vSwitch is not running; run 'sudo make ovs'" >&2; exit 2; \
	else /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null 2>&1 || true; \
	  ovs-vsctl --timeout=10 show >/dev/null || { echo "hpnlab: could not start Open vSwitch" >&2; exit 2; }; fi

demo: install
	$(HPNLAB) demo $(DEMO_SCENARIO)

# Three stages: unit (pure), emulation, the full-kernel lane; the unit stage runs beside the
# emulation stage on the CPU it leaves idle, the lane after it (see tools/scripts/test_stages.sh).
UNIT_ARGS  := tests/unit -q -n $(PURE_JOBS) --durations=15
EMU_ARGS   := tests/emulation -q --durations=25

test: install
	@PYTEST="$(PYTEST)" UNIT_ARGS="$(UNIT_ARGS)" EMU_ARGS="$(EMU_ARGS)" MAKE="$(MAKE)" tools/scripts/test_stages.sh

test-unit: venv
	$(PYTEST) $(UNIT_ARGS)

test-emulation: install
	$(PYTEST) $(EMU_ARGS)

test-kernel:
	@if [ -f mk/kernel.mk ]; then $(MAKE) --no-print-directory -f mk/kernel.mk test-kernel; \
	else echo "full-kernel lane: not present yet (see issue 6)"; fi

# Lint and type gate: ruff (style, likely bugs, imports, names) then mypy (types), both
# configured in pyproject.toml; both always run, and any finding fails the target.
# mypy must see the code under its installed names (hpnlab.fabric, hpnlab.controller,
# hpnlab.cli, mapped from the folders as setup.cfg maps them), which the editable install's
# import hook cannot show it: a tree of links in the venv does, and its findings are printed
# with the checkout's own paths.
LINT_PATHS := fabric controller cli tools topologies tests
MYPY_TREE  := $(VENV)/mypy-path

# mypy also checks tools/scripts/docs_reference.py, which imports mkdocs: the docs extra first.
lint: $(VENV)/.docs-installed
	@mkdir -p $(MYPY_TREE)/hpnlab
	@ln -sfn $(CURDIR)/fabric $(MYPY_TREE)/hpnlab/fabric
	@ln -sfn $(CURDIR)/controller $(MYPY_TREE)/hpnlab/controller
	@ln -sfn $(CURDIR)/cli $(MYPY_TREE)/hpnlab/cli
	@rc=0; \
	echo "ruff check $(LINT_PATHS)"; $(VENV)/bin/ruff check $(LINT_PATHS) || rc=1; \
	echo "mypy $(LINT_PATHS)"; \
	MYPYPATH=$(MYPY_TREE):tests:topologies:tools/bench:tools/probes:tools/scripts $(VENV)/bin/mypy $(MYPY_TREE)/hpnlab tests topologies tools/bench tools/probes tools/scripts/docs_reference.py tools/scripts/code_figures.py \
	  > $(MYPY_TREE)/report.txt 2>&1 || rc=1; \
	sed -e 's#^$(MYPY_TREE)/hpnlab/##' $(MYPY_TREE)/report.txt; \
	exit $$rc

# The documentation site (mkdocs.yml, docs/): the docs extra is installed into the venv on first use
# (the demo does not need it); --strict makes every warning, broken link or missing anchor an error.
# The reference pages are written from the code during the build (tools/scripts/docs_reference.py).
# NO_MKDOCS_2_WARNING: Material's banner about its end of life (docs/development.md says what then).
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(VENV)/.docs-installed: $(VENV)/.installed setup.cfg
	$(VPY) -m pip install -q -e ".[docs]"
	@touch $@

bench: venv
	@failed=""; for b in tools/bench/bench_*.py; do echo "== $$b"; PYTHONPATH=tools/bench:tools/probes $(VPY) $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "below goal or failed:$$failed"; exit 1; fi

clean-venv:
	rm -rf $(VENV)
