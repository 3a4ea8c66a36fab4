package candidates_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virt-rules/virt-rules/controllers/candidates"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// serve is the handler on examples/migration-target's nodes, VMI and pods (plus extra),
// behind a mux with the handler's pattern, as the metrics server serves it.
func serve(t *testing.T, extra ...client.Object) (*httptest.Server, []manifest.Object, *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	objs, err := manifest.Read([]string{
		filepath.Join("..", "..", "examples", "migration-target", "nodes.yaml"),
		filepath.Join("..", "..", "examples", "migration-target", "vmi.yaml"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	})
	for _, o := range objs {
		switch o.GetKind() {
		case "Node", "Pod", "Namespace":
			typed, err := scheme.New(o.GroupVersionKind())
			if err != nil {
				t.Fatal(err)
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, typed); err != nil {
				t.Fatal(err)
			}
			b = b.WithObjects(typed.(client.Object))
		default:
			b = b.WithObjects(o.Unstructured.DeepCopy())
		}
	}
	c := b.WithObjects(extra...).Build()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(candidates.Pattern, &candidates.Handler{Client: c, PodReader: c, Engine: eng, Nodes: eng.NewNodes()})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, objs, eng
}

func get(t *testing.T, srv *httptest.Server, ns, name string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/apis/virt-rules.io/v1alpha1/namespaces/" + ns + "/virtualmachineinstances/" + name + "/candidates")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The endpoint answers what eval --candidates decides on the same objects, a 404 naming a
// VMI that does not exist, and a 409 for a VMI a migration moves.
func TestHandlerAnswersAsEvalCandidates(t *testing.T) {
	srv, objs, eng := serve(t)
	report, err := eval.Run(context.Background(), eng, objs, eval.Options{Candidates: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.MigrationCandidates) != 1 {
		t.Fatalf("eval --candidates: %d entries, want prod/db's only", len(report.MigrationCandidates))
	}
	want, err := json.Marshal(report.MigrationCandidates[0])
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, srv, "prod", "db")
	if code != http.StatusOK {
		t.Fatalf("GET prod/db: %d %s", code, body)
	}
	var got, wanted any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(want, &wanted)
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(wanted)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("GET prod/db:\n%s\nwant eval's\n%s", gotJSON, wantJSON)
	}

	code, body = get(t, srv, "prod", "gone")
	if code != http.StatusNotFound || !strings.Contains(body, "prod/gone") {
		t.Errorf("GET prod/gone: %d %s, want 404 naming prod/gone", code, body)
	}

	m := &unstructured.Unstructured{}
	m.SetAPIVersion("kubevirt.io/v1")
	m.SetKind("VirtualMachineInstanceMigration")
	m.SetNamespace("prod")
	m.SetName("drain")
	_ = unstructured.SetNestedField(m.Object, "db", "spec", "vmiName")
	srv, _, _ = serve(t, m)
	code, body = get(t, srv, "prod", "db")
	if code != http.StatusConflict || !strings.Contains(body, "VirtualMachineInstanceMigration prod/drain") {
		t.Errorf("GET prod/db while migrating: %d %s, want 409 naming the migration", code, body)
	}
}

// Attributes are a get of the VMI the path names, for the SubjectAccessReview.
func TestAttributes(t *testing.T) {
	mux := http.NewServeMux()
	var seen bool
	mux.HandleFunc(candidates.Pattern, func(_ http.ResponseWriter, r *http.Request) {
		a, ok := candidates.Attributes(r)
		seen = ok && a.Verb == "get" && a.APIGroup == "kubevirt.io" && a.Resource == "virtualmachineinstances" &&
			a.Namespace == "prod" && a.Name == "db" && a.ResourceRequest
	})
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/apis/virt-rules.io/v1alpha1/namespaces/prod/virtualmachineinstances/db/candidates", nil))
	if !seen {
		t.Error("want get virtualmachineinstances.kubevirt.io db in prod")
	}
	if _, ok := candidates.Attributes(httptest.NewRequest(http.MethodGet, "/metrics", nil)); ok {
		t.Error("/metrics: want no resource attributes")
	}
}
