package engine_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
)

// memStore is a BundleStore in memory, as a host's store (a ConfigMap) would be elsewhere.
type memStore struct {
	mu      sync.Mutex
	raw     []byte
	etag    string
	saves   int
	loadErr error
}

func (m *memStore) Load(context.Context) ([]byte, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.raw, m.etag, m.loadErr
}

func (m *memStore) Save(_ context.Context, raw []byte, etag string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.raw, m.etag, m.saves = bytes.Clone(raw), etag, m.saves+1
	return nil
}

func (m *memStore) Clear(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.raw, m.etag = nil, ""
	return nil
}

func (m *memStore) String() string { return "memory" }

// TestRemoteBundleStore keeps the downloaded bundle in a host's store: a new engine started
// with the server down serves it, verified again; a store that cannot be read is reported
// and the engine waits for the server.
func TestRemoteBundleStore(t *testing.T) {
	ctx := context.Background()
	private, public := signingKey(t)
	srv := newBundleServer(t)
	store := &memStore{}
	remote := engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, Store: store}
	first, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	served := buildBundle(t, bundleDir(t, kubevirtMode), "stored", private)
	srv.serve(served)
	if err := first.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	if store.saves != 1 || !bytes.Equal(store.raw, served) || store.etag == "" {
		t.Fatalf("store after the first download: %d saves, %d bytes, etag %q; want the served %d bytes and their ETag", store.saves, len(store.raw), store.etag, len(served))
	}
	srv.Close()

	var ev events
	second, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote), engine.WithBundleEvents(ev.record))
	if err != nil {
		t.Fatal(err)
	}
	if second.Revision() != "stored" || second.Source() != "memory" {
		t.Fatalf("started with the server down: revision %q from %q, want stored from memory", second.Revision(), second.Source())
	}
	if got := decidePolicy(t, second); got != "a-zone" {
		t.Errorf("stored bundle decided %q, want a-zone", got)
	}

	store.raw = tamper(t, served, "data.json", `"kubevirt"`, `"default"`)
	third, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote), engine.WithBundleEvents(ev.record))
	if err != nil {
		t.Fatal(err)
	}
	if third.Revision() != "" || ev.last().Reason != engine.ReasonSignature {
		t.Errorf("tampered stored bundle: revision %q, last event %+v; want none active and a signature refusal", third.Revision(), ev.last())
	}

	store.loadErr = errors.New("the API server is away")
	fourth, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote), engine.WithBundleEvents(ev.record))
	if err != nil {
		t.Fatal(err)
	}
	if fourth.Revision() != "" || ev.last().Reason != engine.ReasonRead {
		t.Errorf("unreadable store: revision %q, last event %+v; want none active and a read refusal", fourth.Revision(), ev.last())
	}

	both := remote
	both.CacheDir = t.TempDir()
	if _, err := engine.New(ctx, engine.WithRemoteBundle(both)); err == nil {
		t.Error("a cache directory and a store: no error")
	}
}
