// Package failpoint holds the hooks that tests use to stop a binary at a
// chosen step or to hand it their own tools. They are compiled in only with
// the failpoints build tag (the test harness builds with it, `make build`
// and the packages never do), so a released binary reads none of these
// variables: whoever can set a node's or serve's environment cannot make
// them kill themselves halfway or run a program of their choosing.
package failpoint

// CrashEnv names the variable whose value is the step after which a binary
// built with failpoints kills itself (SIGKILL), to prove a rerun converges.
const CrashEnv = "SALT_VOLUMES_CRASH_AFTER"

// PauseEnv names the variable whose value is the step after which a
// binary built with failpoints stops itself (SIGSTOP) until a test, having
// changed the machine under it, sends SIGCONT.
const PauseEnv = "SALT_VOLUMES_PAUSE_AFTER"

// ToolDirEnv names a directory a binary built with failpoints searches for
// programs before the pinned PATH (a test's mkfs that hangs).
const ToolDirEnv = "SALT_VOLUMES_TEST_TOOL_DIR"
