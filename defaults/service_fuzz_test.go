//go:build libvirt

package defaults_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virt-rules/virt-rules/defaults"
)

// FuzzService posts arbitrary bodies to the defaulter service (seeds: testdata/fuzz, the
// project's examples/defaults among them, bare and in a DefaultsRequest) with the real
// embedded libvirt behind it. Whatever the body, the service answers: 200 with the object or
// its JSON patch, or a Kubernetes Status: 400 for what is no VM, 422 naming every field at
// fault. Never a panic, and never a 500: through a Fail webhook a 500 reads as an outage.
func FuzzService(f *testing.F) {
	lv, eng := setup(f)
	svc := defaults.NewService(eng, nil)
	svc.SetHypervisor(lv)
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 64<<10 {
			t.Skip("bounded inputs")
		}
		dryRun := len(body)%2 == 0
		target := defaults.Path
		if dryRun {
			target += "?dryRun=true"
		}
		rec := httptest.NewRecorder()
		svc.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK:
			var out any
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatalf("200 with a body that is no JSON: %v", err)
			}
			if _, isPatch := out.([]any); isPatch != dryRun {
				t.Fatalf("dry run %v, answer %s", dryRun, rec.Body)
			}
		case http.StatusBadRequest, http.StatusUnprocessableEntity:
			var st metav1.Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Kind != "Status" || st.Message == "" {
				t.Fatalf("%d without a Status: %s", rec.Code, rec.Body)
			}
			if rec.Code == http.StatusUnprocessableEntity {
				if st.Details == nil || len(st.Details.Causes) == 0 {
					t.Fatalf("422 naming no field: %s", rec.Body)
				}
				for _, c := range st.Details.Causes {
					if c.Field == "" || c.Message == "" || !strings.Contains(st.Message, c.Field) {
						t.Fatalf("422 with a cause naming no field: %s", rec.Body)
					}
				}
			}
		default:
			t.Fatalf("%d for %q: %s", rec.Code, body, rec.Body)
		}
	})
}
