package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// VMExampleFiles are the files of the VirtualMachine and VirtualMachineInstance examples the
// VM defaults are judged on: KubeVirt's own examples/ (vm-*.yaml, vmi-*.yaml) at version, from
// the Go module cache (downloaded through the module proxy when missing, never copied into
// this repository), with the instancetypes and preferences of KubeVirt's examples/ that its VM
// examples refer to (the files of instancetype.kubevirt.io objects), then virt-rules'
// examples/defaults under repoRoot. moduleDir is where KubeVirt's module is, to name sources by.
func VMExampleFiles(ctx context.Context, repoRoot, version string) (files []string, moduleDir string, err error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", "kubevirt.io/kubevirt@"+version).Output()
	if err != nil {
		return nil, "", fmt.Errorf("go mod download kubevirt.io/kubevirt@%s: %w", version, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return nil, "", fmt.Errorf("go mod download kubevirt.io/kubevirt@%s: no module directory (%s): %v", version, mod.Error, err)
	}
	all, err := filepath.Glob(filepath.Join(mod.Dir, "examples", "*.yaml"))
	if err != nil {
		return nil, "", err
	}
	for _, f := range all {
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, "", err
		}
		if bytes.Contains(text, []byte("apiVersion: instancetype.kubevirt.io/")) {
			files = append(files, f)
		}
	}
	for _, pattern := range []string{
		filepath.Join(mod.Dir, "examples", "vm-*.yaml"),
		filepath.Join(mod.Dir, "examples", "vmi-*.yaml"),
		filepath.Join(repoRoot, "examples", "defaults", "*.yaml"),
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, "", err
		}
		files = append(files, m...)
	}
	return files, mod.Dir, nil
}
