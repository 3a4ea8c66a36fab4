// Package layers_test checks the import layers of the product: no package imports one above
// its layer, and no product package imports the test harness. docs/development.md lists the
// same layers.
package layers_test

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

const module = "github.com/virt-rules/virt-rules/"

// layers are the product's packages by layer, lowest first, by path prefix (the longest
// prefix wins). A package may import packages of its own layer or below, but for the
// exceptions in forbidden.
var layers = []struct {
	name     string
	prefixes []string
}{
	{"rules and types", []string{"rego", "api/", "internal/intern", "internal/nodetrim", "internal/manifest",
		"internal/heapsize", "internal/benchratio", "internal/delegatedauth", "internal/webhookcerts", "internal/cpumap"}},
	{"engine", []string{"engine"}},
	{"above the engine", []string{"internal/eval", "internal/live", "internal/bundlecache", "internal/bundlestatus",
		"internal/decisionlog", "internal/shadow"}},
	{"controllers and defaults", []string{"controllers", "defaults"}},
	{"commands", []string{"cmd/"}},
}

// harness are the test harness's packages: only tests (and hack/) import them. The test cluster
// and the Go reference live under test/, apart from the product; enginetest and pooltest stay
// beside the packages whose internals they fake.
var harness = []string{"test/testcluster", "test/reference", "engine/enginetest", "controllers/pool/pooltest"}

// forbidden are imports within one layer that are not allowed: the defaulting service never
// imports a controller.
var forbidden = [][2]string{{"defaults", "controllers"}}

func TestLayers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "import layers")
}

// layerOf is the index in layers of pkg (module-relative), -1 for none.
func layerOf(pkg string) (int, string) {
	best, bestPrefix := -1, ""
	for i, l := range layers {
		for _, p := range l.prefixes {
			if (pkg == strings.TrimSuffix(p, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(p, "/")+"/")) && len(p) > len(bestPrefix) {
				best, bestPrefix = i, p
			}
		}
	}
	return best, strings.TrimSuffix(bestPrefix, "/")
}

func isHarness(pkg string) bool {
	for _, h := range harness {
		if pkg == h || strings.HasPrefix(pkg, h+"/") {
			return true
		}
	}
	return false
}

// isProduct is whether pkg (module-relative) is the product's: every package but test/ and
// hack/ (the harness packages among them are left out by isHarness).
func isProduct(pkg string) bool {
	return !strings.HasPrefix(pkg, "test/") && !strings.HasPrefix(pkg, "hack/")
}

// imports are the module's packages (module-relative, test/ and hack/ included) and the module
// packages each imports outside its tests, from go list.
func imports(ctx context.Context) map[string][]string {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, "go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "go list: %s", stderr.String())
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(fields[0], module)
		var deps []string
		for _, d := range fields[1:] {
			if strings.HasPrefix(d, module) {
				deps = append(deps, strings.TrimPrefix(d, module))
			}
		}
		pkgs[pkg] = deps
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return pkgs
}

var _ = Describe("the product's packages", func() {
	It("import none above their layer, and never the test harness", func(ctx SpecContext) {
		pkgs := imports(ctx)
		Expect(pkgs).To(HaveKey("engine"))
		var problems []string
		for pkg, deps := range pkgs {
			if !isProduct(pkg) || isHarness(pkg) {
				continue
			}
			at, atPrefix := layerOf(pkg)
			if at < 0 {
				problems = append(problems, pkg+": in no layer (add it to test/layers and docs/development.md)")
				continue
			}
			for _, d := range deps {
				if isHarness(d) {
					problems = append(problems, pkg+" imports the test harness "+d)
					continue
				}
				dl, dPrefix := layerOf(d)
				if dl > at {
					problems = append(problems, pkg+" ("+layers[at].name+") imports "+d+" ("+layers[dl].name+")")
				}
				for _, f := range forbidden {
					if atPrefix == f[0] && dPrefix == f[1] {
						problems = append(problems, pkg+" imports "+d+": "+f[0]+" never imports "+f[1])
					}
				}
			}
		}
		Expect(problems).To(BeEmpty())
	}, SpecTimeout(2*time.Minute))

	It("has every harness package the layers name", func(ctx SpecContext) {
		pkgs := imports(ctx)
		for _, h := range harness {
			Expect(pkgs).To(HaveKey(h), "harness package %s is gone: update test/layers", h)
		}
	}, SpecTimeout(2*time.Minute))
})
