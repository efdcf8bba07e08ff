package lvm

import (
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
