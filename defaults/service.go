package defaults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gomodules.xyz/jsonpatch/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// Path is where the service defaults objects: POST a VirtualMachine or VirtualMachineInstance
// (JSON); the answer is the whole object defaulted or, with ?dryRun=true, only the RFC 6902
// JSON patch that would default it (application/json-patch+json). ?request=ID identifies the
// request creating an object that has no name yet (generateName): its MACs and firmware UUID
// derive from it. ?namespaceUID=UID is the UID of the object's namespace, which makes those
// derived values this cluster's own.
const Path = "/apis/vms/defaults"

// Request is the other body Path takes: the object with where it is defaulted. The admission
// webhook sends one, with the cluster's live KubeVirt CR and the namespace's UID.
type Request struct {
	APIVersion string `json:"apiVersion"` // RequestAPIVersion
	Kind       string `json:"kind"`       // RequestKind
	// Object is the VirtualMachine or VirtualMachineInstance.
	Object json.RawMessage `json:"object"`
	// KubeVirt is the cluster's KubeVirt CR; without it, the service's own configuration
	// (WithCluster, `defaulter --kubevirt`).
	KubeVirt map[string]any `json:"kubevirt,omitempty"`
	// NamespaceUID and Request are as the query parameters of the same names.
	NamespaceUID string `json:"namespaceUID,omitempty"`
	Request      string `json:"request,omitempty"`
	// Instancetype and Preference are what a VirtualMachine's spec.instancetype and
	// spec.preference refer to, as the caller found them (the object, or the ControllerRevision
	// the VM is pinned to): the service has no cluster to read them from.
	Instancetype *engine.VMReference `json:"instancetype,omitempty"`
	Preference   *engine.VMReference `json:"preference,omitempty"`
}

// Request's kind and API version.
const (
	RequestKind       = "DefaultsRequest"
	RequestAPIVersion = "defaults.virt-rules.io/v1alpha1"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 4 << 20

// Service is the defaulter HTTP service: Path, /healthz, /readyz and /metrics. It is ready once
// SetHypervisor gave it a libvirt whose capabilities are probed; until then requests get 503.
type Service struct {
	engine    *engine.Engine
	hv        atomic.Pointer[Hypervisor]
	log       *slog.Logger
	duration  *prometheus.HistogramVec
	libvirt   prometheus.Histogram
	cacheSize int
	cache     *CacheMetrics
	shapeSize int
	shapes    *ShapeCache
	cluster   *engine.VMCluster
	registry  *prometheus.Registry
	mux       *http.ServeMux
	// auth, when set, guards every path but the probes.
	auth    *Auth
	guarded http.Handler
	// shadow, when set, is asked every answer again with its candidate bundle.
	shadow *shadow.Shadow
	// ready are the further checks /readyz makes (WithReadyCheck).
	ready []func() error
}

// ServiceOption configures a Service.
type ServiceOption func(*Service)

// WithCacheSize keeps up to n libvirt answers (see Cache); 0 asks libvirt for every request.
// The default is DefaultCacheSize.
func WithCacheSize(n int) ServiceOption { return func(s *Service) { s.cacheSize = n } }

// WithShapeCacheSize keeps the defaults of up to n shapes (see ShapeCache); 0 evaluates every
// object in full. It works on top of the libvirt answer cache: without that (WithCacheSize(0))
// nothing is kept. The default is DefaultCacheSize.
func WithShapeCacheSize(n int) ServiceOption { return func(s *Service) { s.shapeSize = n } }

// WithCluster defaults for the cluster of this KubeVirt configuration; the default is
// KubeVirt's built-in configuration.
func WithCluster(c *engine.VMCluster) ServiceOption { return func(s *Service) { s.cluster = c } }

// WithAuth serves Path and /metrics only to the callers a admits; /healthz and /readyz stay
// open to the kubelet's probes. Without it the service answers anyone (local use only).
func WithAuth(a *Auth) ServiceOption { return func(s *Service) { s.auth = a } }

// WithReadyCheck has /readyz answer 503 with check's error while it fails, beside libvirt's
// probe; such as a serving certificate still awaited.
func WithReadyCheck(check func() error) ServiceOption {
	return func(s *Service) { s.ready = append(s.ready, check) }
}

// WithRegistry serves reg's metrics on /metrics, with the service's own registered on it, such
// as the engine's bundle and decision-budget metrics (internal/bundlestatus) beside the
// service's. Default: a registry of the service's own.
func WithRegistry(reg *prometheus.Registry) ServiceOption {
	return func(s *Service) {
		if reg != nil {
			s.registry = reg
		}
	}
}

// WithShadow asks the candidate bundle of s every answer again, in the background once the
// answer is decided, never acting on it (a shadow rollout, internal/shadow): the candidate
// defaults the same object with the same libvirt, and where its patch, warnings or refusal
// differ is counted (virtrules_candidate_decision_*{decision="vm.defaults.defaults"}, on s's
// registry) and logged. s must be running (Start).
func WithShadow(s *shadow.Shadow) ServiceOption { return func(svc *Service) { svc.shadow = s } }

// NewService serves the vm.defaults decision of eng.
func NewService(eng *engine.Engine, log *slog.Logger, opts ...ServiceOption) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{engine: eng, log: log, registry: prometheus.NewRegistry(), mux: http.NewServeMux(), cacheSize: DefaultCacheSize, cache: NewCacheMetrics(), shapeSize: DefaultCacheSize}
	for _, o := range opts {
		o(s)
	}
	shapeMetrics := NewShapeCacheMetrics()
	if s.shapeSize > 0 {
		// The size was checked: NewShapeCache fails only below 1.
		s.shapes, _ = NewShapeCache(s.shapeSize, shapeMetrics)
	}
	buckets := []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	s.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "virtrules_defaults_request_duration_seconds",
		Help:    "Time to answer a request to " + Path + ", by HTTP status code and whether it was a dry run.",
		Buckets: buckets,
	}, []string{"code", "dry_run"})
	s.libvirt = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "virtrules_defaults_libvirt_duration_seconds",
		Help:    "Time libvirt took to define, read back and undefine one domain.",
		Buckets: buckets,
	})
	s.registry.MustRegister(s.duration, s.libvirt, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.registry.MustRegister(s.cache.Collectors()...)
	s.registry.MustRegister(shapeMetrics.Collectors()...)
	s.mux.HandleFunc("POST "+Path, s.serveDefaults)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	s.guarded = s.mux
	if s.auth != nil {
		s.registry.MustRegister(s.auth.Collector())
		s.guarded = s.auth.Wrap(s.mux)
	}
	return s
}

