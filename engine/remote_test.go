package engine_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"

	"github.com/virt-rules/virt-rules/engine"
)

// bundleServer is a real HTTP server on loopback that serves one bundle at a time, with an
// ETag, and answers 304 to a matching If-None-Match, as a bundle server (nginx, S3, OCI
// gateways) does.
type bundleServer struct {
	*httptest.Server
	mu          sync.Mutex
	body        []byte
	etag        string
	published   time.Time // when body was published
	fetched     time.Time // when body was first served in full since
	requests    atomic.Int32
	notModified atomic.Int32
}

func newBundleServer(t *testing.T) *bundleServer {
	s := &bundleServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.mu.Lock()
		body, etag := s.body, s.etag
		s.mu.Unlock()
		if body == nil || r.URL.Path != "/bundles/virt-rules.tar.gz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", etag)
		if inm := r.Header.Get("If-None-Match"); inm != "" && strings.Contains(inm, etag) {
			s.notModified.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		s.mu.Lock()
		if s.etag == etag && s.fetched.IsZero() {
			s.fetched = time.Now()
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/gzip")
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *bundleServer) url() string { return s.URL + "/bundles/virt-rules.tar.gz" }

func (s *bundleServer) serve(body []byte) {
	sum := sha256.Sum256(body)
	s.mu.Lock()
	s.body, s.etag = body, `"`+hex.EncodeToString(sum[:8])+`"`
	s.published, s.fetched = time.Now(), time.Time{}
	s.mu.Unlock()
}

// fetchedAfter is how long after its publication the current bundle was first downloaded.
func (s *bundleServer) fetchedAfter() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetched.Sub(s.published)
}

// signingKey is an ECDSA P-256 key pair: the private key PEM (for signing, as
// `opa build --signing-key` reads it) and the path of the public key PEM.
func signingKey(t *testing.T) (private string, publicFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	publicFile = filepath.Join(t.TempDir(), "key.pub.pem")
	writeFile(t, publicFile, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), publicFile
}

// buildBundle is `opa build --bundle dir --revision rev [--signing-key key --signing-alg
// ES256]`, through OPA's own Go package.
func buildBundle(t *testing.T, dir, rev, key string) []byte {
	t.Helper()
	var out bytes.Buffer
	c := compile.New().WithPaths(dir).WithAsBundle(true).WithRevision(rev).WithOutput(&out)
	if key != "" {
		c = c.WithBundleSigningConfig(bundle.NewSigningConfig(key, "ES256", ""))
	}
	if err := c.Build(context.Background()); err != nil {
		t.Fatalf("build bundle %s: %v", rev, err)
	}
	return out.Bytes()
}

// tamper rewrites file in a bundle tarball, keeping everything else (its signature included).
func tamper(t *testing.T, tarball []byte, file, old, new string) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	tw := tar.NewWriter(zw)
	changed := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == file {
			if !bytes.Contains(b, []byte(old)) {
				t.Fatalf("%s does not contain %q", file, old)
			}
			b, changed = bytes.Replace(b, []byte(old), []byte(new), 1), true
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	if !changed {
		t.Fatalf("no %s in the bundle", file)
	}
	tw.Close()
	zw.Close()
	return out.Bytes()
}

// events collects the engine's bundle events.
type events struct {
	mu  sync.Mutex
	all []engine.BundleEvent
}

func (ev *events) record(_ context.Context, e engine.BundleEvent) {
	ev.mu.Lock()
	ev.all = append(ev.all, e)
	ev.mu.Unlock()
}

func (ev *events) last() engine.BundleEvent {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.all[len(ev.all)-1]
}

