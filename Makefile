# Every entry point a person or CI uses.
GO      ?= go
PREFIX  ?= /usr/local
VERSION ?= $(shell scripts/version.sh 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all setup build dist repo screenshots release image e2e-bin demo test test-salt lint unit check race pytest promtool bench bench-smoke smoke-bench smoke-load load fuzz install salt-files clean \
        vagrant-host vagrant-box vagrant-up vagrant-e2e vagrant-down vagrant-check vagrant-validate

all: build

setup:
	scripts/setup.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/salt-volume-exec ./cmd/salt-volume-exec
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/salt-volumes ./cmd/salt-volumes

# serve's container image: an OCI archive of the static binary on an empty
# base, written by Go (tools/image); no registry, no Docker daemon. Import it
# with: ctr -n k8s.io images import bin/salt-volumes-image.tar
image: build
	$(GO) run ./tools/image -o bin/salt-volumes-image.tar -bin bin/salt-volumes -tag $(VERSION)

# The end-to-end scenario as a program (test/e2e), for the Vagrant master.
e2e-bin:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/salt-volumes-e2e ./test/e2e

# ruff (salt/ruff.toml) guards the Salt modules for the Pythons of every
# Salt line: 3.10 syntax, nothing 3.12-3.14 removed.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	.venv/bin/ruff check --quiet --config salt/ruff.toml salt/
	@if command -v shellcheck >/dev/null; then \
	  shellcheck -x -P SCRIPTDIR -s bash scripts/setup.sh scripts/kube-tools.sh scripts/guest-image.sh scripts/vagrant-host.sh scripts/vagrant-box.sh scripts/vagrant-check.sh scripts/salt-venv.sh scripts/test-salt.sh scripts/dist.sh scripts/sign.sh scripts/repo.sh scripts/saltext.sh scripts/packages.sh scripts/version.sh scripts/release.sh .ci/run vagrant/provision/*.sh; \
	  shellcheck -s sh packaging/nfpm/*.postinst packaging/nfpm/*.prerm packaging/nfpm/*.postrm; \
	else echo "lint: shellcheck not installed, shell scripts not checked"; fi

# Release artifacts for linux/amd64 and linux/arm64 in dist/: both
# binaries, a CycloneDX SBOM of each, the Salt extension's wheel,
# SHA256SUMS; the same bytes for the same commit (scripts/dist.sh;
# test/dist checks it).
dist:
	scripts/dist.sh

# The docs' screenshots, from the last run of the UI tests (make test, or
# go test -run 'TestWebUI|TestNodeHealth' ./test/controlplane/, writes them
# to test/controlplane/artifacts): the pictures never drift from the UI.
screenshots:
	@for f in volume-detail 4-failed; do test -f test/controlplane/artifacts/$$f.png || { \
	  echo "screenshots: no test/controlplane/artifacts/$$f.png: run go test -run 'TestWebUI|TestNodeHealth' ./test/controlplane/ first" >&2; exit 1; }; done
	cp test/controlplane/artifacts/volume-detail.png docs/ui-volume-detail.png
	cp test/controlplane/artifacts/4-failed.png docs/ui-volumes.png

# make repo SIGN_KEY=<gpg key>: signed apt and dnf repositories of dist/'s
# signed packages in repo/ (scripts/repo.sh; docs/operations.md). make
# passes SIGN_KEY, given on its command line, to the scripts' environment.
repo:
	scripts/repo.sh

# make release VERSION=X.Y.Z: two commits, "Release X.Y.Z" tagged vX.Y.Z
# and "Begin X.(Y+1).0-dev", with VERSION, the chart and deploy/kubernetes'
# image tag following (scripts/release.sh, docs/releasing.md). Pushes
# nothing.
release:
	scripts/release.sh $(VERSION)

# A local Salt stack plus the control plane, two real volumes; Ctrl-C stops
# everything and detaches what it attached. DEMO_ARGS=--once for a smoke run.
# The demo sets up only what it needs (scripts/setup.sh demo); with
# --kubernetes or --ha it needs the test setup's Kubernetes tools and etcd.
# From bare, setup (Debian packages, Salt from PyPI) and Go's build (modules
# fetched as they compile) run side by side: neither needs the other.
demo:
	@scripts/setup.sh $(if $(or $(findstring --kubernetes,$(DEMO_ARGS)),$(findstring --ha,$(DEMO_ARGS))),,demo) & setup=$$!; \
	  $(MAKE) --no-print-directory build && $(GO) build -o bin/demo ./test/demo; built=$$?; \
	  wait $$setup && [ $$built -eq 0 ]
	bin/demo $(DEMO_ARGS)

# Unit and integration tests. Integration tests need root and loop devices;
# without them they skip and say why.
# Three lanes on the two cores, since neither core is the only thing a
# lane waits for: the emulated guest of test/packages (one core's worth
# of qemu throughout) then the node and bus suites (LANE1_SUITES),
# test/booted's guests then test/dist and the load
# test's and the benchmarks' smoke runs, and the checks (lint, pytest,
# the race detector) then everything else one package at a time (the
# race detector's packages ran their tests under it already). Two
# lanes left a fifth of the machine idle (the suites with Salt wait on
# jobs) and took 41 min on 2026-12-06; three took 35 (docs/development.md,
# "How long").
# The side lanes' output lands in test-results/lane-*.log, printed at
# the end; their guest tests run with -v, so a run that times out still
# shows how far each story got (go test drops a running test's buffered
# log when it panics on -timeout).
# Suites that follow test/packages in its lane: on 2026-12-07 that lane
# ended ten minutes before the checks' lane (2,029 s against 2,643 s).
LANE1_SUITES = ./test/nodeexec/ ./test/events/ ./test/saltreq/
# Each part's CPU (user, system: its own and its children's) and wall
# time, as "cpu PART: ..." lines in the log (docs/development.md, "How
# long").
CPU = scripts/cpu.sh
test: setup
	@rm -f test-results/adversarial.txt test-results/lane-*.log
	@mkdir -p test-results
	@{ t0=$$(date +%s); $(CPU) packages $(GO) test -count=1 -v -timeout 70m ./test/packages/; r=$$?; \
	    $(CPU) "node and bus suites" $(GO) test -count=1 -p 1 -timeout 20m $(LANE1_SUITES); r2=$$?; \
	    echo "lane packages, node and bus suites: $$(($$(date +%s) - t0)) s"; [ $$r -eq 0 ] && [ $$r2 -eq 0 ]; } \
	    >test-results/lane-packages.log 2>&1 & l1=$$!; \
	  { t0=$$(date +%s); $(CPU) booted $(GO) test -count=1 -v -timeout 60m ./test/booted/; r1=$$?; $(CPU) dist $(GO) test -count=1 -timeout 20m ./test/dist/; r2=$$?; \
	    $(CPU) smoke-load $(MAKE) --no-print-directory smoke-load; r3=$$?; $(CPU) smoke-bench $(MAKE) --no-print-directory smoke-bench; r4=$$?; \
	    echo "lane booted, dist, smoke: $$(($$(date +%s) - t0)) s"; [ $$r1 -eq 0 ] && [ $$r2 -eq 0 ] && [ $$r3 -eq 0 ] && [ $$r4 -eq 0 ]; } \
	    >test-results/lane-booted.log 2>&1 & l2=$$!; \
	  t0=$$(date +%s); $(CPU) "lint, pytest, race" $(MAKE) --no-print-directory lint pytest vagrant-validate promtool race; prc=$$?; \
	  $(CPU) "the other packages" $(GO) test -count=1 -p 1 -timeout 40m $$($(GO) list ./... | grep -vx -e '.*/test/packages' -e '.*/test/booted' -e '.*/test/dist' $(patsubst ./%/,-e '.*/%',$(LANE1_SUITES)) \
	    $$($(GO) list $(RACE_PKGS) | sed 's/^/-e /')); rc=$$?; \
	  echo "lane checks and suites: $$(($$(date +%s) - t0)) s"; \
	  wait $$l1; r1=$$?; wait $$l2; r2=$$?; cat test-results/lane-packages.log test-results/lane-booted.log; \
	  [ $$prc -eq 0 ] && [ $$rc -eq 0 ] && [ $$r1 -eq 0 ] && [ $$r2 -eq 0 ]
	@if [ -f test-results/adversarial.txt ]; then echo "adversarial suite (test/nodeexec): $$(cat test-results/adversarial.txt)"; fi

# The Salt matrix: every Salt-facing suite against the newest installable
# release of one Salt line, SALT=3006, 3007 or 3008, each from its own
# virtualenv cached outside the repository (scripts/test-salt.sh). make test
# runs them on the pinned release (salt/requirements.txt); CI runs the
# other lines too.
SALT ?= 3008
test-salt: setup
	scripts/test-salt.sh $(SALT)

# Every benchmark once at a tiny size, and the load test for a few seconds,
# so that none of them rots unseen (part of make test; the figures come
# from make bench, these land in test-results/bench-metrics-smoke.txt).
bench-smoke: smoke-bench smoke-load
smoke-bench:
	@mkdir -p test-results; rm -f test-results/bench-metrics-smoke.txt
	SALT_VOLUMES_BENCH_SMOKE=1 $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 20m ./test/bench/
smoke-load:
	SALT_VOLUMES_LOAD=1 LOAD_VOLUMES=170 LOAD_NODES=10 LOAD_WATCHERS=20 LOAD_RATE=10 LOAD_SECONDS=3 $(GO) test -count=1 -run TestLoad -v -timeout 5m ./test/load/

# The alert rules shipped in deploy/monitoring, checked by Prometheus's own
# promtool (setup extracts it from Debian's package; skipped without it).
PROMTOOL ?= $(shell command -v promtool || ls $${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}/prometheus/usr/bin/promtool 2>/dev/null)
promtool:
	@if [ -n "$(PROMTOOL)" ]; then $(PROMTOOL) check rules deploy/monitoring/alerts.yaml && \
	  $(PROMTOOL) test rules deploy/monitoring/alerts_test.yaml; \
	else echo "promtool: not available, deploy/monitoring/alerts.yaml not checked"; fi

# Fuzz targets, FUZZTIME each (outside make test). New inputs the fuzzer
# finds stay in Go's cache; crashers land in the package's testdata/fuzz.
# FUZZFLAGS=-parallel=1 leaves a core free; FUZZ_TARGETS=pkg:Fuzz picks some.
FUZZTIME ?= 10m
FUZZ_TARGETS = ./internal/spec:FuzzParse ./internal/gpt:FuzzRead ./internal/probe:FuzzDevice ./internal/probe:FuzzParseWipefs \
               ./internal/events:FuzzDecoder ./internal/saltapi:FuzzParseListJob ./internal/saltreq:FuzzReply
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; fn=$${t##*:}; echo "fuzz: $$fn ($$pkg) for $(FUZZTIME)"; \
	  mkdir -p test-results; log=test-results/fuzz-$$fn.log; \
	  if ! $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) $$pkg > $$log 2>&1; then cat $$log; exit 1; fi; \
	  tail -n 3 $$log; \
	done

# Unit tests of the Salt modules (the real-Salt tests are Go, in test/salt).
pytest:
	.venv/bin/python -m pytest -q salt/tests

unit:
	$(GO) test -count=1 ./internal/...

# The edit-test loop (after make setup once): formatting, vet, ruff,
# shellcheck, pytest and the unit tests of the packages and commands; make
# test stays the whole suite.
check: lint pytest
	$(GO) test -count=1 ./internal/... ./cmd/...

# The control plane's concurrent packages under the race detector: the
# reconciler's workers, the bus reader, the API's watchers, the snapshot loop.
RACE_PKGS = ./internal/reconciler/ ./internal/events/ ./internal/api/ ./internal/store/ ./internal/health/ ./internal/saltapi/ ./internal/leader/ ./internal/kube/ ./internal/snapshots/
race:
	$(GO) test -race -count=1 $(RACE_PKGS)

# Ends with one line per metric, "metric <name> <value> <unit>", to compare
# runs (test-results/bench-metrics.txt).
bench: setup load
	@mkdir -p test-results; rm -f test-results/bench-metrics.txt
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 5x -timeout 60m ./test/bench/
	@echo "summary:"; sort -s -k1,1 test-results/bench-metrics.txt

# serve under load against a fake salt-api and event bus: 5,000 volumes,
# 500 idle watchers, 50 creates/s for 60 s (LOAD_VOLUMES, LOAD_WATCHERS,
# LOAD_RATE, LOAD_SECONDS change it). Fails past 300 MB of RSS.
load:
	@mkdir -p test-results; \
	if ! SALT_VOLUMES_LOAD=1 $(GO) test -count=1 -run TestLoad -v -timeout 10m ./test/load/ > test-results/load.log 2>&1; then \
	  cat test-results/load.log; exit 1; fi; \
	grep -E '^(---|metric|\s+load_test)' test-results/load.log

install: build
	install -D -m 0755 bin/salt-volume-exec $(DESTDIR)$(PREFIX)/bin/salt-volume-exec
	install -d $(DESTDIR)/etc/systemd/system
	sed -e 's/{{ [a-z_]* | default("\([^"]*\)") }}/\1/g' salt/states/salt_volumes/files/salt-volumes-restore.service \
	  > $(DESTDIR)/etc/systemd/system/salt-volumes-restore.service

# Puts the binary where salt_volumes.installed serves it from (salt://).
salt-files: build
	install -m 0755 bin/salt-volume-exec salt/states/salt_volumes/files/salt-volume-exec

# The Vagrant cluster (vagrant/Vagrantfile): a salt-master with salt-api and
# salt-volumes serve, and two minions with two spare disks each. By default
# on the box make vagrant-box builds from the booted tests' guest image
# (libvirt, qemu's software emulation, no network needed; make vagrant-host
# installs and starts libvirt). SV_BOX=debian/bookworm64 uses the public box
# with libvirt or VirtualBox and installs Salt from its official repository.
VAGRANT ?= vagrant
NODES   ?= node-1 node-2
SV_BOX  ?= salt-volumes/debian12
export SV_BOX
LOCAL_BOX := $(filter salt-volumes/%,$(SV_BOX))
ifneq ($(LOCAL_BOX),)
export VAGRANT_DEFAULT_PROVIDER ?= libvirt
endif

vagrant-host:
	scripts/vagrant-host.sh

vagrant-box: vagrant-host
	SV_BOX_NAME=$(SV_BOX) VAGRANT=$(VAGRANT) scripts/vagrant-box.sh

vagrant-up: build salt-files e2e-bin $(if $(LOCAL_BOX),vagrant-box)
	cd vagrant && $(VAGRANT) up $(VAGRANT_ARGS)

# Creates, checks and deletes volumes of every kind on every node through
# the CLI on the master; installs freshly built binaries first.
vagrant-e2e: build salt-files e2e-bin
	cd vagrant && $(VAGRANT) rsync && $(VAGRANT) ssh master -c 'sudo /vagrant/vagrant/provision/e2e.sh $(NODES)'

vagrant-down:
	cd vagrant && $(VAGRANT) destroy -f

# The cluster from nothing, as a new machine meets it (too long for make
# test: ~25 min of both cores): our machines destroyed, our box and the
# image libvirt holds of it removed, then up, the scenario and down, timed.
# Other boxes and machines on the host are left alone.
vagrant-check: vagrant-host
	scripts/vagrant-check.sh

# Part of make test: the Vagrantfile parses, its provisioning scripts exist,
# and the libvirt provider's settings are valid, for the local box and the
# public one (when vagrant-libvirt is installed; VirtualBox's need
# VirtualBox itself).
vagrant-validate:
	@if command -v $(VAGRANT) >/dev/null; then \
	  cd vagrant && SV_BOX=salt-volumes/debian12 $(VAGRANT) validate && SV_BOX=debian/bookworm64 $(VAGRANT) validate; \
	else echo "vagrant not installed: Vagrantfile not validated (make setup installs it)"; fi

clean:
	rm -rf bin dist salt/states/salt_volumes/files/salt-volume-exec
