package booted

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/luks"
	"github.com/salt-volumes/salt-volumes/test/guest"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
)

// guestState is salt-volume-exec's state dir on the guests (the default).
const guestState = "/var/lib/salt-volumes"

// encrypted is what the test keeps of an encrypted volume to check it
// again after the reboot and after its deletion.
type encrypted struct {
	uuid string
	key  []byte
}

// checkEncrypted: a volume with encryption keyfile, prepared through serve,
// is a LUKS2 container on its loop device opened as sv-<uuid>: the opened
// device is the one that shows the volume's UUID (its filesystem's), the
// container shows a UUID of its own, the key is a root-only 32-byte file,
// and what was written through the volume is not in its backing file.
func checkEncrypted(t *testing.T, g *guest.Guest, run func(...string) string, uuid, dev, written string) *encrypted {
	t.Helper()
	file := filepath.Join(guestState, "sparse", uuid)
	loop := run("losetup", "-n", "-O", "NAME", "-j", file)
	require.Regexp(t, `^/dev/loop\d+$`, loop, "the container's loop device")
	assert.Regexp(t, `^/dev/dm-\d+$`, dev, "the volume's device is the opened container")
	assert.Equal(t, "crypto_LUKS", run("blkid", "-o", "value", "-s", "TYPE", loop))
	assert.Equal(t, luks.ContainerUUID(uuid), run("blkid", "-o", "value", "-s", "UUID", loop), "the container's UUID is derived, not the volume's")
	status := run("cryptsetup", "status", luks.MapperName(uuid))
	assert.Regexp(t, `(?m)^\s*type:\s+LUKS2$`, status)
	assert.Regexp(t, `(?m)^\s*device:\s+`+regexp.QuoteMeta(loop)+`$`, status)
	// udev's links: by-uuid of the volume names the opened device, by-uuid
	// of the container its loop device; no other device shows the
	// volume's UUID.
	run("udevadm", "settle")
	assert.Equal(t, dev, run("readlink", "-f", "/dev/disk/by-uuid/"+uuid))
	assert.Equal(t, loop, run("readlink", "-f", "/dev/disk/by-uuid/"+luks.ContainerUUID(uuid)))
	shown := 0
	for _, l := range strings.Split(run("lsblk", "-rno", "NAME,UUID"), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] == uuid {
			shown++
		}
	}
	assert.Equal(t, 1, shown, "one device shows the volume's UUID")
	key := filepath.Join(guestState, "keys", uuid+".key")
	assert.Equal(t, "400 root 32", run("stat", "-c", "%a %U %s", key), "the key: root-only, 256 bits")
	assert.Equal(t, "700 root", run("stat", "-c", "%a %U", filepath.Dir(key)))
	k, err := base64.StdEncoding.DecodeString(run("base64", "-w0", key))
	require.NoError(t, err)
	// Ciphertext on the disk: the file written through the volume is not
	// in its backing file.
	assert.False(t, inFile(t, g, written, file), "the plaintext is not in the backing file")
	return &encrypted{uuid: uuid, key: k}
}

// checkEncryptedBlock: an encrypted Block volume is its opened container,
// /dev/mapper/sv-<uuid>, over a LUKS2 header on the loop device, and what
// was written to it is ciphertext in the backing file.
func checkEncryptedBlock(t *testing.T, g *guest.Guest, run func(...string) string, uuid, dev, written string) {
	t.Helper()
	file := filepath.Join(guestState, "sparse", uuid)
	loop := run("losetup", "-n", "-O", "NAME", "-j", file)
	assert.Regexp(t, `^/dev/dm-\d+$`, dev)
	assert.Equal(t, dev, run("readlink", "-f", "/dev/mapper/"+luks.MapperName(uuid)))
	assert.Equal(t, luks.ContainerUUID(uuid), run("blkid", "-o", "value", "-s", "UUID", loop))
	assert.Equal(t, strconv.Itoa(8<<20), run("blockdev", "--getsize64", dev), "24Mi less the 16Mi header")
	assert.False(t, inFile(t, g, written, file), "the plaintext is not in the backing file")
}

