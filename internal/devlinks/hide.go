package devlinks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// HideDir holds an empty file named after the device-mapper UUID of each
// LV whose content udev must not link yet: a clone being made carries its
// origin's filesystem UUID until it gets its own, and udev gives a link
// two devices claim at equal priority to whichever it saw last, so the
// origin's /dev/disk/by-uuid link would move to the clone.
const HideDir = "/run/salt-volumes/udev-hide"

// hideRule turns udev's disk rules (the by-uuid and by-label links, the
// probe, the watch) off for a marked LV. It must sort after the rule that
// reads device-mapper's flags and before the disk rules, whose names
// differ between distributions.
var hideRule = []byte(`# Written by salt-volume-exec (salt-volumes): an LV named in ` + HideDir + `
# is a clone still carrying its origin's filesystem UUID; udev links it
# once salt-volumes gave it its own and reactivated it.
SUBSYSTEM=="block", KERNEL=="dm-*", ATTR{dm/uuid}=="LVM-?*", TEST=="` + HideDir + `/$attr{dm/uuid}", ENV{DM_UDEV_DISABLE_DISK_RULES_FLAG}="1"
# A loop device on a sparse clone's copy (<state dir>/sparse/<uuid>.clone),
# attached for its xfs log replay, is never linked.
SUBSYSTEM=="block", KERNEL=="loop*", ATTR{loop/backing_file}=="*/sparse/*.clone", ENV{UDEV_DISABLE_PERSISTENT_STORAGE_RULES_FLAG}="1"
`)

// rulesDirs are where udev reads rules, the runtime directory among them.
var rulesDirs = []string{"/etc/udev/rules.d", "/run/udev/rules.d", "/usr/local/lib/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d"}

// hideRulePath places the rule just before the device-mapper disk rules:
// upstream's 13-dm-disk.rules, Debian's 60-persistent-storage-dm.rules;
// both sort before systemd's 60-persistent-storage.rules, which links loop
// devices. dm says whether device-mapper's disk rules were found.
func hideRulePath() (path string, dm bool) {
	for _, c := range []struct{ disk, ours string }{
		{"13-dm-disk.rules", "12-salt-volumes-hide.rules"},
		{"60-persistent-storage-dm.rules", "59-salt-volumes-hide.rules"},
	} {
		for _, d := range rulesDirs {
			if _, err := os.Stat(filepath.Join(d, c.disk)); err == nil {
				return filepath.Join("/run/udev/rules.d", c.ours), true
			}
		}
	}
	return "/run/udev/rules.d/59-salt-volumes-hide.rules", false
}

// Hide marks the LV with device-mapper UUID dmuuid so that udev neither
// probes nor links it from its next event on (activate it afterwards), and
// puts the rule that reads the mark in udev's runtime rules. Without udev
// it does nothing.
func Hide(ctx context.Context, dmuuid string) error {
	if !UdevRunning() {
		return nil
	}
	if !strings.HasPrefix(dmuuid, "LVM-") || strings.ContainsAny(dmuuid, "/\x00") {
		return fmt.Errorf("device-mapper UUID %q is not an LV's", dmuuid)
	}
	if dm, err := EnsureHideRule(ctx); err != nil {
		return err
	} else if !dm {
		return errors.New("udev runs but neither 13-dm-disk.rules nor 60-persistent-storage-dm.rules (device-mapper's disk rules) is in " + strings.Join(rulesDirs, ", ") +
			": salt-volumes cannot keep a clone from taking its origin's /dev/disk/by-uuid link; install device-mapper's udev rules (the dmsetup package on Debian and Ubuntu, device-mapper on RHEL and SUSE)")
	}
	if err := os.MkdirAll(HideDir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(HideDir, dmuuid), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// EnsureHideRule puts the rule that hides marked LVs and clones' loop
// devices from udev's disk rules in udev's runtime rules (once: udev
// reloads its rules when it changed), and says whether device-mapper's
// disk rules were found for it to sort before. Without udev it does
// nothing.
func EnsureHideRule(ctx context.Context) (dm bool, err error) {
	if !UdevRunning() {
		return true, nil
	}
	rule, dm := hideRulePath()
	if old, err := os.ReadFile(rule); err != nil || !bytes.Equal(old, hideRule) {
		if err := os.MkdirAll(filepath.Dir(rule), 0o755); err != nil {
			return dm, err
		}
		// Clones of two volumes may write it at once: each its own temp.
		tmp, err := os.CreateTemp(filepath.Dir(rule), "."+filepath.Base(rule)+".")
		if err != nil {
			return dm, err
		}
		_, err = tmp.Write(hideRule)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(tmp.Name(), 0o644)
		}
		if err == nil {
			err = os.Rename(tmp.Name(), rule)
		}
		if err != nil {
			os.Remove(tmp.Name())
			return dm, err
		}
		// udevd reads its rules again before the next event it handles.
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(rctx, "udevadm", "control", "--reload").CombinedOutput(); err != nil {
			return dm, fmt.Errorf("udevadm control --reload: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return dm, nil
}

// Hidden tells whether the LV is marked (true without udev: there is
// nothing to hide it from).
func Hidden(dmuuid string) bool {
	if !UdevRunning() {
		return true
	}
	_, err := os.Stat(filepath.Join(HideDir, dmuuid))
	return err == nil
}

// Unhide removes the LV's mark; udev links it at its next activation
// (not at a mere change event: device-mapper's rules keep the flags of the
// last activation for those).
func Unhide(dmuuid string) error {
	if dmuuid == "" || strings.ContainsAny(dmuuid, "/\x00") {
		return nil
	}
	err := os.Remove(filepath.Join(HideDir, dmuuid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
