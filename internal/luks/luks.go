// Package luks keeps the LUKS2 containers of encrypted volumes: formatted,
// opened, closed and crypto-erased through cryptsetup, run with argument
// lists. A key only ever reaches cryptsetup as a file (--key-file) or on its
// standard input (--key-file -): never an argument, which any local user
// reads in /proc, nor a log line.
package luks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
)

// namespace derives container UUIDs from volume UUIDs (UUIDv5): fixed, so
// that a container is known as the volume's from its header alone.
var namespace = uuid.MustParse("5d8f0a4e-7c1b-4e0e-9a55-2b6c0f3d9e71")

// ContainerUUID is the LUKS UUID of volume u's container. It is not u: the
// filesystem inside carries u, and udev links /dev/disk/by-uuid/<UUID> to
// whichever device shows a UUID, so only the opened device may show it.
func ContainerUUID(u string) string {
	return uuid.NewSHA1(namespace, []byte(strings.ToLower(u))).String()
}

// MapperName is the device-mapper name volume u's container opens as.
func MapperName(u string) string { return "sv-" + u }

// KeyBytes is the size of the keys we make: 256 random bits.
const KeyBytes = 32

// Key is where cryptsetup reads a volume's key from: a root-only file of
// the node (provider keyfile), or bytes handed to this process that never
// touch the node's disks (provider master), given on cryptsetup's stdin.
type Key struct {
	file  string
	bytes []byte
}

// FileKey is the key in the file at p.
func FileKey(p string) Key { return Key{file: p} }

// BytesKey is the key b, kept in memory only.
func BytesKey(b []byte) Key { return Key{bytes: b} }

// String never shows key bytes: a Key in a log line or an error says
// where the key is, not what it is.
func (k Key) String() string {
	if k.file != "" {
		return k.file
	}
	return "(a key in memory)"
}

// GoString keeps %#v from printing the bytes too.
func (k Key) GoString() string { return k.String() }

func (k Key) args() []string {
	if k.file != "" {
		return []string{"--key-file", k.file}
	}
	return []string{"--key-file", "-"}
}

// stdin is what cryptsetup reads on its standard input for this key.
func (k Key) stdin() []byte {
	if k.file != "" {
		return nil
	}
	return k.bytes
}

// NewKey returns a fresh random key.
func NewKey() ([]byte, error) {
	k := make([]byte, KeyBytes)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("reading random bytes for a key: %w", err)
	}
	return k, nil
}

// Format writes a LUKS2 header with one keyslot for key on device (a
// block device, or the volume's file before it is attached).
//
// The key is 256 random bits, so the keyslot's PBKDF guards nothing that a
// guess could reach: argon2id at its minimum cost keeps opening quick and
// small on a node booting dozens of volumes, where cryptsetup's default
// (up to 1 GiB of memory for ~2 s each) would not.
func Format(ctx context.Context, device, containerUUID string, key Key) error {
	// The data starts at 16 MiB (offset in 512-byte sectors) in 4 KiB
	// sectors whatever cryptsetup would guess from the device: the sizes
	// users see are then the same everywhere, and sizes are whole MiB.
	args := []string{"luksFormat", "--batch-mode", "--type", "luks2", "--uuid", containerUUID,
		"--offset", "32768", "--sector-size", "4096",
		"--cipher", "aes-xts-plain64", "--key-size", "512", "--hash", "sha256",
		"--pbkdf", "argon2id", "--pbkdf-force-iterations", "4", "--pbkdf-memory", "32", "--pbkdf-parallel", "1"}
	args = append(append(args, key.args()...), "--key-slot", "0", device)
	return runKey(ctx, key, args...)
}

// Open maps device under name with key.
func Open(ctx context.Context, device, name string, key Key) error {
	args := append(append([]string{"open", "--type", "luks2"}, key.args()...), device, name)
	return runKey(ctx, key, args...)
}

