package install_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// helmTemplate is `helm template virt-rules charts/virt-rules --namespace virt-rules
// --include-crds --set ...`, with Helm's own chart loader and template engine.
func helmTemplate(values map[string]any) []*unstructured.Unstructured {
	GinkgoHelper()
	chart, rendered := renderChart(values, chartutil.ReleaseOptions{Name: "virt-rules", Namespace: kitNamespace, IsInstall: true})
	var objs []*unstructured.Unstructured
	for _, crd := range chart.CRDObjects() {
		objs = append(objs, decodeAll(crd.File.Data)...)
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		objs = append(objs, decodeAll([]byte(rendered[name]))...)
	}
	return objs
}

func decodeAll(data []byte) []*unstructured.Unstructured {
	GinkgoHelper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		Expect(err).NotTo(HaveOccurred())
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// byKey indexes objects by kind, namespace and name; Helm installs into the release's
// namespace rather than creating it, so the kit's Namespace is left out, and so are Helm's
// hooks (made only while helm uninstall runs; kubectl delete -k needs none).
func byKey(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if _, hook := o.GetAnnotations()["helm.sh/hook"]; hook || o.GetKind() == "Namespace" {
			continue
		}
		out[fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())] = o
	}
	return out
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func container(objs []*unstructured.Unstructured, deployment string) map[string]any {
	GinkgoHelper()
	cs, _, err := unstructured.NestedSlice(find(objs, "Deployment", deployment).Object, "spec", "template", "spec", "containers")
	Expect(err).NotTo(HaveOccurred())
	return cs[0].(map[string]any)
}

var _ = Describe("helm template charts/virt-rules", func() {
	It("renders, with default values, the objects kubectl apply -k examples/deploy installs, field for field", func() {
		chart, kit := byKey(helmTemplate(nil)), byKey(render("examples/deploy"))
		Expect(keys(chart)).To(Equal(keys(kit)))
		for k, o := range kit {
			Expect(asYAML(chart[k])).To(Equal(asYAML(o)), k)
		}
	})

	It("renders, with defaulter.enabled, the objects of examples/deploy/defaults", func() {
		chart, kit := byKey(helmTemplate(map[string]any{"defaulter": map[string]any{"enabled": true}})), byKey(render("examples/deploy/defaults"))
		Expect(keys(chart)).To(Equal(keys(kit)))
		for k, o := range kit {
			Expect(asYAML(chart[k])).To(Equal(asYAML(o)), k)
		}
	})

	It("takes the image, the replicas, the bundle server and its key from values", func() {
		objs := helmTemplate(map[string]any{
			"image":    map[string]any{"repository": "registry.example/virt-rules/controller", "tag": "v1.2.3"},
			"replicas": int64(3),
			"bundle": map[string]any{"url": "https://bundles.example/virt-rules.tar.gz", "verificationKey": "-----BEGIN PUBLIC KEY-----\nabc\n-----END PUBLIC KEY-----\n",
				"candidateUrl": "https://bundles.example/candidate.tar.gz"},
		})
		c := container(objs, "virt-rules")
		Expect(c["image"]).To(Equal("registry.example/virt-rules/controller:v1.2.3"))
		Expect(find(objs, "Deployment", "virt-rules").Object["spec"]).To(HaveKeyWithValue("replicas", BeNumerically("==", 3)))
		Expect(c["args"]).To(ContainElements("--bundle-url=https://bundles.example/virt-rules.tar.gz", "--bundle-verification-key=/etc/virt-rules/bundle-key/public.pem",
			"--candidate-bundle-url=https://bundles.example/candidate.tar.gz"))
		key, _, _ := unstructured.NestedString(find(objs, "Secret", "virt-rules-bundle-key").Object, "stringData", "public.pem")
		Expect(key).To(HavePrefix("-----BEGIN PUBLIC KEY-----"))
		Expect(fmt.Sprint(c["volumeMounts"])).To(ContainSubstring("/etc/virt-rules/bundle-key"))
	})

	It("leaves out every webhook with webhooks.enabled false, and the certificate with selfManagedCertificate false", func() {
		objs := helmTemplate(map[string]any{"webhooks": map[string]any{"enabled": false}, "defaulter": map[string]any{"enabled": true}})
		for _, o := range objs {
			Expect(o.GetKind()).NotTo(HaveSuffix("WebhookConfiguration"))
			Expect(o.GetName()).NotTo(BeElementOf("virt-rules-webhook", "virt-rules-webhook-tls", "virt-rules-defaulter"))
		}
		Expect(strings.Join(toStrings(container(objs, "virt-rules")["args"]), " ")).NotTo(ContainSubstring("--webhook"))

		objs = helmTemplate(map[string]any{"webhooks": map[string]any{"selfManagedCertificate": false}})
		args := toStrings(container(objs, "virt-rules")["args"])
		Expect(args).To(ContainElement("--webhook-cert-dir=/etc/virt-rules/webhook"))
		Expect(strings.Join(args, " ")).NotTo(ContainSubstring("--webhook-cert-secret"))
		for _, o := range objs {
			Expect(o.GetName()).NotTo(Equal("virt-rules-webhook-tls"), "cert-manager's Secret is not the chart's")
		}
	})

	It("with defaulter.selfManagedCertificate false, trusts the supplied Secret's ca.crt, mounted, and may not write that Secret", func() {
		objs := helmTemplate(map[string]any{"defaulter": map[string]any{"enabled": true, "selfManagedCertificate": false}})
		c := container(objs, "virt-rules")
		args := strings.Join(toStrings(c["args"]), " ")
		Expect(args).To(ContainSubstring("--defaulter-ca-file=/etc/virt-rules/defaulter-ca/ca.crt"))
		Expect(args).NotTo(ContainSubstring("--defaulter-cert-secret"))
		Expect(fmt.Sprint(c["volumeMounts"])).To(ContainSubstring("/etc/virt-rules/defaulter-ca"))
		for _, o := range objs {
			Expect(o.GetName()).NotTo(Equal("virt-rules-defaulter-tls"), "the supplied Secret is not the chart's")
		}
		Expect(asYAML(find(objs, "Role", "virt-rules-leader-election"))).NotTo(ContainSubstring("virt-rules-defaulter-tls"))

		objs = helmTemplate(map[string]any{"defaulter": map[string]any{"enabled": true}})
		Expect(asYAML(find(objs, "Role", "virt-rules-leader-election"))).To(ContainSubstring("virt-rules-defaulter-tls"))
		Expect(find(objs, "Secret", "virt-rules-defaulter-tls").Object).NotTo(HaveKey("data"), "never the controller's certificate")
	})
})