// lockedAndOpened: the container of an encrypted volume closed behind the
// control plane's back (what a boot without its key leaves) makes the
// volume Locked in serve, with the reason and what to run, counted in the
// metrics; the command it names opens it, and the volume is Available
// again with its data and no state run of the control plane's.
func lockedAndOpened(t *testing.T, s *saltstack.Stack, p *serveproc.Plane, run func(...string) string, name, uuid, link, job, written string) {
	t.Helper()
	ctx := context.Background()
	phase := func(want string) func() (bool, string) {
		return func() (bool, string) {
			view, err := p.Client().Get(ctx, name)
			require.NoError(t, err)
			return view.Status.Phase.String() == want, view.Status.Phase.String() + " " + view.Status.Reason + " " + view.Status.Message
		}
	}
	assert.Equal(t, 0.0, p.Metric(`salt_volumes_volumes{phase="Locked"}`))
	closed := time.Now()
	run("cryptsetup", "close", luks.MapperName(uuid))
	eventually(t, 3*time.Minute, name+" Locked once its container is closed", phase("Locked"))
	t.Logf("%s Locked in serve %s after its container was closed (the beacon's report, confirmed by a status job)", name, time.Since(closed).Round(time.Second))
	view, err := p.Client().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, "ContainerClosed", view.Status.Reason)
	assert.Contains(t, view.Status.Message, "salt_volumes.restore", "the message names what opens it")
	assert.Equal(t, 1.0, p.Metric(`salt_volumes_volumes{phase="Locked"}`))
	assert.Equal(t, 0.0, p.Metric(`salt_volumes_volume_healthy{volume="`+name+`",node="`+view.Spec.Node+`"}`))

	out, code := s.Salt("--timeout=600", view.Spec.Node, "salt_volumes.restore", "--out=json")
	require.Equal(t, 0, code, out)
	eventually(t, 3*time.Minute, name+" Available once opened", phase("Available"))
	view, err = p.Client().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, job, view.Status.JobID, "no state run of the control plane's")
	assert.Equal(t, 0.0, p.Metric(`salt_volumes_volumes{phase="Locked"}`))
	run("udevadm", "settle")
	run("mount", link, "/mnt/v")
	assert.Equal(t, written, run("cat", "/mnt/v/kept"), "the data, opened again")
	run("umount", "/mnt/v")
}

// masterVolume is the volume whose key the master keeps (provider master).
const masterVolume = "boot-vault"

// masterKeyInPillar puts a fresh key for masterVolume in the master's
// pillar for guest-1 only, as an operator would (here in clear; the docs
// show the gpg renderer), and has the minion read it.
func masterKeyInPillar(t *testing.T, s *saltstack.Stack) []byte {
	t.Helper()
	k, err := luks.NewKey()
	require.NoError(t, err)
	dir := filepath.Join(s.Root, "pillar")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "top.sls"), []byte("base:\n  '"+guestID+"':\n    - volume_keys\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "volume_key"), []byte(base64.StdEncoding.EncodeToString(k)), 0o600))
	writeKeysPillar(t, s, masterKeyLine(t, s))
	return k
}

// masterKeyLine is the pillar's salt_volumes:keys entry of masterVolume.
func masterKeyLine(t *testing.T, s *saltstack.Stack) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Root, "pillar", "volume_key"))
	require.NoError(t, err)
	return "  keys:\n    " + masterVolume + ": " + string(b) + "\n"
}

// writeKeysPillar writes guest-1's salt_volumes pillar and has its minion
// read it again.
func writeKeysPillar(t *testing.T, s *saltstack.Stack, body string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, "pillar", "volume_keys.sls"), []byte("salt_volumes:\n"+body), 0o600))
	out, code := s.Salt("--timeout=600", guestID, "saltutil.refresh_pillar", "wait=True", "--out=json")
	require.Equal(t, 0, code, out)
}

