package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlecache"
	"github.com/virt-rules/virt-rules/internal/decisionlog"
)

// defaultBundleCacheDir is where the controller keeps the last good bundle downloaded from
// --bundle-url (examples/deploy mounts an emptyDir there, which survives container restarts).
const defaultBundleCacheDir = "/var/cache/virt-rules/bundle"

// remoteBundleFlags are the controller's flags for a bundle server.
type remoteBundleFlags struct {
	url          string
	cacheDir     string
	cacheCM      string
	allowHTTP    bool
	revertErrors int
	revertWindow time.Duration
}

func (f *remoteBundleFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "bundle-url", "", "poll the Rego bundle at this http(s) `URL` (ETag/If-None-Match, every --bundle-poll-interval to 1.5x that, backoff on errors) instead of serving the embedded one; /readyz fails until one is active")
	cmd.Flags().StringVar(&f.cacheDir, "bundle-cache-dir", defaultBundleCacheDir, "`DIR` keeping the last good bundle from --bundle-url, served on start when the server is down (\"\" keeps none)")
	cmd.Flags().StringVar(&f.cacheCM, "bundle-cache-configmap", "", "keep the last good bundle from --bundle-url in the ConfigMap `NAMESPACE/NAME` instead of --bundle-cache-dir, so that it outlives the pod (an upgrade, a reschedule); the controller must be allowed to get and update it")
	cmd.Flags().BoolVar(&f.allowHTTP, "bundle-allow-http", false, "accept an http:// --bundle-url: the bundle, which decides what the controller and its webhooks do, then travels in the clear")
	cmd.Flags().IntVar(&f.revertErrors, "bundle-revert-errors", engine.DefaultRevertErrors, "refuse the serving bundle once this many of its decisions broke their budget (--decision-timeout, --decision-memory-limit) within --bundle-revert-window, and restore the one before it (0: never)")
	cmd.Flags().DurationVar(&f.revertWindow, "bundle-revert-window", engine.DefaultRevertWindow, "the window of --bundle-revert-errors; also the probation of a new bundle from --bundle-url, persisted in --bundle-cache-dir or --bundle-cache-configmap only once it has served this long within its budget")
}

// options are the engine options for reverting a bundle, and for a bundle server polled
// every interval (jittered up to 1.5x). cfg reaches the API server of --bundle-cache-configmap.
func (f *remoteBundleFlags) options(interval time.Duration, cfg func() (*rest.Config, error)) ([]engine.Option, error) {
	opts := []engine.Option{engine.WithBundleRevert(f.revertErrors, f.revertWindow)}
	if f.url == "" {
		return opts, nil
	}
	remote := engine.RemoteBundle{URL: f.url, MinDelay: interval, MaxDelay: interval * 3 / 2, CacheDir: f.cacheDir, AllowHTTP: f.allowHTTP}
	if f.cacheCM != "" {
		if f.cacheDir != defaultBundleCacheDir {
			return nil, errors.New("--bundle-cache-configmap and --bundle-cache-dir: set one")
		}
		ns, name, ok := strings.Cut(f.cacheCM, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--bundle-cache-configmap %q: want NAMESPACE/NAME", f.cacheCM)
		}
		rc, err := cfg()
		if err != nil {
			return nil, err
		}
		c, err := client.New(rc, client.Options{})
		if err != nil {
			return nil, fmt.Errorf("--bundle-cache-configmap: client: %w", err)
		}
		remote.CacheDir, remote.Store = "", bundlecache.New(c, client.ObjectKey{Namespace: ns, Name: name})
	}
	return append(opts, engine.WithRemoteBundle(remote)), nil
}

// decisionLogFlag is --decision-log, shared by the commands that decide.
type decisionLogFlag struct {
	spec string
}

func (f *decisionLogFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.spec, "decision-log", "", "log every decision as an OPA decision-log event: stdout or stderr (one JSON line each), or an http(s) `URL` to POST gzip JSON batches to (OPA's decision-log API)")
}

// open returns the decision logger asked for (nil when off) and the engine option using it.
func (f *decisionLogFlag) open(log *slog.Logger) (decisionlog.Logger, []engine.Option, error) {
	if f.spec == "" {
		return nil, nil, nil
	}
	id, _ := os.Hostname()
	if pod := os.Getenv("POD_NAME"); pod != "" {
		id = pod
	}
	l, err := decisionlog.Open(f.spec, decisionlog.Options{
		Labels: map[string]string{"app": "virt-rules", "id": id, "version": binaryVersion()},
		Log:    log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("--decision-log: %w", err)
	}
	return l, []engine.Option{engine.WithDecisionLogger(l)}, nil
}

// closeDecisionLog flushes what the decision logger still holds, for at most 10 seconds.
func closeDecisionLog(l decisionlog.Logger, log *slog.Logger) {
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		log.Error("decision log not flushed", "error", err)
	}
}

func binaryVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}
