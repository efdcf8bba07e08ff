// Package spec defines the volume spec shared by the node binary, the Salt
// modules and the control plane, and validates it field by field.
package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
)

const (
	ModeFilesystem = "Filesystem"
	ModeBlock      = "Block"
	FSExt4         = "ext4"
	FSXFS          = "xfs"

	TypeSparse = "sparseLoopDevice"
	TypeRaw    = "rawBlockDevice"
	TypeLVM    = "lvmLogicalVolume"

	// LVMTagPrefix starts the tag on every LV we create; the volume UUID
	// follows. With our record's LV UUID it is how an LV is known as ours.
	LVMTagPrefix = "salt-volumes.io/uuid="
	// EncryptedBlockPrefix starts the persistent path of an encrypted
	// Block volume: /dev/mapper/ and the name its container is opened as.
	EncryptedBlockPrefix = "/dev/mapper/sv-"
	// DMUUIDLinkPrefix starts the persistent path of an LVM Block volume:
	// udev's link named after the LV's device-mapper UUID.
	DMUUIDLinkPrefix = "/dev/disk/by-id/dm-uuid-"

	// MinXFSSize is the smallest device mkfs.xfs (xfsprogs 6.1) accepts: its
	// "300MB" is 300 MiB (312475648 bytes fails, 314572800 works).
	MinXFSSize = 300 << 20
	// MinFilesystemSize keeps ext4 out of its degenerate tiny-fs layouts.
	MinFilesystemSize = 1 << 20
	// MinBlockSize leaves room for the 1 MiB-aligned partition and both GPTs.
	MinBlockSize = 4 << 20
)

// Size accepts both a quantity string ("10Gi") and a bare JSON number.
type Size string

func (s *Size) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		*s = Size(str)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("size must be a quantity string or a number of bytes")
	}
	*s = Size(n.String())
	return nil
}

type SparseLoopDevice struct {
	Size Size `json:"size"`
}

type RawBlockDevice struct {
	DevicePath string `json:"devicePath"`
}

// LVMLogicalVolume is an LV we create in an existing volume group, named
// after the volume.
type LVMLogicalVolume struct {
	VGName string `json:"vgName"`
	Size   Size   `json:"size"`
	// WipeSignatures lets prepare erase signatures that an earlier LV left
	// on the new LV's extents; without it they are refused.
	WipeSignatures bool `json:"wipeSignatures,omitempty"`
	// ThinPool makes the LV a thin one in this thin pool of the VG (its
	// snapshots are then thin too: no space set aside, no overflow of
	// their own).
	ThinPool string `json:"thinPool,omitempty"`
}

// Spec is the volume spec contract (see ARCHITECTURE.md).
type Spec struct {
	Name             string            `json:"name"`
	UUID             string            `json:"uuid"`
	Node             string            `json:"node,omitempty"`
	Mode             string            `json:"mode,omitempty"`
	FSType           string            `json:"fsType,omitempty"`
	MkfsOptions      []string          `json:"mkfsOptions,omitempty"`
	SparseLoopDevice *SparseLoopDevice `json:"sparseLoopDevice,omitempty"`
	RawBlockDevice   *RawBlockDevice   `json:"rawBlockDevice,omitempty"`
	LVMLogicalVolume *LVMLogicalVolume `json:"lvmLogicalVolume,omitempty"`
	// Template is for the volume's PersistentVolume (Kubernetes mode).
	Template *Template `json:"template,omitempty"`
	// Source makes a new sparse volume a clone of a snapshot on its node.
	Source *Source `json:"source,omitempty"`
	// Encryption puts the volume inside a LUKS2 container.
	Encryption *Encryption `json:"encryption,omitempty"`

	// SizeBytes is the parsed sparse or LV size; filled in by Validate.
	SizeBytes int64 `json:"-"`
}

// Key providers: who holds the key that opens an encrypted volume.
const (
	// ProviderKeyfile: a random key in a root-only file of the node's
	// state dir. It protects a disk that leaves without the node; a node
	// that leaves takes its keys along.
	ProviderKeyfile = "keyfile"
	// ProviderMaster: a random key the Salt master keeps in pillar and
	// hands to the node's salt-volume-exec only while a state of that
	// minion runs. The node never stores it: after a boot the volume is
	// Locked until the master opens it, and a node taken away opens
	// nothing.
	ProviderMaster = "master"
)

