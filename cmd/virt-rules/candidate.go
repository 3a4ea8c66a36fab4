package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// candidateBundleFlags are the flags of a shadow rollout, the controller's and the
// defaulter's: a candidate bundle asked every decision beside the active one, never acted on
// (internal/shadow).
type candidateBundleFlags struct {
	path            string
	url             string
	verificationKey string
	maxInFlight     int
}

func (f *candidateBundleFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.path, "candidate-bundle", "", "shadow rollout: also ask the Rego bundle at `PATH` (a directory or a .tar.gz, reloaded when it changes) every decision, never acting on it; differences are counted, logged and reported")
	fl.StringVar(&f.url, "candidate-bundle-url", "", "shadow rollout: as --candidate-bundle, the bundle polled at this http(s) `URL` (as --bundle-url, without a cache on disk)")
	fl.StringVar(&f.verificationKey, "candidate-bundle-verification-key", "", "refuse a candidate bundle not signed by the private key of this PEM public key `FILE` (default: --bundle-verification-key)")
	fl.IntVar(&f.maxInFlight, "candidate-max-in-flight", shadow.DefaultMaxInFlight, "candidate decisions evaluated at once in the background (up to 10000 more wait; a decision made beyond that is not compared, counted as skipped)")
}

// candidateBounds are what a candidate bundle inherits from the active bundle's flags.
type candidateBounds struct {
	bundle bundleFlags
	// remote holds the bundle server's options (allowHTTP, revert); its URL and cache are not
	// the candidate's.
	remote remoteBundleFlags
	poll   time.Duration
}

// candidateShadow is a shadow rollout and its candidate bundle's status (metrics, Events).
type candidateShadow struct {
	*shadow.Shadow
	status *bundlestatus.Status
}

// shadow loads the candidate bundle and starts following it; nil when none is asked for. It
// has the active bundle's bounds (file and size limits, trial, decision budget, revert) and
// its key unless told another. Its activations and refusals are exported on reg as
// virtrules_candidate_bundle_* (internal/bundlestatus), the comparisons as
// virtrules_candidate_decision_*.
func (f *candidateBundleFlags) shadow(ctx context.Context, active *engine.Engine, b candidateBounds, logger *slog.Logger,
	decisions engine.DecisionLogger, reg prometheus.Registerer) (*candidateShadow, error) {
	switch {
	case f.path == "" && f.url == "":
		return nil, nil
	case f.path != "" && f.url != "":
		return nil, errors.New("--candidate-bundle and --candidate-bundle-url: give one")
	}
	status, err := bundlestatus.NewCandidate(reg)
	if err != nil {
		return nil, fmt.Errorf("candidate bundle metrics: %w", err)
	}
	bounds := b.bundle
	bounds.path = f.path
	if f.verificationKey != "" {
		bounds.verificationKey = f.verificationKey
	}
	remote := b.remote
	remote.url, remote.cacheDir, remote.cacheCM = f.url, "", "" // a candidate keeps no cache
	log := logger.With("bundle", "candidate")
	// Each new candidate revision has the controllers decide every object again, so that it
	// is compared on them all; s is set before the candidate can load another revision.
	var s *shadow.Shadow
	observe := func(ctx context.Context, ev engine.BundleEvent) {
		status.Observe(ctx, ev)
		if s != nil && ev.Err == nil && ev.Revision != "" {
			s.Resync()
		}
	}
	remoteOpts, err := remote.options(b.poll, func() (*rest.Config, error) { return nil, errors.New("a candidate bundle keeps no cache") })
	if err != nil {
		return nil, fmt.Errorf("candidate bundle: %w", err)
	}
	opts := append(append(bounds.options(), engine.WithLogger(log), engine.WithBundleEvents(observe),
		engine.WithBudgetEvents(status.ObserveBudget)), remoteOpts...)
	candidate, err := engine.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("candidate bundle: %w", err)
	}
	s, err = shadow.New(active, candidate, shadow.Options{Log: log, DecisionLog: decisions, Registerer: reg, MaxInFlight: f.maxInFlight})
	if err != nil {
		return nil, err
	}
	if f.path != "" {
		go candidate.WatchBundle(ctx, f.path, b.poll, nil)
	} else {
		// Ask once before the controllers start, so their first decisions are compared; the
		// poller keeps trying when the server does not answer yet.
		if err := candidate.UpdateBundle(ctx); err != nil {
			log.WarnContext(ctx, "no candidate bundle yet: decisions are compared once one is active", "url", f.url, "error", err)
		}
		go candidate.PollBundle(ctx)
	}
	logger.InfoContext(ctx, "shadow rollout: the candidate bundle is asked every decision, never acted on",
		"candidateSource", candidate.Source(), "candidateRevision", candidate.Revision())
	return &candidateShadow{Shadow: s, status: status}, nil
}
