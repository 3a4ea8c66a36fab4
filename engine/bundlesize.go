package engine

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/open-policy-agent/opa/v1/plugins/rest"
)

// The bundle size limit.
//
// OPA's tarball reader checks each file against the file limit, but reads every file of the
// archive into memory before handing any over: many files each under the file limit would
// all be held. The size guard reads the same compressed bytes as OPA's reader, as they pass
// (from a file, or from the bundle server's response), decompresses them a second time and
// adds up the sizes of the archive's regular files from their tar headers, which come before
// their contents. Once the sum passes the size limit the next read fails with
// ErrBundleTooLarge, so OPA's reader stops with the files up to that one in memory: the limit
// holds to within one file (itself under the file limit) and the few KiB of compressed data
// each side decompresses ahead.

// sizeGuard passes a .tar.gz through and fails the read that takes its files over limit.
type sizeGuard struct {
	r     io.Reader
	pw    *io.PipeWriter
	done  chan struct{}
	mu    sync.Mutex
	err   error // the verdict: ErrBundleTooLarge and where
	close sync.Once
}

func newSizeGuard(r io.Reader, limit int64) *sizeGuard {
	pr, pw := io.Pipe()
	g := &sizeGuard{r: r, pw: pw, done: make(chan struct{})}
	go g.scan(pr, limit)
	return g
}

// scan adds up the regular files' sizes of the archive read from pr.
func (g *sizeGuard) scan(pr *io.PipeReader, limit int64) {
	defer close(g.done)
	err := sumTarGz(pr, limit)
	if errors.Is(err, ErrBundleTooLarge) {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		pr.CloseWithError(err) // the guard's next write, and so its read, fails with err
		return
	}
	// Not an archive, or a broken one: OPA's reader says why. Let the bytes pass.
	io.Copy(io.Discard, pr)
}

func sumTarGz(r io.Reader, limit int64) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	var total int64
	for {
		h, err := tr.Next()
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if total += h.Size; total > limit {
			return fmt.Errorf("%w: the files up to %s hold %d bytes once decompressed, over the bundle size limit of %d",
				ErrBundleTooLarge, h.Name, total, limit)
		}
	}
}

func (g *sizeGuard) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 {
		if _, werr := g.pw.Write(p[:n]); werr != nil {
			return 0, werr
		}
	}
	return n, err
}

// Close stops the scan. It does not close what the guard reads.
func (g *sizeGuard) Close() error {
	g.close.Do(func() {
		g.pw.Close()
		<-g.done
	})
	return nil
}

// cause is err, or the guard's verdict when it made the reader fail (OPA's reader does not
// always wrap what its source returned).
func (g *sizeGuard) cause(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil && !errors.Is(err, ErrBundleTooLarge) {
		return fmt.Errorf("%w (%v)", g.err, err)
	}
	return err
}

// guardedBody is a bundle server's response body read through a size guard.
type guardedBody struct {
	*sizeGuard
	body io.ReadCloser
}

func (b *guardedBody) Close() error {
	b.sizeGuard.Close()
	return b.body.Close()
}

// sizeLimitedClient is an OPA REST "auth plugin" that authenticates nothing: it gives OPA's
// bundle downloader OPA's default HTTP client with every successful response body read
// through a size guard, the one place a downloaded bundle can be seen before OPA unpacks it.
type sizeLimitedClient struct {
	limit int64
}

// sizeLimitedClientName is the plugin's name in the downloader's REST configuration.
const sizeLimitedClientName = "virt-rules-size-limit"

func (c sizeLimitedClient) NewClient(cfg rest.Config) (*http.Client, error) {
	tlsConfig, err := rest.DefaultTLSConfig(cfg)
	if err != nil {
		return nil, err
	}
	timeout := int64(0)
	if cfg.ResponseHeaderTimeoutSeconds != nil {
		timeout = *cfg.ResponseHeaderTimeoutSeconds
	}
	hc := rest.DefaultRoundTripperClient(tlsConfig, timeout)
	hc.Transport = &sizeLimitedTransport{next: hc.Transport, limit: c.limit}
	return hc, nil
}

func (sizeLimitedClient) Prepare(*http.Request) error { return nil }

type sizeLimitedTransport struct {
	next  http.RoundTripper
	limit int64
}

func (t *sizeLimitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Body == nil {
		return resp, err
	}
	resp.Body = &guardedBody{sizeGuard: newSizeGuard(resp.Body, t.limit), body: resp.Body}
	return resp, nil
}