// LUKSHeaderBytes is the room the LUKS2 header takes at the start of an
// encrypted volume (cryptsetup's default layout): the opened device is
// that much smaller than the volume.
const LUKSHeaderBytes = 16 << 20

// Encryption asks for the volume inside a LUKS2 container, opened under a
// name of ours; its filesystem (or its Block device) is what users see.
type Encryption struct {
	Provider string `json:"provider"`
}

// plannedProviders are providers users may ask for that this release does
// not have yet: named so that the refusal says what to use meanwhile.
var plannedProviders = map[string]bool{"tpm2": true, "tang": true}

func (en *Encryption) validate(s *Spec) error {
	if en == nil {
		return nil
	}
	switch {
	case en.Provider == "":
		return &FieldError{"encryption.provider", "missing: give keyfile (a random key kept root-only on the node) or master (a key kept in the Salt master's pillar)"}
	case plannedProviders[en.Provider]:
		return &FieldError{"encryption.provider", fmt.Sprintf("%q is not available in this release: use keyfile or master (docs/encryption.md says what each provider protects)", en.Provider)}
	case en.Provider != ProviderKeyfile && en.Provider != ProviderMaster:
		return &FieldError{"encryption.provider", fmt.Sprintf("%q is not a key provider: use keyfile or master", en.Provider)}
	case s.RawBlockDevice != nil || s.LVMLogicalVolume != nil:
		return &FieldError{"encryption", "in this release only sparseLoopDevice volumes can be encrypted: drop encryption, or use sparseLoopDevice"}
	case s.Source != nil:
		return &FieldError{"encryption", "a clone cannot be encrypted in this release (a clone needs a key of its own): drop encryption or source"}
	}
	return nil
}

// Source names the snapshot a volume starts as a copy of: snapshot Name
// of the volume VolumeUUID, on the same node.
type Source struct {
	VolumeUUID string `json:"volumeUUID"`
	Snapshot   string `json:"snapshot"`
}

func (src *Source) validate(s *Spec) error {
	if src == nil {
		return nil
	}
	if s.SparseLoopDevice == nil && s.LVMLogicalVolume == nil {
		if s.RawBlockDevice == nil {
			return nil // the missing kind is said next
		}
		return &FieldError{"source", "a clone is a new sparse file or LV: use sparseLoopDevice or lvmLogicalVolume (a raw device cannot be a clone)"}
	}
	u, err := uuid.Parse(src.VolumeUUID)
	if err != nil || len(src.VolumeUUID) != 36 {
		return &FieldError{"source.volumeUUID", fmt.Sprintf("%q is not a UUID: give the uuid of the volume the snapshot was taken of", src.VolumeUUID)}
	}
	src.VolumeUUID = u.String()
	if src.VolumeUUID == s.UUID {
		return &FieldError{"source.volumeUUID", "is the new volume's own uuid: a clone is a new volume with a uuid of its own"}
	}
	if n := src.Snapshot; n == "" || len(n) > 63 || !snapshotName(n) {
		return &FieldError{"source.snapshot", fmt.Sprintf("%q is not a snapshot name: lower-case letters, digits, '-' and '.', at most 63", n)}
	}
	return nil
}

