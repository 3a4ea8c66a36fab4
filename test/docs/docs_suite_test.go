// Package docs_test runs the console examples of the documentation: every ```console fenced
// block of README.md and of the pages under docs/, as a reader would type it in the
// repository root, after the suite has built bin/virt-rules the way `make build` does.
//
// In a block, a line starting with `$ ` is a command; a command line ending in `\` goes on
// to the next line. The lines after a command, up to the next `$ ` line or the end of the
// block, are its expected output: stdout and stderr together, in the order a terminal shows
// them (both are one file). A block runs as one `bash -o pipefail -c` script, so `$ echo $?`
// shows the previous command's exit status, and cd or variables carry to the next command.
// There is no stdin. PATH starts with the repository's bin/, so `virt-rules` and
// `bin/virt-rules` are the same freshly built binary; make's own variables (MAKEFLAGS,
// MAKELEVEL...) are removed from the environment, so a `$ make ...` prints what it prints in
// a terminal even under `make suites`, and LC_ALL is C.
//
// Output is compared line by line after normalisation: trailing whitespace is removed from
// every line (expected and actual), and empty lines at the end are dropped. An expected line
// that is exactly `...` matches any number of lines (none included), for long or
// machine-dependent output. Nothing else is approximate.
//
// A command whose expected output has a `...` line must also exit 0, unless the next command
// is `$ echo $?`, which then shows its status: `...` would otherwise hide a failure. (Other
// commands are judged by their output alone: under pipefail, `virt-rules eval ... | jq`
// exits 1 when the report it pipes lists objects in error, as documented.)
//
// Each block is one spec named FILE:LINE (of its opening fence); the blocks run in page
// order, one at a time (they share bin/ and what `make` writes).
package docs_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	. "github.com/onsi/gomega"
)

// blockTimeout bounds one block's run.
const blockTimeout = 5 * time.Minute

var (
	repoRoot = mustAbs("../..")
	// env is the environment every block runs in (BeforeSuite).
	env []string
)

func mustAbs(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		panic(fmt.Sprintf("docs suite: %v", err))
	}
	return abs
}

func TestDocs(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules docs console examples")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	env = blockEnv(os.Environ(), repoRoot)
	ensureTools(ctx)
	build := exec.CommandContext(ctx, "make", "--no-print-directory", "build")
	build.Dir, build.Env = repoRoot, env
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "make build: %s", out)
}, NodeTimeout(10*time.Minute))

// blockEnv is the environment of a reader's terminal in the repository root: the process's,
// without make's variables, with root/bin first in PATH, LC_ALL=C and no colours.
func blockEnv(environ []string, root string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR", "LC_ALL", "TERM", "NO_COLOR":
			continue
		case "PATH":
			kv = "PATH=" + filepath.Join(root, "bin") + string(os.PathListSeparator) + strings.TrimPrefix(kv, "PATH=")
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C", "TERM=dumb", "NO_COLOR=1")
}

// ensureTools checks the commands the examples use beside the project's own. jq is the one
// a fresh Debian machine may lack: as root with apt-get, the suite installs it (as
// hack/libvirt.sh installs libvirt), else it fails saying so.
func ensureTools(ctx context.Context) {
	GinkgoHelper()
	for _, tool := range []string{"bash", "make", "go"} {
		_, err := exec.LookPath(tool)
		Expect(err).NotTo(HaveOccurred(), "the console examples need %s", tool)
	}
	if _, err := exec.LookPath("jq"); err == nil {
		return
	}
	_, aptErr := exec.LookPath("apt-get")
	Expect(os.Geteuid() == 0 && aptErr == nil).To(BeTrue(), "the console examples need jq: apt-get install jq")
	fmt.Fprintln(GinkgoWriter, "docs: apt-get install jq")
	for _, args := range [][]string{{"update", "-q"}, {"install", "-y", "-q", "--no-install-recommends", "jq"}} {
		apt := exec.CommandContext(ctx, "apt-get", args...)
		apt.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := apt.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "apt-get %s: %s", strings.Join(args, " "), out)
	}
}

// The blocks are found when the spec tree is built: one It each.
var _ = Describe("console examples", Ordered, ContinueOnFailure, Serial, func() {
	pages, err := markdownPages(repoRoot)
	if err != nil {
		panic(fmt.Sprintf("docs suite: %v", err))
	}
	blocks, err := consoleBlocks(repoRoot, pages)
	if err != nil {
		panic(fmt.Sprintf("docs suite: %v", err))
	}
	commands := 0
	for _, b := range blocks {
		commands += len(b.commands)
	}

	It("finds console examples to run", func() {
		Expect(blocks).NotTo(BeEmpty(), "no ```console block in %v", pages)
		AddReportEntry("console examples found",
			fmt.Sprintf("%d blocks, %d commands, in %d pages", len(blocks), commands, len(pages)))
	})

	for _, b := range blocks {
		It(b.name(), func(ctx SpecContext) {
			runs, err := runBlock(ctx, b, repoRoot, env, blockTimeout)
			AddReportEntry(commandsRunEntry, len(runs), ReportEntryVisibilityFailureOrVerbose)
			Expect(err).NotTo(HaveOccurred())
			for i, c := range b.commands {
				r := runs[i]
				where := fmt.Sprintf("%s:%d: $ %s", b.file, c.line, c.text)
				actual := outputLines(r.output)
				Expect(matches(c.expected, actual)).To(BeTrue(),
					"%s\nexpected output (%d lines):\n%s\nactual output, stdout and stderr (%d lines):\n%s",
					where, len(normalize(c.expected)), indent(normalize(c.expected)), len(actual), indent(actual))
				if slices.Contains(normalize(c.expected), ellipsis) && !statusShown(b.commands, i) {
					Expect(r.status).To(BeZero(), "%s\nexited %d (a command whose output is elided with `...` must exit 0, unless `$ echo $?` follows); output:\n%s",
						where, r.status, indent(actual))
				}
			}
		}, SpecTimeout(blockTimeout+time.Minute))
	}
})

// commandsRunEntry is the report entry of a block's spec that counts the commands it ran.
const commandsRunEntry = "commands run"

// ReportAfterSuite prints the counts whatever the verbosity, so that a run can be cited.
var _ = ReportAfterSuite("console examples run", func(r Report) {
	blocks, passed, commands := 0, 0, 0
	for _, s := range r.SpecReports {
		for _, e := range s.ReportEntries {
			if n, err := strconv.Atoi(e.StringRepresentation()); err == nil && e.Name == commandsRunEntry {
				blocks++
				commands += n
				if s.State == types.SpecStatePassed {
					passed++
				}
			}
		}
	}
	fmt.Printf("docs: %d console blocks run (%d passed), %d commands run\n", blocks, passed, commands)
})

// indent prefixes each line for a failure message.
func indent(lines []string) string {
	if len(lines) == 0 {
		return "    (none)"
	}
	return "    " + strings.Join(lines, "\n    ")
}
