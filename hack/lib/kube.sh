# kube.sh: what hack/control-plane.sh and hack/node.sh share to build Kubernetes' commands from
# the Go module proxy. Sourced; needs staging_version (v0.<minor>.<patch>) set.

# kube_gomod_lines GOMOD: the go and godebug lines of kubernetes' go.mod, and a replace line
# pinning each staging module (there `k8s.io/x => ./staging/src/k8s.io/x`) to its published
# release. Any other replace that names a version is copied as is.
kube_gomod_lines() {
	awk -v staging="${staging_version}" '
		/^go / { print; next }
		/^godebug[ \t]*\(/ { godebug = 1 }
		godebug || /^godebug / { print; if (/\)/) godebug = 0; next }
		/^replace[ \t]*\(/ { block = 1; next }
		block && /^\)/ { block = 0; next }
		block || /^replace / {
			line = $0
			sub(/^[ \t]*(replace[ \t]+)?/, "", line)
			sub(/[ \t]*\/\/.*$/, "", line)
			n = split(line, f, /[ \t]+/)
			if (n == 0 || f[1] == "") next
			for (i = 1; i <= n && f[i] != "=>"; i++) {}
			target = f[i + 1]
			if (target ~ /^\.\/staging\//) {
				printf "replace %s => %s %s\n", f[1], f[1], staging
				count++
			} else if (target ~ /^[.\/]/) {
				printf "kubernetes go.mod replaces %s with local path %s\n", f[1], target > "/dev/stderr"
				bad = 1
			} else {
				print "replace " line
			}
		}
		END {
			if (count == 0) { print "kubernetes go.mod lists no staging modules" > "/dev/stderr"; exit 1 }
			if (bad) exit 1
		}
	' "$1"
}
