package nodeexec

import (
	"context"
	"crypto/sha256"
	bin "encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/salt-volumes/salt-volumes/internal/loopdev"
	"github.com/salt-volumes/salt-volumes/test/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdversarial tries, as an attacker and as an unlucky operator would,
// to make salt-volume-exec change data that is not the volume's. Every case
// states the exit code it must get, the names (field, device, signature)
// its message must carry, and the devices and files that must stay
// byte-identical. The suite ends with one line, also written to
// test-results/adversarial.txt:
//
//	N cases, N clear errors, 0 foreign bytes changed
func TestAdversarial(t *testing.T) {
	a := newArena(t)
	t.Run("signatures", a.signatureCases)
	t.Run("uuid ownership", a.uuidCases)
	t.Run("mkfs options", a.mkfsOptionCases)
	t.Run("damaged volumes", a.damagedCases)
	t.Run("claims on volumes", a.claimCases)
	t.Run("in use", a.inUseCases)
	t.Run("state dir", a.stateDirCases)
	t.Run("spec JSON", a.jsonCases)

	a.mu.Lock()
	defer a.mu.Unlock()
	line := fmt.Sprintf("%d cases, %d clear errors, %d foreign bytes changed", a.cases, a.clear, a.changedBytes)
	t.Log(line)
	fmt.Println(line)
	_ = os.MkdirAll("../../test-results", 0o755)
	_ = os.WriteFile("../../test-results/adversarial.txt", []byte(line+"\n"), 0o644)
	assert.GreaterOrEqual(t, a.cases, 100, "the suite must keep at least 100 cases")
	assert.Equal(t, a.cases, a.clear, "every case must end with its expected exit code and a message naming the field or device")
	assert.Zero(t, a.changedBytes, "no byte that is not the volume's may change")
}

// arena is the suite's node plus its bookkeeping.
type arena struct {
	*node
	mu                  sync.Mutex
	cases, clear        int
	changedBytes        int64
	bystander, byHash   string
	bystanderUUID, tdir string
}

func newArena(t *testing.T) *arena {
	n := newNode(t)
	for _, tool := range []string{"wipefs", "unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: run make setup", tool)
		}
	}
	a := &arena{node: n, tdir: t.TempDir()}
	// A bystander: a host filesystem that no case names, checked at the end.
	d := a.device(t, 32<<20, func(img string) error {
		a.bystanderUUID = uuid.NewString()
		return runTool("mkfs.ext4", "-q", "-U", a.bystanderUUID, img)
	})
	a.bystander, a.byHash = d.Path, sum(t, d.Path)
	t.Cleanup(func() {
		if got := sum(t, a.bystander); got != a.byHash {
			a.changedBytes++
			t.Errorf("the bystander filesystem %s changed", a.bystander)
		}
	})
	return a
}

