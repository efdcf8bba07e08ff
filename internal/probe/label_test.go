package probe

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Labels read from images the real tools made, checked against libblkid.
func TestLabelsAsBlkidReadsThem(t *testing.T) {
	cases := []struct {
		kind  string
		size  int64
		label string
		mkfs  []string
	}{
		{"ext4", 16 << 20, "data-01", []string{"mkfs.ext4", "-q", "-F", "-L", "data-01"}},
		{"ext4", 16 << 20, "sixteen-chars-xx", []string{"mkfs.ext4", "-q", "-F", "-L", "sixteen-chars-xx"}},
		{"xfs", 320 << 20, "xfs-label12", []string{"mkfs.xfs", "-q", "-f", "-L", "xfs-label12"}},
		{"swap", 16 << 20, "swaplabel", []string{"mkswap", "-L", "swaplabel"}},
		{"btrfs", 128 << 20, "btrfs label", []string{"mkfs.btrfs", "-q", "-f", "-L", "btrfs label"}},
		{"ext4", 16 << 20, "", []string{"mkfs.ext4", "-q", "-F"}},
	}
	for _, c := range cases {
		t.Run(c.kind+"/"+c.label, func(t *testing.T) {
			if _, err := exec.LookPath(c.mkfs[0]); err != nil {
				t.Skipf("%s is not installed", c.mkfs[0])
			}
			img := filepath.Join(t.TempDir(), "img")
			require.NoError(t, os.WriteFile(img, nil, 0o600))
			require.NoError(t, os.Truncate(img, c.size))
			out, err := exec.Command(c.mkfs[0], append(c.mkfs[1:], img)...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			f, err := os.Open(img)
			require.NoError(t, err)
			defer f.Close()
			r, err := Device(f, c.size, 512)
			require.NoError(t, err)
			assert.Equal(t, c.kind, r.Kind)
			assert.Equal(t, c.label, r.Label)
			b, _ := exec.Command("blkid", "-p", "-o", "value", "-s", "LABEL", img).Output()
			assert.Equal(t, strings.TrimSpace(string(b)), r.Label, "libblkid reads another label")
		})
	}
}
