package blockdev

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUnescapeMountinfo(t *testing.T) {
	assert.Equal(t, "/mnt/my data", unescape(`/mnt/my\040data`))
	assert.Equal(t, "/plain", unescape("/plain"))
	assert.Equal(t, `/odd\x`, unescape(`/odd\x`))
}

func TestUsageString(t *testing.T) {
	u := Usage{Mountpoints: []string{"/mnt"}, Holders: []string{"dm-0"}}
	assert.True(t, u.InUse())
	assert.Equal(t, "mounted on /mnt and held by dm-0", u.String())
	assert.False(t, Usage{}.InUse())
}
