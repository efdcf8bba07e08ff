// Package packages installs, upgrades and purges salt-volumes' .deb
// packages on a booted Debian guest (test/guest) that has neither Go nor
// the source: its own salt-master and minion (Salt as pip installs it,
// running as the salt user like Salt's packages), the packaged master.d
// snippet, the control plane as its own user, volumes created and deleted
// through the CLI, and an upgrade from the previous release with volumes
// in place.
package packages

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/test/guest"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// previous is the release before this one: 0.3.0, the commit the
// packaging work started from (tagged v0.3.0 where the tag was made). The
// upgrade test packages its binaries and formulas with today's packaging.
const (
	previous        = "1ccafbad756d1c6bf2066cf944a36ea3708c89e1"
	previousVersion = "0.3.0"
)

const minionID = "pkg-guest"

// TestPackages: a clean guest installs this release's packages, runs
// Salt's master with the packaged snippet, prepares itself as a node,
// creates and deletes a volume through the CLI, and purges everything but
// the node's records. Then it adds a signed apt repository holding both
// releases (scripts/sign.sh, scripts/repo.sh), installs the previous
// release from it, makes a volume of each kind, upgrades in place with
// apt-get upgrade, and finds every volume Available
// with its data, its job history and its node record; purge leaves the
// volumes.
func TestPackages(t *testing.T) {
	repo := saltstack.Need(t)
	img, err := guest.Image(repo)
	require.NoError(t, err, "the guest image (scripts/guest-image.sh)")
	started := time.Now()

	// The guest boots while the packages build.
	type booted struct {
		g   *guest.Guest
		err error
	}
	bootc := make(chan booted, 1)
	go func() {
		// vdb: a blank disk for a raw volume.
		g, err := guest.BootWithMemory(context.Background(), img, filepath.Join(t.TempDir(), "guest"), 1536,
			guest.Disk{Name: "vdb", Size: 128 << 20, Bus: "virtio"})
		bootc <- booted{g, err}
	}()
	var g *guest.Guest
	t.Cleanup(func() {
		if g == nil {
			if b := <-bootc; b.g != nil {
				b.g.Stop()
			}
			return
		}
		if t.Failed() {
			out, _ := g.Run("journalctl", "-b", "--no-pager", "-n", "120")
			t.Logf("--- journal of the guest in %s\n%s", g.Dir, out)
		}
		g.Stop()
	})
	current := releaseVersion(t, repo)
	newDebs := packagesOf(t, repo, repo, current)
	oldDebs := previousPackages(t, repo)
	// Both releases in one signed apt repository, as make dist SIGN_KEY
	// and make repo make it: the upgrade story installs and upgrades
	// through it.
	aptRepo, keyring := repository(t, repo, oldDebs, newDebs)
	t.Logf("packages of %s and %s built, signed, in a repository: %s", current, previousVersion, time.Since(started).Round(time.Second))
	b := <-bootc
	g = b.g
	require.NoError(t, b.err)
	t.Logf("guest booted, ssh answering: %s", time.Since(started).Round(time.Second))

	m := &machine{t: t, g: g}
	m.saltMaster()
	quick := quickstart(t, repo, map[string]string{
		// The names and sizes of this guest: its minion id, a disk of a
		// few GiB (a 10Gi sparse volume is past the overcommit ratio).
		"node-1":                             minionID,
		"10Gi":                               "64Mi",
		"./salt-volumes_<version>_amd64.deb": "./" + filepath.Base(newDebs[1]),
	})

	t.Run("the README's quick start, then purge", func(t *testing.T) {
		m.t = t
		at := time.Now()
		// An existing master, as the quick start assumes; the packages
		// where the reader has them, in the working directory.
		m.startMaster()
		m.put(newDebs)
		t.Logf("salt-master and minion up: %s", time.Since(at).Round(time.Second))

		// On the master, line by line: the package's promises are checked
		// before the snippet is enabled.
		require.Len(t, quick["master"], 3, "README's quick start on the master: %q", quick["master"])
		m.sh(quick["master"][0])
		m.assertInstalled()
		for _, line := range quick["master"][1:] {
			m.sh(line)
		}
		m.waitReady()
		assert.Equal(t, "active", m.run("systemctl", "is-active", "salt-api.service"), "the quick start restarted salt-api")
		// A reader types the next block once the restarted master's
		// minions are back; so does the test.
		m.waitMinion(5 * time.Minute)
		t.Logf("the master's block: %s", time.Since(at).Round(time.Second))

		synced := time.Now()
		for _, line := range quick["nodes"] {
			m.sh(line)
		}
		t.Logf("the nodes' block (modules synced, salt_volumes.installed): %s", time.Since(synced).Round(time.Second))
		m.run("test", "-x", "/usr/local/bin/salt-volume-exec")
		assert.Equal(t, "enabled", m.run("systemctl", "is-enabled", "salt-volumes-restore.service"))

		// The CLI's block as one script: its export holds for the rest.
		out := m.sh(strings.Join(quick["cli"], "\n"))
		assert.Contains(t, out, "data-1", "salt-volumes ls lists the volume")
		v := m.volume("data-1")
		assert.Equal(t, "Available", v.Status.Phase)
		m.run("test", "-b", v.Status.DevicePath)
		// The snapshot the quick start asked for, taken on the node.
		testenv.EventuallyEvery(t, 5*time.Minute, time.Second, "the quick start's snapshot is Ready", func() (bool, string) {
			var snap struct{ Name, Volume, Phase, Message string }
			out, err := m.g.Run("env", "SALT_VOLUMES_URL=http://127.0.0.1:8080", "SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token",
				"salt-volumes", "snapshot", "get", "before-upgrade", "-o", "json")
			if err != nil || json.Unmarshal([]byte(out), &snap) != nil {
				return false, out + fmt.Sprint(err)
			}
			require.NotEqual(t, "Failed", snap.Phase, snap.Message)
			return snap.Volume == "data-1" && snap.Phase == "Ready", out
		})

		m.cli("snapshot", "rm", "before-upgrade", "--wait", "--timeout", "5m")
		m.cli("rm", "data-1", "--wait", "--timeout", "5m")
		var left struct{ Items []any }
		require.NoError(t, json.Unmarshal([]byte(m.cli("ls", "-o", "json")), &left))
		assert.Empty(t, left.Items, "volumes left after rm")
		m.noFailedUnits()

		// What the state put on the node goes the way an operator moving
		// to the node package removes it, so the upgrade below starts
		// from packages alone.
		m.run("systemctl", "disable", "salt-volumes-restore.service")
		m.run("rm", "-f", "/usr/local/bin/salt-volume-exec", "/etc/systemd/system/salt-volumes-restore.service")
		m.run("systemctl", "daemon-reload")
		m.purge("salt-volumes")
		m.assertPurged()
		// salt-api's idle threads cost the emulated guest minutes of the
		// upgrade story, which does not need it.
		m.run("systemctl", "stop", "salt-api.service")
		_, _ = m.g.Run("systemctl", "reset-failed", "salt-api.service")
		t.Logf("the README's quick start on %s, delete and purge: %s", current, time.Since(at).Round(time.Second))
	})
	if t.Failed() {
		return
	}

	t.Run("upgrade from the previous release with volumes in place", func(t *testing.T) {
		m.t = t
		at := time.Now()
		// The repository as docs/operations.md adds it, its key checked
		// by apt (a file: URI where the docs have https:).
		m.putTree(aptRepo, "/srv/salt-volumes/apt")
		m.run("install", "-d", "-m", "0755", "/etc/apt/keyrings")
		require.NoError(t, m.g.Write("/etc/apt/keyrings/salt-volumes.gpg", keyring, 0o644))
		require.NoError(t, m.g.Write("/etc/apt/sources.list.d/salt-volumes.list",
			[]byte("deb [signed-by=/etc/apt/keyrings/salt-volumes.gpg] file:/srv/salt-volumes/apt stable main\n"), 0o644))
		m.apt("update")
		m.apt("install", "salt-volume-exec="+previousVersion, "salt-volumes="+previousVersion)
		m.enableSnippet()
		assert.Equal(t, "700 root root", m.run("stat", "-c", "%a %U %G", "/var/lib/salt-volumes"), "the node package's state dir")
		m.salt("saltutil.sync_all")
		m.startServe(previousVersion)

		// A volume of every kind this guest can make: a sparse file with
		// a filesystem, a sparse Block volume, a raw disk with a
		// filesystem (LVM needs a volume group: the booted tests cover it).
		m.cli("create", "old-fs", "--node", minionID, "--size", "64Mi", "--wait", "--timeout", "5m")
		m.cli("create", "old-block", "--node", minionID, "--size", "32Mi", "--mode", "Block", "--wait", "--timeout", "5m")
		m.cli("create", "old-raw", "--node", minionID, "--device", "/dev/vdb", "--wait", "--timeout", "5m")
		names := []string{"old-fs", "old-block", "old-raw"}
		before := map[string]view{}
		jobs := map[string][]string{}
		for _, n := range names {
			v := m.volume(n)
			require.Equal(t, "Available", v.Status.Phase, n)
			before[n] = v
			jobs[n] = m.jobIDs(n)
			require.NotEmpty(t, jobs[n], "%s: no job history before the upgrade", n)
			m.writeMarker(v)
		}
		records := m.records("salt-volume-exec")
		oldPID := m.run("systemctl", "show", "-P", "MainPID", "salt-volumes.service")

		// The upgrade through the repository (apt-get upgrade), then the
		// operator's step of this upgrade: 0.4.0's account runs one
		// function with fixed arguments where 0.3.0's ran state.apply, so
		// the new snippet replaces the old one, and the master restarts
		// (CHANGELOG, docs/operations.md).
		// An admin disabled the restore unit: the upgrade leaves it so
		// (0.4.0's first postinst enabled it at every configure).
		m.run("systemctl", "disable", "salt-volumes-restore.service")
		m.apt("upgrade")
		assert.Equal(t, "disabled", m.unitEnabled("salt-volumes-restore.service"), "the upgrade enabled a unit the admin disabled")
		m.enableSnippet()
		assert.Equal(t, current, m.run("salt-volumes", "version"))
		assert.Contains(t, m.run("salt-volume-exec", "version"), `"`+current+`"`, "the node package upgraded too")
		// And the node's modules, which changed with the formulas: the
		// upgrade's other documented step.
		m.salt("saltutil.sync_all")
		testenv.EventuallyEvery(t, 2*time.Minute, time.Second, "serve restarted on the new binary", func() (bool, string) {
			pid, _ := g.Run("systemctl", "show", "-P", "MainPID", "salt-volumes.service")
			pid = strings.TrimSpace(pid)
			return pid != oldPID && pid != "0" && pid != "", "MainPID " + pid
		})
		m.waitReady()
		for _, n := range names {
			v := m.volume(n)
			assert.Equal(t, "Available", v.Status.Phase, n)
			assert.Equal(t, before[n].Spec, v.Spec, "%s: its spec changed across the upgrade", n)
			assert.Equal(t, before[n].Status.DevicePath, v.Status.DevicePath, n)
			assert.Equal(t, jobs[n], m.jobIDs(n), "%s: its job history is not the one before the upgrade", n)
			m.readMarker(v)
		}
		assert.Equal(t, records, m.records("salt-volume-exec"), "the node's records, read by the new salt-volume-exec")

		// The node: the package put the binary and the restore unit in
		// place; salt_volumes.installed adds the tools and the beacon and
		// leaves the package's files alone.
		m.salt("state.apply", "salt_volumes.installed")
		_, err := g.Run("test", "-e", "/usr/local/bin/salt-volume-exec")
		assert.Error(t, err, "salt_volumes.installed copied a second binary beside the package's")
		_, err = g.Run("test", "-e", "/etc/systemd/system/salt-volumes-restore.service")
		assert.Error(t, err, "salt_volumes.installed wrote a unit over the package's")
		// Nor does it enable the unit the admin disabled: the package
		// owns that; the admin enables it again.
		assert.Equal(t, "disabled", m.unitEnabled("salt-volumes-restore.service"), "salt_volumes.installed enabled a unit the admin disabled")
		m.run("systemctl", "enable", "salt-volumes-restore.service")

		// The new release works on the old volumes and makes new ones.
		m.cli("rm", "old-block", "--wait", "--timeout", "5m")
		m.cli("create", "new-fs", "--node", minionID, "--size", "64Mi", "--wait", "--timeout", "5m")
		assert.Equal(t, "Available", m.volume("new-fs").Status.Phase)
		m.cli("rm", "new-fs", "--wait", "--timeout", "5m")
		m.noFailedUnits()
		t.Logf("install of %s, three volumes, upgrade to %s, checks: %s", previousVersion, current, time.Since(at).Round(time.Second))

		// Removing the node package while it holds volumes is refused
		// (their restore at the next boot would go with it), naming
		// them; the package and its restore unit stay.
		out, err := g.Run("dpkg", "--remove", "salt-volume-exec")
		require.Error(t, err, "the node package was removed with volumes on the node: %s", out)
		for _, want := range []string{"holds volumes", "old-fs", "old-raw", "SALT_VOLUMES_REMOVE_WITH_VOLUMES=yes"} {
			assert.Contains(t, err.Error(), want)
		}
		// (dpkg marks it wanted gone, "deinstall ok installed": installed.)
		assert.Equal(t, "installed", m.run("dpkg-query", "-W", "-f", "${db:Status-Status}", "salt-volume-exec"))
		assert.Equal(t, "enabled", m.unitEnabled("salt-volumes-restore.service"))

		// Purge, said to go ahead, takes the packages, never the volumes:
		// the two left are still there, attached, with their data and
		// their records.
		m.purge("salt-volumes", "salt-volume-exec")
		m.assertPurged()
		listed := m.records("/root/salt-volume-exec-kept")
		for _, n := range []string{"old-fs", "old-raw"} {
			assert.Contains(t, listed, record{Name: n, UUID: before[n].Spec.UUID, DevicePath: before[n].Status.DevicePath, State: "prepared"}, "%s: its node record went with the purge", n)
			m.readMarker(before[n])
		}
	})
	if t.Failed() {
		return
	}

	t.Run("a source install of the previous release, moved onto the packages", func(t *testing.T) {
		m.t = t
		at := time.Now()
		// 0.3.0 as its docs installed it: both binaries in
		// /usr/local/bin, the node's restore unit as make install wrote
		// it, the control plane's unit copied from deploy/, enabled and
		// running as the master's user, and a volume of the old binary's.
		bins := filepath.Dir(oldDebs[0])
		for _, cmd := range []string{"salt-volume-exec", "salt-volumes"} {
			data, err := os.ReadFile(filepath.Join(bins, cmd+"_"+previousVersion+"_linux_amd64"))
			require.NoError(t, err)
			require.NoError(t, g.Write("/usr/local/bin/"+cmd, data, 0o755))
		}
		restoreUnit := regexp.MustCompile(`\{\{ [a-z_]* \| default\("([^"]*)"\) \}\}`).ReplaceAll(
			gitShow(t, repo, previous, "salt/states/salt_volumes/files/salt-volumes-restore.service"), []byte("$1"))
		require.NoError(t, g.Write("/etc/systemd/system/salt-volumes-restore.service", restoreUnit, 0o644))
		require.NoError(t, g.Write("/etc/systemd/system/salt-volumes.service", gitShow(t, repo, previous, "deploy/salt-volumes.service"), 0o644))
		m.run("install", "-d", "-m", "0750", "-o", "root", "-g", "salt", "/etc/salt-volumes")
		require.NoError(t, g.Write("/etc/salt-volumes/config.yaml", gitShow(t, repo, previous, "deploy/config.yaml"), 0o640))
		for _, f := range []string{"token", "salt-api-password"} {
			require.NoError(t, g.Write("/etc/salt-volumes/"+f, []byte(strings.Repeat("ab", 32)+"\n"), 0o640))
		}
		m.run("chgrp", "salt", "/etc/salt-volumes/config.yaml", "/etc/salt-volumes/token", "/etc/salt-volumes/salt-api-password")
		m.run("systemctl", "daemon-reload")
		m.run("systemctl", "enable", "salt-volumes-restore.service")
		m.run("systemctl", "enable", "--now", "salt-volumes.service")
		testenv.EventuallyEvery(t, 2*time.Minute, time.Second, "0.3.0's serve listens", func() (bool, string) {
			tcp, _ := g.Run("cat", "/proc/net/tcp")
			for _, line := range strings.Split(tcp, "\n") {
				if f := strings.Fields(line); len(f) > 3 && f[1] == "0100007F:1F90" && f[3] == "0A" {
					return true, ""
				}
			}
			return false, mustOut(g.Run("systemctl", "status", "--no-pager", "salt-volumes.service"))
		})
		oldPID := m.run("systemctl", "show", "-P", "MainPID", "salt-volumes.service")
		u := "8d3c2f1e-6b5a-4c3d-9e8f-7a6b5c4d3e2f"
		spec := `{"name":"src-fs","uuid":"` + u + `","sparseLoopDevice":{"size":"32Mi"}}`
		out, err := g.RunInput([]byte(spec), "/usr/local/bin/salt-volume-exec", "prepare", "--spec", "-")
		require.NoError(t, err, out)

		// The packages over it, as an operator installs them.
		m.put(newDebs)
		// The scripts' stderr with apt's output, as the operator reads it.
		installLog := m.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confdef " +
			"-o Dpkg::Options::=--force-confold ./" + filepath.Base(newDebs[0]) + " ./" + filepath.Base(newDebs[1]) + " 2>&1")
		for _, want := range []string{
			"moved the source install's /usr/local/bin/salt-volume-exec to /usr/local/bin/salt-volume-exec.retired, and made /usr/local/bin/salt-volume-exec a link to /usr/bin/salt-volume-exec",
			"moved the source install's /usr/local/bin/salt-volumes to /usr/local/bin/salt-volumes.retired, and made",
			"moved the source install's /etc/systemd/system/salt-volumes-restore.service to /etc/systemd/system/salt-volumes-restore.service.retired",
			"moved the source install's /etc/systemd/system/salt-volumes.service to /etc/systemd/system/salt-volumes.service.retired",
		} {
			assert.Contains(t, installLog, want, "the packages did not say what they retired")
		}
		for _, f := range []string{"/etc/systemd/system/salt-volumes-restore.service", "/etc/systemd/system/salt-volumes.service"} {
			_, err := g.Run("test", "-e", f)
			assert.Error(t, err, "%s is still in place", f)
			m.run("test", "-f", f+".retired")
		}
		// The binaries' old paths lead to the packages' binaries (a
		// minion config or an engine may name them).
		for _, cmd := range []string{"salt-volume-exec", "salt-volumes"} {
			m.run("test", "-f", "/usr/local/bin/"+cmd+".retired")
			assert.Equal(t, "/usr/bin/"+cmd, m.run("readlink", "/usr/local/bin/"+cmd))
			assert.Equal(t, "/usr/bin/"+cmd, m.run("sh", "-lc", "readlink -f \"$(command -v "+cmd+")\""), "the first %s on PATH", cmd)
		}
		assert.Regexp(t, `^(/usr)?/lib/systemd/system/salt-volumes-restore\.service$`, m.run("systemctl", "show", "-P", "FragmentPath", "salt-volumes-restore.service"), "the package's unit is the one loaded")
		assert.Equal(t, "enabled", m.unitEnabled("salt-volumes-restore.service"), "the source install's restore was enabled: the package's is")
		assert.Regexp(t, `^(/usr)?/lib/systemd/system/salt-volumes\.service$`, m.run("systemctl", "show", "-P", "FragmentPath", "salt-volumes.service"), "the package's unit is the one loaded")
		assert.Equal(t, "enabled", m.unitEnabled("salt-volumes.service"))
		testenv.EventuallyEvery(t, 2*time.Minute, time.Second, "serve runs the package's binary as its own user", func() (bool, string) {
			pid := strings.TrimSpace(mustOut(g.Run("systemctl", "show", "-P", "MainPID", "salt-volumes.service")))
			if pid == "0" || pid == "" || pid == oldPID {
				return false, "MainPID " + pid
			}
			exe := strings.TrimSpace(mustOut(g.Run("readlink", "/proc/"+pid+"/exe")))
			// (ps cuts user names past eight characters.)
			user := strings.TrimSpace(mustOut(g.Run("stat", "-c", "%U", "/proc/"+pid)))
			return exe == "/usr/bin/salt-volumes" && user == "salt-volumes", exe + " as " + user
		})
		var found *record
		for _, r := range m.records("salt-volume-exec") {
			if r.Name == "src-fs" {
				found = &r
			}
		}
		require.NotNil(t, found, "the new binary does not list the old one's volume")
		assert.Equal(t, u, found.UUID)
		assert.Equal(t, "prepared", found.State)
		m.run("test", "-b", found.DevicePath)

		out, err = g.RunInput([]byte(spec), "salt-volume-exec", "unprepare", "--spec", "-")
		require.NoError(t, err, out)
		m.purge("salt-volumes", "salt-volume-exec")
		m.assertPurged()
		for _, cmd := range []string{"salt-volume-exec", "salt-volumes"} {
			_, err := g.Run("test", "-L", "/usr/local/bin/"+cmd)
			assert.Error(t, err, "the link at /usr/local/bin/%s outlived the package", cmd)
		}
		t.Logf("0.3.0 installed from source, moved onto %s's packages, purged: %s", current, time.Since(at).Round(time.Second))
	})
	t.Logf("qemu's translation cache: %s", g.JIT())
	t.Logf("whole test: %s", time.Since(started).Round(time.Second))
}

