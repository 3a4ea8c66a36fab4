package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/download"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
)

// RemoteBundle is a bundle server the engine polls with OPA's bundle downloader: a GET with
// If-None-Match (the ETag of the bundle it has), a random wait between polls and an
// exponential backoff after errors. A downloaded bundle is verified (WithVerificationKey),
// then validated like any other (compile, strict check, its own tests) before it replaces
// the serving one; on any failure the serving bundle stays.
type RemoteBundle struct {
	// URL is the bundle's http(s) address, such as https://bundles.example/virt-rules.tar.gz.
	URL string
	// MinDelay and MaxDelay bound the random wait between two polls. OPA's downloader counts
	// whole seconds: both are rounded up, to at least 1s. After an error the wait backs off
	// from 0.1s up to MaxDelay.
	MinDelay, MaxDelay time.Duration
	// CacheDir keeps the last good downloaded bundle (bundle.tar.gz, as served, signature
	// included, and its ETag) so that a restart while the server is down starts from it:
	// Store DirStore(CacheDir). "" keeps none.
	CacheDir string
	// Store keeps the last good downloaded bundle instead of CacheDir; set one or neither.
	Store BundleStore
	// AllowHTTP accepts an http:// URL: the bundle, which decides what the controller and its
	// webhooks do, then travels in the clear. By default only https:// is accepted.
	AllowHTTP bool
}

type remote struct {
	cfg        RemoteBundle
	base, path string      // cfg.URL split for OPA's REST client, which requests base + "/" + path
	store      BundleStore // of the last good bundle; nil keeps none

	mu   sync.Mutex
	etag string // of the bundle serving, "" when unknown

	manualMu sync.Mutex // the downloader is not safe for concurrent triggers
	manual   *download.Downloader
}

// startRemote prepares polling and activates the persisted last good bundle, if any. With
// none, the engine starts without a bundle.
func (e *Engine) startRemote(ctx context.Context, cfg RemoteBundle) error {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bundle URL %q: want an https:// address", cfg.URL)
	}
	if u.Scheme == "http" && !cfg.AllowHTTP {
		return fmt.Errorf("bundle URL %q: the bundle would travel in the clear: want https://, or allow http:// explicitly (--bundle-allow-http)", cfg.URL)
	}
	base, path := cfg.URL, ""
	if i := strings.LastIndex(u.Path, "/"); i >= 0 {
		dir := *u
		dir.Path, dir.RawPath, dir.RawQuery, dir.Fragment = u.Path[:i], "", "", ""
		base = dir.String()
		path = u.Path[i+1:]
		if u.RawQuery != "" {
			path += "?" + u.RawQuery
		}
	}
	e.remote = &remote{cfg: cfg, base: base, path: path, store: cfg.Store}
	if cfg.CacheDir != "" {
		if cfg.Store != nil {
			return fmt.Errorf("bundle URL %q: a cache directory and a bundle store: set one", cfg.URL)
		}
		e.remote.store = DirStore(cfg.CacheDir)
	}
	e.active.Store(&generation{source: cfg.URL, decisions: e.decisions})
	if e.remote.store != nil {
		e.loadCached(ctx)
	}
	return nil
}

// loadCached activates the persisted last good bundle. Failing that, it reports why and the
// engine waits for the server.
func (e *Engine) loadCached(ctx context.Context) {
	store := e.remote.store
	raw, etag, err := store.Load(ctx)
	if err != nil {
		e.refuse(ctx, store.String(), refused(store.String(), ReasonRead, "load persisted bundle", err))
		return
	}
	if raw == nil {
		e.log.InfoContext(ctx, "no persisted bundle yet", "store", store.String())
		return
	}
	if err := e.loadRaw(ctx, store.String(), raw, etag); err != nil {
		return // reported by loadRaw
	}
	e.remote.setETag(etag)
}

func (r *remote) setETag(etag string) {
	r.mu.Lock()
	r.etag = etag
	r.mu.Unlock()
}

func (r *remote) currentETag() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.etag
}

// PollBundle polls the bundle server of WithRemoteBundle until ctx ends, activating each new
// bundle that passes verification and validation.
func (e *Engine) PollBundle(ctx context.Context) error {
	if e.remote == nil {
		return errors.New("poll bundle: no bundle server configured")
	}
	d, err := e.downloader(plugins.TriggerPeriodic)
	if err != nil {
		return err
	}
	e.log.InfoContext(ctx, "polling bundle server", "url", e.remote.cfg.URL,
		"minDelay", e.remote.cfg.MinDelay, "maxDelay", e.remote.cfg.MaxDelay, "signed", e.verify != nil)
	d.Start(ctx)
	<-ctx.Done()
	d.Stop(context.Background())
	return nil
}

// UpdateBundle asks the bundle server once, now, and activates what it serves if it is new
// and valid. It returns why a bundle was refused or could not be downloaded, nil when the
// bundle is active or unchanged. Calls are serialised; they do not disturb PollBundle.
func (e *Engine) UpdateBundle(ctx context.Context) error {
	if e.remote == nil {
		return errors.New("update bundle: no bundle server configured")
	}
	e.remote.manualMu.Lock()
	defer e.remote.manualMu.Unlock()
	if e.remote.manual == nil {
		d, err := e.downloader(plugins.TriggerManual)
		if err != nil {
			return err
		}
		e.remote.manual = d
	}
	d := e.remote.manual
	if err := d.Trigger(ctx); err != nil {
		if RefusalReason(err) == "" {
			err = e.downloadError(err)
		}
		return err
	}
	return nil
}

