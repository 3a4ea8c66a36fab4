package testcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// container is a container left in the node's containerd when kubelet has stopped, and its
// network namespace (a pod sandbox's, made by the CRI under /var/run/netns, outside the node's
// folder).
type container struct {
	id    string
	netns string
}

// removeContainers kills and deletes every container left in the node's containerd: a pod
// kubelet did not get to stop (a spec that failed halfway, a drain that timed out).
func (n *RealNode) removeContainers(ctx context.Context) ([]container, error) {
	out, err := n.ctr(ctx, "containers", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	var left []container
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		c := container{id: id, netns: n.netnsOf(ctx, id)}
		left = append(left, c)
		// The task may be gone already: only the delete's failure counts.
		_, _ = n.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		_, _ = n.ctr(ctx, "tasks", "delete", "--force", id)
		if _, err := n.ctr(ctx, "containers", "delete", id); err != nil {
			errs = append(errs, err)
		}
	}
	if len(left) > 0 {
		n.cluster.log.Info("removed containers kubelet left", "node", n.Name, "containers", len(left))
	}
	return left, errors.Join(errs...)
}

// netnsOf is the network namespace file container id's spec joins, "" if none or unreadable.
func (n *RealNode) netnsOf(ctx context.Context, id string) string {
	out, err := n.ctr(ctx, "containers", "info", id)
	if err != nil {
		return ""
	}
	var info struct {
		Spec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"Spec"`
	}
	if json.Unmarshal(out, &info) != nil {
		return ""
	}
	for _, ns := range info.Spec.Linux.Namespaces {
		if ns.Type == "network" && strings.HasPrefix(ns.Path, "/var/run/netns/") {
			return ns.Path
		}
	}
	return ""
}

// killShims kills the containerd shims of the node's containerd, found by the socket they
// were started with: a shim outlives containerd by design, and one of a killed container would
// keep its mounts busy.
func (n *RealNode) killShims() error {
	pids, err := n.shims()
	if err != nil || len(pids) == 0 {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if pids, err = n.shims(); err != nil || len(pids) == 0 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("shims %v of %s still run 10 s after SIGKILL", pids, n.Name)
}

// shims are the PIDs of the processes named containerd-shim* whose -address is the node's
// socket.
func (n *RealNode) shims() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == n.socket {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// removeHostState undoes what the node did to the machine beyond its folder and its
// processes: the mounts under its folder (kubelet bind-mounts its root onto itself, and pods'
// volumes, containers' root filesystems and sandboxes' shm live there), and the network
// namespaces and cgroups of containers kubelet left.
func (n *RealNode) removeHostState(left []container) error {
	var errs []error
	errs = append(errs, unmountUnder(n.Dir))
	for _, c := range left {
		if c.netns != "" {
			if err := syscall.Unmount(c.netns, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", c.netns, err))
			}
			if err := os.Remove(c.netns); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		// runc removes a container's cgroups when the container is deleted; these are of one
		// whose shim was killed first. Empty by now, so rmdir is enough.
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "k8s.io", c.id))
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	}
	// containerd's parent cgroup of every container, made by it in each hierarchy when
	// absent; rmdir leaves it to a containerd that still has containers there.
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "k8s.io"))
	for _, d := range parents {
		_ = os.Remove(d)
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		// The kernel writes a space in a path as \040.
		p := strings.ReplaceAll(fields[4], `\040`, " ")
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	// A path's mounts come after its parents' in mountinfo; a folder mounted twice (kubelet's
	// root) is listed twice and unmounted twice.
	slices.Reverse(points)
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, 0); err != nil {
			if err = syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}
