package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// initChildEnv marks the defaulter started under its own init (runAsInit).
const initChildEnv = "VIRT_RULES_INIT_CHILD"

// runAsInit is what the defaulter does when it is PID 1, as a container's entrypoint is in the
// container's PID namespace: orphans are reparented to PID 1, and libvirt's QEMU capability
// probe makes one each time (it starts QEMU with -daemonize, so QEMU is not libvirt's child,
// then kills it). A PID 1 that does not reap it keeps it a zombie, and libvirt waits for the
// killed QEMU to go away, seconds per probe, probe after probe. So, as PID 1, the defaulter
// runs itself again as a child and acts as init: it forwards SIGTERM and SIGINT to the child,
// reaps every process that ends, and exits as the child does. ran is false when the process is
// not PID 1 (or already the child) and should serve itself.
func runAsInit() (ran bool, err error) {
	if os.Getpid() != 1 || os.Getenv(initChildEnv) != "" {
		return false, nil
	}
	self, err := os.Executable()
	if err != nil {
		return true, fmt.Errorf("init: find the defaulter's executable: %w", err)
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	child := exec.Command(self, os.Args[1:]...)
	child.Env = append(os.Environ(), initChildEnv+"=1")
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		return true, fmt.Errorf("init: start the defaulter: %w", err)
	}
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			_ = child.Process.Signal(sig)
			continue
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if pid == child.Process.Pid {
				return true, childExit(status)
			}
		}
	}
	return true, nil
}

// childExit is the defaulter child's end as this process's error: nil for exit 0.
func childExit(status syscall.WaitStatus) error {
	switch {
	case status.Exited() && status.ExitStatus() == 0:
		return nil
	case status.Exited():
		return fmt.Errorf("defaulter exited with status %d", status.ExitStatus())
	default:
		return fmt.Errorf("defaulter ended by %s", status.Signal())
	}
}