// machine is the guest as an operator sees it.
type machine struct {
	t *testing.T
	g *guest.Guest
}

func (m *machine) run(args ...string) string {
	m.t.Helper()
	out, err := m.g.Run(args...)
	require.NoError(m.t, err)
	return strings.TrimSpace(out)
}

// salt runs a function on the guest's minion from its master.
func (m *machine) salt(args ...string) string {
	m.t.Helper()
	out, err := m.g.Run(append([]string{"/opt/salt/bin/salt", "--timeout=600", "--out=json", "--static", minionID}, args...)...)
	require.NoError(m.t, err, "%s", out)
	var ret map[string]any
	require.NoError(m.t, json.Unmarshal([]byte(out), &ret), out)
	if states, ok := ret[minionID].(map[string]any); ok && len(args) > 0 && args[0] == "state.apply" {
		for id, s := range states {
			st, _ := s.(map[string]any)
			assert.Equal(m.t, true, st["result"], "%s: %v", id, st["comment"])
		}
	}
	return out
}

func (m *machine) cli(args ...string) string {
	m.t.Helper()
	out, err := m.g.Run(append([]string{"env", "SALT_VOLUMES_URL=http://127.0.0.1:8080", "SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token", "salt-volumes"}, args...)...)
	if err != nil {
		journal, _ := m.g.Run("journalctl", "-u", "salt-volumes", "--no-pager", "-n", "60")
		m.t.Fatalf("salt-volumes %v: %v\n%s\n--- serve's journal\n%s", args, err, out, journal)
	}
	return out
}

