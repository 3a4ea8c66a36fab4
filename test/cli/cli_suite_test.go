// Package cli_test runs the real virt-rules binary the way a user does: over the manifests in
// examples/, over stdin, and over malformed input.
package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var (
	binary   string
	repoRoot string
	// buildFlags are extra `go build` flags for the binary (-tags=libvirt when this suite is).
	buildFlags []string
)

func TestCLI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules CLI")
}

var _ = BeforeSuite(func() {
	var err error
	repoRoot, err = filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	binary = filepath.Join(GinkgoT().TempDir(), "virt-rules")
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", binary, "./cmd/virt-rules")...)
	build.Dir = repoRoot
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build: %s", out)
})

// result is one run of the binary.
type result struct {
	stdout, stderr string
	exitCode       int
}

// run runs the binary in the repository root with args and stdin.
func run(stdin string, args ...string) result {
	GinkgoHelper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = repoRoot
	cmd.Stdin = bytes.NewBufferString(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		exit, ok := err.(*exec.ExitError)
		Expect(ok).To(BeTrue(), "run %v: %v", args, err)
		code = exit.ExitCode()
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), exitCode: code}
}

// runInRepo runs the command name with args in the repository root, as a developer would, and
// expects it to succeed.
func runInRepo(name string, args ...string) {
	GinkgoHelper()
	cmd := exec.Command(name, args...)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s %v: %s", name, args, out)
}

// writeTemp writes content to a new file named name and returns its path.
func writeTemp(name, content string) string {
	GinkgoHelper()
	p := filepath.Join(GinkgoT().TempDir(), name)
	Expect(os.WriteFile(p, []byte(content), 0o644)).To(Succeed())
	return p
}
