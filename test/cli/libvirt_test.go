//go:build libvirt

package cli_test

// A suite built with libvirt tests a binary built with it.
func init() { buildFlags = append(buildFlags, "-tags=libvirt") }
