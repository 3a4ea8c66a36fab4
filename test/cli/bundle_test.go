package cli_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// makeTarget runs a Makefile target in the repository root, as an admin would.
func makeTarget(args ...string) {
	GinkgoHelper()
	runInRepo("make", append([]string{"-s"}, args...)...)
}

// rsaKeyPair writes an RSA private key and its public key as PEM files.
func rsaKeyPair(dir string) (private, public string) {
	GinkgoHelper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	Expect(err).NotTo(HaveOccurred())
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	Expect(err).NotTo(HaveOccurred())
	private, public = filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	Expect(os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600)).To(Succeed())
	Expect(os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)).To(Succeed())
	return private, public
}

// tamperTarball rewrites the bundle's data.json in place, keeping its signature.
func tamperTarball(path, old, new string) {
	GinkgoHelper()
	raw, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	Expect(err).NotTo(HaveOccurred())
	tr := tar.NewReader(zr)
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	tw := tar.NewWriter(zw)
	changed := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		Expect(err).NotTo(HaveOccurred())
		b, err := io.ReadAll(tr)
		Expect(err).NotTo(HaveOccurred())
		if strings.TrimPrefix(h.Name, "/") == "data.json" && bytes.Contains(b, []byte(old)) {
			b, changed = bytes.Replace(b, []byte(old), []byte(new), 1), true
			h.Size = int64(len(b))
		}
		Expect(tw.WriteHeader(h)).To(Succeed())
		_, err = tw.Write(b)
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(changed).To(BeTrue(), "no data.json with %q in %s", old, path)
	Expect(tw.Close()).To(Succeed())
	Expect(zw.Close()).To(Succeed())
	Expect(os.WriteFile(path, out.Bytes(), 0o644)).To(Succeed())
}

