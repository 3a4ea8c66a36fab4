# virt-rules: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
OPA := $(GO) tool opa
BIN := bin/virt-rules
# Minimum `opa test` coverage of the Rego decisions, in percent.
REGO_COVERAGE := 90
CONTROL_PLANE := hack/control-plane.sh
# KubeVirt's virt-controller and virt-api, kwok and kubevirt-oracle for the test cluster
# (KUBEVIRT_VERSION, default v1.8.0, the newest the Go module proxy builds).
KUBEVIRT := hack/kubevirt.sh
# VM defaults need libvirt (cgo, the build tag libvirt): every go command gets the tag when
# libvirt-dev is installed (.ci/run installs it); without it the binary builds without them.
LIBVIRT := $(shell pkg-config --exists libvirt 2>/dev/null && echo libvirt)
export GOFLAGS := $(if $(LIBVIRT),-tags=libvirt) $(GOFLAGS)

.PHONY: images images-reproducible all build demo test libvirt vet unit rego rego-lint rego-fmt rego-check rego-test suites control-plane kubevirt cluster test-integration local-cluster scale scale-small real-node bench fuzz bundle bundle-sign custom-bundle docs cpu-map clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/virt-rules

## demo: build, then decide design 000's example on the embedded bundle (no cluster needed).
demo: build
	$(BIN) eval -o table examples/migration-policy/

## test: everything CI runs.
## A fresh make then builds with the libvirt tag, which depends on what libvirt installed.
test: libvirt
	$(MAKE) --no-print-directory vet rego unit suites test-integration scale-small

## libvirt: the Debian packages the VM defaults need (hack/libvirt.sh), installed when missing.
libvirt:
	@hack/libvirt.sh

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

rego: rego-fmt rego-check rego-test rego-lint

## rego-lint: Regal, the Rego linter, with the project's .regal/config.yaml (each rule turned off
## there says why). Regal is a go tool of its own module, hack/regal (see its go.mod).
REGAL := cd hack/regal && GOFLAGS= $(GO) tool regal
rego-lint:
	$(REGAL) lint --config-file ../../.regal/config.yaml ../../rego

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
	$(GO) test -count=1 -timeout=30m $$($(GO) list ./... | grep -v /test/)

## suites: the ginkgo suites under test/ that need no cluster (they build and run the real binary).
suites:
	$(GO) tool ginkgo -r --keep-going --no-color --timeout=60m --skip-package=integration,kubevirt,fidelity,scheduler,outage,install,scale,realnode test

## control-plane: etcd, kube-apiserver, kube-scheduler and kube-controller-manager, built from the Go
## module proxy into ~/.cache/virt-rules (10-16 minutes the first time on 2 cores, instant after).
control-plane:
	@$(CONTROL_PLANE) >/dev/null

## kubevirt: KubeVirt's virt-controller and virt-api, kwok and kubevirt-oracle, built from the Go module
## proxy into ~/.cache/virt-rules (6-8 minutes the first time, instant after).
kubevirt:
	@$(KUBEVIRT) >/dev/null

## cluster: every binary of the test cluster (test/testcluster).
cluster: control-plane kubevirt

## test-integration: the ginkgo suites beside KubeVirt's own code: test/kubevirt beside KubeVirt itself on the
## test cluster (test/testcluster), test/fidelity (VM defaults judged by KubeVirt's admission and converter,
## kubevirt-oracle), test/integration on etcd and kube-apiserver alone.
test-integration: cluster
	KUBEBUILDER_ASSETS="$$($(CONTROL_PLANE))" KUBEVIRT_ASSETS="$$($(KUBEVIRT))" \
		$(GO) tool ginkgo -r --keep-going --no-color --timeout=60m --label-filter='!scale' test/kubevirt test/scheduler test/outage test/fidelity test/integration test/install

## local-cluster: the test cluster for a person, until Ctrl-C: KubeVirt minus the hypervisor on kwok nodes,
## virt-rules' CRDs and webhook configurations; prints the kubeconfig and the `virt-rules controller`
## command line that serves it.
local-cluster: cluster build
	KUBEBUILDER_ASSETS="$$($(CONTROL_PLANE))" KUBEVIRT_ASSETS="$$($(KUBEVIRT))" $(GO) run ./hack/localcluster