// masterOpenedAfterBoot: after a reboot the volume whose key the master
// keeps was left attached and closed by the boot's restore (no Salt, no
// key on the node) and counted locked, not failed; the node's beacon then
// opened it with the key from its minion's pillar, with no state run of
// serve's (the caller checks it Available with its data).
func masterOpenedAfterBoot(t *testing.T, s *saltstack.Stack, p *serveproc.Plane, run func(...string) string, uuid, bootRestore string, lockedAtBoot int) {
	t.Helper()
	ctx := context.Background()
	assert.Equal(t, 1, lockedAtBoot, "the boot's restore counts the master-key volume locked")
	run("test", "!", "-e", filepath.Join(guestState, "keys", uuid+".key"))
	eventually(t, 3*time.Minute, masterVolume+" opened by the node's beacon after the reboot", func() (bool, string) {
		view, err := p.Client().Get(ctx, masterVolume)
		require.NoError(t, err)
		return view.Status.Phase.String() == "Available", view.Status.Phase.String() + " " + view.Status.Reason + " " + view.Status.Message
	})
	var rep struct {
		Restore struct {
			ID       string `json:"id"`
			Locked   int    `json:"locked"`
			Restored int    `json:"restored"`
			Earlier  []struct {
				ID string `json:"id"`
			} `json:"earlier"`
			Volumes []struct {
				Name  string `json:"name"`
				State string `json:"state"`
			} `json:"volumes"`
		} `json:"restore"`
	}
	out := run("salt-volume-exec", "last-restore")
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.NotEqual(t, bootRestore, rep.Restore.ID, "a restore after the boot's (the beacon's salt_volumes.restore)")
	assert.Equal(t, 0, rep.Restore.Locked, out)
	assert.Equal(t, 1, rep.Restore.Restored, "the beacon's run rebuilt only the master-key volume: %s", out)
	var earlier []string
	for _, r := range rep.Restore.Earlier {
		earlier = append(earlier, r.ID)
	}
	assert.Contains(t, earlier, bootRestore, "the boot's run is kept for serve with the beacon's")
	for _, v := range rep.Restore.Volumes {
		if v.Name == masterVolume {
			assert.Equal(t, "prepared", v.State, "opened by it")
		}
	}
}

// masterHeldThenOpened: with pillar salt_volumes:open_locked false the
// beacon leaves a locked master-key volume closed, and serve shows it
// Locked, until salt_volumes.restore is run by hand.
func masterHeldThenOpened(t *testing.T, s *saltstack.Stack, p *serveproc.Plane, run func(...string) string, uuid string) {
	t.Helper()
	ctx := context.Background()
	writeKeysPillar(t, s, masterKeyLine(t, s)+"  open_locked: false\n")
	run("cryptsetup", "close", luks.MapperName(uuid))
	phase := func() string {
		view, err := p.Client().Get(ctx, masterVolume)
		require.NoError(t, err)
		return view.Status.Phase.String()
	}
	eventually(t, 3*time.Minute, masterVolume+" Locked once closed", func() (bool, string) { return phase() == "Locked", phase() })
	view, err := p.Client().Get(ctx, masterVolume)
	require.NoError(t, err)
	assert.Contains(t, view.Status.Message, "its key is the master's")
	// Three beacon intervals and more: held.
	time.Sleep(4 * beaconInterval)
	assert.Equal(t, "Locked", phase(), "open_locked: false holds it")
	out, code := s.Salt("--timeout=600", guestID, "salt_volumes.restore", "--out=json")
	require.Equal(t, 0, code, out)
	eventually(t, 3*time.Minute, masterVolume+" Available once opened by hand", func() (bool, string) { return phase() == "Available", phase() })
	writeKeysPillar(t, s, masterKeyLine(t, s))
}

// noMasterKeyOnTheNode greps what the guest keeps (its state dir, Salt's
// cache and config, its logs) for the master-held key in text forms.
func noMasterKeyOnTheNode(t *testing.T, g *guest.Guest, key []byte) {
	t.Helper()
	for _, f := range keyForms(key)[1:] {
		// grep says 1 for "not found" only; 2 (a path missing, a read
		// error) is not an answer.
		out, err := g.Run("grep", "-rlF", "-e", string(f), guestState, "/var/cache/salt", "/etc/salt", "/var/log")
		require.Error(t, err, "grep finds a form of the master-held key on the node: %s", out)
		assert.Contains(t, err.Error(), "exit status 1", "grep read everything and found nothing")
		assert.Empty(t, strings.TrimSpace(out))
	}
}

// holdUnit is the transient unit that keeps an encrypted volume's file
// open across its deletion.
const holdUnit = "sv-enc-hold"

