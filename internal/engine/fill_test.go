package engine

import (
	"strings"
	"testing"

	"github.com/salt-volumes/salt-volumes/internal/lvm"
)

// A thin pool fills up otherwise than a thick snapshot: the warning says
// what a full pool does (every thin LV in it stops taking writes), looks at
// its metadata as well as its data, and a snapshot whose data is gone is
// marked lost.
func TestFillWarnings(t *testing.T) {
	for _, c := range []struct {
		data, meta float64
		want, not  string
	}{
		{50, -1, "", ""},
		{85, -1, "over 80% full: at 100% LVM drops the snapshot", "thin pool"},
		{96, -1, "over 95% full", ""},
		{50, 10, "", ""},
		{85, 10, "thin pool vg0/pool is filling (data over 80%): when either is full the pool stops taking writes and every thin LV in it", "metadata over"},
		{10, 91, "(metadata over 90%)", "(data over"},
		{95.5, 80, "(data over 95%, metadata over 80%)", "snapshot is lost"},
	} {
		got := fillWarning("vg0/pool", c.data, c.meta)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) || c.not != "" && strings.Contains(got, c.not) {
			t.Errorf("data %g%%, metadata %g%%: %q", c.data, c.meta, got)
		}
	}

	lvs := []lvm.LV{
		{Name: "pool", VG: "vg0", DataPercent: 20, MetadataPercent: 88},
		{Name: "thin", VG: "vg0", Pool: "pool", Tags: []string{"salt-volumes.io/uuid=u"}, DataPercent: 30, MetadataPercent: -1},
		{Name: "svsnap-u-t1", VG: "vg0", UUID: "a", Pool: "pool", Tags: []string{"salt-volumes.io/uuid=u/snapshot=t1"}, DataPercent: -1, MetadataPercent: -1},
		{Name: "svsnap-u-s1", VG: "vg0", UUID: "b", Invalid: true, DataPercent: 100, MetadataPercent: -1},
		{Name: "other", VG: "vg1", Pool: "theirs", DataPercent: 1, MetadataPercent: -1},
		{Name: "theirs", VG: "vg1", DataPercent: 99, MetadataPercent: 99},
	}
	snaps := []*Snapshot{
		{Name: "t1", Phase: SnapshotTaken, LV: "vg0/svsnap-u-t1", LVUUID: "a"},
		{Name: "s1", Phase: SnapshotTaken, LV: "vg0/svsnap-u-s1", LVUUID: "b"},
		{Name: "g1", Phase: SnapshotTaken, LV: "vg0/svsnap-u-g1", LVUUID: "c"},
		{Name: "m1", Phase: SnapshotTaken, LV: "vg9/svsnap-u-m1", LVUUID: "d"},
	}
	fillFrom(snaps, lvs)
	if snaps[0].MetadataPercent == nil || *snaps[0].MetadataPercent != 88 || !strings.Contains(snaps[0].Warning, "metadata over 80%") || snaps[0].Lost {
		t.Errorf("thin snapshot in a pool with 88%% metadata: %+v", snaps[0])
	}
	if !snaps[1].Lost || !strings.HasPrefix(snaps[1].Warning, "overflowed") {
		t.Errorf("overflowed thick snapshot: %+v", snaps[1])
	}
	if !snaps[2].Lost || !strings.Contains(snaps[2].Warning, "is gone") {
		t.Errorf("snapshot whose LV is gone: %+v", snaps[2])
	}
	if snaps[3].Lost || !strings.Contains(snaps[3].Warning, "not visible") {
		t.Errorf("snapshot in a volume group LVM does not see now: %+v (not lost: it may come back)", snaps[3])
	}
	pools := thinPools(lvs)
	if len(pools) != 1 || pools[0].Name != "vg0/pool" || pools[0].DataPercent != 20 || pools[0].MetadataPercent != 88 {
		t.Errorf("thin pools reported: %+v (want vg0/pool only: vg1/theirs holds nothing of ours)", pools)
	}
}