// quickstart reads README.md's quick start as a reader copies it: the
// lines of the shell block after each "<!-- quickstart: NAME" marker,
// with this guest's names put for the README's (each must be there, so
// that a README that drops one fails here rather than runs something
// else).
func quickstart(t *testing.T, repo string, subst map[string]string) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require.NoError(t, err)
	text := string(raw)
	used := map[string]bool{}
	blocks := map[string][]string{}
	for _, part := range strings.Split(text, "<!-- quickstart: ")[1:] {
		name, _, _ := strings.Cut(part, " ")
		_, body, ok := strings.Cut(part, "```sh\n")
		require.True(t, ok, "README.md: quick start block %s has no sh block after its marker", name)
		body, _, ok = strings.Cut(body, "```")
		require.True(t, ok, "README.md: quick start block %s is not closed", name)
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			for from, to := range subst {
				if strings.Contains(line, from) {
					used[from] = true
					line = strings.ReplaceAll(line, from, to)
				}
			}
			blocks[name] = append(blocks[name], line)
		}
	}
	for _, name := range []string{"master", "nodes", "cli"} {
		require.NotEmpty(t, blocks[name], "README.md has no quick start block %q", name)
	}
	for from := range subst {
		assert.True(t, used[from], "README.md's quick start no longer says %q; the test puts this guest's value for it", from)
	}
	return blocks
}