// SetHypervisor makes the service ready, defaulting with hv behind a cache of its answers of
// its own (unless the cache size is 0). When the cache cannot be made (hv's capabilities
// cannot be read), every request asks hv.
func (s *Service) SetHypervisor(hv Hypervisor) {
	hv = timed{hv, s.libvirt}
	if s.cacheSize > 0 {
		c, err := NewCache(context.Background(), hv, s.cacheSize, s.cache)
		if err != nil {
			s.log.Error("libvirt answers will not be cached", "error", err)
		} else {
			hv = c
		}
	}
	s.hv.Store(&hv)
}

// ServeHTTP serves the service's paths: the probes to anyone, the rest to whom WithAuth admits.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
		s.mux.ServeHTTP(w, r)
		return
	}
	s.guarded.ServeHTTP(w, r)
}

func (s *Service) serveReady(w http.ResponseWriter, _ *http.Request) {
	if s.hv.Load() == nil {
		http.Error(w, "libvirt: capabilities not probed yet", http.StatusServiceUnavailable)
		return
	}
	for _, check := range s.ready {
		if err := check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	io.WriteString(w, "ok\n")
}

// timed measures libvirt's part of every request that asks libvirt.
type timed struct {
	Hypervisor
	h prometheus.Histogram
}

func (t timed) DefineAndRead(ctx context.Context, d *libvirtxml.Domain) ([]byte, error) {
	start := time.Now()
	out, err := t.Hypervisor.DefineAndRead(ctx, d)
	t.h.Observe(time.Since(start).Seconds())
	return out, err
}

// CapabilitiesDigest is the timed hypervisor's, if it has one.
func (t timed) CapabilitiesDigest(ctx context.Context) (string, error) {
	if fp, ok := t.Hypervisor.(Fingerprinter); ok {
		return fp.CapabilitiesDigest(ctx)
	}
	return "", nil
}

func (s *Service) serveDefaults(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	dryRun, _ := strconv.ParseBool(r.URL.Query().Get("dryRun"))
	code := s.handle(w, r, dryRun)
	s.duration.WithLabelValues(strconv.Itoa(code), strconv.FormatBool(dryRun)).Observe(time.Since(start).Seconds())
}

func (s *Service) handle(w http.ResponseWriter, r *http.Request, dryRun bool) int {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "read the body: "+err.Error(), nil)
	}
	hv := s.hv.Load()
	if hv == nil {
		return writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, ErrUnavailable.Error()+": capabilities not probed yet", nil)
	}
	q := r.URL.Query()
	opts := Options{Request: q.Get("request"), NamespaceUID: q.Get("namespaceUID")}
	cluster := s.cluster
	// A bare object decodes into a Request too (its kind and apiVersion), with no object. A
	// field of the wrong type stops no other field from decoding, so the kind is known then.
	var req Request
	if err := json.Unmarshal(body, &req); req.Kind == RequestKind {
		if err != nil {
			return writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, RequestKind+": "+err.Error(), nil)
		}
		if req.APIVersion != RequestAPIVersion {
			return writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("%s: apiVersion %q: want %s", RequestKind, req.APIVersion, RequestAPIVersion), nil)
		}
		body, opts = req.Object, Options{Request: req.Request, NamespaceUID: req.NamespaceUID, Instancetype: req.Instancetype, Preference: req.Preference}
		if req.KubeVirt != nil {
			if cluster, err = engine.NewVMCluster(req.KubeVirt); err != nil {
				return writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, RequestKind+": kubevirt: "+err.Error(), nil)
			}
		}
	}
	d := &Defaulter{Engine: s.engine, Hypervisor: *hv, Shapes: s.shapes, Cluster: cluster}
	res, err := d.defaultFor(r.Context(), body, opts, !dryRun)
	if s.shadow != nil {
		s.compareCandidate(r.Context(), Defaulter{Engine: s.shadow.Candidate(), Hypervisor: *hv, Cluster: cluster}, body, opts, res, err)
	}
	if err != nil {
		code, reason, details := statusOf(err)
		if code >= 500 {
			s.log.ErrorContext(r.Context(), "defaults", "error", err)
		}
		return writeStatus(w, code, reason, err.Error(), details)
	}
	for _, text := range res.Warnings {
		if h, err := utilnet.NewWarningHeader(299, "-", text); err == nil {
			w.Header().Add("Warning", h)
		}
	}
	if dryRun {
		w.Header().Set("Content-Type", "application/json-patch+json")
		patch := res.Patch
		if patch == nil {
			patch = []jsonpatch.Operation{}
		}
		return writeJSON(w, http.StatusOK, patch)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(res.Object)
	return http.StatusOK
}