var _ = Describe("helm uninstall of charts/virt-rules", func() {
	// Facts from Helm's own code (v3 action.Uninstall): pre-delete hooks run, then the
	// release's manifests are sorted with releaseutil.UninstallOrder, in which neither webhook
	// configuration kind is listed and unknown kinds sort last; kube.Client deletes one kind
	// at a time, in that order. So the chart's pre-delete hook removes the webhook
	// configurations first (uninstall_test.go drives it on the test cluster).
	It("deletes the webhook configurations last on its own; the pre-delete hook removes each of them first, allowed nothing more", func() {
		for _, defaulter := range []bool{false, true} {
			values := map[string]any{"defaulter": map[string]any{"enabled": defaulter}}
			kinds := uninstallKinds(helmRender(values))
			configurations := []string{"validating/virt-rules-validating", "mutating/virt-rules-mutating"}
			if defaulter {
				configurations = append(configurations, "mutating/zz-virt-rules-defaults")
			}
			last := kinds[len(kinds)-len(configurations):]
			Expect(last).To(HaveEach(HaveSuffix("WebhookConfiguration")), "Helm's order")

			objs := helmTemplate(values)
			hooks := map[string]*unstructured.Unstructured{}
			for _, o := range objs {
				if a := o.GetAnnotations(); a["helm.sh/hook"] != "" {
					Expect(a).To(HaveKeyWithValue("helm.sh/hook", "pre-delete"), o.GetName())
					Expect(a).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded"), o.GetName())
					hooks[o.GetKind()] = o
				}
			}
			Expect(hooks).To(HaveLen(4))
			for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
				Expect(hooks[kind].GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook-weight", "-10"), "made before the Job")
			}
			job := hooks["Job"]
			Expect(job.GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook-weight", "0"))
			Expect(job.Object["spec"]).To(And(HaveKeyWithValue("backoffLimit", BeNumerically("==", 2)), HaveKeyWithValue("activeDeadlineSeconds", BeNumerically("==", 120))))
			sa, _, _ := unstructured.NestedString(job.Object, "spec", "template", "spec", "serviceAccountName")
			Expect(sa).To(Equal(hooks["ServiceAccount"].GetName()))
			cs, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
			Expect(cs[0].(map[string]any)["image"]).To(Equal(container(objs, "virt-rules")["image"]), "the controller's image")
			Expect(toStrings(cs[0].(map[string]any)["args"])).To(Equal([]string{"webhooks", "remove",
				"--webhook-configurations=" + strings.Join(configurations, ","), "--timeout=1m"}))

			rules, _, _ := unstructured.NestedSlice(hooks["ClusterRole"].Object, "rules")
			var allowed []string
			for _, r := range rules {
				r := r.(map[string]any)
				Expect(toStrings(r["verbs"])).To(Equal([]string{"delete"}))
				Expect(toStrings(r["apiGroups"])).To(Equal([]string{"admissionregistration.k8s.io"}))
				resources := toStrings(r["resources"])
				Expect(resources).To(HaveLen(1))
				for _, name := range toStrings(r["resourceNames"]) {
					allowed = append(allowed, strings.TrimSuffix(resources[0], "webhookconfigurations")+"/"+name)
				}
			}
			Expect(allowed).To(ConsistOf(configurations), "delete on the configurations it removes, by name, and nothing else")
		}
		for _, o := range helmTemplate(map[string]any{"webhooks": map[string]any{"enabled": false}}) {
			Expect(o.GetAnnotations()).NotTo(HaveKey("helm.sh/hook"), "no webhooks, nothing to remove")
		}
	})

	It("has no webhook that sees a deletion, so webhooks left for a moment cannot block removing the kit", func() {
		for _, o := range helmTemplate(map[string]any{"defaulter": map[string]any{"enabled": true}}) {
			if !strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				continue
			}
			webhooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
			Expect(err).NotTo(HaveOccurred())
			for _, w := range webhooks {
				rules, _, _ := unstructured.NestedSlice(w.(map[string]any), "rules")
				Expect(rules).NotTo(BeEmpty())
				for _, r := range rules {
					ops, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "operations")
					Expect(ops).NotTo(ContainElement(BeElementOf("DELETE", "*")), "%s %s", o.GetName(), w.(map[string]any)["name"])
				}
			}
		}
	})
})