## scale: virt-rules at the size of a large KubeVirt cluster (test/scale, issue 17) on the test cluster,
## with the real `virt-rules controller`: 5,000 kwok nodes of mixed CPU generations, 10,000 VMIs, 1,000
## MigrationPolicies, 20 VirtualMachinePools of 100 VMs, a burst of 1,000 VMI creates. Prints the table
## (lines starting with SCALE): times, writes, the controller's peak RSS and CPU, webhook latency, and each
## bound of the issue as PASS or FAIL (a broken bound fails the run). Smaller for development:
## SCALE_NODES=500 SCALE_VMIS=1000 SCALE_POLICIES=100 SCALE_POOLS=2 SCALE_POOL_VMS=10 SCALE_BURST=100 make scale
scale: cluster
	KUBEBUILDER_ASSETS="$$($(CONTROL_PLANE))" KUBEVIRT_ASSETS="$$($(KUBEVIRT))" \
		$(GO) tool ginkgo --no-color --timeout=90m --label-filter=scale -v test/scale \
		| tee "$${TMPDIR:-/tmp}/virt-rules-scale.log" | grep -E '^ *SCALE|scale: |Ran |Passed|FAIL'

## scale-small: `make scale` at the small size (about 13 minutes), every latency bound a ratio to its floor;
## part of `make test`, so that CI keeps the bounds (docs/scale.md).
SCALE_SMALL := SCALE_NODES=200 SCALE_VMIS=500 SCALE_POLICIES=50 SCALE_POOLS=2 SCALE_POOL_VMS=5 SCALE_BURST=50 SCALE_NAMESPACES=10
scale-small:
	$(SCALE_SMALL) $(MAKE) --no-print-directory scale

## real-node: virt-rules' own images as real pods (test/realnode, issue 40 stage 1; not in `make test`):
## a real node beside the test cluster's (Debian's containerd and runc, kubelet from the Go module proxy,
## hack/node.sh), a plain pod of the controller image, then the install kit with its webhooks served from
## the controller's pods. Needs root. docs/real-node.md.
real-node: cluster
	CGO_ENABLED=0 $(GO) run ./hack/images -out bin/images -images controller
	KUBEBUILDER_ASSETS="$$($(CONTROL_PLANE))" KUBEVIRT_ASSETS="$$($(KUBEVIRT))" NODE_ASSETS="$$(hack/node.sh)" \
		VIRT_RULES_IMAGES=bin/images $(GO) tool ginkgo --no-color --timeout=30m -v test/realnode

## bundle: the decisions as a standard OPA bundle (tests excluded; rego/.manifest's roots; revision from git).
BUNDLE := bundles/virt-rules.tar.gz
BUNDLE_REVISION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
bundle:
	$(OPA) build --bundle rego --ignore '*_test.rego' --revision "$(BUNDLE_REVISION)" -o $(BUNDLE)

## bundle-sign KEY=private.pem [SIGNING_ALG=RS256|ES256|...]: the bundle, signed (.signatures.json); verify with
## --bundle-verification-key public.pem.
SIGNING_ALG ?= RS256
bundle-sign:
	@test -n "$(KEY)" || { echo "usage: make bundle-sign KEY=private-key.pem [SIGNING_ALG=RS256|ES256|ES384|ES512]" >&2; exit 2; }
	$(OPA) build --bundle rego --ignore '*_test.rego' --revision "$(BUNDLE_REVISION)" \
		--signing-key "$(KEY)" --signing-alg "$(SIGNING_ALG)" -o $(BUNDLE)

