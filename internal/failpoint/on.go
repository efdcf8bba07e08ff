//go:build failpoints

package failpoint

import (
	"os"
	"syscall"
)

// Enabled says whether this binary was built with the failpoints tag.
const Enabled = true

// Hit kills the process when CrashEnv names step, and stops it when
// PauseEnv does.
func Hit(step string) {
	if os.Getenv(PauseEnv) == step {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	if os.Getenv(CrashEnv) != step {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// ToolDirs returns the test's tool directory, if one is set.
func ToolDirs() []string {
	if d := os.Getenv(ToolDirEnv); d != "" {
		return []string{d}
	}
	return nil
}
