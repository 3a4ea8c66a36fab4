// Package rego holds the virt-rules decision modules as an OPA bundle source tree.
//
// The directory layout mirrors the Rego packages (virtrules/migration/policy holds package
// virtrules.migration.policy). Bundle exposes the tree so the engine can serve it without any
// files on disk; `go tool opa test rego` and `go tool opa build rego` see the same files.
package rego

import (
	"embed"
	"io/fs"
)

//go:embed .manifest virtrules
var files embed.FS

// Bundle returns the bundle source tree compiled into the binary, tests included.
func Bundle() fs.FS { return files }
