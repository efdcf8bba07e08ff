# Every entry point a person or CI uses.
GO      ?= go
PREFIX  ?= /usr/local
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all setup build demo test lint unit pytest bench install salt-files clean

all: build

setup:
	scripts/setup.sh

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/salt-volume-exec ./cmd/salt-volume-exec
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/salt-volumes ./cmd/salt-volumes

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...

# A local Salt stack plus the control plane, two real volumes; Ctrl-C stops
# everything and detaches what it attached. DEMO_ARGS=--once for a smoke run.
demo: setup build
	$(GO) run ./test/demo $(DEMO_ARGS)

# Unit and integration tests. Integration tests need root and loop devices;
# without them they skip and say why.
test: setup lint pytest
	$(GO) test -count=1 -timeout 15m ./...

# Unit tests of the Salt modules (the real-Salt tests are Go, in test/salt).
pytest:
	.venv/bin/python -m pytest -q salt/tests

unit:
	$(GO) test -count=1 ./internal/...

bench: setup
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 5x -timeout 20m ./test/bench/

install: build
	install -D -m 0755 bin/salt-volume-exec $(DESTDIR)$(PREFIX)/bin/salt-volume-exec
	install -d $(DESTDIR)/etc/systemd/system
	sed -e 's/{{ [a-z_]* | default("\([^"]*\)") }}/\1/g' salt/states/salt_volumes/files/salt-volumes-restore.service \
	  > $(DESTDIR)/etc/systemd/system/salt-volumes-restore.service

# Puts the binary where salt_volumes.installed serves it from (salt://).
salt-files: build
	install -m 0755 bin/salt-volume-exec salt/states/salt_volumes/files/salt-volume-exec

clean:
	rm -rf bin salt/states/salt_volumes/files/salt-volume-exec
