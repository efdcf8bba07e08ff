package leader

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
)

func TestDescribe(t *testing.T) {
	id, url := Describe("vm:8080 http://127.0.0.1:8080 3f2a9c0b11de")
	assert.Equal(t, "vm:8080", id)
	assert.Equal(t, "http://127.0.0.1:8080", url)
	id, url = Describe("replica-1 http://10.0.0.1:8080")
	assert.Equal(t, "replica-1", id)
	assert.Equal(t, "http://10.0.0.1:8080", url)
}

// A second process with the same replica id (a restarted container, or
// two replicas configured alike) waits for the Lease like anyone else
// instead of taking it as its own while the first still leads.
func TestSameIDDoesNotShareTheLease(t *testing.T) {
	cs := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(l *Lease, leading chan<- *Lease) {
		go func() {
			_ = l.Run(ctx, func(tctx context.Context, _ func() error) {
				leading <- l
				<-tctx.Done()
			})
		}()
	}
	leading := make(chan *Lease, 2)
	first := &Lease{Client: cs, Namespace: "ns", Duration: 3 * time.Second, ID: "vm:8080", URL: "http://127.0.0.1:8080"}
	run(first, leading)
	select {
	case l := <-leading:
		require.Same(t, first, l)
	case <-time.After(10 * time.Second):
		t.Fatal("the first replica did not lead")
	}
	second := &Lease{Client: cs, Namespace: "ns", Duration: 3 * time.Second, ID: "vm:8080", URL: "http://127.0.0.1:8080"}
	run(second, leading)
	select {
	case l := <-leading:
		t.Fatalf("%p leads too, beside the first", l)
	case <-time.After(5 * time.Second):
	}
	assert.True(t, first.Leading())
	assert.False(t, second.Leading())
	id, url := Describe(second.Leader())
	assert.Equal(t, "vm:8080", id, "the follower names the leader")
	assert.Equal(t, "http://127.0.0.1:8080", url)
}
