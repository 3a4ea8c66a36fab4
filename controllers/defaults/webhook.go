// Package defaults applies the vm.defaults decision in a cluster: a mutating webhook on
// VirtualMachine and VirtualMachineInstance CREATE asks the defaulter service (`virt-rules
// defaulter`) for the JSON patch that fills in every guest-visible default, and applies it.
// It sends the object with the cluster's KubeVirt CR (the configuration KubeVirt defaults the
// guest from) and its namespace's UID (which makes the derived firmware UUID and MACs this
// cluster's own), both read from the manager's cache.
//
// When the service cannot answer (down, not ready, libvirt unreachable, too slow, or it refuses
// the webhook's own credentials: 401, 403), the webhook
// answers the API server with HTTP 503 instead of an admission review, so that the webhook
// configuration's failurePolicy decides: Fail rejects the object, Ignore admits it undefaulted.
package defaults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/defaults"
)

// MutatingWebhookPath serves the admission reviews of VirtualMachine and
// VirtualMachineInstance creations.
const MutatingWebhookPath = "/mutate-kubevirt-io-v1-defaults"

// MutatingWebhook fills in an object's guest-visible defaults on CREATE.
type MutatingWebhook struct {
	// URL is the defaulter service's base URL (https://virt-rules-defaulter.virt-rules.svc:8090).
	URL string
	// Timeout bounds one call to the service; keep it below the configuration's timeoutSeconds.
	Timeout time.Duration
	// HTTPClient calls the service (NewHTTPClient: its CA, the token); nil means
	// http.DefaultClient.
	HTTPClient *http.Client
	// Client reads the object's Namespace and the cluster's KubeVirt CR.
	Client client.Reader
}

var _ admission.Handler = &MutatingWebhook{}

type unavailableKey struct{}

// Handler is the http.Handler to register at MutatingWebhookPath.
func (w *MutatingWebhook) Handler() http.Handler {
	review := &admission.Webhook{Handler: w}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var unavailable error
		buf := &bufferedResponse{header: http.Header{}}
		review.ServeHTTP(buf, r.WithContext(context.WithValue(r.Context(), unavailableKey{}, &unavailable)))
		if unavailable != nil {
			http.Error(rw, unavailable.Error(), http.StatusServiceUnavailable)
			return
		}
		for k, v := range buf.header {
			rw.Header()[k] = v
		}
		if buf.code == 0 {
			buf.code = http.StatusOK
		}
		rw.WriteHeader(buf.code)
		_, _ = rw.Write(buf.body.Bytes())
	})
}

// Handle asks the service for the patch that defaults the object being created.
func (w *MutatingWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 4 * time.Second
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body := defaults.Request{APIVersion: defaults.RequestAPIVersion, Kind: defaults.RequestKind, Object: req.Object.Raw}
	// Without a name yet (generateName), the request identifies the object.
	if req.Name == "" {
		body.Request = string(req.UID)
	}
	where, err := w.where(callCtx, req.Namespace)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	body.NamespaceUID, body.KubeVirt = where.namespaceUID, where.kubevirt
	// A VirtualMachine's instancetype and preference, or the revisions it is pinned to: the
	// service has no cluster to read them from.
	if req.Kind.Kind == "VirtualMachine" && w.Client != nil {
		var vm map[string]any
		if err := json.Unmarshal(req.Object.Raw, &vm); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the VirtualMachine: %w", err))
		}
		it, pref, causes, err := defaults.References(callCtx, clusterFinder{w.Client}, vm)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if len(causes) > 0 {
			return denied(causes)
		}
		body.Instancetype, body.Preference = it, pref
	}
	code, answer, warnings, err := w.call(callCtx, &body)
	switch {
	case err != nil:
	case code >= 500:
		err = fmt.Errorf("HTTP %d: %s", code, statusMessage(answer))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		err = fmt.Errorf("HTTP %d: %s: %w", code, statusMessage(answer), errRefused)
	}
	if err != nil {
		err = fmt.Errorf("defaulter %s unavailable: %w", w.URL, err)
		// The API server logs only that the call failed; the cause (a certificate not trusted,
		// a refused token, a timeout) is here.
		log.FromContext(ctx).Error(err, "defaults not given: the webhook's failure policy decides", "namespace", req.Namespace, "name", req.Name, "kind", req.Kind.Kind)
		if p, ok := ctx.Value(unavailableKey{}).(*error); ok {
			*p = err
		}
		return admission.Errored(http.StatusServiceUnavailable, err)
	}
	switch code {
	case http.StatusOK:
		var ops []jsonpatch.JsonPatchOperation
		if err := json.Unmarshal(answer, &ops); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("defaulter answered no JSON patch: %w", err))
		}
		resp := admission.Patched("defaulted by virt-rules", ops...)
		if len(ops) == 0 {
			resp = admission.Allowed("already defaulted")
		}
		// What is left to the node (host devices), each named: never a silent partial default.
		for _, text := range warnings {
			resp.Warnings = append(resp.Warnings, "virt-rules: "+text)
		}
		return resp
	case http.StatusUnprocessableEntity, http.StatusBadRequest:
		var status metav1.Status
		if err := json.Unmarshal(answer, &status); err != nil || status.Message == "" {
			return admission.Errored(int32(code), errors.New(strings.TrimSpace(string(answer))))
		}
		if unsupported(&status) {
			// Valid, just not defaultable here (a volume source without a dummy): admitted as
			// it is.
			resp := admission.Allowed("not defaulted")
			resp.Warnings = []string{"virt-rules did not default this object: " + status.Message}
			return resp
		}
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}
	return admission.Errored(http.StatusInternalServerError, fmt.Errorf("defaulter answered HTTP %d: %s", code, statusMessage(answer)))
}

