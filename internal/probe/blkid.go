package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Signature is one signature util-linux's libblkid found on a device.
type Signature struct {
	Type   string `json:"type"`
	Offset string `json:"offset"`
	UUID   string `json:"uuid"`
	Label  string `json:"label"`
}

func (s Signature) String() string {
	out := s.Type + " signature at offset " + s.Offset
	if s.UUID != "" {
		out += " (UUID " + s.UUID + ")"
	}
	return out
}

// ErrNoProber means util-linux's wipefs is not installed: without it we
// cannot tell that a device is blank, so callers must refuse to write.
var ErrNoProber = errors.New("wipefs (util-linux) is not installed: it is needed to prove a device is blank before writing to it")

// Signatures asks libblkid, through `wipefs --no-act`, for every signature
// it knows on path: filesystems, RAID and volume-manager members, crypto
// containers and partition tables, including ones our own probe does not
// recognise (Ceph BlueStore, Oracle ASM, VDO, ...). Nothing is written.
func Signatures(ctx context.Context, path string) ([]Signature, error) {
	bin, err := exec.LookPath("wipefs")
	if err != nil {
		return nil, ErrNoProber
	}
	cmd := exec.CommandContext(ctx, bin, "--no-act", "--json", path)
	// Output we parse comes in the C locale, whatever the node's. It also
	// spares wipefs loading a dozen locale files: 0.3 ms of a probe that
	// every first write of a raw device waits for.
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("wipefs --no-act %s: %w: %s", path, err, strings.TrimSpace(errb.String()))
	}
	return ParseWipefs(&out)
}

// ParseWipefs reads `wipefs --json` output. wipefs prints nothing at all
// for a device without signatures.
func ParseWipefs(r io.Reader) ([]Signature, error) {
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	var doc struct {
		Signatures []Signature `json:"signatures"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parsing wipefs output: %w", err)
	}
	return doc.Signatures, nil
}

// WipeAll erases every signature libblkid finds on path (wipefs --all),
// through wipefs's own exclusive open: a mounted device is refused.
func WipeAll(ctx context.Context, path string) error {
	bin, err := exec.LookPath("wipefs")
	if err != nil {
		return ErrNoProber
	}
	cmd := exec.CommandContext(ctx, bin, "--all", path)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("wipefs --all %s: %w: %s", path, err, strings.TrimSpace(errb.String()))
	}
	return nil
}