// keptForErase holds the container's file and its key file open (a
// process of its own) and copies the key where the deletion does not
// reach: what someone holding the disk's blocks and a leaked copy of the
// key would have after the volume is deleted. It returns the paths that
// read the file and the key file once they are deleted (/proc/PID/fd/N).
func keptForErase(t *testing.T, g *guest.Guest, run func(...string) string, e *encrypted) (heldFile, heldKey string) {
	t.Helper()
	file := filepath.Join(guestState, "sparse", e.uuid)
	key := filepath.Join(guestState, "keys", e.uuid+".key")
	run("systemd-run", "--unit="+holdUnit, "--collect", "python3", "-c",
		"import sys, time; f = [open(p, 'rb') for p in sys.argv[1:]]; time.sleep(7200)", file, key)
	t.Cleanup(func() { _, _ = g.Run("systemctl", "stop", holdUnit) })
	run("cp", key, "/root/enc-key")
	eventually(t, time.Minute, "the holder has both files open", func() (bool, string) {
		pid := run("systemctl", "show", "-p", "MainPID", "--value", holdUnit)
		fds, _ := g.Run("ls", "/proc/"+pid+"/fd")
		for _, fd := range strings.Fields(fds) {
			switch to, _ := g.Run("readlink", "/proc/"+pid+"/fd/"+fd); strings.TrimSpace(to) {
			case file:
				heldFile = "/proc/" + pid + "/fd/" + fd
			case key:
				heldKey = "/proc/" + pid + "/fd/" + fd
			}
		}
		return heldFile != "" && heldKey != "", pid + ": " + fds
	})
	out, err := g.Run("cryptsetup", "open", "--test-passphrase", "--key-file", "/root/enc-key", heldFile)
	require.NoError(t, err, "before the deletion the key opens the container: %s", out)
	return heldFile, heldKey
}

// checkErased: deleted with --wipe, the container's header holds no
// keyslot (read back from the deleted file, still held open), the key
// opens nothing, and the key file and the opened device are gone.
func checkErased(t *testing.T, g *guest.Guest, e *encrypted, held, heldKey string) {
	t.Helper()
	// The key file's blocks: zeros written in place before it went.
	k, err := g.Run("base64", "-w0", heldKey)
	require.NoError(t, err)
	assert.Equal(t, base64.StdEncoding.EncodeToString(make([]byte, luks.KeyBytes)), strings.TrimSpace(k), "the deleted key file's bytes are zeros")
	to, _ := g.Run("readlink", held)
	assert.Contains(t, to, "(deleted)", "the file itself is gone")
	out, err := g.Run("cryptsetup", "luksDump", "--dump-json-metadata", held)
	require.NoError(t, err, out)
	assert.Regexp(t, `"keyslots":\s*\{\s*\}`, out, "no keyslot left in the header")
	out, err = g.Run("cryptsetup", "open", "--test-passphrase", "--key-file", "/root/enc-key", held)
	assert.Error(t, err, "the old key opens nothing: %s", out)
	_, err = g.Run("test", "-e", filepath.Join(guestState, "keys", e.uuid+".key"))
	assert.Error(t, err, "the key file is gone")
	_, err = g.Run("test", "-e", "/dev/mapper/"+luks.MapperName(e.uuid))
	assert.Error(t, err, "the container is closed")
	_, _ = g.Run("systemctl", "stop", holdUnit)
	_, _ = g.Run("rm", "-f", "/root/enc-key")
}

// inFile tells whether text is in file on the guest: grep's exit status
// 0 (found) or 1 (not found); anything else fails the test.
func inFile(t *testing.T, g *guest.Guest, text, file string) bool {
	t.Helper()
	_, err := g.Run("grep", "-q", "-F", text, file)
	if err == nil {
		return true
	}
	require.Contains(t, err.Error(), "exit status 1", "grep %s", file)
	return false
}

// keyForms are the ways a key could show up in a text: as bytes, hex or
// base64.
func keyForms(k []byte) [][]byte {
	return [][]byte{k, []byte(hex.EncodeToString(k)), []byte(strings.ToUpper(hex.EncodeToString(k))),
		[]byte(base64.StdEncoding.EncodeToString(k)), []byte(base64.RawStdEncoding.EncodeToString(k))}
}

// assertNoKey fails if any form of key is in text (named what).
func assertNoKey(t *testing.T, what string, text []byte, key []byte) {
	t.Helper()
	for _, f := range keyForms(key) {
		if strings.Contains(string(text), string(f)) {
			t.Errorf("the key of an encrypted volume is in %s", what)
			return
		}
	}
}

