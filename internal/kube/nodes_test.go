package kube

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNodeMapDefaultIsTheMinionID(t *testing.T) {
	m := &NodeMap{}
	n, err := m.NodeName("node-1")
	require.NoError(t, err)
	assert.Equal(t, "node-1", n)
	id, err := m.Minion(context.Background(), "node-1")
	require.NoError(t, err)
	assert.Equal(t, "node-1", id)
}

func TestNodeMapFromAGrain(t *testing.T) {
	calls := 0
	grains := map[string]string{"m1": `"w1.example.com"`, "m2": `"w2.example.com"`, "m3": `""`, "m4": `"dup"`, "m5": `"dup"`, "m6": `{"not":"a string"}`}
	m := &NodeMap{Grain: "k8s_node", Fetch: func(_ context.Context, grain string) (map[string]json.RawMessage, error) {
		calls++
		assert.Equal(t, "k8s_node", grain)
		out := map[string]json.RawMessage{}
		for k, v := range grains {
			out[k] = json.RawMessage(v)
		}
		return out, nil
	}}
	ctx := context.Background()
	id, err := m.Minion(ctx, "w2.example.com")
	require.NoError(t, err)
	assert.Equal(t, "m2", id)
	n, err := m.NodeName("m1")
	require.NoError(t, err)
	assert.Equal(t, "w1.example.com", n)
	assert.Equal(t, 1, calls, "answers are kept")

	id, err = m.Minion(ctx, "dup")
	require.NoError(t, err)
	assert.Empty(t, id, "two minions claiming one node: neither")
	_, err = m.NodeName("m3")
	assert.ErrorContains(t, err, "grains.setval k8s_node", "an empty grain says how to set it")

	grains["m7"] = `"w7"`
	id, err = m.Minion(ctx, "w7")
	require.NoError(t, err)
	assert.Equal(t, "m7", id, "an unknown name asks again at once")
}
