// Package scenario is the end-to-end user scenario that both the loopback
// stack (test/controlplane) and the Vagrant cluster (make vagrant-e2e, through
// test/e2e) run: on every node, create one volume of each kind through the
// salt-volumes CLI, check each on its node through Salt (blkid behind the
// persistent path, the node binary's own records), read back the Kubernetes
// PersistentVolume the CLI prints for it, delete them all and check that
// nothing is left.
//
// It only knows two programs, the CLI and the salt CLI, so the same code runs
// wherever a user could type those commands.
package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// Exec runs one program with an argument list (never a shell) and returns
// its stdout, stderr and exit code; err is for failing to run it at all.
type Exec func(ctx context.Context, args ...string) (stdout, stderr string, code int, err error)

// Node is one minion and the two blank disks the scenario may format and wipe.
type Node struct {
	Name  string
	Disks []string
}

// Scenario is one run. CLI has the server URL and token already set.
type Scenario struct {
	CLI     Exec
	Salt    Exec
	Nodes   []Node
	Prefix  string        // volume names start with it; default "e2e"
	Timeout time.Duration // per wait; default 5m
	Logf    func(format string, args ...any)
}

// Case is one volume the scenario creates.
type Case struct {
	Name   string
	Node   string
	Kind   string // sparse or raw
	Mode   string // Filesystem or Block
	FS     string // ext4 or xfs, Filesystem mode only
	Device string // raw only
	Args   []string
}

// Cases lists, for every node, a sparse ext4 Filesystem volume, a sparse
// Block volume, a raw xfs Filesystem volume on the first disk and a raw Block
// volume on the second.
func (s *Scenario) Cases() []Case {
	prefix := s.Prefix
	if prefix == "" {
		prefix = "e2e"
	}
	var cs []Case
	for _, n := range s.Nodes {
		base := prefix + "-" + n.Name
		cs = append(cs,
			Case{Name: base + "-sparse-fs", Node: n.Name, Kind: "sparse", Mode: "Filesystem", FS: "ext4",
				Args: []string{"--size", "64Mi", "--mkfs-option=-m", "--mkfs-option=0"}},
			Case{Name: base + "-sparse-blk", Node: n.Name, Kind: "sparse", Mode: "Block",
				Args: []string{"--size", "32Mi", "--mode", "Block"}},
		)
		if len(n.Disks) >= 2 {
			cs = append(cs,
				Case{Name: base + "-raw-fs", Node: n.Name, Kind: "raw", Mode: "Filesystem", FS: "xfs", Device: n.Disks[0],
					Args: []string{"--device", n.Disks[0], "--fs", "xfs"}},
				Case{Name: base + "-raw-blk", Node: n.Name, Kind: "raw", Mode: "Block", Device: n.Disks[1],
					Args: []string{"--device", n.Disks[1], "--mode", "Block"}},
			)
		}
	}
	return cs
}

func (s *Scenario) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

func (s *Scenario) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return 5 * time.Minute
}

