// Package guest boots Debian guests under qemu for the tests that need a
// real machine: udev, a kernel that reads partition tables, reboots. The
// image comes from scripts/guest-image.sh (cached); each guest boots from
// a copy-on-write overlay of it, with extra disks of its own, and is
// reached with ssh through a port qemu forwards from 127.0.0.1.
//
// This machine's /dev/kvm cannot run stock kernels, so guests run under
// qemu's software emulation (TCG): ~45 s to boot alone, more under load.
package guest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// Image builds (first time only) and returns the directory of the guest
// image: scripts/guest-image.sh.
func Image(repo string) (string, error) { return testenv.CachedBuild(repo, "guest-image.sh") }

// Disk is an extra disk: a sparse raw file on the host.
type Disk struct {
	Name string
	Size int64
	// Bus is "virtio" (/dev/vdX), "nvme" (/dev/nvmeXn1) or "scsi"
	// (/dev/sdX, on virtio-scsi).
	Bus string
	// Partitions, if any, are laid out in a GPT (sgdisk, before the boot),
	// in order, each of that many bytes: an operator's partitioned disk.
	Partitions []int64
}

// Guest is one running guest.
type Guest struct {
	Dir     string // overlay, disks, console log
	SSHPort int
	image   string
	cmd     *exec.Cmd
	done    chan struct{}
}

// BootTimeout bounds one boot, up to sshd answering (TCG, two cores
// shared with the tests). A boot alone takes 40-100 s; at make test's
// start three guests boot beside the race build, and on 2026-12-07 two of
// them were still in the kernel's driver probing at 228 s and missed a
// 5 min bound: the bound is for a guest that never comes up, not a slow
// one.
const BootTimeout = 10 * time.Minute

// Boot starts a guest from image with disks, under dir, and waits until
// ssh answers. Stop it with Stop, also when Boot fails.
func Boot(ctx context.Context, image, dir string, disks ...Disk) (*Guest, error) {
	return BootWithMemory(ctx, image, dir, 768, disks...)
}

// BootWithMemory is Boot with memMiB of memory: a guest that runs a
// salt-master as well needs more than a minion.
func BootWithMemory(ctx context.Context, image, dir string, memMiB int, disks ...Disk) (*Guest, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	g := &Guest{Dir: dir, image: image}
	overlay := filepath.Join(dir, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(image, "rootfs.qcow2"), "-F", "qcow2", overlay).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g.SSHPort = l.Addr().(*net.TCPAddr).Port
	l.Close()
	// The translation cache: at 128 MiB a guest running a Salt master,
	// a minion and serve filled it and flushed it 27 times in its first
	// 4.5 minutes (qemu's "info jit"), each flush a full retranslation;
	// 1 GiB is qemu's own default, at the cost of memory the host has.
	//
	// qemu64, not max: under emulation the instructions a newer CPU
	// offers are slower than the plain code they replace, and the
	// guest's libraries pick them when offered (AES-NI for Salt's
	// message encryption, SHA-NI, AVX string functions). Measured
	// 2026-11-28 in one guest each, alone: boot 39-41 s against 52 s,
	// Salt's master and minion modules imported cold in 12 s against
	// 22 s, AES-CBC of 80 MiB in Python 3.1-3.9 s against 15.3 s,
	// salt-call --local test.ping 9.6-12.4 s against 12.4 s.
	args := []string{
		"-accel", "tcg,tb-size=1024", "-smp", "1", "-cpu", "qemu64", "-m", fmt.Sprint(memMiB),
		"-display", "none", "-monitor", "unix:" + filepath.Join(dir, "monitor.sock") + ",server=on,wait=off", "-serial", "file:" + filepath.Join(dir, "console.log"),
		"-kernel", filepath.Join(image, "vmlinuz"), "-initrd", filepath.Join(image, "initrd.img"),
		// norandmaps: every run of a program maps its code where the last
		// one did, so qemu reuses its translations instead of making new
		// ones for each of the many short-lived Python processes Salt
		// starts (a test guest needs no address-space randomisation).
		"-append", "root=/dev/vda rw console=ttyS0 quiet norandmaps",
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2",
		"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22", g.SSHPort),
		"-device", "virtio-net-pci,netdev=n0",
	}
	scsi := false
	for i, d := range disks {
		f := filepath.Join(dir, d.Name+".raw")
		if err := makeSparse(f, d.Size); err != nil {
			return nil, err
		}
		if len(d.Partitions) > 0 {
			sg := []string{"-o"}
			for i, n := range d.Partitions {
				sg = append(sg, "-n", fmt.Sprintf("%d:0:+%dK", i+1, n>>10))
			}
			if out, err := exec.Command("sgdisk", append(sg, f)...).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("partitioning disk %s: %v: %s", d.Name, err, out)
			}
		}
		id := fmt.Sprintf("d%d", i)
		switch d.Bus {
		case "", "virtio":
			args = append(args, "-drive", "file="+f+",if=virtio,format=raw")
		case "nvme":
			args = append(args, "-drive", "file="+f+",if=none,id="+id+",format=raw", "-device", "nvme,serial="+d.Name+",drive="+id+",id=disk-"+d.Name)
		case "scsi":
			if !scsi {
				args = append(args, "-device", "virtio-scsi-pci,id=scsi0")
				scsi = true
			}
			args = append(args, "-drive", "file="+f+",if=none,id="+id+",format=raw", "-device", "scsi-hd,drive="+id+",bus=scsi0.0,id=disk-"+d.Name)
		default:
			return nil, fmt.Errorf("disk %s: bus %q: use virtio, nvme or scsi", d.Name, d.Bus)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		return nil, err
	}
	g.cmd = exec.Command("qemu-system-x86_64", args...)
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	g.done = make(chan struct{})
	go func() { _ = g.cmd.Wait(); logf.Close(); close(g.done) }()
	if err := g.waitSSH(ctx, ""); err != nil {
		return g, err
	}
	return g, nil
}

