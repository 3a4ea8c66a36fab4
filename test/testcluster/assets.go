package testcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Assets is the binaries folder named by the environment variable env, or else the last line
// hack/SCRIPT prints in repoRoot (hack/control-plane.sh, hack/kubevirt.sh): the script builds
// the binaries the first time on a machine (minutes; its progress goes to progress) and answers
// from its cache after that. Cancelling ctx stops the build, go included, with SIGTERM.
func Assets(ctx context.Context, repoRoot, env, script string, progress io.Writer) (string, error) {
	if dir := os.Getenv(env); dir != "" {
		return dir, nil
	}
	path := filepath.Join(repoRoot, "hack", script)
	cmd := exec.CommandContext(ctx, path)
	cmd.Dir = repoRoot
	cmd.Stderr = progress
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("run %s (%s is unset): %w", path, env, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}