## custom-bundle: examples/custom-bundle's admin change (files in its overlay/ replace or add to rego/),
## checked with opa fmt, check --strict and test, then built (tests excluded) to $(CUSTOM_BUNDLE).
CUSTOM_OVERLAY := examples/custom-bundle/overlay
CUSTOM_BUNDLE ?= examples/custom-bundle/virt-rules-custom.tar.gz
custom-bundle:
	src="$$(mktemp -d)" && trap 'rm -rf "$$src"' EXIT && opa="$$($(GO) tool -n opa)" && out="$(abspath $(CUSTOM_BUNDLE))" \
		&& cp -r rego/. "$$src" && cp -r $(CUSTOM_OVERLAY)/. "$$src" && cd "$$src" \
		&& "$$opa" fmt --list --fail . && "$$opa" check --strict . && "$$opa" test . \
		&& "$$opa" build --bundle . --ignore '*_test.rego' --revision "custom-$(BUNDLE_REVISION)" -o "$$out"

## fuzz [FUZZTIME=3m]: every Go fuzz target (the manifest reader, each decision's input conversion, the
## defaulter's request path with libvirt) in turn, FUZZTIME each. A crasher is written under the package's
## testdata/fuzz/FuzzX/, which `make unit` runs as regression tests: commit it with its fix. New inputs are
## minimized for at most FUZZMINIMIZETIME (Go's default, 60 s, would eat most of a short run).
FUZZTIME ?= 3m
FUZZMINIMIZETIME ?= 5s
FUZZ_PACKAGES := ./internal/manifest ./engine ./defaults
fuzz:
	for pkg in $(FUZZ_PACKAGES); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
		done; \
	done

## docs: the reference pages under docs/reference (CLI pages from the cobra commands; annotation, label,
## reason and metric tables from the constants and Rego that define them), regenerated. `make unit` fails
## (TestReference) when they are out of date.
docs:
	UPDATE_DOCS=1 $(GO) test ./cmd/virt-rules -run TestReference -count=1

## cpu-map: libvirt's CPU models (cpu_map) for the baseline decision, regenerated from the installed libvirt.
cpu-map:
	@test -n "$(LIBVIRT)" || { echo "cpu-map needs libvirt-dev (make libvirt)" >&2; exit 1; }
	$(GO) run ./hack/cpumap -o rego/virtrules/node/baseline/cpu_map/data.json

## bench: decision speed as ratios against the native Go reference in the same run.
bench:
	$(GO) test -run '^$$' -bench . -benchtime=1s -count=3 -benchmem ./engine/... ./defaults/... | $(GO) run ./internal/benchratio

clean:
	rm -rf bin bundles/*.tar.gz $(CUSTOM_BUNDLE)

## images: the controller and defaulter images as OCI image layouts under bin/images, offline and
## reproducibly (hack/images: go-containerregistry, no container engine, no base image; the
## defaulter's libvirt and QEMU from Debian's packages), then each unpacked and run in an isolated
## root (root only: unshare, chroot; IMAGES_VERIFY= to skip): `version` in both, and the defaulter
## served there defaulting examples/defaults/vm.yaml through its HTTP API. Prints each image's reference,
## digest and size. Push with `crane push bin/images/controller REGISTRY/virt-rules/controller:TAG`
## or `skopeo copy oci:bin/images/controller docker://REGISTRY/virt-rules/controller:TAG`.
IMAGES_VERIFY ?= -verify -verify-defaulting
images:
	CGO_ENABLED=0 $(GO) run ./hack/images -out bin/images $(IMAGES_VERIFY)

## images-reproducible: build the images twice, each from an empty cache (binaries built again,
## Debian packages downloaded again), and fail unless both builds give the same digests.
## IMAGES=controller for the controller alone.
IMAGES ?= controller,defaulter
images-reproducible:
	rm -rf bin/reproducible && mkdir -p bin/reproducible
	for i in 1 2; do CGO_ENABLED=0 $(GO) run ./hack/images -images $(IMAGES) -out bin/reproducible/$$i -cache bin/reproducible/cache-$$i > bin/reproducible/$$i.txt || exit 1; cut -f1,3 bin/reproducible/$$i.txt > bin/reproducible/$$i.digests; cat bin/reproducible/$$i.txt; done
	diff bin/reproducible/1.digests bin/reproducible/2.digests
	@echo "images-reproducible: the same digests twice"
