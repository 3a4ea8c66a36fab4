#!/usr/bin/env bash
# node.sh: what a real node of the test cluster needs (issue 40, test/realnode): kubelet built
# from the Go module proxy (release downloads are not reachable from CI) and cached by version,
# and Debian's containerd, runc and CNI plugins, installed when missing (with sudo unless root):
#
#   export NODE_ASSETS="$(hack/node.sh)"
#
# The folder holding kubelet is the last line of stdout; progress goes to stderr. A cached
# folder is returned at once; a cold build takes 6-12 minutes on 2 cores (under a minute when
# Go's build cache already holds hack/control-plane.sh's packages, most of kubelet's). kubelet
# comes from a throwaway module in a temporary directory, as in hack/control-plane.sh and for
# the same reason: `go install` refuses k8s.io/kubernetes, whose go.mod has replace directives.
#
# containerd, runc and the CNI plugins are Debian's (containerd 1.6, runc 1.1, plugins in
# /usr/lib/cni): a node runs them as they are packaged, and only the real node suite needs them.
#
# Environment: K8S_VERSION (default v1.35.4, hack/control-plane.sh's), XDG_CACHE_HOME.
set -euo pipefail

k8s_version="${K8S_VERSION:-v1.35.4}"
k8s_version="v${k8s_version#v}" # 1.35.4 and v1.35.4 alike
readonly k8s_version

cache_root="${XDG_CACHE_HOME:-${HOME}/.cache}/virt-rules/node"
dest="${cache_root}/k8s-${k8s_version}"
readonly cache_root dest

# Everything but the folder path goes to stderr; fd 3 is the real stdout.
exec 3>&1 1>&2

die() {
	echo "node.sh: $*" >&2
	exit 1
}

# install_packages: Debian's containerd, runc and CNI plugins, as hack/libvirt.sh installs
# libvirt's: only what is missing, so a machine that has them pays nothing.
install_packages() {
	local pkgs=(containerd runc containernetworking-plugins) missing=() p sudo=""
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed" || missing+=("${p}")
	done
	((${#missing[@]})) || return 0
	[[ "$(id -u)" == 0 ]] || sudo=sudo
	echo "== apt-get install ${missing[*]}"
	${sudo} apt-get update -q
	${sudo} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

built() {
	[[ -x "${dest}/kubelet" ]]
}

command -v dpkg-query >/dev/null || die "dpkg-query not found: the node's packages come from Debian"
install_packages || die "install containerd, runc and containernetworking-plugins failed"

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

# shellcheck source=lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
cache_begin "${cache_root}" node
mkdir -p "${work}/bin"

# A go.work above the temporary folder, or one named by GOWORK, must not take part.
export GOWORK=off CGO_ENABLED=0

# shellcheck source=lib/kube.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/kube.sh"

build_kubelet() {
	local mod="${work}/kube" kube_gomod build_date
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
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >"${mod}/tools.go"

	# What kubernetes' hack/lib/version.sh stamps, in both version packages; the commit is not
	# known from the module proxy.
	local ldflags="-s -w" pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
		ldflags+=" -X ${pkg}.gitTreeState=archive -X ${pkg}.buildDate=${build_date} -X ${pkg}.gitCommit="
	done
	(
		exec 3>&- 4>&- # go's children must not hold our stdout or the lock
		cd "${mod}" &&
			go mod tidy &&
			go build -trimpath -ldflags "${ldflags}" -o "${work}/bin/kubelet" k8s.io/kubernetes/cmd/kubelet
	) || die "build kubelet ${k8s_version} failed"
}

echo "building kubelet ${k8s_version} into ${dest} (6-12 minutes cold)"
start=${SECONDS}
build_kubelet
"${work}/bin/kubelet" --version || die "built kubelet does not run"
echo "kubelet ${k8s_version}: built in $((SECONDS - start)) s"

# The binary is moved in whole: a folder that has kubelet has a working one.
mkdir -p "${dest}"
mv "${work}/bin/kubelet" "${dest}/"
built || die "${dest} is incomplete"
echo "${dest}" >&3