// put copies files into root's home on the guest, under their own names.
func (m *machine) put(files []string) {
	m.t.Helper()
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(m.t, err)
		require.NoError(m.t, m.g.Write("/root/"+filepath.Base(f), data, 0o644))
	}
}

// sh runs README text as a reader's root shell would, in root's home,
// with Salt's commands on the PATH; it fails the test on a non-zero exit.
func (m *machine) sh(script string) string {
	m.t.Helper()
	out, err := m.g.Run("env", "PATH=/opt/salt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"bash", "-e", "-o", "pipefail", "-c", "cd /root && "+script)
	if err != nil {
		journal, _ := m.g.Run("journalctl", "-u", "salt-volumes", "-u", "salt-master", "-u", "salt-api", "--no-pager", "-n", "60")
		m.t.Fatalf("the README's %q: %v\n%s\n--- journal\n%s", script, err, out, journal)
	}
	return out
}

// waitMinion waits until the minion answers its master. Each salt
// command costs the emulated guest 5-14 s of its one CPU, which a master
// starting or a minion reconnecting needs (measured 2026-12-06: about a
// minute of every master start went to a loop of test.ping), so the
// command is tried only once the minion holds a connection to the
// master's publisher (cheap to read), and then every few seconds.
func (m *machine) waitMinion(limit time.Duration) {
	m.t.Helper()
	testenv.EventuallyEvery(m.t, limit, time.Second, "the minion connected to the master's publisher", func() (bool, string) {
		tcp, err := m.g.Run("cat", "/proc/net/tcp")
		if err != nil {
			return false, err.Error()
		}
		return connectedTo(tcp, 4505), "no established connection to 127.0.0.1:4505 in /proc/net/tcp"
	})
	testenv.EventuallyEvery(m.t, limit, 5*time.Second, "the minion answers the master", func() (bool, string) {
		out, err := m.g.Run("/opt/salt/bin/salt", "--timeout=30", minionID, "test.ping")
		return err == nil && strings.Contains(out, "True"), out
	})
}

// connectedTo tells whether /proc/net/tcp's text holds an established
// connection to port on the loopback address (the address as the
// little-endian guest writes it, the port in hex).
func connectedTo(tcp string, port int) bool {
	remote := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(tcp, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] == remote && f[3] == "01" {
			return true
		}
	}
	return false
}

