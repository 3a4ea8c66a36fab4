// Package decisionlog writes the engine's decisions as OPA decision-log events, so that an
// admin can audit which bundle revision decided what, on which input, and how fast.
//
// Each decision becomes one event in the shape of OPA's decision-log API (EventV1 of
// github.com/open-policy-agent/opa/v1/plugins/logs): labels, decision_id, bundles (the
// revision), path, result, timestamp, metrics.timer_rego_query_eval_ns. The input itself is
// not logged (it can be large and hold whatever is in the objects); "erased": ["/input"]
// says so and custom.input_sha256 identifies it. custom.decision is the decision's name.
//
// A Writer writes one JSON line per event (stdout, stderr); an HTTP logger posts batches,
// as OPA's decision-log plugin does: a gzip-compressed JSON array per POST.
package decisionlog

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/plugins/logs"

	"github.com/virt-rules/virt-rules/engine"
)

// BundleName is the name events give the engine's bundle under "bundles".
const BundleName = "virt-rules"

// Logger is an engine.DecisionLogger that can be flushed and closed.
type Logger interface {
	engine.DecisionLogger
	// Close flushes what is buffered and stops; ctx bounds how long that may take.
	Close(ctx context.Context) error
}

// Options tune Open.
type Options struct {
	// Labels are added to every event (OPA puts id and version there).
	Labels map[string]string
	// BatchSize and FlushInterval bound an HTTP batch: whichever comes first posts it.
	BatchSize     int
	FlushInterval time.Duration
	// BufferSize is how many events may wait for the HTTP endpoint; beyond it new events
	// are dropped (and counted) rather than slow decisions down.
	BufferSize int
	Log        *slog.Logger
}

// Open returns the logger for spec: "stdout", "stderr", or an http(s):// URL to post batches to.
func Open(spec string, o Options) (Logger, error) {
	switch spec {
	case "stdout":
		return NewWriter(os.Stdout, o.Labels), nil
	case "stderr":
		return NewWriter(os.Stderr, o.Labels), nil
	}
	u, err := url.Parse(spec)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("decision log %q: want stdout, stderr or an http(s):// URL", spec)
	}
	return NewHTTP(spec, o), nil
}

// Event is the OPA decision-log event for d.
func Event(d *engine.Decision, labels map[string]string) *logs.EventV1 {
	ev := &logs.EventV1{
		Labels:     labels,
		DecisionID: newID(),
		Bundles:    map[string]logs.BundleInfoV1{BundleName: {Revision: d.Revision}},
		Path:       strings.ReplaceAll(strings.TrimPrefix(d.Query, "data."), ".", "/"),
		Erased:     []string{"/input"},
		Timestamp:  d.Timestamp.UTC(),
		Metrics:    map[string]any{"timer_rego_query_eval_ns": d.Duration.Nanoseconds()},
		Custom:     map[string]any{"decision": d.Name, "input_sha256": InputDigest(d.Input)},
	}
	if d.Err != nil {
		ev.Error = eventError{d.Err}
	}
	if d.Result != nil {
		if v, err := ast.JSON(d.Result.Value); err == nil {
			ev.Result = &v
		}
	}
	return ev
}

// InputDigest is the hex SHA-256 of input as compact JSON with sorted object keys.
func InputDigest(input ast.Value) string {
	if input == nil {
		return ""
	}
	v, err := ast.JSON(input)
	if err != nil {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// eventError is a decision's error as OPA logs it: an object with a message.
type eventError struct{ error }

func (e eventError) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"message": e.Error()})
}

// newID is a random UUID (version 4), as OPA's decision ids are.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Writer writes one JSON event per line.
type Writer struct {
	labels map[string]string
	mu     sync.Mutex
	enc    *json.Encoder
}

// NewWriter writes events to w.
func NewWriter(w io.Writer, labels map[string]string) *Writer {
	return &Writer{labels: labels, enc: json.NewEncoder(w)}
}

// LogDecision writes d's event as one line.
func (w *Writer) LogDecision(_ context.Context, d *engine.Decision) {
	ev := Event(d, w.labels)
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.enc.Encode(ev) // a decision never fails because its log line could not be written
}

// Close does nothing: every line is written when its decision is.
func (w *Writer) Close(context.Context) error { return nil }

// HTTP posts batches of events to an endpoint of OPA's decision-log API.
type HTTP struct {
	url    string
	o      Options
	client *http.Client
	events chan *logs.EventV1
	done   chan struct{}
	once   sync.Once

	dropped atomic.Int64
	sent    atomic.Int64
}

// NewHTTP starts posting to endpoint; Close flushes and stops.
func NewHTTP(endpoint string, o Options) *HTTP {
	if o.BatchSize <= 0 {
		o.BatchSize = 500
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 5 * time.Second
	}
	if o.BufferSize <= 0 {
		o.BufferSize = 10000
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	h := &HTTP{
		url:    endpoint,
		o:      o,
		client: &http.Client{Timeout: 30 * time.Second},
		events: make(chan *logs.EventV1, o.BufferSize),
		done:   make(chan struct{}),
	}
	go h.run()
	return h
}

// LogDecision queues d's event; when the queue is full the event is dropped and counted.
func (h *HTTP) LogDecision(_ context.Context, d *engine.Decision) {
	select {
	case h.events <- Event(d, h.o.Labels):
	default:
		h.dropped.Add(1)
	}
}

// Dropped is how many events were lost: queue full or endpoint failing.
func (h *HTTP) Dropped() int64 { return h.dropped.Load() }

// Sent is how many events the endpoint accepted.
func (h *HTTP) Sent() int64 { return h.sent.Load() }

// Close posts what is queued and stops.
func (h *HTTP) Close(ctx context.Context) error {
	h.once.Do(func() { close(h.events) })
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flush decision log: %w", ctx.Err())
	}
}

func (h *HTTP) run() {
	defer close(h.done)
	ticker := time.NewTicker(h.o.FlushInterval)
	defer ticker.Stop()
	batch := make([]*logs.EventV1, 0, h.o.BatchSize)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		if err := h.post(batch); err != nil {
			h.dropped.Add(int64(len(batch)))
			h.o.Log.Error("decision log upload failed; events dropped", "url", h.url, "events", len(batch), "error", err)
		} else {
			h.sent.Add(int64(len(batch)))
		}
		batch = batch[:0]
	}
	for {
		select {
		case ev, ok := <-h.events:
			if !ok {
				flush()
				return
			}
			batch = append(batch, ev)
			if len(batch) >= h.o.BatchSize {
				flush()
			}
		case <-ticker.C:
			flush()
		}
	}
}

// post sends one batch as OPA's decision-log plugin does: a gzip-compressed JSON array.
func (h *HTTP) post(batch []*logs.EventV1) error {
	var body bytes.Buffer
	zw := gzip.NewWriter(&body)
	if err := json.NewEncoder(zw).Encode(batch); err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return errors.New("endpoint answered " + resp.Status)
	}
	return nil
}