func runTool(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// device makes an image, lets write put a signature on it, and attaches it.
func (a *arena) device(t *testing.T, size int64, write func(img string) error) loopdev.Device {
	t.Helper()
	return testenv.FakeDiskWith(t, size, write)
}

// expect is what one case must end with.
type expect struct {
	code    int
	errCode string   // the error's code; "" for a success
	names   []string // what the message (or a warning) must name
	victims []string // devices and files that must not change
}

// try runs one case: hashes the victims, runs the command, checks the exit
// code and the message, and hashes the victims again.
func (a *arena) try(t *testing.T, e expect, cmd string, spec any, extra ...string) run {
	t.Helper()
	before := map[string]string{}
	for _, v := range e.victims {
		before[v] = hashPath(t, v)
	}
	var stdin string
	switch s := spec.(type) {
	case string:
		stdin = s
	case nil:
	default:
		b, err := json.Marshal(s)
		require.NoError(t, err)
		stdin = string(b)
	}
	args := []string{cmd}
	if spec != nil {
		args = append(args, "--spec", "-")
	}
	r := a.exec(nil, stdin, append(args, extra...)...)
	text := r.errMsg()
	if e.errCode == "" {
		text = r.Stdout
	}
	clear := assert.Equal(t, e.code, r.Code, "exit code; stdout: %s", r.Stdout)
	if e.errCode != "" {
		clear = assert.Equal(t, e.errCode, r.errCode(), r.Stdout) && clear
	}
	for _, n := range e.names {
		clear = assert.Contains(t, text, n, "the message must name %q", n) && clear
	}
	var changed int64
	for _, v := range e.victims {
		if after := hashPath(t, v); after != before[v] {
			changed++
			t.Errorf("%s changed", v)
		}
	}
	a.mu.Lock()
	a.cases++
	if clear {
		a.clear++
	}
	a.changedBytes += changed
	a.mu.Unlock()
	return r
}

// hashPath hashes a device or a file; for a directory, every file in it
// with its name; a missing path hashes as "absent".
func hashPath(t *testing.T, p string) string {
	t.Helper()
	st, err := os.Lstat(p)
	if os.IsNotExist(err) {
		return "absent"
	}
	require.NoError(t, err)
	if st.Mode()&os.ModeSymlink != 0 {
		l, _ := os.Readlink(p)
		return "link:" + l
	}
	if !st.IsDir() {
		return sum(t, p)
	}
	h := sha256.New()
	require.NoError(t, filepath.Walk(p, func(q string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		fmt.Fprintf(h, "%s %o\n", q, fi.Mode())
		if fi.Mode().IsRegular() {
			f, err := os.Open(q)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(h, f)
			return err
		}
		return nil
	}))
	return hex.EncodeToString(h.Sum(nil))
}

// signature is a way to put a recognisable signature on an image, with the
// name libblkid (or our probe) reports for it.
type signature struct {
	name, tool string
	size       int64
	write      func(img string) error
}

func rawBytes(off int64, b []byte) func(string) error {
	return func(img string) error {
		f, err := os.OpenFile(img, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.WriteAt(b, off)
		return err
	}
}

// mdSuperblock is an md 1.2 superblock with a valid checksum (libblkid
// checks it); mdadm itself needs the md driver, which this kernel lacks.
func mdSuperblock() []byte {
	b := make([]byte, 256)
	le := bin.LittleEndian
	le.PutUint32(b[0:], 0xa92b4efc)
	le.PutUint32(b[4:], 1)
	copy(b[16:32], uuid.New().NodeID())
	copy(b[32:], "adv:0")
	le.PutUint32(b[72:], 1)
	le.PutUint64(b[80:], 60000)
	le.PutUint32(b[92:], 2)
	le.PutUint64(b[128:], 2048)
	le.PutUint64(b[136:], 60000)
	le.PutUint64(b[144:], 8)
	var s uint64
	for i := 0; i < 256; i += 4 {
		s += uint64(le.Uint32(b[i:]))
	}
	le.PutUint32(b[216:], uint32(s&0xffffffff)+uint32(s>>32))
	return b
}

// dosMBR is a DOS partition table with one Linux partition.
func dosMBR() []byte {
	b := make([]byte, 512)
	e := b[446:]
	e[4] = 0x83
	bin.LittleEndian.PutUint32(e[8:], 2048)
	bin.LittleEndian.PutUint32(e[12:], 8192)
	b[510], b[511] = 0x55, 0xaa
	return b
}

func tool(name string, args ...string) func(string) error {
	return func(img string) error { return runTool(name, append(args, img)...) }
}

func signatures(dir string) []signature {
	src := filepath.Join(dir, "tree")
	_ = os.MkdirAll(src, 0o755)
	_ = os.WriteFile(filepath.Join(src, "a"), []byte("someone's data\n"), 0o644)
	luks := func(typ string) func(string) error {
		return func(img string) error {
			cmd := exec.Command("cryptsetup", "luksFormat", "-q", "--type", typ, "--pbkdf", "pbkdf2",
				"--pbkdf-force-iterations", "1000", "--key-file", "-", img)
			cmd.Stdin = strings.NewReader("secret")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("cryptsetup: %v: %s", err, out)
			}
			return nil
		}
	}
	return []signature{
		{"ext2", "mkfs.ext2", 32 << 20, tool("mkfs.ext2", "-q")},
		{"ext3", "mkfs.ext3", 32 << 20, tool("mkfs.ext3", "-q")},
		{"ext4", "mkfs.ext4", 32 << 20, tool("mkfs.ext4", "-q")},
		{"xfs", "mkfs.xfs", 300 << 20, tool("mkfs.xfs", "-q")},
		{"btrfs", "mkfs.btrfs", 128 << 20, tool("mkfs.btrfs", "-q")},
		{"f2fs", "mkfs.f2fs", 64 << 20, tool("mkfs.f2fs", "-q")},
		{"exfat", "mkfs.exfat", 32 << 20, tool("mkfs.exfat")},
		{"vfat", "mkfs.vfat", 32 << 20, tool("mkfs.vfat")},
		{"ntfs", "mkntfs", 32 << 20, tool("mkntfs", "-q", "-F", "-Q")},
		{"nilfs2", "mkfs.nilfs2", 64 << 20, tool("mkfs.nilfs2", "-q", "-f", "-B", "16")},
		{"jfs", "mkfs.jfs", 32 << 20, tool("mkfs.jfs", "-q")},
		{"udf", "mkudffs", 32 << 20, tool("mkudffs")},
		{"reiserfs", "mkreiserfs", 64 << 20, tool("mkreiserfs", "-q")},
		{"minix", "mkfs.minix", 32 << 20, tool("mkfs.minix")},
		{"swap", "mkswap", 32 << 20, tool("mkswap")},
		{"crypto_LUKS", "cryptsetup", 32 << 20, luks("luks1")},
		{"crypto_LUKS", "cryptsetup", 32 << 20, luks("luks2")},
		{"bcache", "make-bcache", 32 << 20, tool("make-bcache", "-B")},
		{"iso9660", "xorriso", 32 << 20, func(img string) error {
			return runTool("xorriso", "-outdev", "stdio:"+img, "-map", src, "/")
		}},
		{"squashfs", "mksquashfs", 32 << 20, func(img string) error {
			return runTool("mksquashfs", src, img, "-quiet", "-noappend")
		}},
		{"cramfs", "mkfs.cramfs", 32 << 20, func(img string) error {
			tmp := img + ".cramfs"
			if err := runTool("mkfs.cramfs", src, tmp); err != nil {
				return err
			}
			b, err := os.ReadFile(tmp)
			if err != nil {
				return err
			}
			return rawBytes(0, b)(img)
		}},
		{"gpt", "sgdisk", 32 << 20, tool("sgdisk", "-n", "1:2048:+8M")},
		{"dos", "", 32 << 20, rawBytes(0, dosMBR())},
		{"linux_raid_member", "", 32 << 20, rawBytes(4096, mdSuperblock())},
		{"ceph_bluestore", "", 32 << 20, rawBytes(0, []byte("bluestore block device\n"))},
		{"oracleasm", "", 32 << 20, rawBytes(32, []byte("ORCLDISK"))},
		{"vdo", "", 32 << 20, rawBytes(0, []byte("dmvdo001"))},
	}
}

// Every signature libblkid knows and a Debian package writes here (raw
// bytes where the tool needs a kernel feature this machine lacks) is
// refused, in both modes, before anything is written.
func (a *arena) signatureCases(t *testing.T) {
	for _, sig := range signatures(a.tdir) {
		t.Run(sig.name+"-"+sig.tool, func(t *testing.T) {
			if sig.tool != "" {
				if _, err := exec.LookPath(sig.tool); err != nil {
					t.Fatalf("needs %s (make setup installs it)", sig.tool)
				}
			}
			d := a.device(t, sig.size, sig.write)
			for _, mode := range []string{"Filesystem", "Block"} {
				spec := rawSpec("victim", a.newUUID(), d.Path, map[string]any{"mode": mode})
				a.try(t, expect{code: 3, errCode: "foreign_data", names: []string{"rawBlockDevice.devicePath", d.Path, sig.name},
					victims: []string{d.Path}}, "prepare", spec)
			}
		})
	}
	// LVM2 needs a block device to write its label on.
	t.Run("LVM2_member-pvcreate", func(t *testing.T) {
		if _, err := exec.LookPath("pvcreate"); err != nil {
			t.Fatal("needs pvcreate (make setup installs lvm2)")
		}
		d := a.device(t, 32<<20, nil)
		require.NoError(t, runTool("pvcreate", "-q", "-f", d.Path))
		for _, mode := range []string{"Filesystem", "Block"} {
			spec := rawSpec("victim", a.newUUID(), d.Path, map[string]any{"mode": mode})
			a.try(t, expect{code: 3, errCode: "foreign_data", names: []string{d.Path, "LVM2"}, victims: []string{d.Path}}, "prepare", spec)
		}
	})
}

// Finding 1: a UUID in a spec proves nothing.
func (a *arena) uuidCases(t *testing.T) {
	fsVictim := func(t *testing.T, kind string) (loopdev.Device, string) {
		u := uuid.NewString()
		size, args := int64(32<<20), []string{"mkfs.ext4", "-q", "-U", u}
		if kind == "xfs" {
			size, args = 300<<20, []string{"mkfs.xfs", "-q", "-m", "uuid=" + u}
		}
		d := a.device(t, size, func(img string) error { return runTool(args[0], append(args[1:], img)...) })
		a.uuids = append(a.uuids, u)
		return d, u
	}
	for _, kind := range []string{"ext4", "xfs"} {
		t.Run("unprepare --wipe without a record, uuid of a "+kind+" elsewhere", func(t *testing.T) {
			victim, u := fsVictim(t, kind)
			other := a.device(t, 32<<20, nil)
			spec := rawSpec("attack", u, other.Path, nil)
			spec["fsType"] = kind
			a.try(t, expect{code: 0, names: []string{"no record of volume " + u, "nothing was touched"}, victims: []string{victim.Path, other.Path}},
				"unprepare", spec, "--wipe")
		})
		t.Run("raw prepare adopting a "+kind+" by its uuid", func(t *testing.T) {
			victim, u := fsVictim(t, kind)
			spec := rawSpec("attack", u, victim.Path, map[string]any{"fsType": kind})
			a.try(t, expect{code: 3, errCode: "uuid_in_use", names: []string{"uuid: " + u, victim.Path}, victims: []string{victim.Path}}, "prepare", spec)
		})
		t.Run("raw prepare of a blank device with a "+kind+"'s uuid", func(t *testing.T) {
			victim, u := fsVictim(t, kind)
			blank := a.device(t, 32<<20, nil)
			spec := rawSpec("attack", u, blank.Path, nil)
			a.try(t, expect{code: 3, errCode: "uuid_in_use", names: []string{"uuid: " + u, victim.Path}, victims: []string{victim.Path, blank.Path}}, "prepare", spec)
		})
		t.Run("sparse prepare with a "+kind+"'s uuid, its link in place", func(t *testing.T) {
			victim, u := fsVictim(t, kind)
			link := "/dev/disk/by-uuid/" + u
			require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
			require.NoError(t, os.Symlink("../../"+victim.Name, link))
			spec := sparseSpec("attack", u, "32Mi", nil)
			a.try(t, expect{code: 3, errCode: "uuid_in_use", names: []string{"uuid: " + u, victim.Path},
				victims: []string{victim.Path, link, filepath.Join(a.dir, "sparse", u)}}, "prepare", spec)
			// and an unprepare of that uuid leaves the host's link alone
			a.try(t, expect{code: 0, names: []string{"nothing was touched"}, victims: []string{victim.Path, link}}, "unprepare", spec)
		})
	}
	t.Run("Block volumes: a partition GUID of someone's disk", func(t *testing.T) {
		u := uuid.NewString()
		a.uuids = append(a.uuids, u)
		disk := a.device(t, 32<<20, tool("sgdisk", "-n", "1:2048:+8M", "-u", "1:"+u))
		blank := a.device(t, 32<<20, nil)
		for _, spec := range []map[string]any{
			sparseSpec("attack", u, "32Mi", map[string]any{"mode": "Block"}),
			rawSpec("attack", u, blank.Path, map[string]any{"mode": "Block"}),
		} {
			a.try(t, expect{code: 3, errCode: "uuid_in_use", names: []string{"uuid: " + u, disk.Path, "partition GUID"}, victims: []string{disk.Path, blank.Path}}, "prepare", spec)
		}
		a.try(t, expect{code: 0, names: []string{"nothing was touched"}, victims: []string{disk.Path, blank.Path}},
			"unprepare", rawSpec("attack", u, disk.Path, map[string]any{"mode": "Block"}), "--wipe")
	})
	t.Run("info of a foreign uuid changes nothing", func(t *testing.T) {
		victim, u := fsVictim(t, "ext4")
		a.try(t, expect{code: 0, names: []string{`"state":"orphan"`}, victims: []string{victim.Path}}, "info", rawSpec("attack", u, victim.Path, nil))
	})
}

// Finding 2: mkfsOptions is an allow-list.
func (a *arena) mkfsOptionCases(t *testing.T) {
	for _, tc := range []struct {
		fs    string
		opts  []string
		field string
	}{
		{"ext4", []string{"-d", "../../../../etc/ssh"}, "mkfsOptions[0]"},
		{"ext4", []string{"-d/etc/ssh"}, "mkfsOptions[0]"},
		{"ext4", []string{"-n"}, "mkfsOptions[0]"},
		{"ext4", []string{"-E", "offset=4096"}, "mkfsOptions[1]"},
		{"ext4", []string{"-E", "lazy_itable_init=1,offset=4096"}, "mkfsOptions[1]"},
		{"ext4", []string{"-J", "device=/dev/vda"}, "mkfsOptions[1]"},
		{"ext4", []string{"-J", "location=1"}, "mkfsOptions[1]"},
		{"ext4", []string{"-F"}, "mkfsOptions[0]"},
		{"ext4", []string{"-S"}, "mkfsOptions[0]"},
		{"ext4", []string{"-U", "clear"}, "mkfsOptions[0]"},
		{"ext4", []string{"-O", "journal_dev"}, "mkfsOptions[1]"},
		{"ext4", []string{"-l", "/etc/passwd"}, "mkfsOptions[0]"},
		{"ext4", []string{"-z", "/tmp/undo"}, "mkfsOptions[0]"},
		{"ext4", []string{"-t", "ext2"}, "mkfsOptions[0]"},
		{"ext4", []string{"-m", "0", "4096"}, "mkfsOptions[2]"},
		{"ext4", []string{"-E", "root_owner=0:0,hash_seed=" + uuid.NewString()}, "mkfsOptions[1]"},
		{"xfs", []string{"-d", "file,name=/etc/shadow"}, "mkfsOptions[1]"},
		{"xfs", []string{"-f"}, "mkfsOptions[0]"},
		{"xfs", []string{"-N"}, "mkfsOptions[0]"},
		{"xfs", []string{"-p", "/etc/proto"}, "mkfsOptions[0]"},
		{"xfs", []string{"-r", "rtdev=/dev/vda"}, "mkfsOptions[0]"},
		{"xfs", []string{"-l", "logdev=/dev/vda"}, "mkfsOptions[1]"},
		{"xfs", []string{"-m", "uuid=" + uuid.NewString()}, "mkfsOptions[1]"},
		{"xfs", []string{"-c", "options=/etc/xfs.conf"}, "mkfsOptions[0]"},
	} {
		t.Run(tc.fs+" "+strings.Join(tc.opts, " "), func(t *testing.T) {
			u := a.newUUID()
			spec := sparseSpec("opts", u, "320Mi", map[string]any{"fsType": tc.fs, "mkfsOptions": tc.opts})
			a.try(t, expect{code: 2, errCode: "invalid_spec", names: []string{tc.field},
				victims: []string{filepath.Join(a.dir, "sparse", u), filepath.Join(a.dir, "volumes", u+".json"), "/etc/ssh"}}, "prepare", spec)
		})
	}
	t.Run("raw device with -d", func(t *testing.T) {
		d := a.device(t, 32<<20, nil)
		spec := rawSpec("opts", a.newUUID(), d.Path, map[string]any{"mkfsOptions": []string{"-d", "/etc"}})
		a.try(t, expect{code: 2, errCode: "invalid_spec", names: []string{"mkfsOptions[0]"}, victims: []string{d.Path}}, "prepare", spec)
	})
	t.Run("allowed options still make the volume", func(t *testing.T) {
		u := a.newUUID()
		spec := sparseSpec("tuned", u, "32Mi", map[string]any{"mkfsOptions": []string{"-m", "0", "-L", "tuned", "-E", "lazy_itable_init=1"}})
		a.try(t, expect{code: 0, names: []string{`"state":"prepared"`}, victims: []string{a.bystander}}, "prepare", spec)
		assert.Equal(t, "tuned", blkid(t, "/dev/disk/by-uuid/"+u)["LABEL"])
		a.ok("unprepare", spec)
	})
}

// zeroAt overwrites n bytes at off of a device, as damage would.
func zeroAt(t *testing.T, dev string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(make([]byte, n), off)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
}

// Finding 3: a volume we formatted is never formatted again.
func (a *arena) damagedCases(t *testing.T) {
	type damage struct {
		name  string
		spec  func() map[string]any
		wreck func(t *testing.T, dev string, size int64)
		hint  string
	}
	superblock := func(off int64, n int) func(*testing.T, string, int64) {
		return func(t *testing.T, dev string, _ int64) { zeroAt(t, dev, off, n) }
	}
	bothGPTs := func(t *testing.T, dev string, size int64) {
		zeroAt(t, dev, 512, 512)
		zeroAt(t, dev, size-512, 512)
	}
	raw := a.device(t, 32<<20, nil)
	rawBlk := a.device(t, 32<<20, nil)
	for _, d := range []damage{
		{"sparse ext4", func() map[string]any { return sparseSpec("dmg", a.newUUID(), "32Mi", nil) }, superblock(1024, 1024), "e2fsck -b 32768"},
		{"sparse xfs", func() map[string]any {
			return sparseSpec("dmg", a.newUUID(), "300Mi", map[string]any{"fsType": "xfs"})
		}, superblock(0, 512), "xfs_repair"},
		{"sparse Block", func() map[string]any {
			return sparseSpec("dmg", a.newUUID(), "32Mi", map[string]any{"mode": "Block"})
		}, bothGPTs, "gdisk"},
		{"raw ext4", func() map[string]any { return rawSpec("dmg", a.newUUID(), raw.Path, nil) }, superblock(1024, 1024), "e2fsck -b 32768"},
		{"raw Block", func() map[string]any {
			return rawSpec("dmg", a.newUUID(), rawBlk.Path, map[string]any{"mode": "Block"})
		}, bothGPTs, "gdisk"},
	} {
		t.Run(d.name, func(t *testing.T) {
			spec := d.spec()
			r := a.ok("prepare", spec)
			dev, file := r.str("devicePath"), r.str("backingFile")
			whole := dev
			if spec["mode"] == "Block" {
				whole = strings.TrimSuffix(dev, "p1")
			}
			size := int64(32 << 20)
			if spec["fsType"] == "xfs" {
				size = 300 << 20
			}
			d.wreck(t, whole, size)
			victim := whole
			if file != "" {
				victim = file
			}
			a.try(t, expect{code: 3, errCode: "damaged", names: []string{d.hint, "not writing it again"}, victims: []string{victim}}, "prepare", spec)
			a.try(t, expect{code: 0, names: []string{`"state":"damaged"`, d.hint}, victims: []string{victim}}, "info", spec)
			if file != "" {
				// restore reports it and attaches nothing over it
				a.try(t, expect{code: 1, names: []string{`"state":"damaged"`}, victims: []string{victim}}, "restore", nil)
			}
			a.ok("unprepare", spec)
		})
	}
}

// Finding 5: no new volume on, in or around an existing volume's device.
func (a *arena) claimCases(t *testing.T) {
	sparseBlk := sparseSpec("held-blk", a.newUUID(), "32Mi", map[string]any{"mode": "Block"})
	sb := a.ok("prepare", sparseBlk)
	sparseFS := sparseSpec("held-fs", a.newUUID(), "32Mi", nil)
	sf := a.ok("prepare", sparseFS)
	disk := a.device(t, 32<<20, nil)
	rawBlk := rawSpec("held-raw", a.newUUID(), disk.Path, map[string]any{"mode": "Block"})
	rb := a.ok("prepare", rawBlk)
	pdisk := a.device(t, 64<<20, tool("sgdisk", "-n", "1:2048:+16M", "-n", "2:0:+16M"))
	parts := addPartitions(t, pdisk, [2]int64{2048 * 512, 16 << 20}, [2]int64{2048*512 + 16<<20, 16 << 20})
	rawPart := rawSpec("held-part", a.newUUID(), parts[0], nil)
	a.ok("prepare", rawPart)
	// Someone attaches a second loop device to our sparse file, and one on
	// top of our raw disk.
	extra, err := loopdev.Attach(context.Background(), sf.str("backingFile"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = loopdev.Detach(context.Background(), extra, 5*time.Second) })
	stacked, err := loopdev.Attach(context.Background(), disk.Path)
	require.NoError(t, err)

	for _, tc := range []struct{ name, path, volume string }{
		{"the partition of a sparse Block volume", sb.str("devicePath"), "held-blk"},
		{"the loop device of a sparse Block volume", strings.TrimSuffix(sb.str("devicePath"), "p1"), "held-blk"},
		{"the loop device of a sparse ext4 volume", sf.str("devicePath"), "held-fs"},
		{"a second loop device on a sparse volume's file", extra.Path, "held-fs"},
		{"the partition of a raw Block volume", rb.str("devicePath"), "held-raw"},
		{"a loop device stacked on a raw volume's disk", stacked.Path, "held-raw"},
		{"the disk holding a raw partition volume", pdisk.Path, "held-part"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"Filesystem", "Block"} {
				spec := rawSpec("claim", a.newUUID(), tc.path, map[string]any{"mode": mode})
				a.try(t, expect{code: 3, errCode: "device_conflict", names: []string{tc.path, tc.volume},
					victims: []string{tc.path, disk.Path, pdisk.Path, sb.str("backingFile"), sf.str("backingFile")}}, "prepare", spec)
			}
		})
	}
	require.NoError(t, loopdev.Detach(context.Background(), stacked, 5*time.Second))
	require.NoError(t, loopdev.Detach(context.Background(), extra, 5*time.Second))
	for _, s := range []map[string]any{sparseBlk, sparseFS, rawBlk, rawPart} {
		a.ok("unprepare", s, "--wipe")
	}
}

