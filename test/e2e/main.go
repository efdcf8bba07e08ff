// Command salt-volumes-e2e runs the end-to-end scenario (test/scenario)
// against a running control plane and Salt master: the Vagrant cluster's
// master runs it for make vagrant-e2e; it works on any installation where
// salt-volumes and salt are on PATH. It creates, checks and deletes volumes
// named <prefix>-<node>-*, and wipes the raw disks it is given: give it only
// blank disks you can spare.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/salt-volumes/salt-volumes/test/scenario"
)

type nodeFlags []string

func (n *nodeFlags) String() string     { return strings.Join(*n, " ") }
func (n *nodeFlags) Set(v string) error { *n = append(*n, v); return nil }

func main() {
	os.Exit(run())
}

func run() int {
	var nodes nodeFlags
	flag.Var(&nodes, "node", "NAME or NAME=DISK1,DISK2 (repeat per node); without disks they come from the node's grain, and without that grain raw volumes are skipped")
	cli := flag.String("cli", "salt-volumes", "the salt-volumes client (SALT_VOLUMES_URL and a token in the environment)")
	salt := flag.String("salt", "salt", "the salt CLI on the master")
	saltConfig := flag.String("salt-config", "", "passed to salt as -c (default: Salt's own, /etc/salt)")
	grain := flag.String("disks-grain", "salt_volumes_e2e:disks", "grain listing a node's two spare blank disks")
	prefix := flag.String("prefix", "e2e", "volume name prefix")
	timeout := flag.Duration("timeout", 5*time.Minute, "per-volume wait")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(nodes) == 0 {
		fmt.Fprintln(os.Stderr, "salt-volumes-e2e: give at least one --node")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	sc := &scenario.Scenario{
		CLI: command(*cli), Salt: command(*salt, saltArgs(*saltConfig)...), Prefix: *prefix, Timeout: *timeout,
		Logf: func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) },
	}
	for _, n := range nodes {
		name, disks, _ := strings.Cut(n, "=")
		node := scenario.Node{Name: name}
		if disks != "" {
			node.Disks = strings.Split(disks, ",")
		} else {
			d, err := grainDisks(ctx, sc, name, *grain)
			if err != nil {
				fmt.Fprintln(os.Stderr, "salt-volumes-e2e:", err)
				return 1
			}
			if len(d) == 0 {
				log.Warn("no spare disks: raw volumes skipped on this node", "node", name, "grain", *grain)
			}
			node.Disks = d
		}
		sc.Nodes = append(sc.Nodes, node)
	}
	start := time.Now()
	if err := sc.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "salt-volumes-e2e: FAILED:", err)
		return 1
	}
	fmt.Printf("salt-volumes-e2e: PASSED: %d volumes on %d nodes created, checked and deleted in %.1fs\n",
		len(sc.Cases()), len(sc.Nodes), time.Since(start).Seconds())
	return 0
}

func saltArgs(config string) []string {
	if config == "" {
		return nil
	}
	return []string{"-c", config}
}

func command(prog string, pre ...string) scenario.Exec {
	return func(ctx context.Context, args ...string) (string, string, int, error) {
		cmd := exec.CommandContext(ctx, prog, append(append([]string(nil), pre...), args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.String(), errb.String(), ee.ExitCode(), nil
		}
		if err != nil {
			return "", "", 0, fmt.Errorf("running %s: %w", prog, err)
		}
		return out.String(), errb.String(), 0, nil
	}
}

func grainDisks(ctx context.Context, sc *scenario.Scenario, node, grain string) ([]string, error) {
	var ret json.RawMessage
	if err := sc.SaltReturn(ctx, &ret, node, "grains.get", grain); err != nil {
		return nil, err
	}
	var disks []string
	if err := json.Unmarshal(ret, &disks); err != nil {
		return nil, nil // grains.get returns "" when the grain is not set
	}
	return disks, nil
}
