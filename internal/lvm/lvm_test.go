package lvm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Reports as lvm2 2.03 prints them (Debian 12's guest).
func TestParseReports(t *testing.T) {
	lvs, err := ParseLVs([]byte(`  {
      "report": [
          {
              "lv": [
                  {"lv_name":"data", "vg_name":"vg0", "lv_uuid":"Jf1V2d-0d9Q-yZ9y-5c1u-R1xH-2yVb-8XwQ1b", "vg_uuid":"aaaaaa-bbbb-cccc-dddd-eeee-ffff-gggggg", "lv_size":"67108864", "lv_tags":"salt-volumes.io/uuid=3f2504e0-4f89-41d3-9a0c-0305e82c3301,other", "lv_active":"active", "lv_path":"/dev/vg0/data"},
                  {"lv_name":"hand", "vg_name":"vg0", "lv_uuid":"x", "vg_uuid":"y", "lv_size":"4194304", "lv_tags":"", "lv_active":"", "lv_path":""}
              ]
          }
      ]
  }`))
	require.NoError(t, err)
	require.Len(t, lvs, 2)
	assert.Equal(t, int64(64<<20), lvs[0].Size)
	assert.True(t, lvs[0].Active)
	assert.True(t, lvs[0].HasTag("salt-volumes.io/uuid=3f2504e0-4f89-41d3-9a0c-0305e82c3301"))
	assert.False(t, lvs[0].HasTag("salt-volumes.io/uuid="))
	assert.Equal(t, "LVM-aaaaaabbbbccccddddeeeeffffggggggJf1V2d0d9QyZ9y5c1uR1xH2yVb8XwQ1b", lvs[0].DMUUID())
	assert.False(t, lvs[1].Active)
	assert.Empty(t, lvs[1].Tags)

	vgs, err := ParseVGs([]byte(`{"report":[{"vg":[{"vg_name":"vg0","vg_uuid":"u","vg_size":"1069547520","vg_free":"998244352","vg_extent_size":"4194304"}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, []VG{{Name: "vg0", UUID: "u", Size: 1069547520, Free: 998244352, ExtentSize: 4 << 20}}, vgs)

	// A thick snapshot 85.5 % full, and one that overflowed.
	snaps, err := ParseLVs([]byte(`{"report":[{"lv":[
	  {"lv_name":"s1","vg_name":"vg0","lv_size":"8388608","origin":"data","pool_lv":"","data_percent":"85.50","lv_attr":"swi-a-s---","lv_time":"2026-11-27 09:21:22 +0100"},
	  {"lv_name":"s2","vg_name":"vg0","lv_size":"8388608","origin":"data","pool_lv":"","data_percent":"100.00","lv_attr":"swi-I-s---"},
	  {"lv_name":"t1","vg_name":"vg0","lv_size":"8388608","origin":"thin","pool_lv":"pool","data_percent":"","lv_attr":"Vwi---tz-k"},
	  {"lv_name":"pool","vg_name":"vg0","lv_size":"50331648","origin":"","pool_lv":"","data_percent":"12.50","metadata_percent":"10.84","lv_attr":"twi-aotz--"}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, 85.5, snaps[0].DataPercent)
	assert.Equal(t, "data", snaps[0].Origin)
	assert.False(t, snaps[0].Invalid)
	assert.True(t, snaps[1].Invalid, "state I: overflowed")
	assert.Equal(t, time.Date(2026, 11, 27, 8, 21, 22, 0, time.UTC), snaps[0].Created, "lv_time, in UTC")
	assert.True(t, snaps[1].Created.IsZero(), "no lv_time: zero")
	assert.Equal(t, "pool", snaps[2].Pool)
	assert.Equal(t, -1.0, snaps[2].DataPercent, "inactive: no percent")
	assert.Equal(t, -1.0, snaps[0].MetadataPercent, "not a pool: no metadata percent")
	assert.Equal(t, 10.84, snaps[3].MetadataPercent, "a thin pool's metadata")
	assert.Equal(t, 12.5, snaps[3].DataPercent)

	_, err = ParseLVs([]byte("  WARNING: not json"))
	assert.Error(t, err)
}

// lvs -a with the restore's fields, in the shape lvm2 2.03 prints it
// (`lvs -a --reportformat json --units b --nosuffix -o ...,lv_merging,
// lv_merge_failed,thin_id vg0`): a thick origin merging its hidden
// snapshot, a thin pool's hidden parts, a thin LV and its snapshot, and a
// linear LV of two segments (one row each, thin_id being a segment's
// field).
func TestParseAll(t *testing.T) {
	lvs, err := ParseAll([]byte(`  {
      "report": [
          {
              "lv": [
                  {"lv_name":"data", "vg_name":"vg0", "lv_uuid":"o1", "vg_uuid":"v", "lv_size":"33554432", "lv_tags":"salt-volumes.io/uuid=3f2504e0-4f89-41d3-9a0c-0305e82c3301", "lv_active":"active", "lv_path":"/dev/vg0/data", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_attr":"Owi-a-s---", "lv_time":"2026-11-27 09:21:22 +0100", "lv_merging":"merging", "lv_merge_failed":"", "thin_id":""},
                  {"lv_name":"[svsnap-3f2504e0-s1]", "vg_name":"vg0", "lv_uuid":"s1", "vg_uuid":"v", "lv_size":"16777216", "lv_tags":"salt-volumes.io/uuid=3f2504e0-4f89-41d3-9a0c-0305e82c3301/snapshot=s1", "lv_active":"active", "lv_path":"", "pool_lv":"", "origin":"data", "data_percent":"12.00", "metadata_percent":"", "lv_attr":"Swi-a-s---", "lv_time":"2026-11-27 09:22:00 +0100", "lv_merging":"merging", "lv_merge_failed":"", "thin_id":""},
                  {"lv_name":"pool", "vg_name":"vg0", "lv_uuid":"p", "vg_uuid":"v", "lv_size":"50331648", "lv_tags":"", "lv_active":"active", "lv_path":"", "pool_lv":"", "origin":"", "data_percent":"12.50", "metadata_percent":"10.84", "lv_attr":"twi-aotz--", "lv_time":"", "lv_merging":"", "lv_merge_failed":"unknown", "thin_id":""},
                  {"lv_name":"[pool_tdata]", "vg_name":"vg0", "lv_uuid":"pt", "vg_uuid":"v", "lv_size":"50331648", "lv_tags":"", "lv_active":"active", "lv_path":"", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_attr":"Twi-ao----", "lv_time":"", "lv_merging":"", "lv_merge_failed":"unknown", "thin_id":""},
                  {"lv_name":"thin", "vg_name":"vg0", "lv_uuid":"t", "vg_uuid":"v", "lv_size":"33554432", "lv_tags":"", "lv_active":"", "lv_path":"", "pool_lv":"pool", "origin":"", "data_percent":"", "metadata_percent":"", "lv_attr":"Vwi---tz--", "lv_time":"", "lv_merging":"", "lv_merge_failed":"unknown", "thin_id":"1"},
                  {"lv_name":"[svsnap-aaaaaaaa-t1]", "vg_name":"vg0", "lv_uuid":"t1", "vg_uuid":"v", "lv_size":"33554432", "lv_tags":"", "lv_active":"", "lv_path":"", "pool_lv":"pool", "origin":"thin", "data_percent":"", "metadata_percent":"", "lv_attr":"Vwi---tz-k", "lv_time":"", "lv_merging":"merging", "lv_merge_failed":"merge failed", "thin_id":"2"},
                  {"lv_name":"two", "vg_name":"vg0", "lv_uuid":"2s", "vg_uuid":"v", "lv_size":"8388608", "lv_tags":"", "lv_active":"active", "lv_path":"/dev/vg0/two", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_attr":"-wi-a-----", "lv_time":"", "lv_merging":"", "lv_merge_failed":"", "thin_id":""},
                  {"lv_name":"two", "vg_name":"vg0", "lv_uuid":"2s", "vg_uuid":"v", "lv_size":"8388608", "lv_tags":"", "lv_active":"active", "lv_path":"/dev/vg0/two", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_attr":"-wi-a-----", "lv_time":"", "lv_merging":"", "lv_merge_failed":"", "thin_id":""}
              ]
          }
      ]
  }`))
	require.NoError(t, err)
	require.Len(t, lvs, 7, "the two rows of LV two (a segment each) are one LV")
	data, cow, pool, tdata, thin, tsnap, two := lvs[0], lvs[1], lvs[2], lvs[3], lvs[4], lvs[5], lvs[6]
	assert.True(t, data.Merging, "the origin a snapshot merges into")
	assert.False(t, data.Hidden)
	assert.Equal(t, "svsnap-3f2504e0-s1", cow.Name, "the hidden snapshot's name without brackets")
	assert.True(t, cow.Hidden)
	assert.True(t, cow.Merging)
	assert.Equal(t, "data", cow.Origin)
	assert.True(t, cow.HasTag("salt-volumes.io/uuid=3f2504e0-4f89-41d3-9a0c-0305e82c3301/snapshot=s1"))
	assert.False(t, pool.MergeFailed, "unknown: not failed")
	assert.Equal(t, "pool_tdata", tdata.Name)
	assert.True(t, tdata.Hidden)
	assert.Equal(t, "1", thin.ThinID)
	assert.False(t, thin.Active)
	assert.Equal(t, "2", tsnap.ThinID)
	assert.True(t, tsnap.MergeFailed)
	assert.Equal(t, "", two.ThinID)
	assert.Equal(t, "2s", two.UUID)

	// Reported as numbers (report/binary_values_as_numeric = 1).
	n, err := ParseAll([]byte(`{"report":[{"lv":[{"lv_name":"a","vg_name":"vg0","lv_uuid":"a","lv_merging":"1","lv_merge_failed":"0","thin_id":"7"}]}]}`))
	require.NoError(t, err)
	assert.True(t, n[0].Merging)
	assert.False(t, n[0].MergeFailed)
	assert.Equal(t, "7", n[0].ThinID)
}

// A cancelled LVM tool is asked to stop (SIGTERM, which LVM holds off in
// its critical sections), not killed at once.
func TestRunStopsAToolWithSIGTERM(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "termed")
	script := "#!/bin/sh\ntrap 'echo term > " + mark + "; exit 5' TERM\nwhile :; do sleep 0.05; done\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lvs"), []byte(script), 0o755))
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := run(ctx, "lvs")
	require.Error(t, err)
	b, rerr := os.ReadFile(mark)
	require.NoError(t, rerr, "the tool got SIGTERM and ran its handler")
	assert.Equal(t, "term\n", string(b))
}