func makeSparse(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(size)
}

// waitSSH waits until ssh answers with a boot id other than old.
func (g *Guest) waitSSH(ctx context.Context, old string) error {
	deadline := time.Now().Add(BootTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-g.done:
			return fmt.Errorf("qemu exited: %s", g.Tail(2000))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		id, err := g.Run("cat", "/proc/sys/kernel/random/boot_id")
		if err == nil && strings.TrimSpace(id) != old {
			return nil
		}
		time.Sleep(2 * time.Second)
	}
	return fmt.Errorf("no ssh within %s; console:\n%s", BootTimeout, g.Tail(3000))
}

// Run runs a program in the guest as root and returns its stdout; stderr
// is in the error. sshd hands the command line to the guest's shell: each
// argument is quoted, so none is interpreted.
func (g *Guest) Run(args ...string) (string, error) { return g.RunInput(nil, args...) }

// RunInput is Run with stdin.
func (g *Guest) RunInput(stdin []byte, args ...string) (string, error) {
	out, _, err := g.RunInputStderr(stdin, args...)
	return out, err
}

// RunInputStderr is RunInput that also returns the command's stderr (a
// node binary's steps).
func (g *Guest) RunInputStderr(stdin []byte, args ...string) (string, string, error) {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	ssh := append(g.sshArgs(), "root@127.0.0.1", "--", strings.Join(quoted, " "))
	cmd := exec.Command("ssh", ssh...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), errb.String(), nil
}

func (g *Guest) sshArgs() []string {
	return []string{"-i", filepath.Join(g.image, "id_ed25519"), "-p", fmt.Sprint(g.SSHPort),
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
		// One connection for every command: a handshake costs seconds
		// under emulation.
		"-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(g.Dir, "ssh.sock"), "-o", "ControlPersist=120"}
}

// Write writes data to a file in the guest with mode.
func (g *Guest) Write(remote string, data []byte, mode os.FileMode) error {
	if _, err := g.RunInput(data, "dd", "of="+remote, "status=none"); err != nil {
		return err
	}
	_, err := g.Run("chmod", fmt.Sprintf("%o", mode), remote)
	return err
}

// Reboot reboots the guest as an operator would and waits until it is
// back (a new boot id).
func (g *Guest) Reboot(ctx context.Context) error {
	old, err := g.Run("cat", "/proc/sys/kernel/random/boot_id")
	if err != nil {
		return err
	}
	// The connection may drop before systemctl answers.
	_, _ = g.Run("systemctl", "reboot")
	return g.waitSSH(ctx, strings.TrimSpace(old))
}

// RemoveDisk pulls an NVMe or SCSI disk out of the running guest, as a
// failed or unplugged disk goes (qemu's device_del, through its monitor).
func (g *Guest) RemoveDisk(name string) error {
	out, err := g.monitor("device_del disk-" + name)
	if err != nil {
		return err
	}
	// The monitor echoes the command (with terminal escapes); qemu's
	// refusals read "Error: ..." or "Device '...' not found".
	if strings.Contains(out, "rror") || strings.Contains(out, "not found") {
		return fmt.Errorf("device_del disk-%s: %q", name, out)
	}
	return nil
}

// JIT is how full qemu's translation cache is and how often it was
// flushed (each flush retranslates everything the guest runs), for the
// tests' logs: "gen code size 116900771/134212608, TB flush count 27".
func (g *Guest) JIT() string {
	out, err := g.monitor("info jit")
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.Join(strings.Fields(l), " ")
		if strings.HasPrefix(l, "gen code size") || strings.HasPrefix(l, "TB flush count") {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, ", ")
}

// monitor runs one command on qemu's human monitor and returns what it
// printed up to the next prompt.
func (g *Guest) monitor(cmd string) (string, error) {
	c, err := net.DialTimeout("unix", filepath.Join(g.Dir, "monitor.sock"), 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("qemu monitor: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	prompt := func() (string, error) {
		var got strings.Builder
		for !strings.HasSuffix(got.String(), "(qemu) ") {
			b, err := r.ReadByte()
			if err != nil {
				return got.String(), fmt.Errorf("qemu monitor: %w (read %q)", err, got.String())
			}
			got.WriteByte(b)
		}
		return got.String(), nil
	}
	if _, err := prompt(); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(c, "%s\n", cmd); err != nil {
		return "", fmt.Errorf("qemu monitor: %w", err)
	}
	return prompt()
}

// Tail is the end of the guest's serial console.
func (g *Guest) Tail(n int) string {
	b, _ := os.ReadFile(filepath.Join(g.Dir, "console.log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Stop powers the guest off (no shutdown: its disks are thrown away).
func (g *Guest) Stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = exec.Command("ssh", append(g.sshArgs(), "-O", "exit", "root@127.0.0.1")...).Run()
	_ = g.cmd.Process.Kill()
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
	}
}