// saltMaster prepares the guest to be a Salt master of itself as Salt's
// packages set one up: a salt user that the master runs as, its
// directories, a unit; startMaster starts it.
func (m *machine) saltMaster() {
	m.t.Helper()
	m.run("useradd", "--system", "--user-group", "--home-dir", "/var/lib/salt", "--shell", "/usr/sbin/nologin", "salt")
	// The master's directories are its user's, as Salt's packages make
	// them; its log first of all, which root's salt and salt-key write too.
	for _, d := range []string{"/etc/salt/pki/master", "/var/cache/salt/master", "/var/run/salt/master", "/var/log/salt"} {
		m.run("install", "-d", "-o", "salt", "-g", "salt", "-m", "0750", d)
	}
	m.run("install", "-o", "salt", "-g", "salt", "-m", "0640", "/dev/null", "/var/log/salt/master")
	m.run("install", "-o", "salt", "-g", "salt", "-m", "0640", "/dev/null", "/var/log/salt/key")
	require.NoError(m.t, m.g.Write("/etc/systemd/system/salt-master.service", []byte(
		"[Unit]\nDescription=Salt master\nAfter=network.target\n\n[Service]\nExecStart=/opt/salt/bin/salt-master\nLimitNOFILE=100000\nKillMode=process\nRestart=on-failure\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n"), 0o644))
	// salt-api as Salt's packages run it (enabled by no one: the quick
	// start restarts it once the snippet turned rest_cherrypy on).
	require.NoError(m.t, m.g.Write("/etc/systemd/system/salt-api.service", []byte(
		"[Unit]\nDescription=Salt API\nAfter=network.target salt-master.service\n\n[Service]\nExecStart=/opt/salt/bin/salt-api\nKillMode=process\nRestart=on-failure\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n"), 0o644))
	// Few workers: the guest is emulated and small.
	m.run("mkdir", "-p", "/etc/salt/master.d")
	// The master accepts its own minion's key: it listens on loopback only.
	// The salt command waits longer than Salt's 5 s (and 10 s for a job's
	// progress) before giving up on a minion: the README's commands run
	// here as typed, on an emulated guest.
	// The master's grains cached: each request worker loads them at
	// start, 15 of its 30 s of emulated CPU (measured 2026-12-06).
	require.NoError(m.t, m.g.Write("/etc/salt/master.d/10-guest.conf", []byte("user: salt\nworker_threads: 2\ninterface: 127.0.0.1\nauto_accept: True\ntimeout: 120\ngather_job_timeout: 60\n"+
		"grains_cache: True\ngrains_cache_expiration: 86400\n"), 0o644))
	require.NoError(m.t, m.g.Write("/etc/salt/minion.d/master.conf", []byte("id: "+minionID+"\nmaster: 127.0.0.1\nacceptance_wait_time: 2\n"), 0o644))
}