// Run plays the whole scenario. On failure it still deletes what it created
// (raw devices wiped) before returning the first error.
func (s *Scenario) Run(ctx context.Context) (err error) {
	if len(s.Nodes) == 0 {
		return errors.New("scenario: no nodes given")
	}
	for _, n := range s.Nodes {
		if len(n.Disks) != 0 && len(n.Disks) < 2 {
			return fmt.Errorf("scenario: node %s: give two disks (or none to skip raw volumes), got %v", n.Name, n.Disks)
		}
	}
	cases := s.Cases()
	created := map[string]bool{}
	defer func() {
		if err == nil {
			return
		}
		for _, c := range cases {
			if created[c.Name] {
				_, _, _, _ = s.CLI(context.WithoutCancel(ctx), "rm", c.Name, "--wipe", "--wait", "--timeout", s.timeout().String())
			}
		}
	}()

	if err := s.checkNodesUp(ctx); err != nil {
		return err
	}

	start := time.Now()
	for _, c := range cases {
		args := append([]string{"create", c.Name, "--node", c.Node}, c.Args...)
		out, errs, code, err := s.CLI(ctx, args...)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("salt-volumes %s: exit %d: %s%s", strings.Join(args, " "), code, out, errs)
		}
		created[c.Name] = true
	}
	views := map[string]saltvolumes.View{}
	for _, c := range cases {
		if err := s.wait(ctx, c.Name, "Available"); err != nil {
			return err
		}
	}
	s.logf("%d volumes on %d nodes Available %.1fs after the first create", len(cases), len(s.Nodes), time.Since(start).Seconds())

	var list struct {
		Items []saltvolumes.View `json:"items"`
	}
	if err := s.cliJSON(ctx, &list, "ls", "-o", "json"); err != nil {
		return err
	}
	for _, v := range list.Items {
		views[v.Spec.Name] = v
	}
	for _, c := range cases {
		v, ok := views[c.Name]
		if !ok {
			return fmt.Errorf("%s: not in salt-volumes ls", c.Name)
		}
		if err := checkView(c, v); err != nil {
			return err
		}
		if err := s.checkOnNode(ctx, c, v); err != nil {
			return err
		}
		if err := s.checkPV(ctx, c, v); err != nil {
			return err
		}
		s.logf("%s on %s: %s -> %s (%s), checked on the node", c.Name, c.Node, v.Status.PersistentPath, v.Status.DevicePath, c.Mode)
	}
	if err := s.checkNodeCounts(ctx, cases); err != nil {
		return err
	}

	// The node binary's own records, to prove deletion leaves nothing.
	records := map[string]map[string]any{}
	for _, n := range s.Nodes {
		recs, err := s.nodeRecords(ctx, n.Name)
		if err != nil {
			return err
		}
		for u, r := range recs {
			records[u] = r
		}
	}

	deleting := time.Now()
	for _, c := range cases {
		args := []string{"rm", c.Name}
		if c.Kind == "raw" {
			args = append(args, "--wipe") // leaves the disk blank for the next run
		}
		out, errs, code, err := s.CLI(ctx, args...)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("salt-volumes %s: exit %d: %s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	for _, c := range cases {
		if err := s.wait(ctx, c.Name, "Deleted"); err != nil {
			return err
		}
		delete(created, c.Name)
	}
	s.logf("%d volumes Deleted %.1fs after the first delete", len(cases), time.Since(deleting).Seconds())
	after := map[string]map[string]map[string]any{}
	for _, n := range s.Nodes {
		if after[n.Name], err = s.nodeRecords(ctx, n.Name); err != nil {
			return err
		}
	}
	for _, c := range cases {
		v := views[c.Name]
		if _, ok := after[c.Node][v.Spec.UUID]; ok {
			return fmt.Errorf("%s: salt_volumes.list on %s still shows uuid %s after deletion", c.Name, c.Node, v.Spec.UUID)
		}
		if err := s.checkGone(ctx, c, v, records[v.Spec.UUID]); err != nil {
			return err
		}
	}
	s.logf("%d volumes deleted, nothing left on the nodes", len(cases))
	return nil
}

func (s *Scenario) wait(ctx context.Context, name, phase string) error {
	out, errs, code, err := s.CLI(ctx, "wait", name, "--for", phase, "--timeout", s.timeout().String())
	if err != nil {
		return err
	}
	if code != 0 {
		detail, _, _, _ := s.CLI(ctx, "get", name)
		return fmt.Errorf("%s did not reach %s (exit %d): %s%s\n%s", name, phase, code, out, errs, detail)
	}
	return nil
}

func (s *Scenario) cliJSON(ctx context.Context, into any, args ...string) error {
	out, errs, code, err := s.CLI(ctx, args...)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("salt-volumes %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	if err := json.Unmarshal([]byte(out), into); err != nil {
		return fmt.Errorf("salt-volumes %s: output is not JSON: %v", strings.Join(args, " "), err)
	}
	return nil
}

// nodes is salt-volumes nodes, by node name.
func (s *Scenario) nodes(ctx context.Context) (map[string]saltvolumes.Node, error) {
	var out struct {
		Items []saltvolumes.Node `json:"items"`
	}
	if err := s.cliJSON(ctx, &out, "nodes", "-o", "json"); err != nil {
		return nil, err
	}
	byName := map[string]saltvolumes.Node{}
	for _, n := range out.Items {
		byName[n.Name] = n
	}
	return byName, nil
}

