package install_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// bundleServer is a real HTTP bundle server on loopback serving one bundle with an ETag, as
// an admin's (README "Install": --bundle-url).
type bundleServer struct {
	*httptest.Server
	mu         sync.Mutex
	body, etag string
}

func startBundleServer(tarball []byte) *bundleServer {
	s := &bundleServer{}
	sum := sha256.Sum256(tarball)
	s.body, s.etag = string(tarball), `"`+hex.EncodeToString(sum[:8])+`"`
	s.Server = httptest.NewServer(s)
	return s
}

func (s *bundleServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body, etag := s.body, s.etag
	s.mu.Unlock()
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	_, _ = io.WriteString(w, body)
}

func (s *bundleServer) url() string { return s.URL + "/virt-rules.tar.gz" }

// shippedBundle is the embedded bundle without its tests, built by OPA's `opa build` code
// with revision rev.
func shippedBundle(rev string) []byte { return clustersuite.ShippedBundle(ctx, rev) }

// kitArgs are the arguments of the controller container of the kit's Deployment virt-rules.
func kitArgs(kit []*unstructured.Unstructured) []string {
	GinkgoHelper()
	containers, _, err := unstructured.NestedSlice(find(kit, "Deployment", "virt-rules").Object, "spec", "template", "spec", "containers")
	Expect(err).NotTo(HaveOccurred())
	return toStrings(containers[0].(map[string]any)["args"])
}

// newerKit is kit as a newer release ships it: every object labelled with the new version,
// the controller's image tag and one argument changed.
func newerKit(kit []*unstructured.Unstructured) []*unstructured.Unstructured {
	GinkgoHelper()
	newer := make([]*unstructured.Unstructured, len(kit))
	for i, o := range kit {
		newer[i] = o.DeepCopy()
		labels := newer[i].GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["app.kubernetes.io/version"] = "newer"
		newer[i].SetLabels(labels)
	}
	d := find(newer, "Deployment", "virt-rules")
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	Expect(err).NotTo(HaveOccurred())
	c := containers[0].(map[string]any)
	c["image"] = "virt-rules/controller:newer"
	c["args"] = append(c["args"].([]any), "--log-level=debug")
	Expect(unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers")).To(Succeed())
	return newer
}