// startMaster starts the master and the minion, accepts the minion's key
// and waits until it answers.
func (m *machine) startMaster() {
	m.t.Helper()
	// Salt gives its publisher 30 s to start, which a cold emulated guest
	// can miss: its modules are read once before, and the unit restarts.
	m.run("/opt/salt/bin/python3", "-c", "import salt.master, salt.channel.server, salt.transport.tcp, salt.transport.zeromq")
	m.run("systemctl", "daemon-reload")
	// The master alone first: the minion's retries would slow its start.
	m.run("systemctl", "stop", "salt-minion.service")
	m.run("systemctl", "enable", "--now", "salt-master.service")
	testenv.EventuallyEvery(m.t, 5*time.Minute, time.Second, "the master's event bus is up", func() (bool, string) {
		_, err := m.g.Run("test", "-S", "/var/run/salt/master/master_event_pub.ipc")
		return err == nil, fmt.Sprint(err)
	})
	m.run("systemctl", "start", "salt-minion.service")
	m.waitMinion(10 * time.Minute)
}

// apt runs apt-get as an operator's unattended run would, on the
// repository's list alone: the guest reaches no Debian mirror, and its
// own packages are not what is tested.
func (m *machine) apt(args ...string) string {
	m.t.Helper()
	out, err := m.g.Run(append([]string{"env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q",
		"-o", "Dir::Etc::SourceList=/etc/apt/sources.list.d/salt-volumes.list", "-o", "Dir::Etc::SourceParts=-",
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}, args...)...)
	require.NoError(m.t, err, "apt-get %v: %s", args, out)
	return out
}

// putTree copies the files under dir on the host to remote in the guest.
func (m *machine) putTree(dir, remote string) {
	m.t.Helper()
	require.NoError(m.t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := remote + "/" + filepath.ToSlash(rel)
		if _, err := m.g.Run("mkdir", "-p", filepath.Dir(dst)); err != nil {
			return err
		}
		return m.g.Write(dst, data, 0o644)
	}))
}

// enableSnippet puts the installed package's master.d snippet in place,
// as the operations guide says after an install or upgrade, and restarts
// a running master when it changed.
func (m *machine) enableSnippet() {
	m.t.Helper()
	snippet := "/etc/salt/master.d/salt-volumes.conf"
	if _, err := m.g.Run("cmp", "-s", "/usr/share/salt-volumes/master.d/salt-volumes.conf", snippet); err != nil {
		m.run("cp", "/usr/share/salt-volumes/master.d/salt-volumes.conf", snippet)
		if _, err := m.g.Run("systemctl", "is-active", "--quiet", "salt-master.service"); err != nil {
			return
		}
		m.run("systemctl", "restart", "salt-master.service")
		m.waitMinion(5 * time.Minute)
	}
}

// assertInstalled checks what the packages promise before anything runs.
func (m *machine) assertInstalled() {
	m.t.Helper()
	t := m.t
	assert.Contains(t, m.run("id", "salt-volumes"), "(salt)", "serve's user is in the master's group")
	assert.NotContains(t, m.run("id", "salt-volumes"), "uid=0")
	// Made by systemd-sysusers from the package's declaration: a system
	// user with no login and the store's directory as its home.
	f := strings.Split(m.run("getent", "passwd", "salt-volumes"), ":")
	require.Len(t, f, 7)
	uid, err := strconv.Atoi(f[2])
	require.NoError(t, err)
	assert.Less(t, uid, 1000, "a system user")
	assert.Equal(t, []string{"salt-volumes control plane", "/var/lib/salt-volumes-control", "/usr/sbin/nologin"}, f[4:])
	for f, want := range map[string]string{
		"/etc/salt-volumes/token":             "640 root salt-volumes",
		"/etc/salt-volumes/salt-api-password": "640 root salt-volumes",
		"/etc/salt-volumes/config.yaml":       "640 root salt-volumes",
		"/etc/salt/api-users":                 "600 salt salt",
	} {
		assert.Equal(t, want, m.run("stat", "-c", "%a %U %G", f), f)
	}
	password := m.run("cat", "/etc/salt-volumes/salt-api-password")
	assert.Len(t, password, 64)
	assert.Equal(t, "salt-volumes:"+password, m.run("cat", "/etc/salt/api-users"), "the master's eauth file holds the generated password")
	assert.Equal(t, "disabled", strings.TrimSpace(mustOut(m.g.Run("systemctl", "is-enabled", "salt-volumes.service"))), "serve starts once the operator enabled the snippet")
}

