package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// process is one binary of the cluster, started by it and stopped by it, its output in
// Dir/logs/NAME.log. A restarted process is run again whenever it exits, as kubelet does for
// KubeVirt's pods (virt-controller exits on purpose, for example, when CDI's API appears).
type process struct {
	name    string
	bin     string
	args    []string
	restart bool
	log     *os.File

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	restarts int
	done     chan struct{} // closed when the process has exited for good
	err      error
}

// start runs bin with args in its own process group, so that stopping it stops what it started.
func (c *Cluster) start(name, bin string, args ...string) (*process, error) {
	return c.startProcess(&process{name: name, bin: bin, args: args})
}

// startRestarted is start for a process run again whenever it exits.
func (c *Cluster) startRestarted(name, bin string, args ...string) (*process, error) {
	return c.startProcess(&process{name: name, bin: bin, args: args, restart: true})
}

func (c *Cluster) startProcess(p *process) (*process, error) {
	logFile, err := os.Create(filepath.Join(c.Dir, "logs", p.name+".log"))
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	p.log, p.done = logFile, make(chan struct{})
	cmd, err := p.run()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	go p.supervise(cmd, c)
	c.procs = append(c.procs, p)
	c.log.Info("started", "process", p.name, "pid", cmd.Process.Pid)
	return p, nil
}

func (p *process) run() (*exec.Cmd, error) {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", p.name, p.bin, err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	return cmd, nil
}

// supervise waits for the process and, for a restarted one, runs it again a second later.
func (p *process) supervise(cmd *exec.Cmd, c *Cluster) {
	for {
		err := cmd.Wait()
		p.mu.Lock()
		stopping := p.stopping || !p.restart
		p.mu.Unlock()
		if stopping {
			p.err = err
			close(p.done)
			return
		}
		c.log.Info("restarting", "process", p.name, "exit", err)
		fmt.Fprintf(p.log, "\n==> testcluster: %s exited (%v); restarting it, as kubelet would <==\n", p.name, err)
		time.Sleep(time.Second)
		p.mu.Lock()
		p.restarts++
		stopping = p.stopping
		p.mu.Unlock()
		if stopping {
			close(p.done)
			return
		}
		if cmd, err = p.run(); err != nil {
			p.err = err
			close(p.done)
			return
		}
	}
}

// exited is an error naming the process and its log when it has exited for good, nil while
// it runs or will be restarted.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); see %s", p.name, p.err, p.log.Name())
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) error {
	defer p.log.Close()
	p.mu.Lock()
	p.stopping = true
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	p.mu.Lock()
	pid = p.cmd.Process.Pid
	p.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM: killed", p.name, grace)
}

// waitFor polls ready every 200 ms until it returns nil, a process of the cluster exits for
// good, ctx ends or timeout passes; what names the wait in the error.
func (c *Cluster) waitFor(ctx context.Context, timeout time.Duration, what string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		for _, p := range c.procs {
			if err := p.exited(); err != nil {
				return fmt.Errorf("wait for %s: %w", what, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last: %w)", what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

var errNotYet = errors.New("not yet")

// logFile creates logs/<name>.log for a process envtest starts (etcd, kube-apiserver); Stop
// closes it.
func (c *Cluster) logFile(name string) (*os.File, error) {
	f, err := os.Create(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return nil, fmt.Errorf("create log of %s: %w", name, err)
	}
	c.envLogs = append(c.envLogs, f)
	return f, nil
}