// Resize grows the opened container name to its device's size (LUKS2
// needs the volume key for it, hence the key).
func Resize(ctx context.Context, name string, key Key) error {
	return runKey(ctx, key, append(append([]string{"resize"}, key.args()...), name)...)
}

// Opens tells whether key opens a keyslot of device's header. cryptsetup
// says no with exit status 2 (no keyslot takes this key) or 1 and "No
// usable keyslot" (the header has none).
func Opens(ctx context.Context, device string, key Key) (bool, error) {
	args := append(append([]string{"open", "--test-passphrase", "--type", "luks2"}, key.args()...), device)
	err := runKey(ctx, key, args...)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ee) && (ee.ExitCode() == 2 || ee.ExitCode() == 1 && strings.Contains(err.Error(), "No usable keyslot")):
		return false, nil
	}
	return false, err
}

// Close unmaps name.
func Close(ctx context.Context, name string) error {
	return run(ctx, "close", name)
}

// Erase destroys every keyslot of device's header: the data stays, but no
// key opens it any more.
func Erase(ctx context.Context, device string) error {
	return run(ctx, "erase", "--batch-mode", device)
}

// Header is what we read back from a LUKS2 header.
type Header struct {
	UUID     string
	Keyslots int
}

// Dump reads device's header (cryptsetup's JSON metadata).
func Dump(ctx context.Context, device string) (Header, error) {
	out, err := output(ctx, "luksDump", "--dump-json-metadata", device)
	if err != nil {
		return Header{}, err
	}
	var m struct {
		Keyslots map[string]json.RawMessage `json:"keyslots"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return Header{}, fmt.Errorf("reading the header of %s: %w", device, err)
	}
	u, err := output(ctx, "luksUUID", device)
	if err != nil {
		return Header{}, err
	}
	return Header{UUID: strings.TrimSpace(string(u)), Keyslots: len(m.Keyslots)}, nil
}

// Mapping is an opened container as the kernel shows it.
type Mapping struct {
	Device string // dm-N
	Slaves []string
}

// Mapped finds the device-mapper device named name (in /sys, without
// cryptsetup or udev).
func Mapped(name string) (Mapping, bool) {
	ents, _ := filepath.Glob("/sys/block/dm-*/dm/name")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Base(filepath.Dir(filepath.Dir(p)))
		m := Mapping{Device: dev}
		if kids, err := os.ReadDir(filepath.Join("/sys/block", dev, "slaves")); err == nil {
			for _, k := range kids {
				m.Slaves = append(m.Slaves, k.Name())
			}
		}
		return m, true
	}
	return Mapping{}, false
}

// Ready tells whether this node can open containers: cryptsetup installed
// and a kernel with device-mapper. Opening its control node loads dm_mod
// where it is a module; a kernel without it answers ENODEV.
func Ready() error {
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		return ErrMissing
	}
	f, err := os.OpenFile("/dev/mapper/control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("the kernel has no device-mapper (%w): dm_mod and dm_crypt are needed", err)
	}
	f.Close()
	return nil
}

// ErrMissing says cryptsetup is not installed.
var ErrMissing = errors.New("cryptsetup not found: install cryptsetup (Debian, Ubuntu: cryptsetup-bin; RHEL, Fedora: cryptsetup)")

func run(ctx context.Context, args ...string) error {
	_, err := outputIn(ctx, nil, args...)
	return err
}

func runKey(ctx context.Context, key Key, args ...string) error {
	_, err := outputIn(ctx, key.stdin(), args...)
	return err
}

func output(ctx context.Context, args ...string) ([]byte, error) { return outputIn(ctx, nil, args...) }

// outputIn runs cryptsetup with stdin on its standard input: with
// --key-file - it reads the key from there, every byte up to EOF.
func outputIn(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	path, err := exec.LookPath("cryptsetup")
	if err != nil {
		return nil, ErrMissing
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("cryptsetup %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}
