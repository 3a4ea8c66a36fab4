#!/usr/bin/env bash
# kubevirt.sh: KubeVirt's own virt-controller and virt-api, kwok, and virt-rules' kubevirt-oracle
# for the test cluster, built from the Go module proxy and cached by version:
#
#   export KUBEVIRT_ASSETS="$(hack/kubevirt.sh)"
#
# The folder holding the four binaries is the last line of stdout; progress goes to stderr.
#
# - virt-controller, virt-api: kubevirt.io/kubevirt's go.mod replaces kubevirt.io/api and
#   kubevirt.io/client-go with ./staging folders the module zip does not have, so they are built
#   in a writable copy of the module with those two replaces dropped and both required at the
#   same version. Nothing else of KubeVirt's go.mod changes.
# - kubevirt-oracle: hack/kubevirt/oracle (virt-rules' own code, build tag virtrules_oracle),
#   built in the same copy so it links KubeVirt's packages; cached by its source's hash. Each
#   file under hack/kubevirt/export/PATH/ (virt-rules' own too, same tag) is copied into
#   package PATH of the copy first, to export what the oracle calls and KubeVirt does not
#   export; the hash covers them.
# - kwok: sigs.k8s.io/kwok's go.mod has no replaces, so `go install` builds it. Its own node and
#   pod stages (kustomize/stage/...) are copied from its module into kwok-stages/, for
#   test/testcluster to read at run time.
#
# Cold, about 6-8 minutes on 2 cores (with the module downloads); cached, instant.
# Environment: KUBEVIRT_VERSION (default v1.8.0), KWOK_VERSION (default v0.8.0), XDG_CACHE_HOME.
set -euo pipefail

kubevirt_version="${KUBEVIRT_VERSION:-v1.8.0}"
kubevirt_version="v${kubevirt_version#v}"
kwok_version="${KWOK_VERSION:-v0.8.0}"
kwok_version="v${kwok_version#v}"
readonly kubevirt_version kwok_version

here="$(cd "$(dirname "$0")" && pwd)"
oracle_src="${here}/kubevirt/oracle"
export_src="${here}/kubevirt/export"
cache_root="${XDG_CACHE_HOME:-${HOME}/.cache}/virt-rules/kubevirt"
kubevirt_dir="${cache_root}/kubevirt-${kubevirt_version}"
kwok_dir="${cache_root}/kwok-${kwok_version}"
oracle_hash="$(cd "${here}/kubevirt" && find oracle export -name '*.go' | LC_ALL=C sort |
	while read -r f; do echo "${f}" && cat "${f}"; done | sha256sum | cut -c1-12)"
# What the caller gets: the oracle of this source, beside links to the version-keyed binaries.
dest="${kubevirt_dir}/assets-kwok-${kwok_version}-oracle-${oracle_hash}"
readonly here oracle_src export_src cache_root kubevirt_dir kwok_dir oracle_hash dest

exec 3>&1 1>&2

die() {
	echo "kubevirt.sh: $*" >&2
	exit 1
}

built() {
	local b
	for b in virt-controller virt-api kwok kubevirt-oracle; do
		[[ -x "${dest}/${b}" ]] || return 1
	done
	[[ -d "${dest}/kwok-stages" ]]
}

if built; then
	echo "${dest}" >&3
	exit 0
fi

