package engine

import (
	"strings"
	"testing"

	"github.com/salt-volumes/salt-volumes/internal/blockdev"
	"github.com/salt-volumes/salt-volumes/internal/probe"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const volUUID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"

func testSpec(t *testing.T, mode, fs string) *spec.Spec {
	t.Helper()
	s := &spec.Spec{Name: "data-1", UUID: volUUID, Mode: mode, FSType: fs,
		RawBlockDevice: &spec.RawBlockDevice{DevicePath: "/dev/sdb"}}
	require.NoError(t, s.Validate())
	return s
}

// wantErr checks an engine error's exit kind, code and message.
func wantErr(t *testing.T, err error, kind int, code, inMsg string) {
	t.Helper()
	require.Error(t, err)
	e := AsError(err)
	assert.Equal(t, kind, e.Kind, e.Message)
	assert.Equal(t, code, e.Code, e.Message)
	assert.Contains(t, e.Message, inMsg)
}

func TestDecideTarget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		f        targetFacts
		code, in string
	}{
		{"blank, unused, whole", targetFacts{Path: "/dev/sdb"}, "", ""},
		{"part of a volume", targetFacts{Path: "/dev/loop3p1", HeldBy: "blk-1"}, "device_conflict", "volume blk-1"},
		{"mounted", targetFacts{Path: "/dev/sdb", Usage: blockdev.Usage{Mountpoints: []string{"/mnt"}}}, "in_use", "mounted on /mnt"},
		{"held by dm", targetFacts{Path: "/dev/sdb", Usage: blockdev.Usage{Holders: []string{"dm-0"}}}, "in_use", "held by dm-0"},
		{"backs a loop device", targetFacts{Path: "/dev/sdb", Usage: blockdev.Usage{LoopBacked: []string{"loop7"}}}, "in_use", "backing file of loop7"},
		{"claimed in another namespace", targetFacts{Path: "/dev/sdb", Busy: blockdev.ErrBusy}, "in_use", "exclusively"},
		{"our probe sees ext4", targetFacts{Path: "/dev/sdb", Own: probe.Result{Kind: "ext4", UUID: "u"}}, "foreign_data", "ext4 filesystem"},
		{"only libblkid sees it", targetFacts{Path: "/dev/sdb", Signatures: []probe.Signature{{Type: "ceph_bluestore", Offset: "0x0"}}}, "foreign_data", "ceph_bluestore"},
		{"partitioned", targetFacts{Path: "/dev/sdb", Children: []string{"sdb1"}}, "foreign_data", "sdb1"},
		{"held wins over blank", targetFacts{Path: "/dev/sdb", HeldBy: "x", Own: probe.Result{}}, "device_conflict", "volume x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decideTarget(tc.f)
			if tc.code == "" {
				require.NoError(t, err)
				return
			}
			wantErr(t, err, KindRefused, tc.code, tc.in)
			assert.Contains(t, AsError(err).Message, devicePathField, "names the field")
		})
	}
}

func TestDecideContent(t *testing.T) {
	ext4 := probe.Result{Kind: "ext4", UUID: "other"}
	for _, tc := range []struct {
		name     string
		mode, fs string
		c        contentFacts
		want     contentAction
		code, in string
	}{
		{"ours: keep", "Filesystem", "ext4", contentFacts{Ours: true, Formatted: true}, keepContent, "", ""},
		{"blank, never written: write", "Filesystem", "ext4", contentFacts{}, writeContent, "", ""},
		{"our file, interrupted mkfs: redo", "Filesystem", "xfs", contentFacts{Found: probe.Result{Kind: "xfs"}, OurFile: true}, rewriteContent, "", ""},
		{"superblock zeroed after prepare: never mkfs again", "Filesystem", "ext4", contentFacts{Where: "/dev/loop3", Formatted: true}, 0, "damaged", "e2fsck -b 32768 /dev/loop3"},
		{"xfs damaged", "Filesystem", "xfs", contentFacts{Where: "/dev/loop3", Formatted: true}, 0, "damaged", "xfs_repair /dev/loop3"},
		{"GPT damaged", "Block", "", contentFacts{Where: "/dev/loop3", Formatted: true, Found: ext4}, 0, "damaged", "gdisk /dev/loop3"},
		{"foreign on a raw device we never wrote", "Filesystem", "ext4", contentFacts{Where: "/dev/sdb", Found: ext4}, 0, "foreign_data", "did not write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec(t, tc.mode, tc.fs)
			act, err := decideContent(s, tc.c)
			if tc.code == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.want, act)
				return
			}
			wantErr(t, err, KindRefused, tc.code, tc.in)
		})
	}
}

func TestDecideUUID(t *testing.T) {
	s := testSpec(t, "Filesystem", "ext4")
	require.NoError(t, decideUUID(s, nil, nil), "nobody carries it")
	require.NoError(t, decideUUID(s, []carrier{{"loop3", "ext4 filesystem UUID"}}, map[string]bool{"loop3": true}), "our own device")
	err := decideUUID(s, []carrier{{"loop3", "ext4 filesystem UUID"}, {"vda1", "ext4 filesystem UUID"}}, map[string]bool{"loop3": true})
	wantErr(t, err, KindRefused, "uuid_in_use", "/dev/vda1")
	assert.Contains(t, AsError(err).Message, "uuid: ")
}