func snapshotName(n string) bool {
	if n[0] == '-' || n[0] == '.' || n[len(n)-1] == '-' || n[len(n)-1] == '.' {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// FieldError names the offending field so the message can tell the user
// exactly what to fix.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// dns1123Label checks ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (length apart) without
// a regexp compiled at every start of the node binary.
func dns1123Label(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// minionID is what a node may be: a host name or FQDN as Salt uses for
// minion ids, and nothing Salt would read as a target expression.
func minionID(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// Parse decodes a spec strictly (unknown fields are errors, so typos such as
// "fstype" do not silently fall back to defaults) and validates it.
func Parse(r io.Reader) (*Spec, error) { return decode(r, nil) }

// ParseNew is Parse for a volume being created: an absent (or empty) uuid
// is filled in by newUUID after the strict decode, before validation.
func ParseNew(r io.Reader, newUUID func() string) (*Spec, error) { return decode(r, newUUID) }

func decode(r io.Reader, newUUID func() string) (*Spec, error) {
	data, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("reading spec: %w", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, &FieldError{Field: "spec", Msg: "empty input: pass the volume spec as JSON"}
	}
	if data[0] != '{' {
		// null decodes into a zero Spec without complaint; say what is
		// wrong rather than that the name is missing.
		return nil, &FieldError{Field: "spec", Msg: "must be a JSON object (the volume spec), not " + jsonKind(data[0])}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		// An unknown or mistyped field deep inside: the key check names
		// its path, where the decoder names the top.
		if kerr := checkKeys(data); kerr != nil && !strings.Contains(kerr.Error(), "invalid JSON") {
			return nil, kerr
		}
		msg := strings.TrimPrefix(err.Error(), "json: ")
		return nil, &FieldError{Field: "spec", Msg: "invalid JSON: " + msg}
	}
	if dec.More() {
		return nil, &FieldError{Field: "spec", Msg: "trailing data after the JSON object"}
	}
	if err := checkDuplicateKeys(data); err != nil {
		return nil, err
	}
	if err := checkKeys(data); err != nil {
		return nil, err
	}
	if newUUID != nil && s.UUID == "" {
		s.UUID = newUUID()
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// jsonKind names the JSON value that starts with c, for error messages.
func jsonKind(c byte) string {
	switch {
	case c == 'n':
		return "null"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == '-' || c >= '0' && c <= '9':
		return "a number"
	}
	return "something that is not JSON"
}

// knownKeys are the exact field names; encoding/json alone would also accept
// "fstype" or "NAME", which hides typos and lets two spellings disagree.
// Objects are named by their path; the maps inside template.metadata hold
// free keys and are not listed.
var knownKeys = map[string]map[string]bool{
	"": {"name": true, "uuid": true, "node": true, "mode": true, "fsType": true, "mkfsOptions": true,
		"sparseLoopDevice": true, "rawBlockDevice": true, "lvmLogicalVolume": true, "template": true, "source": true,
		"encryption": true},
	"sparseLoopDevice":  {"size": true},
	"encryption":        {"provider": true},
	"source":            {"volumeUUID": true, "snapshot": true},
	"lvmLogicalVolume":  {"vgName": true, "size": true, "wipeSignatures": true, "thinPool": true},
	"rawBlockDevice":    {"devicePath": true},
	"template":          {"metadata": true},
	"template.metadata": {"labels": true, "annotations": true},
}

func checkKeys(data []byte) error {
	return checkObjectKeys("", data)
}

func checkObjectKeys(path string, data json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		if path == "" {
			return &FieldError{Field: "spec", Msg: "invalid JSON: " + err.Error()}
		}
		return &FieldError{Field: path, Msg: "must be an object"}
	}
	field := path
	if field == "" {
		field = "spec"
	}
	for k, v := range m {
		if !knownKeys[path][k] {
			return &FieldError{Field: field, Msg: fmt.Sprintf("unknown field %q (field names are case-sensitive)", k)}
		}
		sub := k
		if path != "" {
			sub = path + "." + k
		}
		if _, ok := knownKeys[sub]; ok && string(bytes.TrimSpace(v)) != "null" {
			if err := checkObjectKeys(sub, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkDuplicateKeys refuses an object that names a key twice: encoding/json
// keeps the last one silently, so {"size":"10Mi","size":"1Ti"} would mean
// whatever the last writer wanted while a reviewer reads the first.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return &FieldError{Field: "spec", Msg: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return &FieldError{Field: "spec", Msg: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
				}
				k, _ := kt.(string)
				field := k
				if path != "" {
					field = path + "." + k
				}
				if seen[k] {
					return &FieldError{Field: field, Msg: "given twice: keep one (JSON objects must not repeat a key)"}
				}
				seen[k] = true
				if err := walk(field); err != nil {
					return err
				}
			}
			_, err = dec.Token() // '}'
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ']'
		}
		if err != nil {
			return &FieldError{Field: "spec", Msg: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
		}
		return nil
	}
	return walk("")
}

// Bytes is the size a sparse or LVM volume's spec asks for, parsed from
// its quantity (a spec read back from a store keeps the quantity only:
// SizeBytes is filled by Validate); 0 for a raw volume, whose size is its
// device's, or a quantity that does not parse.
func (s *Spec) Bytes() int64 {
	var q Size
	switch {
	case s.SparseLoopDevice != nil:
		q = s.SparseLoopDevice.Size
	case s.LVMLogicalVolume != nil:
		q = s.LVMLogicalVolume.Size
	default:
		return 0
	}
	n, err := ParseSize(string(q))
	if err != nil {
		return 0
	}
	return n
}

// Validate fills defaults, normalises the UUID to lower case and checks every
// field. It does not look at the machine (sizes against free space, devices);
// the engine does that.
func (s *Spec) Validate() error {
	if s.Name == "" {
		return &FieldError{"name", "missing: give the volume a name (lowercase letters, digits and '-')"}
	}
	if len(s.Name) > 63 || !dns1123Label(s.Name) {
		return &FieldError{"name", fmt.Sprintf("%q is not a DNS-1123 label: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit", s.Name)}
	}
	if s.UUID == "" {
		return &FieldError{"uuid", "missing: give an RFC 4122 UUID such as 3f2504e0-4f89-41d3-9a0c-0305e82c3301"}
	}
	u, err := uuid.Parse(s.UUID)
	if err != nil || len(s.UUID) != 36 || u.Variant() != uuid.RFC4122 || u == uuid.Nil {
		return &FieldError{"uuid", fmt.Sprintf("%q is not an RFC 4122 UUID: use the 8-4-4-4-12 hex form, e.g. 3f2504e0-4f89-41d3-9a0c-0305e82c3301", s.UUID)}
	}
	s.UUID = u.String()

	if s.Node != "" && !minionID(s.Node) {
		return &FieldError{"node", fmt.Sprintf("%q is not a Salt minion id: use the id salt-key -L shows (letters, digits, '.', '_' and '-'; no globs, commas or spaces)", s.Node)}
	}

	switch s.Mode {
	case "":
		s.Mode = ModeFilesystem
	case ModeFilesystem, ModeBlock:
	default:
		return &FieldError{"mode", fmt.Sprintf("%q is not a mode: use Filesystem or Block", s.Mode)}
	}
	if s.Mode == ModeFilesystem {
		switch s.FSType {
		case "":
			s.FSType = FSExt4
		case FSExt4, FSXFS:
		default:
			return &FieldError{"fsType", fmt.Sprintf("%q is not supported: use ext4 or xfs", s.FSType)}
		}
		if err := checkMkfsOptions(s.FSType, s.MkfsOptions); err != nil {
			return err
		}
	} else {
		if s.FSType != "" {
			return &FieldError{"fsType", "a Block volume has no filesystem: drop fsType or use mode Filesystem"}
		}
		if len(s.MkfsOptions) > 0 {
			return &FieldError{"mkfsOptions", "a Block volume has no filesystem: drop mkfsOptions or use mode Filesystem"}
		}
	}

	if err := s.Template.validate(); err != nil {
		return err
	}
	if err := s.Source.validate(s); err != nil {
		return err
	}
	if err := s.Encryption.validate(s); err != nil {
		return err
	}

	kinds := 0
	for _, given := range []bool{s.SparseLoopDevice != nil, s.RawBlockDevice != nil, s.LVMLogicalVolume != nil} {
		if given {
			kinds++
		}
	}
	switch {
	case kinds > 1:
		return &FieldError{"sparseLoopDevice", "give exactly one of sparseLoopDevice, rawBlockDevice and lvmLogicalVolume, not several"}
	case kinds == 0:
		return &FieldError{"sparseLoopDevice", "missing: give sparseLoopDevice: {size: 10Gi}, rawBlockDevice: {devicePath: /dev/sdb} or lvmLogicalVolume: {vgName: vg0, size: 10Gi}"}
	case s.LVMLogicalVolume != nil:
		return s.validateLVM()
	case s.SparseLoopDevice != nil:
		n, err := ParseSize(string(s.SparseLoopDevice.Size))
		if err != nil {
			return &FieldError{"sparseLoopDevice.size", err.Error()}
		}
		if err := s.checkMinimum("sparseLoopDevice.size", n); err != nil {
			return err
		}
		s.SizeBytes = n
	default:
		return checkDevicePath(s.RawBlockDevice.DevicePath)
	}
	return nil
}

// validateLVM checks the VG name as LVM would and the size; the LV is
// named after the volume, so the name must be one LVM accepts too.
func (s *Spec) validateLVM() error {
	l := s.LVMLogicalVolume
	switch {
	case l.VGName == "":
		return &FieldError{"lvmLogicalVolume.vgName", "missing: give the volume group to create the LV in (vgs lists them)"}
	case len(l.VGName) > 127 || l.VGName == "." || l.VGName == ".." || l.VGName[0] == '-' || !lvmName(l.VGName):
		return &FieldError{"lvmLogicalVolume.vgName", fmt.Sprintf("%q is not a volume group name: use letters, digits and + _ . - (not starting with -), as vgs shows it", l.VGName)}
	case l.ThinPool != "" && (len(l.ThinPool) > 127 || l.ThinPool[0] == '-' || !lvmName(l.ThinPool)):
		return &FieldError{"lvmLogicalVolume.thinPool", fmt.Sprintf("%q is not a thin pool name: use letters, digits and + _ . - (not starting with -), as lvs shows it", l.ThinPool)}
	case strings.HasPrefix(s.Name, "snapshot") || strings.HasPrefix(s.Name, "pvmove"):
		return &FieldError{"name", fmt.Sprintf("%q: LVM reserves LV names starting with snapshot or pvmove, and the LV is named after the volume: choose another name", s.Name)}
	}
	n, err := ParseSize(string(l.Size))
	if err != nil {
		return &FieldError{"lvmLogicalVolume.size", err.Error()}
	}
	if err := s.checkMinimum("lvmLogicalVolume.size", n); err != nil {
		return err
	}
	s.SizeBytes = n
	return nil
}

func lvmName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// CheckMinimum refuses devices too small for the requested layout; the engine
// reuses it for raw devices once their real size is known.
func (s *Spec) checkMinimum(field string, n int64) error {
	given, plus := n, ""
	if s.Encryption != nil && n%(1<<20) != 0 {
		// The container encrypts in 4 KiB sectors: whole MiB keep every
		// size (and every growth) a multiple of them.
		return &FieldError{field, fmt.Sprintf("%s is not a whole number of Mi: an encrypted volume's size is (use e.g. %s)", FormatSize(n), FormatSize((n>>20+1)<<20))}
	}
	if s.Encryption != nil {
		// The container's header comes first: the filesystem gets the rest.
		if n <= LUKSHeaderBytes {
			return &FieldError{field, fmt.Sprintf("%s is too small for an encrypted volume: its LUKS2 header alone takes 16Mi; use at least 17Mi", FormatSize(n))}
		}
		n -= LUKSHeaderBytes
		plus = ", plus 16Mi for the LUKS2 header"
	}
	switch {
	case s.Mode == ModeBlock && n < MinBlockSize:
		return &FieldError{field, fmt.Sprintf("%s is too small for a Block volume: use at least 4Mi%s", FormatSize(given), plus)}
	case s.Mode == ModeFilesystem && s.FSType == FSXFS && n < MinXFSSize:
		return &FieldError{field, fmt.Sprintf("%s is too small for xfs (mkfs.xfs needs at least 300Mi%s): use a larger size or fsType ext4", FormatSize(given), plus)}
	case s.Mode == ModeFilesystem && n < MinFilesystemSize:
		return &FieldError{field, fmt.Sprintf("%s is too small for a filesystem: use at least 1Mi%s", FormatSize(given), plus)}
	}
	return nil
}

// CheckDeviceSize validates a raw device's real size against the layout.
func (s *Spec) CheckDeviceSize(n int64) error {
	return s.checkMinimum("rawBlockDevice.devicePath", n)
}

func checkDevicePath(p string) error {
	const field = "rawBlockDevice.devicePath"
	switch {
	case p == "":
		return &FieldError{field, "missing: give the device, e.g. /dev/sdb or /dev/disk/by-id/..."}
	case !filepath.IsAbs(p):
		return &FieldError{field, fmt.Sprintf("%q is relative: give an absolute path under /dev", p)}
	case filepath.Clean(p) != p:
		return &FieldError{field, fmt.Sprintf("%q is not a clean path: write it as %q", p, filepath.Clean(p))}
	case !strings.HasPrefix(p, "/dev/") || len(p) <= len("/dev/"):
		return &FieldError{field, fmt.Sprintf("%q is not under /dev: give a block device such as /dev/sdb", p)}
	case strings.ContainsAny(p, " \t\n\x00"):
		return &FieldError{field, fmt.Sprintf("%q contains whitespace or control characters", p)}
	}
	return nil
}

// Type is the volume kind as reported in outputs.
func (s *Spec) Type() string {
	switch {
	case s.SparseLoopDevice != nil:
		return TypeSparse
	case s.LVMLogicalVolume != nil:
		return TypeLVM
	}
	return TypeRaw
}

// PersistentPath is where the volume is always found, whatever its kernel
// name today. An LVM Block volume's path is named by its LV's own UUID,
// which only the node knows: "" here, see MatchesPersistentPath.
func (s *Spec) PersistentPath() string {
	if s.Mode == ModeBlock && s.LVMLogicalVolume != nil {
		return ""
	}
	if s.Mode == ModeBlock && s.Encryption != nil {
		// The opened container itself (a device-mapper device has no
		// partition table the kernel reads): its name is ours.
		return EncryptedBlockPrefix + s.UUID
	}
	if s.Mode == ModeBlock {
		return "/dev/disk/by-partuuid/" + s.UUID
	}
	return "/dev/disk/by-uuid/" + s.UUID
}

// MatchesPersistentPath tells whether a path a node reported can be this
// volume's: its own UUID's link, or for a Block volume on an LV (ours, or
// an existing one given as rawBlockDevice) udev's link of an LVM
// device-mapper UUID (LVM- and 64 letters and digits).
func (s *Spec) MatchesPersistentPath(p string) bool {
	if p != "" && p == s.PersistentPath() {
		return true
	}
	if s.Mode != ModeBlock || s.SparseLoopDevice != nil {
		return false
	}
	rest, ok := strings.CutPrefix(p, DMUUIDLinkPrefix+"LVM-")
	if !ok || len(rest) != 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// SameVolume tells whether two specs describe the same storage, ignoring
// fields that do not change what is on disk (node).
func (s *Spec) SameVolume(o *Spec) (bool, string) {
	switch {
	case s.Name != o.Name:
		return false, fmt.Sprintf("name %q (recorded) vs %q", o.Name, s.Name)
	case s.Type() != o.Type():
		return false, fmt.Sprintf("kind %s (recorded) vs %s", o.Type(), s.Type())
	case s.Mode != o.Mode:
		return false, fmt.Sprintf("mode %s (recorded) vs %s", o.Mode, s.Mode)
	case s.FSType != o.FSType:
		return false, fmt.Sprintf("fsType %s (recorded) vs %s", o.FSType, s.FSType)
	case s.EncryptionProvider() != o.EncryptionProvider():
		return false, fmt.Sprintf("encryption %q (recorded) vs %q: a volume is encrypted or not from its creation", o.EncryptionProvider(), s.EncryptionProvider())
	case s.SparseLoopDevice != nil && s.SizeBytes < o.SizeBytes:
		return false, fmt.Sprintf("size %d bytes (recorded) vs %d bytes: shrinking is refused (a volume only grows)", o.SizeBytes, s.SizeBytes)
	case s.LVMLogicalVolume != nil && s.LVMLogicalVolume.VGName != o.LVMLogicalVolume.VGName:
		return false, fmt.Sprintf("vgName %s (recorded) vs %s", o.LVMLogicalVolume.VGName, s.LVMLogicalVolume.VGName)
	case s.LVMLogicalVolume != nil && s.SizeBytes < o.SizeBytes:
		return false, fmt.Sprintf("size %d bytes (recorded) vs %d bytes: shrinking is refused (a volume only grows)", o.SizeBytes, s.SizeBytes)
	case s.RawBlockDevice != nil && s.RawBlockDevice.DevicePath != o.RawBlockDevice.DevicePath:
		return false, fmt.Sprintf("devicePath %s (recorded) vs %s", o.RawBlockDevice.DevicePath, s.RawBlockDevice.DevicePath)
	}
	return true, ""
}

// EncryptionProvider is the volume's key provider, "" for a plain volume.
func (s *Spec) EncryptionProvider() string {
	if s.Encryption == nil {
		return ""
	}
	return s.Encryption.Provider
}