// helmRender is the chart's templates as Helm renders them for a release (file name: YAML).
func helmRender(values map[string]any) map[string]string {
	GinkgoHelper()
	_, rendered := renderChart(values, chartutil.ReleaseOptions{Name: "virt-rules", Namespace: kitNamespace, IsUpgrade: true})
	return rendered
}

// renderChart loads charts/virt-rules and renders its templates with values for release, as
// Helm's template engine does: the chart and its rendered templates (file name: YAML).
func renderChart(values map[string]any, release chartutil.ReleaseOptions) (*chart.Chart, map[string]string) {
	GinkgoHelper()
	c, err := loader.Load(filepath.Join(repoRoot, "charts", "virt-rules"))
	Expect(err).NotTo(HaveOccurred())
	vals, err := chartutil.ToRenderValues(c, values, release, chartutil.DefaultCapabilities)
	Expect(err).NotTo(HaveOccurred())
	rendered, err := engine.Render(c, vals)
	Expect(err).NotTo(HaveOccurred())
	return c, rendered
}

// uninstallKinds are the kinds of the rendered objects in the order `helm uninstall`
// deletes them (releaseutil.SortManifests with UninstallOrder, as action.Uninstall does).
func uninstallKinds(rendered map[string]string) []string {
	GinkgoHelper()
	var manifest strings.Builder
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.TrimSpace(rendered[name]) != "" {
			manifest.WriteString("\n---\n" + rendered[name])
		}
	}
	_, files, err := releaseutil.SortManifests(releaseutil.SplitManifests(manifest.String()), nil, releaseutil.UninstallOrder)
	Expect(err).NotTo(HaveOccurred())
	var kinds []string
	for _, f := range files {
		if f.Head != nil && f.Head.Kind != "" {
			kinds = append(kinds, f.Head.Kind)
		}
	}
	return kinds
}

// asYAML is the object as YAML with sorted keys, numbers as JSON has them.
func asYAML(o *unstructured.Unstructured) string {
	GinkgoHelper()
	data, err := yaml.Marshal(o.Object)
	Expect(err).NotTo(HaveOccurred())
	data, err = yaml.YAMLToJSON(data)
	Expect(err).NotTo(HaveOccurred())
	data, err = yaml.JSONToYAML(data)
	Expect(err).NotTo(HaveOccurred())
	return string(data)
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}