func (e *Engine) downloader(trigger plugins.TriggerMode) (*download.Downloader, error) {
	r := e.remote
	minDelay, maxDelay := seconds(r.cfg.MinDelay), seconds(r.cfg.MaxDelay)
	maxDelay = max(maxDelay, minDelay)
	cfg := download.Config{Trigger: &trigger, Polling: download.PollingConfig{MinDelaySeconds: &minDelay, MaxDelaySeconds: &maxDelay}}
	if err := cfg.ValidateAndInjectDefaults(); err != nil {
		return nil, fmt.Errorf("bundle polling: %w", err)
	}
	// The size-limited client reads every response through a size guard (bundlesize.go).
	restCfg, err := json.Marshal(map[string]any{"url": r.base, "credentials": map[string]any{"plugin": sizeLimitedClientName}})
	if err != nil {
		return nil, err
	}
	plugin := sizeLimitedClient{limit: e.sizeLimit}
	client, err := rest.New(restCfg, nil, rest.Logger(&opaLogger{log: e.log.With("url", r.cfg.URL)}),
		rest.AuthPluginLookup(func(name string) rest.HTTPAuthPlugin {
			if name == sizeLimitedClientName {
				return plugin
			}
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("bundle server client: %w", err)
	}
	d := download.New(cfg, client, r.path).
		WithCallback(e.onDownload).
		WithBundleVerificationConfig(e.verify).
		WithBundlePersistence(r.store != nil).
		WithSizeLimitBytes(e.fileLimit).
		WithBundleParserOpts(ast.ParserOptions{ProcessAnnotation: true, RegoVersion: ast.RegoV1})
	d.SetCache(r.currentETag())
	return d, nil
}

func seconds(d time.Duration) int64 { return max(1, int64(math.Ceil(d.Seconds()))) }

// onDownload is called by OPA's downloader after every poll.
func (e *Engine) onDownload(ctx context.Context, u download.Update) error {
	url := e.remote.cfg.URL
	e.endProbation(ctx, time.Now())
	switch {
	case u.Error != nil:
		e.refuse(ctx, url, e.downloadError(u.Error))
		return nil // the downloader backs off and returns u.Error itself
	case u.Bundle == nil:
		e.log.DebugContext(ctx, "bundle not modified", "url", url, "etag", u.ETag)
		return nil
	}
	var raw []byte
	if e.remote.store != nil && u.Raw != nil {
		var err error
		if raw, err = io.ReadAll(u.Raw); err != nil {
			raw = nil
		}
	}
	var activated *generation
	err := e.activate(ctx, url, func() (*generation, error) {
		g, err := e.build(ctx, u.Bundle, url)
		if g != nil {
			g.raw, g.etag = raw, u.ETag
		}
		activated = g
		return g, err
	})
	if err != nil {
		return err // keeps u.ETag: the same refused bundle is not downloaded again
	}
	e.remote.setETag(u.ETag)
	if raw != nil {
		e.startProbation(ctx, activated)
	}
	return nil
}

// downloadError classifies an error of OPA's downloader: the server, the signature or the
// bundle's contents.
func (e *Engine) downloadError(err error) error {
	var httpErr download.HTTPError
	switch {
	case errors.As(err, &httpErr), strings.HasPrefix(err.Error(), "request failed"):
		return refused(e.remote.cfg.URL, ReasonDownload, "download", err)
	case e.verify != nil && isSignatureError(err):
		return refused(e.remote.cfg.URL, ReasonSignature, "verify", err)
	default:
		return refused(e.remote.cfg.URL, ReasonRead, "read", err)
	}
}

// persist makes raw, as served, and its ETag the store's last good bundle.
func (e *Engine) persist(ctx context.Context, raw []byte, etag string) error {
	if err := e.remote.store.Save(ctx, raw, etag); err != nil {
		return fmt.Errorf("save in %s: %w", e.remote.store, err)
	}
	return nil
}

// opaLogger hands OPA's download and REST client logs to the engine's structured logger.
type opaLogger struct {
	log *slog.Logger
}

func (l *opaLogger) Debug(f string, a ...any) { l.log.Debug(fmt.Sprintf(f, a...)) }
func (l *opaLogger) Info(f string, a ...any)  { l.log.Info(fmt.Sprintf(f, a...)) }
func (l *opaLogger) Warn(f string, a ...any)  { l.log.Warn(fmt.Sprintf(f, a...)) }
func (l *opaLogger) Error(f string, a ...any) { l.log.Error(fmt.Sprintf(f, a...)) }

func (l *opaLogger) WithFields(fields map[string]any) logging.Logger {
	attrs := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		attrs = append(attrs, k, v)
	}
	return &opaLogger{log: l.log.With(attrs...)}
}

func (l *opaLogger) GetLevel() logging.Level {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		return logging.Debug
	}
	return logging.Info
}

func (l *opaLogger) SetLevel(logging.Level) {}
