#!/usr/bin/env bash
# control-plane.sh: etcd, kube-apiserver, kube-scheduler and kube-controller-manager for the test
# suites, built from the Go module proxy (release downloads are not reachable from CI) and cached
# by version:
#
#   export KUBEBUILDER_ASSETS="$(hack/control-plane.sh)"
#
# The folder holding the binaries is the last line of stdout; progress goes to stderr. A cached
# folder is returned at once; a cold build takes 10-16 minutes on 2 cores. etcd, and the three
# Kubernetes binaries together, come from throwaway modules in a temporary directory, because
# `go install` refuses modules whose go.mod has replace directives (etcd's and kubernetes' both
# do). Only missing binaries are built, so a cache from before kube-scheduler and
# kube-controller-manager were added is completed, not rebuilt.
#
# Environment: K8S_VERSION (default v1.35.4), ETCD_VERSION (default v3.6.5), XDG_CACHE_HOME.
set -euo pipefail

k8s_version="${K8S_VERSION:-v1.35.4}"
k8s_version="v${k8s_version#v}" # 1.35.4 and v1.35.4 alike
etcd_version="${ETCD_VERSION:-v3.6.5}"
etcd_version="v${etcd_version#v}"
readonly k8s_version etcd_version

cache_root="${XDG_CACHE_HOME:-${HOME}/.cache}/virt-rules/control-plane"
dest="${cache_root}/k8s-${k8s_version}_etcd-${etcd_version}"
readonly cache_root dest

# Everything but the folder path goes to stderr; fd 3 is the real stdout.
exec 3>&1 1>&2

die() {
	echo "control-plane.sh: $*" >&2
	exit 1
}

readonly kube_binaries=(kube-apiserver kube-scheduler kube-controller-manager)

built() {
	local b
	for b in etcd "${kube_binaries[@]}"; do
		[[ -x "${dest}/${b}" ]] || return 1
	done
}

if built; then
	echo "${dest}" >&3
	exit 0
fi

command -v go >/dev/null || die "go not found on PATH"
[[ "${k8s_version}" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] ||
	die "K8S_VERSION=${k8s_version}: want a release such as v1.35.4"
readonly k8s_minor="${BASH_REMATCH[1]}"
# Staging modules (k8s.io/api, k8s.io/apiserver, ...) are published as v0.<minor>.<patch>.
readonly staging_version="v0.${k8s_version#v1.}"
[[ "${etcd_version}" =~ ^v3\.[0-9]+\.[0-9]+$ ]] ||
	die "ETCD_VERSION=${etcd_version}: want a release such as v3.6.5"

# shellcheck source=lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
cache_begin "${cache_root}" control-plane
mkdir -p "${work}/bin"

# A go.work above the temporary folder, or one named by GOWORK, must not take part.
export GOWORK=off CGO_ENABLED=0

# write_tools_file DIR IMPORT...: a tools.go that makes `go mod tidy` require each IMPORT's module
# and everything its packages need.
write_tools_file() {
	local dir=$1 imp
	shift
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		for imp in "$@"; do
			printf '\t_ "%s"\n' "${imp}"
		done
		printf ')\n'
	} >"${dir}/tools.go"
}

build_etcd() {
	local mod="${work}/etcd"
	mkdir -p "${mod}"
	cat >"${mod}/go.mod" <<-GOMOD
		module virt-rules.local/etcd

		go 1.24

		require go.etcd.io/etcd/server/v3 ${etcd_version}
	GOMOD
	write_tools_file "${mod}" go.etcd.io/etcd/server/v3
	# etcd's version is a constant of the go.etcd.io/etcd/api/v3 module; its git SHA is not
	# known from the module proxy and stays "Not provided".
	(
		exec 3>&- 4>&- # go's children must not hold our stdout or the lock
		cd "${mod}" &&
			go mod tidy &&
			go build -trimpath -ldflags "-s -w" -o "${work}/bin/etcd" go.etcd.io/etcd/server/v3
	) || die "build etcd ${etcd_version} failed"
}

# shellcheck source=lib/kube.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube.sh"

# build_kube BINARY...: the named commands of k8s.io/kubernetes, from one throwaway module.
build_kube() {
	local mod="${work}/kube" kube_gomod build_date b
	mkdir -p "${mod}"
	kube_gomod="$(go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@${k8s_version}")" ||
		die "k8s.io/kubernetes ${k8s_version} not found on the module proxy"
	# The release's tag time, so that rebuilding the same version gives the same binary.
	build_date="$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "k8s.io/kubernetes@${k8s_version}")"
	{
		echo "module virt-rules.local/kube"
		echo
		kube_gomod_lines "${kube_gomod}" || die "read ${kube_gomod}"
		echo
		echo "require k8s.io/kubernetes ${k8s_version}"
	} >"${mod}/go.mod"
	echo "kubernetes: $(grep -c '^replace k8s.io/.* => k8s.io/' "${mod}/go.mod") staging modules at ${staging_version}"
	write_tools_file "${mod}" "${@/#/k8s.io/kubernetes/cmd/}"

	# What kubernetes' hack/lib/version.sh stamps, in both version packages. The commit is not
	# known from the module proxy: empty rather than the "$Format:%H$" placeholder.
	local ldflags="-s -w" pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
		ldflags+=" -X ${pkg}.gitTreeState=archive -X ${pkg}.buildDate=${build_date} -X ${pkg}.gitCommit="
	done
	(exec 3>&- 4>&- && cd "${mod}" && go mod tidy) || die "resolve k8s.io/kubernetes ${k8s_version} failed"
	for b in "$@"; do
		local start=${SECONDS}
		(
			exec 3>&- 4>&-
			cd "${mod}" &&
				go build -trimpath -ldflags "${ldflags}" -o "${work}/bin/${b}" "k8s.io/kubernetes/cmd/${b}"
		) || die "build ${b} ${k8s_version} failed"
		"${work}/bin/${b}" --version || die "built ${b} does not run"
		echo "${b} ${k8s_version}: built in $((SECONDS - start)) s"
	done
}

echo "building etcd ${etcd_version} and Kubernetes ${k8s_version} into ${dest} (10-16 minutes cold)"
if [[ ! -x "${dest}/etcd" ]]; then
	start=${SECONDS}
	build_etcd
	"${work}/bin/etcd" --version || die "built etcd does not run"
	echo "etcd ${etcd_version}: built in $((SECONDS - start)) s"
fi
missing=()
for b in "${kube_binaries[@]}"; do
	[[ -x "${dest}/${b}" ]] || missing+=("${b}")
done
if ((${#missing[@]})); then
	build_kube "${missing[@]}"
fi

# Each binary is moved in whole: a folder that has a binary has a working one.
mkdir -p "${dest}"
mv "${work}/bin/"* "${dest}/"
built || die "${dest} is incomplete"
echo "${dest}" >&3