// statusOf maps an error to its HTTP status: 400 not a VM, 422 invalid or unsupported (with
// every field at fault), 503 libvirt unreachable, 500 anything else (a bundle's fault).
func statusOf(err error) (int, metav1.StatusReason, *metav1.StatusDetails) {
	var bad *BadRequestError
	var invalid *InvalidError
	switch {
	case errors.As(err, &bad):
		return http.StatusBadRequest, metav1.StatusReasonBadRequest, nil
	case errors.As(err, &invalid):
		details := &metav1.StatusDetails{}
		for _, c := range invalid.Causes {
			details.Causes = append(details.Causes, metav1.StatusCause{Type: metav1.CauseType(c.Type), Field: c.Field, Message: c.Message})
		}
		return http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, details
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, nil
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusGatewayTimeout, metav1.StatusReasonTimeout, nil
	}
	return http.StatusInternalServerError, metav1.StatusReasonInternalError, nil
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string, details *metav1.StatusDetails) int {
	w.Header().Set("Content-Type", "application/json")
	return writeJSON(w, code, &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Details: details, Code: int32(code),
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) int {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encode: %v", err), http.StatusInternalServerError)
		return http.StatusInternalServerError
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
	return code
}

// defaultsAnswer is the service's answer as the shadow rollout compares it: the patch and
// warnings of an object defaulted (200), or the fields at fault of one refused (422).
type defaultsAnswer struct {
	Code     int                   `json:"code"`
	Patch    []jsonpatch.Operation `json:"patch,omitempty"`
	Warnings []string              `json:"warnings,omitempty"`
	Causes   []Cause               `json:"causes,omitempty"`
}

// answerOf is what the rules answered: ok false when they did not (a malformed request, a
// libvirt or bundle failure), which is no answer to compare.
func answerOf(res *Result, err error) (a defaultsAnswer, subject string, ok bool) {
	var invalid *InvalidError
	switch {
	case err == nil:
		return defaultsAnswer{Code: http.StatusOK, Patch: res.Patch, Warnings: res.Warnings}, res.Subject, true
	case errors.As(err, &invalid):
		return defaultsAnswer{Code: http.StatusUnprocessableEntity, Causes: invalid.Causes}, invalid.Object, true
	}
	return defaultsAnswer{}, "", false
}

// compareCandidate queues the comparison of the answer (res, err) with candidate's for the
// same body; candidate has no shape cache (the active one's holds the active bundle's
// defaults). Nothing is compared when the active bundle gave no answer.
func (s *Service) compareCandidate(ctx context.Context, candidate Defaulter, body []byte, opts Options, res *Result, err error) {
	active, subject, ok := answerOf(res, err)
	if !ok {
		return
	}
	s.shadow.CompareAnswer(ctx, shadow.DecisionVMDefaults, shadow.Object{Name: subject}, active, func(ctx context.Context) (any, error) {
		res, err := candidate.defaultFor(ctx, body, opts, false)
		answer, _, ok := answerOf(res, err)
		if !ok {
			return nil, fmt.Errorf("default %s: %w", subject, err)
		}
		return answer, nil
	})
}