func TestLinkIsOurs(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    linkFacts
		want bool
	}{
		{"no link", linkFacts{}, true},
		{"names our device", linkFacts{Target: "loop3", Exists: true, Carries: true}, true},
		{"dangling", linkFacts{Target: "loop9"}, true},
		{"stale: device reused, no UUID", linkFacts{Target: "loop9", Exists: true}, true},
		{"another device with the UUID", linkFacts{Target: "vda1", Exists: true, Carries: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, linkIsOurs(tc.l, "loop3"))
		})
	}
}

func TestDecideWipe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode, fs string
		w        wipeFacts
		want     wipeAction
		code     string
	}{
		{"our ext4", "Filesystem", "ext4", wipeFacts{Written: "ext4", Ours: true}, wipeSuperblock, ""},
		{"signature gone", "Filesystem", "ext4", wipeFacts{Written: "ext4"}, wipeNothing, "foreign_data"},
		{"our table", "Block", "", wipeFacts{Written: "gpt", Ours: true, OurLayout: true, DiskGUID: "d", RecordedDiskGUID: "d"}, wipeTable, ""},
		{"a table with our GUID but not our disk GUID", "Block", "", wipeFacts{Written: "gpt", Ours: true, OurLayout: true, DiskGUID: "x", RecordedDiskGUID: "d"}, wipeNothing, "foreign_data"},
		{"a table with more partitions", "Block", "", wipeFacts{Written: "gpt", Ours: true, DiskGUID: "d", RecordedDiskGUID: "d"}, wipeNothing, "foreign_data"},
		{"partition GUID", "Block", "", wipeFacts{Written: "guid", Ours: true}, resetGUID, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act, err := decideWipe(testSpec(t, tc.mode, tc.fs), "/dev/sdb", tc.w)
			assert.Equal(t, tc.want, act)
			if tc.code == "" {
				require.NoError(t, err)
				return
			}
			wantErr(t, err, KindRefused, tc.code, "/dev/sdb")
		})
	}
	_, err := decideWipe(testSpec(t, "Filesystem", "ext4"), "/dev/sdb", wipeFacts{Ours: true})
	assert.Equal(t, KindFailed, AsError(err).Kind, "a record that says nothing was written wipes nothing")
}

func TestDecideLabels(t *testing.T) {
	data := wantedLabel{"LABEL", "data"}
	part := wantedLabel{"PARTLABEL", "data-1"}
	assert.NoError(t, decideLabels(nil, nil))
	assert.NoError(t, decideLabels([]labelHolder{{carrier{"loop3", "ext4 filesystem label"}, data}}, map[string]bool{"loop3": true}),
		"our own device carrying the label is this volume's")
	wantErr(t, decideLabels([]labelHolder{{carrier{"sda2", "ext4 filesystem label"}, data}}, nil),
		KindRefused, "label_in_use", "mkfsOptions: LABEL=data is already carried by /dev/sda2 (ext4 filesystem label)")
	wantErr(t, decideLabels([]labelHolder{{carrier{"sdb", "GPT name of partition 1"}, part}}, map[string]bool{"loop3": true}),
		KindRefused, "label_in_use", "name: PARTLABEL=data-1 is already carried by /dev/sdb")
}

func TestUdevEncode(t *testing.T) {
	assert.Equal(t, "data-1_x.y:z=@#+", udevEncode("data-1_x.y:z=@#+"))
	assert.Equal(t, `my\x20data\x2fx`, udevEncode("my data/x"))
	assert.Equal(t, "dätä", udevEncode("dätä"), "valid UTF-8 is kept")
	assert.Equal(t, `a\xffb`, udevEncode("a\xffb"))
}

func TestLabelsOf(t *testing.T) {
	s := testSpec(t, spec.ModeFilesystem, spec.FSExt4)
	s.MkfsOptions = []string{"-m", "0", "-L", "data"}
	assert.Equal(t, []wantedLabel{{"LABEL", "data"}}, labelsOf(s, nil))
	s.MkfsOptions = []string{"-Ldata2"}
	assert.Equal(t, []wantedLabel{{"LABEL", "data2"}}, labelsOf(s, nil))
	s.MkfsOptions = nil
	assert.Empty(t, labelsOf(s, nil))
}

func TestValidSnapshotName(t *testing.T) {
	for n, want := range map[string]bool{
		"a": true, "nightly": true, "before-upgrade.1": true, "0": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, ".a": false, "a.": false, "A": false, "a_b": false, "a/b": false,
		strings.Repeat("a", 64): false, "é": false,
	} {
		if got := validSnapshotName(n); got != want {
			t.Errorf("validSnapshotName(%q) = %v, want %v", n, got, want)
		}
	}
}

// A partition udev's re-read took away is known as ours by its name alone.
func TestPartitionOfAny(t *testing.T) {
	mine := map[string]bool{"loop3": true, "sda": true, "nvme0n1": true}
	for name, want := range map[string]bool{
		"loop3p1": true, "loop3p12": true, "sda1": true, "nvme0n1p2": true,
		"loop31p1": false, "loop3": false, "loop3p": false, "loop31": false,
		"sdab": false, "sdb1": false, "nvme0n10p1": false, "loop3p1x": false,
	} {
		assert.Equal(t, want, partitionOfAny(name, mine), name)
	}
}