const mountAndWait = `mount "$1" "$2" && echo ready && exec sleep 600`

// holdOpen runs script (which prints "ready" once it holds the device) in
// a private mount namespace and keeps it alive until the test ends.
func holdOpen(t *testing.T, script string, args ...string) {
	t.Helper()
	cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "hold"}, args...)...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 6)
	_, err = io.ReadFull(out, buf)
	require.NoError(t, err, "the holder did not start")
}

// Finding 6: in use means in use anywhere.
func (a *arena) inUseCases(t *testing.T) {
	t.Run("a blank device that backs another loop device", func(t *testing.T) {
		d := a.device(t, 32<<20, nil)
		l, err := loopdev.Attach(context.Background(), d.Path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = loopdev.Detach(context.Background(), l, 5*time.Second) })
		for _, mode := range []string{"Filesystem", "Block"} {
			spec := rawSpec("busy", a.newUUID(), d.Path, map[string]any{"mode": mode})
			a.try(t, expect{code: 3, errCode: "in_use", names: []string{d.Path, l.Name}, victims: []string{d.Path}}, "prepare", spec)
		}
	})
	t.Run("a blank device opened exclusively by another program", func(t *testing.T) {
		d := a.device(t, 32<<20, nil)
		holdOpen(t, `exec python3 -c 'import os,sys,time; os.open(sys.argv[1], os.O_RDONLY|os.O_EXCL); print("ready", flush=True); time.sleep(600)' "$1"`, d.Path)
		spec := rawSpec("busy", a.newUUID(), d.Path, nil)
		a.try(t, expect{code: 3, errCode: "in_use", names: []string{d.Path, "exclusively"}, victims: []string{d.Path}}, "prepare", spec)
	})
	t.Run("a sparse volume mounted in another mount namespace", func(t *testing.T) {
		spec := sparseSpec("nsmount", a.newUUID(), "32Mi", nil)
		r := a.ok("prepare", spec)
		mp := t.TempDir()
		holdOpen(t, mountAndWait, r.str("devicePath"), mp)
		a.try(t, expect{code: 3, errCode: "in_use", names: []string{r.str("devicePath"), "exclusively"},
			victims: []string{r.str("backingFile"), r.str("persistentPath")}}, "unprepare", spec)
		assert.Equal(t, "prepared", a.ok("info", spec).str("state"), "still attached and linked")
	})
	t.Run("a raw volume mounted in another mount namespace", func(t *testing.T) {
		d := a.device(t, 32<<20, nil)
		spec := rawSpec("nsraw", a.newUUID(), d.Path, nil)
		a.ok("prepare", spec)
		mp := t.TempDir()
		holdOpen(t, mountAndWait, d.Path, mp)
		a.try(t, expect{code: 3, errCode: "in_use", names: []string{d.Name, "exclusively"}, victims: []string{d.Path}}, "unprepare", spec, "--wipe")
	})
	t.Run("a sparse volume that backs another loop device", func(t *testing.T) {
		spec := sparseSpec("stacked", a.newUUID(), "32Mi", nil)
		r := a.ok("prepare", spec)
		l, err := loopdev.Attach(context.Background(), r.str("devicePath"))
		require.NoError(t, err)
		a.try(t, expect{code: 3, errCode: "in_use", names: []string{r.str("deviceName"), l.Name}, victims: []string{r.str("backingFile"), r.str("persistentPath")}}, "unprepare", spec)
		require.NoError(t, loopdev.Detach(context.Background(), l, 5*time.Second))
		a.ok("unprepare", spec)
	})
}

