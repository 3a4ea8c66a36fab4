//go:build !linux

package main

// runAsInit is for Linux containers only (init_linux.go).
func runAsInit() (bool, error) { return false, nil }
