# virt-rules: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
OPA := $(GO) tool opa
BIN := bin/virt-rules
# Minimum `opa test` coverage of the Rego decisions, in percent.
REGO_COVERAGE := 90
CONTROL_PLANE := hack/control-plane.sh
# VM defaults need libvirt (cgo, the build tag libvirt): every go command gets the tag when
# libvirt-dev is installed (.ci/run installs it); without it the binary builds without them.
LIBVIRT := $(shell pkg-config --exists libvirt 2>/dev/null && echo libvirt)
export GOFLAGS := $(if $(LIBVIRT),-tags=libvirt) $(GOFLAGS)

.PHONY: all build demo test libvirt vet unit rego rego-fmt rego-check rego-test suites control-plane test-integration bench bundle clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/virt-rules

## demo: build, then decide design 000's example on the embedded bundle (no cluster needed).
demo: build
	$(BIN) eval -o table examples/migration-policy/

## test: everything CI runs.
test: libvirt vet rego unit suites test-integration

## libvirt: make test needs libvirt for the VM defaults tests: fail early, saying how to get it.
libvirt:
	@test -n "$(LIBVIRT)" || { echo "libvirt-dev not found (pkg-config libvirt): run .ci/run, or apt-get install --no-install-recommends libvirt-dev pkg-config libvirt-daemon-driver-qemu qemu-system-x86"; exit 1; }

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

rego: rego-fmt rego-check rego-test

rego-fmt:
	$(OPA) fmt --list --fail rego

rego-check:
	$(OPA) check --strict rego

rego-test:
	$(OPA) test rego --coverage --threshold $(REGO_COVERAGE) --format json > /dev/null \
		|| { $(OPA) test rego -v | tail -40; $(OPA) test rego --coverage --threshold $(REGO_COVERAGE) --format json | grep -E '"coverage"|threshold' | tail -3; exit 1; }
	$(OPA) test rego

## unit: Go unit tests (engine, CLI glue, differential tests against the Go reference).
unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test/)

## suites: the ginkgo suites under test/ that need no control plane (they build and run the real binary).
suites:
	$(GO) tool ginkgo -r --keep-going --no-color --timeout=60m --skip-package=integration test

## control-plane: etcd + kube-apiserver for test/integration, built from the Go module proxy into
## ~/.cache/virt-rules (8-13 minutes the first time on 2 cores, instant after).
control-plane:
	@$(CONTROL_PLANE) >/dev/null

## test-integration: the ginkgo suites on a real etcd and kube-apiserver.
test-integration: control-plane
	assets="$$($(CONTROL_PLANE))" && KUBEBUILDER_ASSETS="$$assets" $(GO) tool ginkgo -r --no-color --timeout=60m test/integration

## bundle: the decisions as a standard OPA bundle (tests excluded), revision from git.
bundle:
	$(OPA) build --bundle rego --ignore '*_test.rego' \
		--revision "$$(git describe --always --dirty 2>/dev/null || echo dev)" -o bundles/virt-rules.tar.gz

## bench: decision speed as ratios against the native Go reference in the same run.
bench:
	$(GO) test -run '^$$' -bench . -benchtime=1s -count=3 -benchmem ./engine/... ./defaults/... | $(GO) run ./internal/benchratio

clean:
	rm -rf bin bundles/*.tar.gz
