package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
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
// The documents that are no object (unreadable, not Kubernetes objects) are returned apart,
// as errors of the report: the other objects are decided all the same. The error is for
// inputs that cannot be read at all (a path that is not there, over --max-input-bytes, a
// cluster that refuses), or that hold nothing.
func (f *inputFlags) readAt(cmd *cobra.Command, paths []string, warn func(string), now string) ([]manifest.Object, []*manifest.Error, time.Time, error) {
	at, err := parseNow(now)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	objs, err := f.read(cmd, paths, warn)
	unreadable, rest := manifest.Errors(err)
	if rest != nil {
		return nil, nil, time.Time{}, rest
	}
	if len(objs) == 0 && len(unreadable) == 0 && !f.isLive() {
		return nil, nil, time.Time{}, fmt.Errorf("no objects in %s: nothing to decide", strings.Join(paths, ", "))
	}
	return objs, unreadable, at, nil
}

// objectErrors prints errs to w, one line each as FILE:LINE: Kind namespace/name: field:
// message, then how many objects are in error; and returns exit status 1 when there is any
// (the report printed is complete for every other object).
func objectErrors(w io.Writer, errs []*manifest.Error) error {
	if len(errs) == 0 {
		return nil
	}
	objects := map[string]bool{}
	for _, e := range errs {
		fmt.Fprintln(w, "error:", e)
		// A document that names no object counts by its location.
		key := e.Object()
		if key == "" {
			key = e.Location
		}
		objects[key] = true
	}
	fmt.Fprintf(w, "%d %s in error, %d %s: every other object is decided\n", len(objects), plural(len(objects), "object", "objects"), len(errs), plural(len(errs), "error", "errors"))
	return exitStatus(1)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// warner writes warnings to w, one line each.
func warner(w io.Writer) func(string) {
	return func(line string) { fmt.Fprintln(w, "warning:", line) }
}