func mustOut(out string, _ error) string { return out }

// startServe enables and starts the packaged unit and waits until serve
// is ready, running as its own user.
func (m *machine) startServe(version string) {
	m.t.Helper()
	m.run("systemctl", "enable", "--now", "salt-volumes.service")
	m.waitReady()
	assert.Equal(m.t, version, m.run("salt-volumes", "version"))
	pid := m.run("systemctl", "show", "-P", "MainPID", "salt-volumes.service")
	assert.Equal(m.t, "salt-volumes", m.run("stat", "-c", "%U", "/proc/"+pid), "serve runs as its own user")
}

func (m *machine) waitReady() {
	m.t.Helper()
	testenv.EventuallyEvery(m.t, 5*time.Minute, time.Second, "serve is ready", func() (bool, string) {
		out, err := m.g.Run("env", "SALT_VOLUMES_URL=http://127.0.0.1:8080", "SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token", "salt-volumes", "status", "-o", "json")
		return err == nil, out + fmt.Sprint(err)
	})
}

func (m *machine) noFailedUnits() {
	m.t.Helper()
	assert.Empty(m.t, m.run("systemctl", "list-units", "--failed", "--no-legend", "--plain"), "failed units")
}

// purge removes packages with their configuration.
func (m *machine) purge(pkgs ...string) {
	m.t.Helper()
	// The node binary, kept outside the package, to read the records after.
	if _, err := m.g.Run("test", "-e", "/usr/bin/salt-volume-exec"); err == nil {
		m.run("cp", "/usr/bin/salt-volume-exec", "/root/salt-volume-exec-kept")
	}
	out, err := m.g.Run(append([]string{"env", "SALT_VOLUMES_REMOVE_WITH_VOLUMES=yes", "dpkg", "--purge"}, pkgs...)...)
	require.NoError(m.t, err, "%s", out)
}

// gitShow is a file of the repository at a commit.
func gitShow(t *testing.T, repo, commit, path string) []byte {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "show", commit+":"+path).Output()
	require.NoError(t, err, "git show %s:%s", commit, path)
	return out
}

// unitEnabled is systemctl is-enabled's answer, a disabled unit's too
// (it exits 1 for that).
func (m *machine) unitEnabled(unit string) string {
	out, _ := m.g.Run("systemctl", "is-enabled", unit)
	return strings.TrimSpace(out)
}

// assertPurged: nothing of the packages is left but the node's records.
func (m *machine) assertPurged() {
	m.t.Helper()
	t := m.t
	for _, f := range []string{"/etc/salt-volumes", "/usr/bin/salt-volumes", "/usr/bin/salt-volume-exec",
		"/lib/systemd/system/salt-volumes.service", "/lib/systemd/system/salt-volumes-restore.service",
		"/etc/systemd/system/local-fs.target.wants/salt-volumes-restore.service",
		"/usr/share/salt-formulas", "/usr/share/salt-volumes", "/var/lib/salt-volumes-control", "/etc/salt/api-users"} {
		_, err := m.g.Run("test", "-e", f)
		assert.Error(t, err, "%s is left after purge", f)
	}
	_, err := m.g.Run("getent", "passwd", "salt-volumes")
	assert.Error(t, err, "the salt-volumes user is left after purge")
	_, err = m.g.Run("getent", "group", "salt-volumes")
	assert.Error(t, err, "the salt-volumes group is left after purge")
	assert.Equal(t, "700 root", m.run("stat", "-c", "%a %U", "/var/lib/salt-volumes"), "the node's records stay")
	m.noFailedUnits()
}

// record is what the checks read of a node's record of a volume.
type record struct {
	Name, UUID, DevicePath, PersistentPath, State string
}

// records are the node's records as salt-volume-exec (at path) lists
// them; usage and the filesystem's free space left out.
func (m *machine) records(exec string) []record {
	m.t.Helper()
	out := m.run(exec, "list")
	var list struct{ Volumes []record }
	require.NoError(m.t, json.Unmarshal([]byte(out), &list), out)
	for i := range list.Volumes {
		list.Volumes[i].PersistentPath = ""
	}
	return list.Volumes
}

// view is what the checks read of a volume.
type view struct {
	Spec struct {
		UUID string `json:"uuid"`
		Mode string `json:"mode,omitempty"`
		Name string `json:"name"`
	} `json:"spec"`
	Status struct {
		Phase      string `json:"phase"`
		DevicePath string `json:"devicePath"`
	} `json:"status"`
}

func (m *machine) volume(name string) view {
	m.t.Helper()
	var v view
	out := m.cli("get", name, "-o", "json")
	require.NoError(m.t, json.Unmarshal([]byte(out), &v), out)
	return v
}

// jobIDs are the ids of a volume's last state runs, from the REST API.
func (m *machine) jobIDs(name string) []string {
	m.t.Helper()
	out := m.run("python3", "-c", `import json, sys, urllib.request
token = open("/etc/salt-volumes/token").read().strip()
req = urllib.request.Request("http://127.0.0.1:8080/api/v1/volumes/" + sys.argv[1] + "/jobs", headers={"Authorization": "Bearer " + token})
print(json.dumps([j["jid"] for j in json.load(urllib.request.urlopen(req))["items"]]))`, name)
	var ids []string
	require.NoError(m.t, json.Unmarshal([]byte(out), &ids), out)
	return ids
}