// Finding 7: the state dir is checked, not trusted.
func (a *arena) stateDirCases(t *testing.T) {
	victimFile := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "precious")
		require.NoError(t, os.WriteFile(p, []byte("someone's data\n"), 0o600))
		require.NoError(t, os.Truncate(p, 32<<20))
		return p
	}
	require.NoError(t, os.MkdirAll(filepath.Join(a.dir, "sparse"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(a.dir, "volumes"), 0o700))
	t.Run("a symlink planted at sparse/<uuid>", func(t *testing.T) {
		u, victim := a.newUUID(), victimFile(t)
		require.NoError(t, os.Symlink(victim, filepath.Join(a.dir, "sparse", u)))
		a.try(t, expect{code: 3, errCode: "orphan", names: []string{"sparse/" + u}, victims: []string{victim}}, "prepare", sparseSpec("planted", u, "32Mi", nil))
	})
	t.Run("a symlink planted under a record of ours", func(t *testing.T) {
		u, victim := a.newUUID(), victimFile(t)
		spec := sparseSpec("planted2", u, "32Mi", nil)
		plantRecord(t, a.dir, u, spec)
		require.NoError(t, os.Symlink(victim, filepath.Join(a.dir, "sparse", u)))
		a.try(t, expect{code: 3, errCode: "sparse_file", names: []string{"symlink"}, victims: []string{victim}}, "prepare", spec)
		a.try(t, expect{code: 3, errCode: "sparse_file", names: []string{"symlink"}, victims: []string{victim}}, "unprepare", spec)
		require.NoError(t, os.Remove(filepath.Join(a.dir, "volumes", u+".json")))
	})
	t.Run("a hard link planted under a record of ours", func(t *testing.T) {
		u, victim := a.newUUID(), victimFile(t)
		spec := sparseSpec("planted3", u, "32Mi", nil)
		plantRecord(t, a.dir, u, spec)
		require.NoError(t, os.Link(victim, filepath.Join(a.dir, "sparse", u)))
		a.try(t, expect{code: 3, errCode: "sparse_file", names: []string{"hard links"}, victims: []string{victim}}, "prepare", spec)
		require.NoError(t, os.Remove(filepath.Join(a.dir, "volumes", u+".json")))
		require.NoError(t, os.Remove(filepath.Join(a.dir, "sparse", u)))
	})
	t.Run("a record whose uuid climbs out of the state dir", func(t *testing.T) {
		u := a.newUUID()
		escape := filepath.Join(a.dir, "..", "escaped")
		spec := sparseSpec("climb", u, "32Mi", nil)
		spec["uuid"] = "../../escaped"
		plantRecord(t, a.dir, u, spec)
		a.try(t, expect{code: 1, names: []string{"not valid", "uuid"}, victims: []string{escape, filepath.Dir(escape) + "/escaped.json"}}, "restore", nil)
		require.NoError(t, os.Remove(filepath.Join(a.dir, "volumes", u+".json")))
	})
	t.Run("a record filed under another volume's uuid", func(t *testing.T) {
		u := a.newUUID()
		plantRecord(t, a.dir, u, sparseSpec("swapped", a.newUUID(), "32Mi", nil))
		a.try(t, expect{code: 1, names: []string{"not valid", u}, victims: []string{filepath.Join(a.dir, "sparse")}}, "restore", nil)
		require.NoError(t, os.Remove(filepath.Join(a.dir, "volumes", u+".json")))
	})
	t.Run("the sparse dir replaced by a symlink", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		require.NoError(t, os.MkdirAll(dir, 0o700))
		elsewhere := t.TempDir()
		require.NoError(t, os.Symlink(elsewhere, filepath.Join(dir, "sparse")))
		spec := sparseSpec("redirect", a.newUUID(), "32Mi", nil)
		b, _ := json.Marshal(spec)
		cmd := exec.Command(binary, "--state-dir", dir, "prepare", "--spec", "-")
		cmd.Stdin = strings.NewReader(string(b))
		before := hashPath(t, elsewhere)
		out, _ := cmd.Output()
		var res struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(out, &res)
		clear := assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out) &&
			assert.Contains(t, res.Error.Message, filepath.Join(dir, "sparse"))
		a.mu.Lock()
		a.cases++
		if clear {
			a.clear++
		}
		if hashPath(t, elsewhere) != before {
			a.changedBytes++
		}
		a.mu.Unlock()
	})
}

