package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// block is one ```console fenced block of a Markdown page.
type block struct {
	file     string // relative to the repository root, slash-separated
	line     int    // of the opening fence, 1-based
	commands []command
}

// command is one `$ ` line of a block (with its continuation lines) and the output shown
// under it, up to the next `$ ` line or the end of the block.
type command struct {
	line     int    // of the `$ ` line, 1-based
	text     string // without the `$ ` prompt; continuation lines joined by newlines
	expected []string
}

// name is how a block's spec is named: FILE:LINE of its opening fence.
func (b block) name() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// markdownPages are README.md and every .md file under docs/, relative to root, sorted.
func markdownPages(root string) ([]string, error) {
	pages := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path == filepath.Join(root, "docs") {
				return fs.SkipDir
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list docs pages: %w", err)
	}
	slices.Sort(pages[1:])
	return pages, nil
}

// consoleBlocks are the ```console blocks of the pages under root.
func consoleBlocks(root string, pages []string) ([]block, error) {
	var all []block
	for _, page := range pages {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
		if err != nil {
			return nil, fmt.Errorf("read page: %w", err)
		}
		blocks, err := parseConsoleBlocks(page, data)
		if err != nil {
			return nil, err
		}
		all = append(all, blocks...)
	}
	return all, nil
}

// parseConsoleBlocks finds the ```console blocks of one Markdown page. A fence may be
// indented (inside a list item): that many leading spaces are taken off each line of the
// block.
func parseConsoleBlocks(file string, data []byte) ([]block, error) {
	var (
		blocks []block
		cur    *block
		indent int
		n      int
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if info, ok := strings.CutPrefix(trimmed, "```"); ok && strings.Fields(info + " x")[0] == "console" {
				cur, indent = &block{file: file, line: n}, len(line)-len(trimmed)
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") && strings.Trim(trimmed, "` \t") == "" {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		line = line[min(indent, len(line)-len(trimmed)):]
		if err := cur.add(n, line); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", file, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: console block not closed", file, cur.line)
	}
	return blocks, nil
}

// add takes the block's next line: a command, a command's continuation, or output.
func (b *block) add(n int, line string) error {
	last := len(b.commands) - 1
	switch {
	case last >= 0 && len(b.commands[last].expected) == 0 && strings.HasSuffix(b.commands[last].text, `\`):
		b.commands[last].text += "\n" + line
	case strings.HasPrefix(line, "$ "):
		b.commands = append(b.commands, command{line: n, text: strings.TrimPrefix(line, "$ ")})
	case last < 0:
		if strings.TrimSpace(line) == "" {
			return nil
		}
		return fmt.Errorf("output %q before the block's first `$ ` command", line)
	default:
		b.commands[last].expected = append(b.commands[last].expected, line)
	}
	return nil
}

// statusShown tells whether the command after commands[i] is `echo $?`, which shows its
// exit status: only then may a command exit with another status than 0.
func statusShown(commands []command, i int) bool {
	return i+1 < len(commands) && strings.TrimSpace(commands[i+1].text) == "echo $?"
}

// ran is what one command of a block did.
type ran struct {
	output string
	status int
}

// runBlock runs a block's commands as one bash script (so `echo $?`, cd and variables carry
// from one command to the next), in dir with env, stdout and stderr on one pipe as a
// terminal shows them. After each command the script writes a marker with the command's
// status, then restores $? for the next command.
func runBlock(ctx context.Context, b block, dir string, env []string, timeout time.Duration) ([]ran, error) {
	marker := fmt.Sprintf("\x1evirt-rules-docs-%d:", time.Now().UnixNano())
	var script strings.Builder
	for i, c := range b.commands {
		fmt.Fprintf(&script, "%s\n__docs_status=$?; printf '%%s%d %%d\\n' '%s' \"$__docs_status\"; (exit \"$__docs_status\")\n",
			c.text, i, marker)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", script.String())
	cmd.Dir, cmd.Env, cmd.WaitDelay = dir, env, 10*time.Second
	// The block runs in a process group of its own, killed whole on a timeout and when bash
	// exits: bash alone killed would leave its children (make, opa, a server started with &)
	// running beside the next block. Its output goes to a file rather than a pipe, so that
	// nothing left running can hold the run open; one file for both, in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	outFile, err := os.CreateTemp("", "virt-rules-docs-block-*")
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", b.name(), err)
	}
	defer os.Remove(outFile.Name())
	defer outFile.Close()
	cmd.Stdout, cmd.Stderr = outFile, outFile
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if runErr != nil && !errors.As(runErr, new(*exec.ExitError)) {
		return nil, fmt.Errorf("run %s: %w", b.name(), runErr)
	}
	var out bytes.Buffer
	if _, err := outFile.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("run %s: %w", b.name(), err)
	}
	if _, err := out.ReadFrom(outFile); err != nil {
		return nil, fmt.Errorf("run %s: %w", b.name(), err)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("run %s: stopped after %s: %w\n%s", b.name(), timeout, ctx.Err(), out.String())
	}
	return splitRuns(out.String(), marker, len(b.commands))
}

// splitRuns cuts a block's output at the markers runBlock's script writes.
func splitRuns(out, marker string, commands int) ([]ran, error) {
	runs := make([]ran, 0, commands)
	for i := range commands {
		before, after, ok := strings.Cut(out, marker)
		if !ok {
			return runs, fmt.Errorf("the script ended before command %d finished (did it exit?): %q", i+1, out)
		}
		head, rest, _ := strings.Cut(after, "\n")
		fields := strings.Fields(head)
		if len(fields) != 2 || fields[0] != strconv.Itoa(i) {
			return runs, fmt.Errorf("unexpected marker %q after command %d", head, i+1)
		}
		status, err := strconv.Atoi(fields[1])
		if err != nil {
			return runs, fmt.Errorf("status of command %d: %w", i+1, err)
		}
		runs = append(runs, ran{output: before, status: status})
		out = rest
	}
	if strings.TrimSpace(out) != "" {
		return runs, fmt.Errorf("output after the last command: %q", out)
	}
	return runs, nil
}

// normalize splits output into lines as they are compared: each line without trailing
// whitespace, and no empty lines at the end.
func normalize(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, strings.TrimRight(l, " \t\r"))
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

// outputLines are a command's output as normalized lines.
func outputLines(output string) []string { return normalize(strings.Split(output, "\n")) }

// ellipsis is an expected output line that matches any number of actual lines, none included.
const ellipsis = "..."

// matches tells whether actual (normalized lines) is what expected shows: equal lines, where
// an expected line that is exactly "..." stands for any number of lines.
func matches(expected, actual []string) bool {
	expected = normalize(expected)
	// can[i][j]: expected[i:] matches actual[j:], filled from the ends.
	can := make([][]bool, len(expected)+1)
	for i := range can {
		can[i] = make([]bool, len(actual)+1)
	}
	can[len(expected)][len(actual)] = true
	for i := len(expected) - 1; i >= 0; i-- {
		for j := len(actual); j >= 0; j-- {
			if expected[i] == ellipsis {
				can[i][j] = can[i+1][j] || (j < len(actual) && can[i][j+1])
			} else {
				can[i][j] = j < len(actual) && expected[i] == actual[j] && can[i+1][j+1]
			}
		}
	}
	return can[0][0]
}
