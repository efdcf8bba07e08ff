package saltstack

import (
	"testing"
	"time"
)

// A Salt command asked to wait longer than the default cap is not killed
// before its own timeout.
func TestRunLimitCoversTheCommandsTimeout(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"node-1", "test.ping"}, 5 * time.Minute},
		{[]string{"--timeout=60", "node-1", "test.ping"}, 5 * time.Minute},
		{[]string{"--timeout=600", "-L", "a,b", "state.apply"}, 12 * time.Minute},
		{[]string{"--timeout=x", "node-1"}, 5 * time.Minute},
	} {
		if got := runLimit(c.args); got != c.want {
			t.Errorf("runLimit(%q) = %s, want %s", c.args, got, c.want)
		}
	}
}