// place is where an object is defaulted: its namespace's UID and the cluster's KubeVirt CR
// (nil without one: KubeVirt's built-in configuration).
type place struct {
	namespaceUID string
	kubevirt     map[string]any
}

func (w *MutatingWebhook) where(ctx context.Context, namespace string) (place, error) {
	var p place
	if w.Client == nil {
		return p, nil
	}
	ns := &corev1.Namespace{}
	if err := w.Client.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
		return p, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	p.namespaceUID = string(ns.UID)
	kv, err := kinds.ReadClusterKubeVirt(ctx, w.Client)
	if err != nil && !meta.IsNoMatchError(err) {
		return p, fmt.Errorf("read the KubeVirt CR: %w", err)
	}
	if kv != nil {
		p.kubevirt = kv.Object
	}
	return p, nil
}

// clusterFinder reads what a VirtualMachine refers to from the cluster, get only (the
// webhook's client reads unstructured objects from the API server, not from a cache).
type clusterFinder struct{ c client.Reader }

func (f clusterFinder) Find(ctx context.Context, kind, namespace, name string) (map[string]any, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(defaults.InstancetypeGroup + "/v1beta1")
	if kind == defaults.KindControllerRevision {
		u.SetAPIVersion("apps/v1")
	}
	u.SetKind(kind)
	err := f.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return u.Object, nil
}

// denied refuses the object for causes, each naming its field, as the service refuses one.
func denied(causes []defaults.Cause) admission.Response {
	resp := admission.Denied("")
	status := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Details: &metav1.StatusDetails{}}
	var parts []string
	for _, c := range causes {
		status.Details.Causes = append(status.Details.Causes, metav1.StatusCause{Type: metav1.CauseType(c.Type), Field: c.Field, Message: c.Message})
		parts = append(parts, c.Field+": "+c.Message)
	}
	status.Message = "virt-rules: " + strings.Join(parts, "; ")
	resp.Result = status
	return resp
}

// call posts body to the service for its dry run: the HTTP status, the answer and the
// warnings it sent.
func (w *MutatingWebhook) call(ctx context.Context, body *defaults.Request) (int, []byte, []string, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("encode the request: %w", err)
	}
	u := strings.TrimSuffix(w.URL, "/") + defaults.Path + "?dryRun=true"
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	c := w.HTTPClient
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(r)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, defaults.MaxBodyBytes))
	var warnings []string
	parsed, _ := utilnet.ParseWarningHeaders(resp.Header.Values("Warning"))
	for _, h := range parsed {
		warnings = append(warnings, h.Text)
	}
	return resp.StatusCode, answer, warnings, err
}

func unsupported(s *metav1.Status) bool {
	if s.Details == nil || len(s.Details.Causes) == 0 {
		return false
	}
	for _, c := range s.Details.Causes {
		if c.Type != metav1.CauseTypeFieldValueNotSupported {
			return false
		}
	}
	return true
}

func statusMessage(body []byte) string {
	var s metav1.Status
	if json.Unmarshal(body, &s) == nil && s.Message != "" {
		return s.Message
	}
	return strings.TrimSpace(string(body))
}

// bufferedResponse holds an admission review's answer until it is known whether to send it.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedResponse) WriteHeader(code int) { b.code = code }
