# shellcheck shell=bash
# cache.sh: what the build scripts of hack/ share, sourced by them. A build script defines
# die, built (whether ${dest} holds every binary) and dest, opens fd 3 on its real stdout, then
# calls cache_begin ROOT WHAT.

# cache_begin ROOT WHAT: one build at a time per cache ROOT: a second caller waits for the lock,
# then, finding the binaries built, prints ${dest} and exits. Sets work, a temporary folder in
# ROOT (beside the destination, so moving binaries in is a rename), removed on exit.
cache_begin() {
	local root=$1 what=$2
	mkdir -p "${root}"
	if command -v flock >/dev/null; then
		exec 4>"${root}/.lock"
		if ! flock -n 4; then
			echo "waiting for another ${what} build (lock ${root}/.lock)"
			flock 4
		fi
		if built; then
			echo "${dest}" >&3
			exit 0
		fi
		# Holding the lock, leftovers of a killed build are safe to remove.
		rm -rf "${root}"/.build-*
	fi
	work="$(mktemp -d "${root}/.build-XXXXXX")"
	readonly work
	trap 'rm -rf "${work}"' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}
