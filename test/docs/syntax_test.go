package docs_test

import (
	"os"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("console block syntax", func() {
	It("reads commands, continuation lines and output, in indented fences too", func() {
		page := strings.Join([]string{
			"text",
			"```sh",
			"$ not run",
			"```",
			"1. a step:",
			"   ```console",
			"   $ echo a \\",
			"     b",
			"   a b",
			"   $ false",
			"   $ echo $?",
			"   1",
			"   ```",
		}, "\n")
		blocks, err := parseConsoleBlocks("p.md", []byte(page))
		Expect(err).NotTo(HaveOccurred())
		Expect(blocks).To(HaveLen(1))
		Expect(blocks[0].name()).To(Equal("p.md:6"))
		Expect(blocks[0].commands).To(Equal([]command{
			{line: 7, text: "echo a \\\n  b", expected: []string{"a b"}},
			{line: 10, text: "false"},
			{line: 11, text: "echo $?", expected: []string{"1"}},
		}))
		Expect(statusShown(blocks[0].commands, 1)).To(BeTrue())
		Expect(statusShown(blocks[0].commands, 0)).To(BeFalse())
	})

	It("refuses output before the first command and an unclosed block", func() {
		_, err := parseConsoleBlocks("p.md", []byte("```console\noutput\n$ true\n```\n"))
		Expect(err).To(MatchError(ContainSubstring("p.md:2: output")))
		_, err = parseConsoleBlocks("p.md", []byte("```console\n$ true\n"))
		Expect(err).To(MatchError(ContainSubstring("p.md:1: console block not closed")))
	})

	DescribeTable("matching output",
		func(expected []string, actual string, want bool) {
			Expect(matches(expected, outputLines(actual))).To(Equal(want))
		},
		Entry("equal", []string{"a", "b"}, "a\nb\n", true),
		Entry("trailing whitespace and empty lines at the end", []string{"a  ", "b"}, "a\nb \t\n\n", true),
		Entry("leading whitespace counts", []string{" a"}, "a\n", false),
		Entry("a line missing", []string{"a", "b"}, "a\n", false),
		Entry("a line more", []string{"a"}, "a\nb\n", false),
		Entry("no output", nil, "", true),
		Entry("... matches no line", []string{"a", "...", "b"}, "a\nb\n", true),
		Entry("... matches many lines", []string{"a", "...", "z"}, "a\nb\nc\nz\n", true),
		Entry("... alone matches anything", []string{"..."}, "x\ny\n", true),
		Entry("... is only a whole line", []string{"PASS: .../..."}, "PASS: 1/1\n", false),
		Entry("the lines around ... still count", []string{"...", "z"}, "a\nb\n", false),
	)

	It("cuts a block's output at the markers", func() {
		_, err := splitRuns("one\nM0 0\nM1 3\ntwo", "M", 2)
		Expect(err).To(MatchError(ContainSubstring("output after the last command")))
		runs, err := splitRuns("one\nM0 0\nno newline M1 3\n", "M", 2)
		Expect(err).NotTo(HaveOccurred())
		Expect(runs).To(Equal([]ran{{output: "one\n", status: 0}, {output: "no newline ", status: 3}}))
	})

	It("leaves nothing running after a block, and stops a block at its timeout", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		started := time.Now()
		runs, err := runBlock(ctx, block{file: "p.md", line: 1, commands: []command{
			{text: "(sleep 30; touch late) &"},
			{text: "echo hi"},
		}}, dir, os.Environ(), time.Minute)
		Expect(err).NotTo(HaveOccurred())
		Expect(runs).To(Equal([]ran{{output: "", status: 0}, {output: "hi\n", status: 0}}))
		Expect(time.Since(started)).To(BeNumerically("<", 5*time.Second), "a command left in the background held the block")

		started = time.Now()
		_, err = runBlock(ctx, block{file: "p.md", line: 1, commands: []command{{text: "sleep 30 | cat"}}}, dir, os.Environ(), time.Second)
		Expect(err).To(MatchError(ContainSubstring("stopped after 1s")))
		Expect(time.Since(started)).To(BeNumerically("<", 5*time.Second))
		Expect(dir + "/late").NotTo(BeAnExistingFile())
	}, SpecTimeout(time.Minute))
})