// plantRecord writes a state record by hand, as an attacker with write
// access to the state dir (or a corrupted disk) would.
func plantRecord(t *testing.T, dir, u string, spec map[string]any) {
	t.Helper()
	rec := map[string]any{"version": 1, "spec": spec, "sizeBytes": 32 << 20, "phase": "preparing"}
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "volumes"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "volumes", u+".json"), b, 0o600))
}

// Finding 8: the spec is read strictly.
func (a *arena) jsonCases(t *testing.T) {
	u := a.newUUID()
	for _, tc := range []struct{ name, js, field string }{
		{"size given twice", `{"name":"j","uuid":"` + u + `","sparseLoopDevice":{"size":"10Mi","size":"1Ti"}}`, "sparseLoopDevice.size"},
		{"name given twice", `{"name":"j","name":"k","uuid":"` + u + `","sparseLoopDevice":{"size":"10Mi"}}`, "name"},
		{"uuid given twice", `{"name":"j","uuid":"` + u + `","uuid":"` + uuid.NewString() + `","sparseLoopDevice":{"size":"10Mi"}}`, "uuid"},
		{"devicePath given twice", `{"name":"j","uuid":"` + u + `","rawBlockDevice":{"devicePath":"/dev/null","devicePath":"/dev/vda"}}`, "rawBlockDevice.devicePath"},
		{"size with spaces", `{"name":"j","uuid":"` + u + `","sparseLoopDevice":{"size":" 10Mi"}}`, "sparseLoopDevice.size"},
		{"size with a trailing newline", `{"name":"j","uuid":"` + u + `","sparseLoopDevice":{"size":"10Mi\n"}}`, "sparseLoopDevice.size"},
		{"field in the wrong case", `{"name":"j","uuid":"` + u + `","fstype":"xfs","sparseLoopDevice":{"size":"10Mi"}}`, "fstype"},
		{"two documents", `{"name":"j","uuid":"` + u + `","sparseLoopDevice":{"size":"10Mi"}} {}`, "trailing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.try(t, expect{code: 2, errCode: "invalid_spec", names: []string{tc.field},
				victims: []string{filepath.Join(a.dir, "sparse", u), filepath.Join(a.dir, "volumes", u+".json")}}, "prepare", tc.js)
		})
	}
}