// assertNoKeyUnder reads every file under dir (the master's job cache,
// logs and event cache) for the key.
func assertNoKeyUnder(t *testing.T, dir string, key []byte) int {
	t.Helper()
	return assertNoKeyUnderExcept(t, dir, key, func(string) bool { return false })
}

// assertNoKeyUnderExcept is assertNoKeyUnder but for the files skip
// names, which it logs when they hold the key (where the master keeps it).
func assertNoKeyUnderExcept(t *testing.T, dir string, key []byte, skip func(string) bool) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if skip(p) {
			if b, err := os.ReadFile(p); err == nil {
				for _, f := range keyForms(key) {
					if strings.Contains(string(b), string(f)) {
						t.Logf("the key is in %s (expected there)", p)
						break
					}
				}
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		n++
		assertNoKey(t, p, b, key)
		return nil
	})
	require.NoError(t, err)
	return n
}

// ddSeconds is the time dd reports for its copy ("..., 0.5 s, 67 MB/s").
var ddSeconds = regexp.MustCompile(`copied, ([0-9.]+) s,`)

// seqThroughput writes then reads 32 MiB through the filesystem of the
// volume at link (direct I/O, so the page cache measures nothing) and
// returns the seconds of each, as dd reports them.
func seqThroughput(t *testing.T, g *guest.Guest, link string) (write, read float64) {
	t.Helper()
	secs := func(args ...string) float64 {
		_, errs, err := g.RunInputStderr(nil, args...)
		require.NoError(t, err, errs)
		m := ddSeconds.FindStringSubmatch(errs)
		require.NotNil(t, m, "dd's report: %s", errs)
		f, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		return f
	}
	_, err := g.Run("mount", link, "/mnt/v")
	require.NoError(t, err)
	defer func() { _, _ = g.Run("umount", "/mnt/v") }()
	write = secs("dd", "if=/dev/zero", "of=/mnt/v/bench", "bs=1M", "count=32", "oflag=direct", "conv=fsync")
	read = secs("dd", "if=/mnt/v/bench", "of=/dev/null", "bs=1M", "iflag=direct")
	_, err = g.Run("rm", "/mnt/v/bench")
	require.NoError(t, err)
	return write, read
}

// encryptionRatios measures the encrypted volume against a plain one of
// the same kind on the same guest, in the same run: the ratio of the
// seconds each took (1.0 = no cost). Under software emulation AES runs
// without AES-NI: the ratio is reported, not judged.
func encryptionRatios(t *testing.T, g *guest.Guest, plainLink, encLink string) {
	t.Helper()
	pw, pr := seqThroughput(t, g, plainLink)
	ew, er := seqThroughput(t, g, encLink)
	t.Logf("32 MiB sequential, direct I/O, under TCG: plain write %.3fs read %.3fs; encrypted write %.3fs read %.3fs", pw, pr, ew, er)
	if pw > 0 && pr > 0 {
		fmt.Printf("metric encryption_write_ratio %.2f x\n", ew/pw)
		fmt.Printf("metric encryption_read_ratio %.2f x\n", er/pr)
	}
}

var stepRe = regexp.MustCompile(`"step":"([a-z-]+)"`)

// stepsOf lists the steps a run of salt-volume-exec logged on stderr.
func stepsOf(stderr string) []string {
	var out []string
	for _, m := range stepRe.FindAllStringSubmatch(stderr, -1) {
		out = append(out, m[1])
	}
	return out
}