// writeMarker leaves data in a volume: a file on a filesystem, bytes at
// the start of a Block volume.
func (m *machine) writeMarker(v view) {
	m.t.Helper()
	marker := "salt-volumes upgrade marker " + v.Spec.UUID + "\n"
	if v.Spec.Mode == "Block" {
		_, err := m.g.RunInput([]byte(marker), "dd", "of="+v.Status.DevicePath, "bs=512", "conv=fsync", "status=none")
		require.NoError(m.t, err)
		return
	}
	m.run("mkdir", "-p", "/mnt/"+v.Spec.Name)
	m.run("mount", v.Status.DevicePath, "/mnt/"+v.Spec.Name)
	require.NoError(m.t, m.g.Write("/mnt/"+v.Spec.Name+"/marker", []byte(marker), 0o644))
	m.run("umount", "/mnt/"+v.Spec.Name)
}

func (m *machine) readMarker(v view) {
	m.t.Helper()
	marker := "salt-volumes upgrade marker " + v.Spec.UUID
	if v.Spec.Mode == "Block" {
		out := m.run("head", "-c", fmt.Sprint(len(marker)), v.Status.DevicePath)
		assert.Equal(m.t, marker, out, "%s: its data", v.Spec.Name)
		return
	}
	m.run("mount", "-o", "ro", v.Status.DevicePath, "/mnt/"+v.Spec.Name)
	defer m.run("umount", "/mnt/"+v.Spec.Name)
	assert.Equal(m.t, marker, m.run("cat", "/mnt/"+v.Spec.Name+"/marker"), "%s: its data", v.Spec.Name)
}

// releaseVersion is the version make dist would give this tree.
func releaseVersion(t *testing.T, repo string) string {
	out, err := exec.Command(filepath.Join(repo, "scripts", "version.sh")).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// packagesOf builds the amd64 binaries of the tree src as version and
// packages them with this tree's packaging (scripts/packages.sh); it
// returns the two .debs.
func packagesOf(t *testing.T, repo, src, version string) []string {
	t.Helper()
	dir := t.TempDir()
	for _, cmd := range []string{"salt-volume-exec", "salt-volumes"} {
		build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -X main.version="+version,
			"-o", filepath.Join(dir, cmd+"_"+version+"_linux_amd64"), "./cmd/"+cmd)
		build.Dir = src
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "building %s of %s: %s", cmd, version, out)
	}
	pkg := exec.Command(filepath.Join(repo, "scripts", "packages.sh"), dir)
	pkg.Env = append(os.Environ(), "ARCHES=amd64", "VERSION="+version, "SOURCE="+src)
	out, err := pkg.CombinedOutput()
	require.NoError(t, err, "packaging %s: %s", version, out)
	deb := strings.Replace(version, "-", "~", 1)
	return []string{
		filepath.Join(dir, "salt-volume-exec_"+deb+"_amd64.deb"),
		filepath.Join(dir, "salt-volumes_"+deb+"_amd64.deb"),
	}
}

// previousPackages packages the previous release from its commit (git
// archive: the checkout stays as it is). A clone without that commit
// (shallow) cannot test the upgrade and says so.
func previousPackages(t *testing.T, repo string) []string {
	t.Helper()
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", previous+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the previous release's commit %s is not in this clone (%v: %s): fetch the history (git fetch --unshallow)", previous, err, out)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", repo, "archive", "--format=tar", previous)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	untar.Stdin = pipe
	require.NoError(t, untar.Start())
	require.NoError(t, archive.Run())
	require.NoError(t, untar.Wait())
	return packagesOf(t, repo, src, previousVersion)
}

// repository signs the packages of both releases with a throwaway key and
// makes them one apt repository with scripts/sign.sh and scripts/repo.sh,
// as make dist SIGN_KEY and make repo do; it returns the repository's apt
// tree and the key as apt's signed-by keyring.
func repository(t *testing.T, repo string, releases ...[]string) (string, []byte) {
	t.Helper()
	dist := t.TempDir()
	for _, debs := range releases {
		// packages.sh writes each release's .rpms beside its .debs;
		// make repo wants both kinds.
		for _, glob := range []string{"*.deb", "*.rpm"} {
			files, err := filepath.Glob(filepath.Join(filepath.Dir(debs[0]), glob))
			require.NoError(t, err)
			for _, f := range files {
				data, err := os.ReadFile(f)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dist, filepath.Base(f)), data, 0o644))
			}
		}
	}
	home := t.TempDir()
	env := append(os.Environ(), "GNUPGHOME="+home)
	// gpg's agent, started in the throwaway home, goes before the home.
	t.Cleanup(func() {
		cmd := exec.Command("gpgconf", "--kill", "all")
		cmd.Env = env
		_ = cmd.Run()
	})
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s %v: %s%s", name, args, out, stderr.String())
		return string(out)
	}
	run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "salt-volumes test repository <repo@salt-volumes.invalid>", "rsa3072", "sign", "never")
	var fpr string
	for _, line := range strings.Split(run("gpg", "--batch", "--with-colons", "--list-secret-keys"), "\n") {
		if f := strings.Split(line, ":"); f[0] == "fpr" && fpr == "" {
			fpr = f[9]
		}
	}
	require.NotEmpty(t, fpr)
	run(filepath.Join(repo, "scripts", "sign.sh"), dist, fpr)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(repo, "scripts", "repo.sh"))
	cmd.Dir = repo
	cmd.Env = append(env, "DIST="+dist, "REPO="+out, "SIGN_KEY="+fpr)
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "scripts/repo.sh: %s", msg)
	keyring, err := exec.Command("gpg", "--batch", "--dearmor", "--output", "-", filepath.Join(out, "signing-key.asc")).Output()
	require.NoError(t, err)
	return filepath.Join(out, "apt"), keyring
}