command -v go >/dev/null || die "go not found on PATH"
[[ "${kubevirt_version}" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KUBEVIRT_VERSION=${kubevirt_version}: want a release such as v1.8.0"
[[ "${kwok_version}" =~ ^v0\.[0-9]+\.[0-9]+$ ]] || die "KWOK_VERSION=${kwok_version}: want a release such as v0.8.0"
# shellcheck source=lib/cache.sh
source "${here}/lib/cache.sh"
cache_begin "${cache_root}" KubeVirt
mkdir -p "${work}/bin"
export GOWORK=off CGO_ENABLED=0

# go_quiet CMD...: go's children must not hold our stdout or the lock.
go_quiet() { (exec 3>&- 4>&- && "$@"); }

# kubevirt_tree: a writable copy of the kubevirt.io/kubevirt module that builds on its own.
kubevirt_tree() {
	local src="${work}/kubevirt"
	if [[ ! -d "${src}" ]]; then
		local mod
		mod="$(go_quiet go mod download -json "kubevirt.io/kubevirt@${kubevirt_version}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
		[[ -d "${mod}" ]] || die "kubevirt.io/kubevirt ${kubevirt_version} not found on the module proxy"
		cp -r "${mod}" "${src}"
		chmod -R u+w "${src}"
		rm -f "${src}/go.work" "${src}/go.work.sum"
		(cd "${src}" && go_quiet go mod edit \
			-dropreplace kubevirt.io/api -dropreplace kubevirt.io/client-go \
			-require "kubevirt.io/api@${kubevirt_version}" -require "kubevirt.io/client-go@${kubevirt_version}")
	fi
	echo "${src}"
}

# kubevirt_build OUT PKG: one binary of the KubeVirt tree (its vendor/ is absent: -mod=mod).
kubevirt_build() {
	local src
	src="$(kubevirt_tree)"
	(cd "${src}" && GOFLAGS=-mod=mod go_quiet go build -trimpath -tags virtrules_oracle \
		-ldflags "-s -w -X main.kubevirtVersion=${kubevirt_version}" -o "$1" "$2") ||
		die "build $2 of kubevirt.io/kubevirt ${kubevirt_version} failed"
}

start=${SECONDS}
if ! [[ -x "${kubevirt_dir}/virt-controller" && -x "${kubevirt_dir}/virt-api" ]]; then
	echo "building KubeVirt ${kubevirt_version} virt-controller and virt-api into ${kubevirt_dir}"
	kubevirt_build "${work}/bin/virt-controller" ./cmd/virt-controller
	kubevirt_build "${work}/bin/virt-api" ./cmd/virt-api
	mkdir -p "${kubevirt_dir}"
	mv "${work}/bin/virt-controller" "${work}/bin/virt-api" "${kubevirt_dir}/"
	echo "virt-controller, virt-api ${kubevirt_version}: built in $((SECONDS - start)) s"
fi

start=${SECONDS}
if ! [[ -x "${kwok_dir}/kwok" ]]; then
	echo "building kwok ${kwok_version} into ${kwok_dir}"
	GOBIN="${work}/bin" go_quiet go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${kwok_version}" ||
		die "build kwok ${kwok_version} failed"
	mkdir -p "${kwok_dir}"
	mv "${work}/bin/kwok" "${kwok_dir}/"
	echo "kwok ${kwok_version}: built in $((SECONDS - start)) s"
fi
if ! [[ -d "${kwok_dir}/kwok-stages" ]]; then
	kwok_mod="$(go_quiet go mod download -json "sigs.k8s.io/kwok@${kwok_version}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
	mkdir -p "${work}/kwok-stages"
	for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
		pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
		cp "${kwok_mod}/kustomize/stage/${stage}.yaml" "${work}/kwok-stages/" ||
			die "kwok ${kwok_version} has no stage ${stage}"
	done
	mv "${work}/kwok-stages" "${kwok_dir}/"
fi

start=${SECONDS}
echo "building kubevirt-oracle (source ${oracle_hash}) against KubeVirt ${kubevirt_version}"
src="$(kubevirt_tree)"
mkdir -p "${src}/tools/virtrules-oracle"
cp "${oracle_src}"/*.go "${src}/tools/virtrules-oracle/"
# The exporting files go into KubeVirt's packages under a name of their own (zz_virtrules_...),
# which never replaces a file of KubeVirt's.
while read -r file; do
	rel="${file#"${export_src}"/}"
	pkg="${src}/$(dirname "${rel}")"
	[[ -d "${pkg}" ]] || die "hack/kubevirt/export/${rel}: kubevirt.io/kubevirt ${kubevirt_version} has no package $(dirname "${rel}")"
	cp "${file}" "${pkg}/zz_virtrules_$(basename "${rel}")"
done < <(find "${export_src}" -name '*.go' | LC_ALL=C sort)
kubevirt_build "${work}/bin/kubevirt-oracle" ./tools/virtrules-oracle
echo "kubevirt-oracle: built in $((SECONDS - start)) s"
[[ "$("${work}/bin/kubevirt-oracle" version)" == "${kubevirt_version}" ]] || die "built kubevirt-oracle does not run"

ln -s "${kubevirt_dir}/virt-controller" "${kubevirt_dir}/virt-api" "${kwok_dir}/kwok" "${kwok_dir}/kwok-stages" "${work}/bin/"
rm -rf "${dest}"
mv "${work}/bin" "${dest}"
echo "${dest}" >&3
