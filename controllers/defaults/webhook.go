// Package defaults applies the vm.defaults decision in a cluster: a mutating webhook on
// VirtualMachine and VirtualMachineInstance CREATE asks the defaulter service (`virt-rules
// defaulter`) for the JSON patch that fills in every guest-visible default, and applies it.
//
// When the service cannot answer (down, not ready, libvirt unreachable, too slow), the webhook
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
	"net/url"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/defaults"
)

// MutatingWebhookPath serves the admission reviews of VirtualMachine and
// VirtualMachineInstance creations.
const MutatingWebhookPath = "/mutate-kubevirt-io-v1-defaults"

// MutatingWebhook fills in an object's guest-visible defaults on CREATE.
type MutatingWebhook struct {
	// URL is the defaulter service's base URL (http://virt-rules-defaulter.virt-rules.svc:8090).
	URL string
	// Timeout bounds one call to the service; keep it below the configuration's timeoutSeconds.
	Timeout time.Duration
	// Client calls the service; nil means http.DefaultClient.
	Client *http.Client
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
	// Without a name yet (generateName), the request identifies the object.
	request := ""
	if req.Name == "" {
		request = string(req.UID)
	}
	code, body, err := w.call(callCtx, req.Object.Raw, request)
	if err == nil && code >= 500 {
		err = fmt.Errorf("HTTP %d: %s", code, statusMessage(body))
	}
	if err != nil {
		err = fmt.Errorf("defaulter %s unavailable: %w", w.URL, err)
		if p, ok := ctx.Value(unavailableKey{}).(*error); ok {
			*p = err
		}
		return admission.Errored(http.StatusServiceUnavailable, err)
	}
	switch code {
	case http.StatusOK:
		var ops []jsonpatch.JsonPatchOperation
		if err := json.Unmarshal(body, &ops); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("defaulter answered no JSON patch: %w", err))
		}
		if len(ops) == 0 {
			return admission.Allowed("already defaulted")
		}
		return admission.Patched("defaulted by virt-rules", ops...)
	case http.StatusUnprocessableEntity, http.StatusBadRequest:
		var status metav1.Status
		if err := json.Unmarshal(body, &status); err != nil || status.Message == "" {
			return admission.Errored(int32(code), errors.New(strings.TrimSpace(string(body))))
		}
		if unsupported(&status) {
			// Valid, just not defaultable here (a passthrough device): admitted as it is.
			resp := admission.Allowed("not defaulted")
			resp.Warnings = []string{"virt-rules did not default this object: " + status.Message}
			return resp
		}
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}
	return admission.Errored(http.StatusInternalServerError, fmt.Errorf("defaulter answered HTTP %d: %s", code, statusMessage(body)))
}

func (w *MutatingWebhook) call(ctx context.Context, object []byte, request string) (int, []byte, error) {
	u := strings.TrimSuffix(w.URL, "/") + defaults.Path + "?dryRun=true"
	if request != "" {
		u += "&request=" + url.QueryEscape(request)
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(object))
	if err != nil {
		return 0, nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	client := w.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(r)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, defaults.MaxBodyBytes))
	return resp.StatusCode, body, err
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
