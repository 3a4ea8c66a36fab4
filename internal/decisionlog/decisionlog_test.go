package decisionlog_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/decisionlog"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// event is the part of an OPA decision-log event these tests read.
type event struct {
	Labels     map[string]string `json:"labels"`
	DecisionID string            `json:"decision_id"`
	Bundles    map[string]struct {
		Revision string `json:"revision"`
	} `json:"bundles"`
	Path      string         `json:"path"`
	Result    any            `json:"result"`
	Erased    []string       `json:"erased"`
	Timestamp time.Time      `json:"timestamp"`
	Metrics   map[string]any `json:"metrics"`
	Custom    struct {
		Decision    string `json:"decision"`
		InputSHA256 string `json:"input_sha256"`
	} `json:"custom"`
}

// decideExamples runs every decision family of eval over the repository's examples.
func decideExamples(t *testing.T, l engine.DecisionLogger) *engine.Engine {
	t.Helper()
	ctx := context.Background()
	e, err := engine.New(ctx, engine.WithDecisionLogger(l))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"migration-policy", "migration-target", "migratability"} {
		objs, err := manifest.Read([]string{"../../examples/" + dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eval.Run(ctx, e, objs, eval.Options{Warn: func(string) {}}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func TestWriterLogsEveryDecisionAsOneLine(t *testing.T) {
	var out bytes.Buffer
	e := decideExamples(t, decisionlog.NewWriter(&out, map[string]string{"app": "virt-rules"}))
	names := map[string]int{}
	ids := map[string]bool{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("not one JSON event per line: %v\n%s", err, sc.Text())
		}
		names[ev.Custom.Decision]++
		if ids[ev.DecisionID] {
			t.Errorf("decision id %s repeated", ev.DecisionID)
		}
		ids[ev.DecisionID] = true
		if ev.Bundles[decisionlog.BundleName].Revision != e.Revision() || ev.Labels["app"] != "virt-rules" {
			t.Errorf("event without the bundle revision or labels: %+v", ev)
		}
		if len(ev.Custom.InputSHA256) != 64 || len(ev.Erased) != 1 || ev.Erased[0] != "/input" {
			t.Errorf("event without its input digest: %+v", ev)
		}
		if ev.Path == "" || ev.Timestamp.IsZero() || ev.Metrics["timer_rego_query_eval_ns"].(float64) <= 0 {
			t.Errorf("event without path, time or latency: %+v", ev)
		}
	}
	t.Logf("events per decision: %v", names)
	for _, name := range []string{"migration.policy", "migration.policy.index", "migration.target", "node.migratability.levels"} {
		if names[name] == 0 {
			t.Errorf("no event for decision %s", name)
		}
	}
}

func TestEventShape(t *testing.T) {
	var out bytes.Buffer
	decideExamples(t, decisionlog.NewWriter(&out, nil))
	line, _, _ := bufio.NewReader(&out).ReadLine()
	var raw map[string]any
	if err := json.Unmarshal(line, &raw); err != nil {
		t.Fatal(err)
	}
	// The keys OPA's decision-log API reads.
	for _, k := range []string{"decision_id", "bundles", "path", "result", "timestamp", "metrics", "erased", "custom"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("event has no %q: %s", k, line)
		}
	}
	if _, ok := raw["input"]; ok {
		t.Errorf("event logs the input itself: %s", line)
	}
}

// endpoint is a real HTTP server on loopback that accepts OPA decision-log uploads.
type endpoint struct {
	mu      sync.Mutex
	batches [][]event
	status  int
}

func (p *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status != 0 {
		w.WriteHeader(p.status)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Encoding") != "gzip" || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "want a gzip JSON POST", http.StatusBadRequest)
		return
	}
	zr, err := gzip.NewReader(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var batch []event
	if err := json.NewDecoder(zr).Decode(&batch); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.batches = append(p.batches, batch)
}

func (p *endpoint) events() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.batches {
		n += len(b)
	}
	return n
}

func TestHTTPPostsGzipBatches(t *testing.T) {
	p := &endpoint{}
	srv := httptest.NewServer(p)
	defer srv.Close()
	var lines bytes.Buffer
	h := decisionlog.NewHTTP(srv.URL+"/logs", decisionlog.Options{BatchSize: 10, FlushInterval: time.Hour})
	decideExamples(t, tee{h, decisionlog.NewWriter(&lines, nil)})
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := bytes.Count(lines.Bytes(), []byte("\n"))
	if got := p.events(); got != want || h.Sent() != int64(want) || h.Dropped() != 0 {
		t.Errorf("endpoint got %d events (sent %d, dropped %d), want all %d decisions", got, h.Sent(), h.Dropped(), want)
	}
	if len(p.batches) < 2 || len(p.batches[0]) != 10 {
		t.Errorf("%d batches, first of %d events; want batches of 10", len(p.batches), len(p.batches[0]))
	}
}

func TestHTTPCountsWhatItCouldNotSend(t *testing.T) {
	p := &endpoint{status: http.StatusServiceUnavailable}
	srv := httptest.NewServer(p)
	defer srv.Close()
	h := decisionlog.NewHTTP(srv.URL, decisionlog.Options{BatchSize: 1000, FlushInterval: time.Hour})
	decideExamples(t, h)
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.Dropped() == 0 || h.Sent() != 0 {
		t.Errorf("sent %d, dropped %d; want all dropped by a failing endpoint", h.Sent(), h.Dropped())
	}
}

func TestOpen(t *testing.T) {
	for _, spec := range []string{"stdout", "stderr", "https://logs.example/v1/logs"} {
		l, err := decisionlog.Open(spec, decisionlog.Options{})
		if err != nil {
			t.Errorf("%s: %v", spec, err)
			continue
		}
		l.Close(context.Background())
	}
	if _, err := decisionlog.Open("file.log", decisionlog.Options{}); err == nil {
		t.Error("file.log accepted")
	}
}

type tee []engine.DecisionLogger

func (t tee) LogDecision(ctx context.Context, d *engine.Decision) {
	for _, l := range t {
		l.LogDecision(ctx, d)
	}
}
