package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"
)

// NodeMap maps Salt minion ids to Kubernetes node names: equal by default,
// or the value of a grain on each minion (when nodes are named after
// something else than the minion id, e.g. the FQDN).
type NodeMap struct {
	// Grain names the grain holding the node name; empty: names are equal.
	Grain string
	// Fetch asks every minion for the grain (salt '*' grains.get <grain>);
	// the answer comes from the master's authenticated returns.
	Fetch func(ctx context.Context, grain string) (map[string]json.RawMessage, error)
	// MaxAge is how long an answer is used (default 1m); a name not found
	// asks again at once.
	MaxAge time.Duration

	mu      sync.Mutex
	byNode  map[string]string
	byMin   map[string]string
	fetched time.Time
}

// NodeName is the Kubernetes node name of a minion.
func (m *NodeMap) NodeName(minion string) (string, error) {
	if m.Grain == "" {
		return minion, nil
	}
	m.mu.Lock()
	n, ok := m.byMin[minion]
	m.mu.Unlock()
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.refresh(ctx); err != nil {
			return "", err
		}
		m.mu.Lock()
		n, ok = m.byMin[minion]
		m.mu.Unlock()
	}
	if !ok {
		return "", fmt.Errorf("minion %s has no grain %s: set it to the minion's Kubernetes node name (salt %s grains.setval %s <node name>)", minion, m.Grain, minion, m.Grain)
	}
	return n, nil
}

// Minion is the Salt minion of a Kubernetes node; "" when none is known.
func (m *NodeMap) Minion(ctx context.Context, node string) (string, error) {
	if m.Grain == "" {
		return node, nil
	}
	m.mu.Lock()
	id, ok := m.byNode[node]
	stale := time.Since(m.fetched) > m.maxAge()
	m.mu.Unlock()
	if ok && !stale {
		return id, nil
	}
	if err := m.refresh(ctx); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byNode[node], nil
}

func (m *NodeMap) maxAge() time.Duration {
	if m.MaxAge > 0 {
		return m.MaxAge
	}
	return time.Minute
}

func (m *NodeMap) refresh(ctx context.Context) error {
	if m.Fetch == nil {
		return fmt.Errorf("kubernetes.nodeNameGrain is set but the control plane cannot ask Salt for grains")
	}
	raw, err := m.Fetch(ctx, m.Grain)
	if err != nil {
		return fmt.Errorf("reading grain %s from the minions: %w", m.Grain, err)
	}
	byNode, byMin := map[string]string{}, map[string]string{}
	dup := map[string][]string{}
	for id, v := range raw {
		var name string
		if json.Unmarshal(v, &name) != nil || name == "" {
			continue
		}
		byMin[id] = name
		dup[name] = append(dup[name], id)
		byNode[name] = id
	}
	for name, ids := range dup {
		if len(ids) > 1 {
			// Two minions claiming one node: provision on neither.
			sort.Strings(ids)
			delete(byNode, name)
			for _, id := range ids {
				delete(byMin, id)
			}
		}
	}
	m.mu.Lock()
	m.byNode, m.byMin, m.fetched = byNode, byMin, time.Now()
	m.mu.Unlock()
	return nil
}