// encryptedCrashes: salt-volume-exec killed after each step of an
// encrypted volume's prepare, and of its deletion with --wipe, converges
// when run again: the volume prepared with its filesystem inside the
// opened container, then nothing of it left (record, file, key, loop
// device, opened container). And a header of ours that no key opens (a
// luksFormat cut short between its header and its keyslot) is formatted
// again rather than left unopenable.
func encryptedCrashes(t *testing.T, g *guest.Guest, run func(...string) string) {
	t.Helper()
	started := time.Now()
	specOf := func(u string) []byte {
		return []byte(`{"name":"crash-enc","uuid":"` + u + `","sparseLoopDevice":{"size":"24Mi"},"encryption":{"provider":"keyfile"}}`)
	}
	var lastOut string
	exec := func(u string, crashAfter string, args ...string) (string, error) {
		cmd := append([]string{"env", "SALT_VOLUMES_CRASH_AFTER=" + crashAfter, "salt-volume-exec"}, args...)
		out, errs, err := g.RunInputStderr(specOf(u), append(cmd, "--spec", "-")...)
		lastOut = out
		return errs, err
	}
	prepared := func(u string) {
		t.Helper()
		assert.Equal(t, u, run("blkid", "-o", "value", "-s", "UUID", "/dev/mapper/"+luks.MapperName(u)), "the filesystem inside the opened container")
		assert.Equal(t, "crypto_LUKS", run("blkid", "-o", "value", "-s", "TYPE", filepath.Join(guestState, "sparse", u)))
	}
	gone := func(u, after string) {
		t.Helper()
		for _, p := range []string{filepath.Join(guestState, "keys", u+".key"), filepath.Join(guestState, "sparse", u),
			filepath.Join(guestState, "volumes", u+".json"), "/dev/mapper/" + luks.MapperName(u)} {
			_, err := g.Run("test", "-e", p)
			assert.Error(t, err, "%s left after a crash after %s and a rerun", p, after)
		}
	}
	// One clean run of each tells the steps.
	u := uuid.NewString()
	errs, err := exec(u, "", "prepare")
	require.NoError(t, err, errs)
	prepare := stepsOf(errs)
	prepared(u)
	// The guest keeps its state dir, keys and sparse files alike, on its
	// root filesystem: the prepare says what that leaves unprotected.
	assert.Contains(t, lastOut, "is on the same filesystem as its data", "the warning of a key beside its data")
	errs, err = exec(u, "", "unprepare", "--wipe")
	require.NoError(t, err, errs)
	unprepare := stepsOf(errs)
	gone(u, "nothing")
	require.Contains(t, prepare, "luks-formatted")
	require.Contains(t, prepare, "opened")
	require.Contains(t, unprepare, "wiped")
	for i := 0; i < max(len(prepare), len(unprepare)); i++ {
		u := uuid.NewString()
		if i < len(prepare) {
			_, err := exec(u, prepare[i], "prepare")
			require.Error(t, err, "killed after %s", prepare[i])
		}
		errs, err := exec(u, "", "prepare")
		require.NoError(t, err, "prepare again after a crash after %s: %s", prepare[min(i, len(prepare)-1)], errs)
		prepared(u)
		step := "nothing"
		if i < len(unprepare) {
			step = unprepare[i]
			_, err := exec(u, step, "unprepare", "--wipe")
			require.Error(t, err, "killed after %s", step)
		}
		errs, err = exec(u, "", "unprepare", "--wipe")
		require.NoError(t, err, "unprepare again after a crash after %s: %s", step, errs)
		gone(u, step)
	}
	// Deleted (with --wipe) right after a prepare was killed, unfinished.
	for _, step := range prepare[:len(prepare)-1] {
		u := uuid.NewString()
		_, err := exec(u, step, "prepare")
		require.Error(t, err, "killed after %s", step)
		errs, err := exec(u, "", "unprepare", "--wipe")
		require.NoError(t, err, "unprepare --wipe of a prepare killed after %s: %s", step, errs)
		gone(u, step+" (then deleted)")
	}
	t.Logf("encrypted volume: killed after each of %d prepare steps %v and %d unprepare steps %v, each converged; deleted after each unfinished prepare", len(prepare), prepare, len(unprepare), unprepare)

	// A header of ours with no keyslot (what a luksFormat cut between its
	// two writes leaves): made by hand after a crash right after the key.
	u = uuid.NewString()
	_, err = exec(u, "key-created", "prepare")
	require.Error(t, err)
	file := filepath.Join(guestState, "sparse", u)
	key := filepath.Join(guestState, "keys", u+".key")
	run("cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--uuid", luks.ContainerUUID(u), "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", key, file)
	run("cryptsetup", "erase", "--batch-mode", file)
	errs, err = exec(u, "", "prepare")
	require.NoError(t, err, errs)
	assert.Contains(t, stepsOf(errs), "luks-unfinished", "the unopenable header noticed")
	prepared(u)
	errs, err = exec(u, "", "unprepare", "--wipe")
	require.NoError(t, err, errs)
	gone(u, "an unfinished header")
	t.Logf("encrypted volumes' crash runs with the node's binary: %s", time.Since(started).Round(time.Second))
}
