// Package toolpath pins the PATH the binaries find root tools on (mkfs,
// wipefs, blkid, lvm, resize2fs, udevadm). They run as root, started by a
// minion or a unit whose environment an operator's shell, sudo or a
// misconfigured service may have shaped; a directory earlier on an inherited
// PATH would otherwise decide which program formats a disk.
package toolpath

import (
	"os"
	"strings"

	"github.com/salt-volumes/salt-volumes/internal/failpoint"
)

// Safe is systemd's and Debian's default PATH for root: directories only
// root may write on any distribution we support.
const Safe = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Pin replaces the process's PATH with Safe, so that exec.LookPath and every
// child process see only it. Test builds may put their tool directory first.
func Pin() {
	dirs := append(failpoint.ToolDirs(), Safe)
	_ = os.Setenv("PATH", strings.Join(dirs, ":"))
}
