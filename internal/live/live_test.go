package live_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/virt-rules/virt-rules/internal/live"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// server answers list requests as kube-apiserver does for the glue under test: nodes in pages of
// the limit asked (continue = the next index), an empty list for other served kinds, 404 for
// the kinds in missing and 403 for those in forbidden.
func server(t *testing.T, nodes int, missing, forbidden map[string]bool) (*httptest.Server, *[]string) {
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests = append(requests, r.URL.Path+"?"+r.URL.RawQuery)
		resource := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		w.Header().Set("Content-Type", "application/json")
		status := func(code int, reason string) {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":%q,"code":%d,"message":"%s %s"}`, reason, code, resource, strings.ToLower(reason))
		}
		switch {
		case missing[resource] || missing[strings.TrimPrefix(r.URL.Path, "/apis/")]:
			status(http.StatusNotFound, "NotFound")
			return
		case forbidden[resource]:
			status(http.StatusForbidden, "Forbidden")
			return
		}
		items := []map[string]any{}
		next := ""
		if resource == "nodes" {
			limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
			from, _ := strconv.Atoi(r.URL.Query().Get("continue"))
			for i := from; i < nodes && i < from+limit; i++ {
				items = append(items, map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("node-%d", i),
					"managedFields": []any{map[string]any{"manager": "kubelet"}}}})
			}
			if from+limit < nodes {
				next = strconv.Itoa(from + limit)
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": "List", "apiVersion": "v1", "metadata": map[string]any{"continue": next}, "items": items})
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

func TestReadPagesThroughEveryKind(t *testing.T) {
	srv, requests := server(t, 5, map[string]bool{"datavolumes": true}, nil)
	var warnings []string
	objs, err := live.Read(t.Context(), &rest.Config{Host: srv.URL}, live.Options{PageSize: 2, Warn: func(l string) { warnings = append(warnings, l) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 5 {
		t.Fatalf("%d objects, want the 5 nodes", len(objs))
	}
	for i, o := range objs {
		if o.GetKind() != "Node" || o.GetAPIVersion() != "v1" || o.GetName() != fmt.Sprintf("node-%d", i) || o.GetManagedFields() != nil {
			t.Errorf("object %d: %s %s %s, managedFields %v", i, o.GetAPIVersion(), o.GetKind(), o.GetName(), o.GetManagedFields())
		}
		if want := fmt.Sprintf("Node node-%d", i); o.Position() != "cluster" || o.Describe() != want {
			t.Errorf("position %q, %q: want cluster, %q", o.Position(), o.Describe(), want)
		}
	}
	nodeRequests := 0
	for _, r := range *requests {
		if strings.HasPrefix(r, "/api/v1/nodes?") {
			nodeRequests++
			if !strings.Contains(r, "limit=2") {
				t.Errorf("request %s without the page size", r)
			}
		}
		if strings.HasPrefix(r, "/api/v1/pods?") && !strings.Contains(r, "fieldSelector=status.phase") {
			t.Errorf("pods listed without excluding terminated ones: %s", r)
		}
		if strings.Contains(r, "/datavolumes?") && !strings.Contains(r, "labelSelector=pool.virt-rules.io") {
			t.Errorf("datavolumes listed without the preserved label: %s", r)
		}
	}
	if nodeRequests != 3 {
		t.Errorf("%d node pages, want 3 of at most 2 (requests: %v)", nodeRequests, *requests)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "no DataVolume is read") {
		t.Errorf("warnings %v, want one for the missing DataVolume kind", warnings)
	}
}

func TestReadNamesWhatIsForbidden(t *testing.T) {
	srv, _ := server(t, 1, nil, map[string]bool{"virtualmachineinstances": true})
	_, err := live.Read(t.Context(), &rest.Config{Host: srv.URL}, live.Options{})
	if err == nil || !strings.Contains(err.Error(), "list virtualmachineinstances (kubevirt.io/v1)") || !strings.Contains(err.Error(), "virtualmachineinstances forbidden") || !strings.Contains(err.Error(), "examples/rbac/eval.yaml") {
		t.Fatalf("error %v, want one naming the resource and the ClusterRole", err)
	}
}

func TestReadStopsAtTheByteBudget(t *testing.T) {
	srv, _ := server(t, 1000, nil, nil)
	_, err := live.Read(t.Context(), &rest.Config{Host: srv.URL}, live.Options{PageSize: 100, MaxBytes: 10000})
	if !errors.Is(err, manifest.ErrTooLarge) {
		t.Fatalf("error %v, want ErrTooLarge", err)
	}
}

// KubeVirt's pools are read in the newest version the cluster serves: v1alpha1 before 1.7.
func TestReadFallsBackToAnOlderVersion(t *testing.T) {
	srv, requests := server(t, 0, map[string]bool{"pool.kubevirt.io/v1beta1/virtualmachinepools": true, "datavolumes": true}, nil)
	var warnings []string
	if _, err := live.Read(t.Context(), &rest.Config{Host: srv.URL}, live.Options{Warn: func(l string) { warnings = append(warnings, l) }}); err != nil {
		t.Fatal(err)
	}
	var pools []string
	for _, r := range *requests {
		if strings.Contains(r, "pool.kubevirt.io") {
			pools = append(pools, r[:strings.Index(r, "?")])
		}
	}
	if want := []string{"/apis/pool.kubevirt.io/v1beta1/virtualmachinepools", "/apis/pool.kubevirt.io/v1alpha1/virtualmachinepools"}; strings.Join(pools, " ") != strings.Join(want, " ") {
		t.Errorf("pool requests %v, want %v", pools, want)
	}
	if len(warnings) != 1 {
		t.Errorf("warnings %v: want only the DataVolumes' (v1alpha1 is served)", warnings)
	}

	srv, _ = server(t, 0, map[string]bool{"virtualmachinepools": true, "datavolumes": true}, nil)
	warnings = nil
	if _, err := live.Read(t.Context(), &rest.Config{Host: srv.URL}, live.Options{Warn: func(l string) { warnings = append(warnings, l) }}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(warnings, "the cluster serves no virtualmachinepools (pool.kubevirt.io/v1beta1, v1alpha1): no VirtualMachinePool is read") {
		t.Errorf("warnings %q: want one naming both versions of KubeVirt's pools", warnings)
	}
}