func (ev *events) activations() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, e := range ev.all {
		if e.Err == nil {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestRemoteBundleActiveWithinOnePollInterval polls a real server: nothing is active (and
// nothing decides) before the first download; a new revision published later is active
// within one poll interval; unchanged polls are answered 304 thanks to If-None-Match.
func TestRemoteBundleActiveWithinOnePollInterval(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := newBundleServer(t)
	const interval = time.Second
	e, err := engine.New(ctx, engine.WithRemoteBundle(engine.RemoteBundle{
		AllowHTTP: true, URL: srv.url(), MinDelay: interval, MaxDelay: interval, CacheDir: t.TempDir(),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision() != "" {
		t.Fatalf("revision %q before any download, want none", e.Revision())
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Decide(ctx, tieVMI); !errors.Is(err, engine.ErrNoBundle) {
		t.Fatalf("decision without a bundle: %v, want ErrNoBundle", err)
	}

	polling := make(chan struct{})
	go func() { defer close(polling); _ = e.PollBundle(ctx) }()
	// The poller may be persisting a bundle into its cache dir: stop it before the test's
	// temporary directories are removed.
	defer func() { cancel(); <-polling }()
	// The server has nothing yet (404): the engine backs off and keeps asking.
	waitFor(t, 5*time.Second, "first poll", func() bool { return srv.requests.Load() > 0 })
	srv.serve(buildBundle(t, bundleDir(t, nil), "rev-1", ""))
	waitFor(t, 5*time.Second, "rev-1 active", func() bool { return e.Revision() == "rev-1" })
	waitFor(t, 5*time.Second, "a 304 for an unchanged bundle", func() bool { return srv.notModified.Load() > 0 })

	srv.serve(buildBundle(t, bundleDir(t, kubevirtMode), "rev-2", ""))
	took := waitFor(t, 10*time.Second, "rev-2 active", func() bool { return e.Revision() == "rev-2" })
	fetched := srv.fetchedAfter()
	t.Logf("rev-2 downloaded %v and active %v after it was published (poll interval %v); %d requests, %d answered 304",
		fetched, took, interval, srv.requests.Load(), srv.notModified.Load())
	// The next poll fetches it: within one interval (plus scheduling slack). Activation then
	// takes a compile, whose speed is not this test's business.
	if fetched < 0 || fetched > interval+250*time.Millisecond {
		t.Errorf("rev-2 downloaded %v after it was published, want within one poll interval (%v)", fetched, interval)
	}
	d, err := set.Decide(ctx, tieVMI)
	if err != nil || d.Policy != "a-zone" || d.Revision != "rev-2" {
		t.Errorf("after rev-2: %+v, %v; want a-zone from rev-2", d, err)
	}
}

// TestRemoteBadBundlesAreRefused serves, after a good signed bundle, bundles that must not
// replace it; each is refused for its own reason and the good one keeps answering.
func TestRemoteBadBundlesAreRefused(t *testing.T) {
	ctx := context.Background()
	private, public := signingKey(t)
	srv := newBundleServer(t)
	var ev events
	e, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithBundleEvents(ev.record),
		engine.WithRemoteBundle(engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	good := buildBundle(t, bundleDir(t, nil), "good", private)
	srv.serve(good)
	if err := e.UpdateBundle(ctx); err != nil {
		t.Fatalf("signed bundle refused: %v", err)
	}
	if e.Revision() != "good" {
		t.Fatalf("revision %q, want good", e.Revision())
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		bundle func(t *testing.T) []byte
		reason string
		inText string
	}{{
		name: "tampered after signing",
		bundle: func(t *testing.T) []byte {
			return tamper(t, buildBundle(t, bundleDir(t, nil), "tampered", private), "data.json", `"default"`, `"kubevirt"`)
		},
		reason: engine.ReasonSignature,
		inText: "digest mismatch",
	}, {
		name:   "unsigned",
		bundle: func(t *testing.T) []byte { return buildBundle(t, bundleDir(t, kubevirtMode), "unsigned", "") },
		reason: engine.ReasonSignature,
		inText: ".signatures.json",
	}, {
		name: "signed by another key",
		bundle: func(t *testing.T) []byte {
			other, _ := signingKey(t)
			return buildBundle(t, bundleDir(t, kubevirtMode), "other-key", other)
		},
		reason: engine.ReasonSignature,
		inText: "verify",
	}, {
		name: "does not compile strictly",
		bundle: func(t *testing.T) []byte {
			return buildBundle(t, bundleDir(t, func(dir string) {
				replaceIn(t, filepath.Join(dir, policyModule), "_scope_name := {", "_unused(x) := 1\n\n_scope_name := {")
			}), "strict", private)
		},
		reason: engine.ReasonCompile,
		inText: "unused argument x",
	}, {
		name: "fails its own test",
		bundle: func(t *testing.T) []byte {
			return buildBundle(t, bundleDir(t, func(dir string) {
				writeFile(t, filepath.Join(dir, "virtrules/migration/policy/broken_test.rego"),
					"package virtrules.migration.policy_test\n\ntest_no_policy_wins if {\n\tdata.virtrules.migration.policy.decision.policy == \"nope\" with input as {\"vmi\": {}, \"policies\": []}\n}\n")
			}), "test-failing", private)
		},
		reason: engine.ReasonTest,
		inText: "test_no_policy_wins",
	}, {
		name:   "server down",
		bundle: nil,
		reason: engine.ReasonDownload,
		inText: "request failed",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bundle != nil {
				srv.serve(tc.bundle(t))
			} else {
				srv.Close()
			}
			err := e.UpdateBundle(ctx)
			if err == nil {
				t.Fatal("bundle was accepted")
			}
			if !errors.Is(err, engine.ErrBundleRefused) || engine.RefusalReason(err) != tc.reason {
				t.Errorf("refused with reason %q, want %q: %v", engine.RefusalReason(err), tc.reason, err)
			}
			if !strings.Contains(err.Error(), tc.inText) {
				t.Errorf("error does not mention %q: %v", tc.inText, err)
			}
			if last := ev.last(); last.Err == nil || last.Reason != tc.reason {
				t.Errorf("last event %+v, want a refusal for %s", last, tc.reason)
			}
			if e.Revision() != "good" {
				t.Errorf("revision %q after a refused bundle, want good", e.Revision())
			}
			d, err := set.Decide(ctx, tieVMI)
			if err != nil || d.Policy != "b-app" || d.Revision != "good" {
				t.Errorf("the good bundle no longer answers: %+v, %v", d, err)
			}
		})
	}
}

// TestRemoteServerDownAtStartUsesPersisted restarts the engine with the server down: it
// serves the last good bundle persisted on disk, verified again.
func TestRemoteServerDownAtStartUsesPersisted(t *testing.T) {
	ctx := context.Background()
	private, public := signingKey(t)
	srv := newBundleServer(t)
	cache := filepath.Join(t.TempDir(), "cache")
	remote := engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}
	first, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	srv.serve(buildBundle(t, bundleDir(t, kubevirtMode), "persisted", private))
	if err := first.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Close()

	second, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote))
	if err != nil {
		t.Fatal(err)
	}
	if second.Revision() != "persisted" {
		t.Fatalf("restarted with the server down: revision %q, want persisted", second.Revision())
	}
	if got := decidePolicy(t, second); got != "a-zone" {
		t.Errorf("persisted bundle decided %q, want a-zone", got)
	}
	if err := second.UpdateBundle(ctx); engine.RefusalReason(err) != engine.ReasonDownload {
		t.Errorf("poll with the server down: %v, want a download failure", err)
	}
	if second.Revision() != "persisted" {
		t.Errorf("revision %q after a failed poll, want persisted", second.Revision())
	}

	// The copy on disk is verified like a download: tampered, it is refused and the engine
	// waits for the server rather than serve it.
	file := filepath.Join(cache, engine.CachedBundleFile)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, string(tamper(t, raw, "data.json", `"kubevirt"`, `"default"`)))
	var ev events
	third, err := engine.New(ctx, engine.WithVerificationKey(public), engine.WithRemoteBundle(remote), engine.WithBundleEvents(ev.record))
	if err != nil {
		t.Fatal(err)
	}
	if third.Revision() != "" || ev.last().Reason != engine.ReasonSignature {
		t.Errorf("tampered persisted bundle: revision %q, last event %+v; want none active and a signature refusal", third.Revision(), ev.last())
	}
}

// TestRemote100SwapsUnderConcurrentEvaluation downloads 100 alternating bundles from a real
// server while goroutines decide: no decision fails, and each matches the one revision it
// reports.
func TestRemote100SwapsUnderConcurrentEvaluation(t *testing.T) {
	ctx := context.Background()
	srv := newBundleServer(t)
	var ev events
	e, err := engine.New(ctx, engine.WithBundleEvents(ev.record),
		engine.WithRemoteBundle(engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	bundles := [2][]byte{
		buildBundle(t, bundleDir(t, nil), "swap-default", ""),
		buildBundle(t, bundleDir(t, kubevirtMode), "swap-kubevirt", ""),
	}
	want := map[string]string{"swap-default": "b-app", "swap-kubevirt": "a-zone"}
	srv.serve(bundles[0])
	if err := e.UpdateBundle(ctx); err != nil {
		t.Fatal(err)
	}
	set, err := e.MigrationPolicies(tiePolicies(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Four deciding goroutines, each pausing a little between decisions so that the swaps
	// (about 0.1s of compiling each) still get a core on a 2-core machine.
	const workers = 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var decisions, failures atomic.Int64
	seen := sync.Map{}
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := set.Decide(ctx, tieVMI)
				if err != nil {
					failures.Add(1)
					t.Error(err)
					return
				}
				if want[d.Revision] != d.Policy {
					failures.Add(1)
					t.Errorf("revision %q decided %q, want %q", d.Revision, d.Policy, want[d.Revision])
					return
				}
				seen.Store(d.Revision, true)
				decisions.Add(1)
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	start := time.Now()
	const swaps = 100
	for i := 1; i <= swaps; i++ {
		srv.serve(bundles[i%2])
		if err := e.UpdateBundle(ctx); err != nil {
			t.Fatalf("swap %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d swaps in %v, %d decisions during them, %d failed or mixed", swaps, time.Since(start).Round(time.Millisecond), decisions.Load(), failures.Load())
	if got := ev.activations(); got != swaps+1 {
		t.Errorf("%d activations, want %d", got, swaps+1)
	}
	for rev := range want {
		if _, ok := seen.Load(rev); !ok {
			t.Errorf("no decision reported revision %s", rev)
		}
	}
}

// bomb is a small .tar.gz whose data.json unpacks to size bytes.
func bomb(t *testing.T, size int) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	body := append(append([]byte(`{"padding": "`), bytes.Repeat([]byte("a"), size-16)...), []byte(`"}`+"\n")...)
	if err := tw.WriteHeader(&tar.Header{Name: "/data.json", Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBundleFileLimitHoldsWhileUnpacking refuses a .tar.gz holding a file over the limit,
// from a path and from a server, before the file is in memory: the heap grows by far less
// than the file.
func TestBundleFileLimitHoldsWhileUnpacking(t *testing.T) {
	ctx := context.Background()
	const size = 200 << 20 // 200 MiB of data.json in a ~200 KiB tarball
	tarball := bomb(t, size)
	path := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(path, tarball, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(ctx, engine.WithBundleFileLimit(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	before := heapInUse()
	err = e.LoadPath(ctx, path)
	if !errors.Is(err, engine.ErrBundleRefused) || !strings.Contains(err.Error(), "exceeds configured size_limit_bytes") {
		t.Fatalf("a %d KiB tarball of a %d MiB file: %v, want refused over the size limit", len(tarball)>>10, size>>20, err)
	}
	if grew := heapInUse() - before; grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB reading it", grew>>20)
	}
	if e.Source() != engine.SourceEmbedded {
		t.Errorf("serving %s after the refusal, want the embedded bundle still", e.Source())
	}

	srv := newBundleServer(t)
	srv.serve(tarball)
	ev := &events{}
	remote, err := engine.New(ctx, engine.WithBundleFileLimit(1<<20), engine.WithBundleEvents(ev.record),
		engine.WithRemoteBundle(engine.RemoteBundle{AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	err = remote.UpdateBundle(ctx)
	if err == nil || !strings.Contains(err.Error(), "exceeds configured size_limit_bytes") {
		t.Fatalf("from a server: %v, want refused over the size limit", err)
	}
	if remote.Revision() != "" {
		t.Errorf("revision %q after the refusal, want none", remote.Revision())
	}
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

func TestBundleURLMustBeHTTPSUnlessAllowed(t *testing.T) {
	_, err := engine.New(context.Background(), engine.WithRemoteBundle(engine.RemoteBundle{URL: "http://bundles.example/virt-rules.tar.gz"}))
	if err == nil || !strings.Contains(err.Error(), "--bundle-allow-http") {
		t.Fatalf("http:// without AllowHTTP: %v", err)
	}
	if _, err := engine.New(context.Background(), engine.WithRemoteBundle(engine.RemoteBundle{URL: "http://bundles.example/virt-rules.tar.gz", AllowHTTP: true})); err != nil {
		t.Fatalf("http:// with AllowHTTP: %v", err)
	}
}