// checkNodesUp waits up to two minutes for every node to be up: right
// after a state run on every minion (the cluster's provisioning, e2e.sh's
// salt_volumes.installed) a slow master answers serve's manage.up late,
// and every node shows down until it does.
func (s *Scenario) checkNodesUp(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		down, err := s.nodesDown(ctx)
		if err == nil && down == "" {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("node %s not up in salt-volumes nodes after 2 min: is its minion running and accepted?", down)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// nodesDown names the first of the scenario's nodes that is not up, with
// what serve says of it, or is "" when all are.
func (s *Scenario) nodesDown(ctx context.Context) (string, error) {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range s.Nodes {
		if !nodes[n.Name].Up {
			return fmt.Sprintf("%s (%+v)", n.Name, nodes[n.Name]), nil
		}
	}
	return "", nil
}

func (s *Scenario) checkNodeCounts(ctx context.Context, cases []Case) error {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return err
	}
	want := map[string]int{}
	for _, c := range cases {
		want[c.Node]++
	}
	for name, w := range want {
		if got := nodes[name].Phases["Available"]; got < w {
			return fmt.Errorf("salt-volumes nodes: %s has %d Available volumes, want at least %d", name, got, w)
		}
	}
	return nil
}

// checkView is what the control plane says about the volume.
func checkView(c Case, v saltvolumes.View) error {
	if v.Status.Phase.String() != "Available" || v.Spec.Node != c.Node || string(v.Spec.Mode) != c.Mode {
		return fmt.Errorf("%s: phase %s node %s mode %s, want Available on %s in %s", c.Name, v.Status.Phase, v.Spec.Node, v.Spec.Mode, c.Node, c.Mode)
	}
	want := "/dev/disk/by-uuid/" + v.Spec.UUID
	if c.Mode == "Block" {
		want = "/dev/disk/by-partuuid/" + v.Spec.UUID
	}
	if v.Status.PersistentPath != want {
		return fmt.Errorf("%s: persistent path %q, want %q", c.Name, v.Status.PersistentPath, want)
	}
	if v.Status.Size <= 0 || v.Status.DevicePath == "" {
		return fmt.Errorf("%s: no device info (size %d, device %q)", c.Name, v.Status.Size, v.Status.DevicePath)
	}
	if !v.Deletable {
		return fmt.Errorf("%s: Available but not deletable: %s", c.Name, v.DeleteBlockedReason)
	}
	return nil
}

// checkPV reads back the Kubernetes PersistentVolume the CLI prints for the
// volume: it must point at the persistent path, in the volume's mode, on
// the volume's node.
func (s *Scenario) checkPV(ctx context.Context, c Case, v saltvolumes.View) error {
	out, errs, code, err := s.CLI(ctx, "pv", c.Name)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("salt-volumes pv %s: exit %d: %s", c.Name, code, errs)
	}
	var pv struct {
		Kind string `yaml:"kind"`
		Spec struct {
			VolumeMode string `yaml:"volumeMode"`
			Local      struct {
				Path string `yaml:"path"`
			} `yaml:"local"`
			NodeAffinity struct {
				Required struct {
					Terms []struct {
						Exprs []struct {
							Key    string   `yaml:"key"`
							Values []string `yaml:"values"`
						} `yaml:"matchExpressions"`
					} `yaml:"nodeSelectorTerms"`
				} `yaml:"required"`
			} `yaml:"nodeAffinity"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(out), &pv); err != nil {
		return fmt.Errorf("salt-volumes pv %s: not YAML: %v", c.Name, err)
	}
	terms := pv.Spec.NodeAffinity.Required.Terms
	if pv.Kind != "PersistentVolume" || pv.Spec.Local.Path != v.Status.PersistentPath || pv.Spec.VolumeMode != c.Mode ||
		len(terms) != 1 || len(terms[0].Exprs) != 1 || terms[0].Exprs[0].Key != "kubernetes.io/hostname" ||
		len(terms[0].Exprs[0].Values) != 1 || terms[0].Exprs[0].Values[0] != c.Node {
		return fmt.Errorf("salt-volumes pv %s: want a %s PersistentVolume at %s on %s, got:\n%s", c.Name, c.Mode, v.Status.PersistentPath, c.Node, out)
	}
	return nil
}

// checkOnNode asks the node itself, through Salt, what is behind the
// persistent path: low-level blkid (no cache) must find the volume UUID as
// the filesystem UUID (Filesystem) or the GPT partition's unique GUID (Block).
func (s *Scenario) checkOnNode(ctx context.Context, c Case, v saltvolumes.View) error {
	tags, code, err := s.blkid(ctx, c.Node, v.Status.PersistentPath)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%s: blkid -p %s on %s exited %d: the persistent path does not lead to the volume", c.Name, v.Status.PersistentPath, c.Node, code)
	}
	if c.Mode == "Filesystem" {
		if tags["UUID"] != v.Spec.UUID || tags["TYPE"] != c.FS {
			return fmt.Errorf("%s: on %s, %s holds %s UUID %s, want %s UUID %s", c.Name, c.Node, v.Status.PersistentPath, tags["TYPE"], tags["UUID"], c.FS, v.Spec.UUID)
		}
	} else if tags["PART_ENTRY_UUID"] != v.Spec.UUID {
		return fmt.Errorf("%s: on %s, %s is partition %q, want unique GUID %s", c.Name, c.Node, v.Status.PersistentPath, tags["PART_ENTRY_UUID"], v.Spec.UUID)
	}
	return nil
}

// checkGone proves a deleted volume left nothing on its node: no persistent
// path, the sparse file removed, a wiped raw disk blank.
func (s *Scenario) checkGone(ctx context.Context, c Case, v saltvolumes.View, record map[string]any) error {
	exists, err := s.saltBool(ctx, c.Node, "file.access", v.Status.PersistentPath, "f")
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("%s: %s still exists on %s after deletion", c.Name, v.Status.PersistentPath, c.Node)
	}
	if c.Kind == "sparse" {
		file, _ := record["backingFile"].(string)
		if file == "" {
			return fmt.Errorf("%s: the node's record had no backingFile: %v", c.Name, record)
		}
		exists, err := s.saltBool(ctx, c.Node, "file.file_exists", file)
		if err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("%s: sparse file %s still exists on %s", c.Name, file, c.Node)
		}
		return nil
	}
	tags, code, err := s.blkid(ctx, c.Node, c.Device)
	if err != nil {
		return err
	}
	if code != 2 { // blkid's "nothing found"
		return fmt.Errorf("%s: %s on %s is not blank after rm --wipe (blkid exit %d: %v)", c.Name, c.Device, c.Node, code, tags)
	}
	return nil
}

// SaltReturn runs one function on one minion through the salt CLI and
// decodes that minion's return into into.
func (s *Scenario) SaltReturn(ctx context.Context, into any, node, fun string, args ...string) error {
	all := append([]string{"--out=json", "--static", "--timeout=60", node, fun}, args...)
	out, errs, _, err := s.Salt(ctx, all...)
	if err != nil {
		return err
	}
	var ret map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &ret); err != nil || ret[node] == nil {
		return fmt.Errorf("salt %s %s: no JSON return from %s: %s%s", node, fun, node, out, errs)
	}
	if err := json.Unmarshal(ret[node], into); err != nil {
		return fmt.Errorf("salt %s %s: unexpected return %s", node, fun, ret[node])
	}
	return nil
}

func (s *Scenario) saltBool(ctx context.Context, node, fun string, args ...string) (bool, error) {
	var b bool
	err := s.SaltReturn(ctx, &b, node, fun, args...)
	return b, err
}

// blkid runs low-level probing (-p: no cache, reads the device) on the node.
func (s *Scenario) blkid(ctx context.Context, node, path string) (map[string]string, int, error) {
	var r struct {
		Retcode int    `json:"retcode"`
		Stdout  string `json:"stdout"`
	}
	if err := s.SaltReturn(ctx, &r, node, "cmd.run_all", "blkid -p -o export "+path, "python_shell=False"); err != nil {
		return nil, 0, err
	}
	tags := map[string]string{}
	for _, line := range strings.Split(r.Stdout, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			tags[k] = v
		}
	}
	return tags, r.Retcode, nil
}

// nodeRecords is salt_volumes.list on the node, by volume UUID.
func (s *Scenario) nodeRecords(ctx context.Context, node string) (map[string]map[string]any, error) {
	var recs []map[string]any
	if err := s.SaltReturn(ctx, &recs, node, "salt_volumes.list"); err != nil {
		return nil, err
	}
	byUUID := map[string]map[string]any{}
	for _, r := range recs {
		if u, ok := r["uuid"].(string); ok {
			byUUID[u] = r
		}
	}
	return byUUID, nil
}
