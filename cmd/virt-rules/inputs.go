package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/virt-rules/virt-rules/internal/live"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// inputFlags say where the objects to decide for come from: manifests (PATH...) or a live
// cluster (--kubeconfig), shared by eval, diff and bench.
type inputFlags struct {
	kubeconfig     string
	context        string
	pageSize       int64
	requestTimeout time.Duration
	maxInput       int64
}

func (f *inputFlags) register(cmd *cobra.Command, cluster bool) {
	maxInputFlag(cmd, &f.maxInput)
	if !cluster {
		return
	}
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "read the objects from the cluster of this kubeconfig `FILE` (paged lists, read only: examples/rbac/eval.yaml) instead of manifests")
	cmd.Flags().StringVar(&f.context, "context", "", "the kubeconfig `NAME`d context (default: its current context)")
	cmd.Flags().Int64Var(&f.pageSize, "page-size", live.DefaultPageSize, "list at most `N` objects per request from the cluster")
	cmd.Flags().DurationVar(&f.requestTimeout, "request-timeout", 60*time.Second, "give up on a request to the cluster after this long")
}

// isLive is whether the objects come from a cluster.
func (f *inputFlags) isLive() bool { return f.kubeconfig != "" || f.context != "" }

// args checks that there are paths or a cluster, not both.
func (f *inputFlags) args(_ *cobra.Command, paths []string) error {
	switch {
	case f.isLive() && len(paths) > 0:
		return errors.New("give manifests (PATH...) or --kubeconfig, not both")
	case !f.isLive() && len(paths) == 0:
		return errors.New("give manifests (PATH..., - for stdin) or --kubeconfig to read a cluster")
	}
	return nil
}

// read reads the objects: from the manifests under paths, or from the cluster.
func (f *inputFlags) read(cmd *cobra.Command, paths []string, warn func(string)) ([]manifest.Object, error) {
	if !f.isLive() {
		return manifest.ReadLimited(paths, cmd.InOrStdin(), f.maxInput)
	}
	cfg, err := live.Config(f.kubeconfig, f.context, f.requestTimeout)
	if err != nil {
		return nil, err
	}
	return live.Read(cmd.Context(), cfg, live.Options{PageSize: f.pageSize, MaxBytes: f.maxInput, Warn: warn})
}

// readAt reads the objects as read does, and --now (now) as the time they are decided at.
func (f *inputFlags) readAt(cmd *cobra.Command, paths []string, warn func(string), now string) ([]manifest.Object, time.Time, error) {
	at, err := parseNow(now)
	if err != nil {
		return nil, time.Time{}, err
	}
	objs, err := f.read(cmd, paths, warn)
	return objs, at, err
}

// warner writes warnings to w, one line each.
func warner(w io.Writer) func(string) {
	return func(line string) { fmt.Fprintln(w, "warning:", line) }
}
