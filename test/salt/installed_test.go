package salt

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// salt_volumes.installed gives each minion the node binary of its own
// architecture (#52 item 3): a master offering amd64 and arm64 binaries
// (as the salt-volumes package does) sends an arm64 minion, told by its
// osarch grain, the arm64 one, which runs (under qemu-user here). A
// minion of an architecture the master has no binary for fails, naming
// it and the fix, and gets nothing.
func TestInstalledSendsTheMinionsArchitecture(t *testing.T) {
	saltstack.Need(t)
	qemu, err := exec.LookPath("qemu-aarch64-static")
	require.NoError(t, err, "qemu-user-static runs the arm64 binary (make setup installs it)")
	dir := t.TempDir()
	files := filepath.Join(dir, "roots", "salt_volumes", "files")
	require.NoError(t, os.MkdirAll(files, 0o755))
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(files, "salt-volume-exec.arm64"), "./cmd/salt-volume-exec")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	host, err := os.ReadFile(binary)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(files, "salt-volume-exec.amd64"), host, 0o755))
	// The stack runs a copy of the node binary: the state replaces it.
	exe := filepath.Join(dir, "bin", "salt-volume-exec")
	require.NoError(t, os.MkdirAll(filepath.Dir(exe), 0o755))
	require.NoError(t, os.WriteFile(exe, host, 0o755))
	// The state installs the boot-time unit on the machine; leave the
	// machine as it was.
	const unit = "/etc/systemd/system/salt-volumes-restore.service"
	if _, err := os.Stat(unit); os.IsNotExist(err) {
		t.Cleanup(func() { os.Remove(unit) })
	}

	s := saltstack.StartOpts(t, exe, saltstack.Options{FileRootFirst: filepath.Join(dir, "roots"), MinionExtra: "grains:\n  osarch: arm64\n"})
	out2, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out2)
	res, code := s.Salt(s.MinionID, "state.apply", "salt_volumes.installed", "--out=json", "--static")
	require.Equal(t, 0, code, res)
	f, err := elf.Open(exe)
	require.NoError(t, err)
	machine := f.Machine
	f.Close()
	assert.Equal(t, elf.EM_AARCH64, machine, "the arm64 minion got the arm64 binary")
	ver, err := exec.Command(qemu, exe, "version").CombinedOutput()
	require.NoError(t, err, "%s", ver)
	assert.Contains(t, string(ver), `"version"`, "it runs: %s", ver)

	// An architecture the master has no binary for: refused, naming it
	// and the fix; the node keeps what it has.
	require.NoError(t, os.WriteFile(exe, host, 0o755))
	m := saltstack.MasterlessOpts(t, exe, saltstack.Options{FileRootFirst: filepath.Join(dir, "roots"), MinionExtra: "grains:\n  osarch: riscv64\n"})
	out3, code := m.SaltCall("saltutil.sync_all", "--out=json")
	require.Equal(t, 0, code, out3)
	out4, code := m.SaltCall("--retcode-passthrough", "--out=json", "state.apply", "salt_volumes.installed")
	assert.NotEqual(t, 0, code, out4)
	st := states(t, saltstack.JSON(t, out4), "local")["salt_volumes binary"]
	require.NotNil(t, st, out4)
	assert.Equal(t, false, st["result"])
	for _, want := range []string{"(riscv64, Go's riscv64)", "salt-volume-exec.amd64, salt-volume-exec.arm64", "GOARCH=riscv64", "salt://salt_volumes/files/salt-volume-exec.riscv64"} {
		assert.Contains(t, st["comment"], want)
	}
	after, err := os.ReadFile(exe)
	require.NoError(t, err)
	assert.Equal(t, host, after, "nothing replaced the node's binary")
}