var _ = Describe("bundles", func() {
	const (
		customGolden     = "examples/custom-bundle/migration-policy.golden.out"
		customPoolGolden = "examples/custom-bundle/pool.golden.out"
	)

	It("builds examples/custom-bundle (opa test passing) and decides examples/migration-policy as its golden says", func() {
		tarball := filepath.Join(GinkgoT().TempDir(), "custom.tar.gz")
		makeTarget("custom-bundle", "CUSTOM_BUNDLE="+tarball)

		r := run("", "eval", "-o", "json", "--bundle", tarball, "examples/migration-policy/")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		golden := filepath.Join(repoRoot, customGolden)
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			Expect(os.WriteFile(golden, []byte(r.stdout), 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(golden)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.stdout).To(MatchJSON(want))

		// The change shows: design 000's VMI obeys another policy, by name, under KubeVirt's order.
		shipped := run("", "eval", "-o", "json", "examples/migration-policy/")
		Expect(r.stdout).NotTo(MatchJSON(shipped.stdout))
		explained := run("", "eval", "--explain", "--bundle", tarball, "examples/migration-policy/")
		order, _, precedence := explanationOf(parseOutput(explained.stdout), "hpc/fedora-gpu")
		Expect(precedence).To(Equal("kubevirt"))
		Expect(order[:2]).To(Equal([]string{"hpc-large", "tuned-bandwidth"}))

		// The pool change shows too: scale-in takes a ready VM, where the shipped order takes the
		// stopped my-vm-2 of the naming example.
		r = run("", "eval", "-o", "json", "--bundle", tarball, "examples/pool/")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		poolGolden := filepath.Join(repoRoot, customPoolGolden)
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			Expect(os.WriteFile(poolGolden, []byte(r.stdout), 0o644)).To(Succeed())
		}
		want, err = os.ReadFile(poolGolden)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.stdout).To(MatchJSON(want))
		Expect(poolsOf(r.stdout)["naming/my-vm"].Delete).To(ConsistOf(BeElementOf("my-vm-1", "my-vm-3")))
		Expect(poolsOf(run("", "eval", "-o", "json", "examples/pool/").stdout)["naming/my-vm"].Delete).To(Equal([]string{"my-vm-2"}))

		r = run("", "version", "--bundle", tarball)
		Expect(r.stdout).To(MatchRegexp(`bundle custom-\S+ \(`))
	})

	It("serves a bundle signed by make bundle-sign only with the matching key, and never a tampered or unsigned one", func() {
		dir := GinkgoT().TempDir()
		private, public := rsaKeyPair(dir)
		signed := filepath.Join(dir, "signed.tar.gz")
		makeTarget("bundle-sign", "KEY="+private, "BUNDLE="+signed, "BUNDLE_REVISION=signed-1")

		r := run("", "eval", "--bundle", signed, "--bundle-verification-key", public, "examples/migration-policy/")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(MatchJSON(run("", "eval", "examples/migration-policy/").stdout))
		r = run("", "version", "--bundle", signed, "--bundle-verification-key", public)
		Expect(r.stdout).To(ContainSubstring("bundle signed-1 ("))

		_, otherPublic := rsaKeyPair(GinkgoT().TempDir())
		r = run("", "eval", "--bundle", signed, "--bundle-verification-key", otherPublic, "examples/migration-policy/")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("bundle refused"))
		Expect(r.stderr).To(ContainSubstring("verify JWT signature"))

		unsigned := filepath.Join(dir, "unsigned.tar.gz")
		makeTarget("bundle", "BUNDLE="+unsigned)
		r = run("", "eval", "--bundle", unsigned, "--bundle-verification-key", public, "examples/migration-policy/")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("bundle missing .signatures.json file"))

		tamperTarball(signed, `"precedence":"default"`, `"precedence":"kubevirt"`)
		r = run("", "eval", "--bundle", signed, "--bundle-verification-key", public, "examples/migration-policy/")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("data.json: digest mismatch"))
	})

	It("refuses a verification key that is not a PEM public key", func() {
		r := run("", "eval", "--bundle-verification-key", writeTemp("key.pem", "not a key"), "examples/migration-policy/")
		Expect(r.exitCode).NotTo(Equal(0))
		Expect(r.stderr).To(ContainSubstring("bundle verification key"))
		Expect(r.stderr).To(ContainSubstring("not PEM"))
	})

	It("logs every decision as an OPA decision-log event with --decision-log", func() {
		r := run("", "eval", "--decision-log", "stderr", "examples/migration-policy/")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		revision := strings.Fields(run("", "version").stdout)[3]
		perDecision := map[string]int{}
		sc := bufio.NewScanner(strings.NewReader(r.stderr))
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			if !strings.HasPrefix(sc.Text(), "{") {
				continue // eval's own warnings
			}
			var ev struct {
				DecisionID string `json:"decision_id"`
				Bundles    map[string]struct {
					Revision string `json:"revision"`
				} `json:"bundles"`
				Path    string         `json:"path"`
				Result  any            `json:"result"`
				Metrics map[string]any `json:"metrics"`
				Custom  map[string]any `json:"custom"`
			}
			Expect(json.Unmarshal(sc.Bytes(), &ev)).To(Succeed(), sc.Text())
			Expect(ev.Bundles["virt-rules"].Revision).To(Equal(revision))
			Expect(ev.Custom["input_sha256"]).To(HaveLen(64))
			Expect(ev.Metrics).To(HaveKey("timer_rego_query_eval_ns"))
			perDecision[ev.Custom["decision"].(string)]++
			if ev.Custom["decision"] == "migration.policy" {
				Expect(ev.Path).To(Equal("virtrules/migration/policy/decision"))
				Expect(ev.Result).To(HaveKey("policy"))
			}
		}
		// One decision per VMI of the example, and the policy index they share.
		Expect(perDecision).To(HaveKeyWithValue("migration.policy", 4))
		Expect(perDecision).To(HaveKeyWithValue("migration.policy.index", 1))
	})
})
