package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"10Gi":       10 << 30,
		"1.5Gi":      3 << 29,
		"500M":       500_000_000,
		"1073741824": 1 << 30,
		"1e9":        1_000_000_000,
		"64Mi":       64 << 20,
		"1k":         1000,
		"2Ki":        2048,
		"0.5Ki":      512,
		"1E3":        1000,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, got, in)
		}
	}
	bad := map[string]string{
		"":       "empty",
		"0":      "greater than zero",
		"-1Gi":   "greater than zero",
		"0Gi":    "greater than zero",
		"10GB":   "not a size",
		"ten":    "not a size",
		"1.5":    "whole number of bytes",
		"1m":     "not a size", // milli is not a byte size
		"10 Gi":  "not a size",
		"9Ei":    "too large",
		"1e-3":   "whole number",
		"1e99":   "exponent",
		"Gi":     "not a size",
		"0x10Gi": "not a size",
	}
	for in, want := range bad {
		_, err := ParseSize(in)
		if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), want, in)
		}
	}
}

func TestFormatSize(t *testing.T) {
	assert.Equal(t, "10Gi", FormatSize(10<<30))
	assert.Equal(t, "1536Mi", FormatSize(3<<29))
	assert.Equal(t, "500000000", FormatSize(500_000_000))
}

const u1 = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"

func parse(t *testing.T, js string) (*Spec, error) {
	t.Helper()
	return Parse(strings.NewReader(js))
}

func TestParseDefaultsAndNormalisation(t *testing.T) {
	s, err := parse(t, `{"name":"data-1","uuid":"3F2504E0-4F89-41D3-9A0C-0305E82C3301","node":"n1","sparseLoopDevice":{"size":"10Gi"}}`)
	require.NoError(t, err)
	assert.Equal(t, u1, s.UUID, "uuid is stored lowercase")
	assert.Equal(t, ModeFilesystem, s.Mode)
	assert.Equal(t, FSExt4, s.FSType)
	assert.Equal(t, int64(10<<30), s.SizeBytes)
	assert.Equal(t, "/dev/disk/by-uuid/"+u1, s.PersistentPath())
	assert.Equal(t, TypeSparse, s.Type())

	s, err = parse(t, `{"name":"b","uuid":"`+u1+`","mode":"Block","sparseLoopDevice":{"size":1073741824}}`)
	require.NoError(t, err)
	assert.Equal(t, "", s.FSType)
	assert.Equal(t, int64(1<<30), s.SizeBytes, "a bare JSON number is bytes")
	assert.Equal(t, "/dev/disk/by-partuuid/"+u1, s.PersistentPath())

	s, err = parse(t, `{"name":"r","uuid":"`+u1+`","fsType":"xfs","mkfsOptions":["-L","data"],"rawBlockDevice":{"devicePath":"/dev/disk/by-id/wwn-0x5000"}}`)
	require.NoError(t, err)
	assert.Equal(t, TypeRaw, s.Type())
}

func TestParseErrorsNameTheField(t *testing.T) {
	base := func(extra string) string {
		return `{"name":"data-1","uuid":"` + u1 + `",` + extra + `}`
	}
	cases := []struct{ js, field, hint string }{
		{``, "spec", "empty"},
		{`{"name":`, "spec", "invalid JSON"},
		{`[]`, "spec", "must be a JSON object (the volume spec), not an array"},
		{`null`, "spec", "must be a JSON object (the volume spec), not null"},
		{base(`"sparseLoopDevice":{"size":"1Gi"},"fstype":"xfs"`), "spec", `unknown field "fstype"`},
		{base(`"sparseLoopDevice":{"size":"1Gi"}} {`), "spec", "trailing"},
		{`{"uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"}}`, "name", "missing"},
		{`{"name":"Data_1","uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"}}`, "name", "DNS-1123"},
		{`{"name":"` + strings.Repeat("a", 64) + `","uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"}}`, "name", "DNS-1123"},
		{`{"name":"-a","uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"}}`, "name", "DNS-1123"},
		{`{"name":"a","sparseLoopDevice":{"size":"1Gi"}}`, "uuid", "missing"},
		{`{"name":"a","uuid":"not-a-uuid","sparseLoopDevice":{"size":"1Gi"}}`, "uuid", "RFC 4122"},
		{`{"name":"a","uuid":"{` + u1 + `}","sparseLoopDevice":{"size":"1Gi"}}`, "uuid", "RFC 4122"},
		{`{"name":"a","uuid":"00000000-0000-0000-0000-000000000000","sparseLoopDevice":{"size":"1Gi"}}`, "uuid", "RFC 4122"},
		{`{"name":"a","uuid":"3f2504e0-4f89-41d3-ca0c-0305e82c3301","sparseLoopDevice":{"size":"1Gi"}}`, "uuid", "RFC 4122"}, // wrong variant
		{base(`"mode":"block","sparseLoopDevice":{"size":"1Gi"}`), "mode", "Filesystem or Block"},
		{base(`"fsType":"btrfs","sparseLoopDevice":{"size":"1Gi"}`), "fsType", "ext4 or xfs"},
		{base(`"mode":"Block","fsType":"ext4","sparseLoopDevice":{"size":"1Gi"}`), "fsType", "Block volume has no filesystem"},
		{base(`"mode":"Block","mkfsOptions":["-m","0"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions", "Block volume"},
		{base(`"mkfsOptions":["-U","random"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "UUID"},
		{base(`"fsType":"xfs","mkfsOptions":["-m","uuid=x"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", "UUID"},
		{base(`"mkfsOptions":["/dev/sda"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "path"},
		{base(`"mkfsOptions":[""],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "empty"},
		{base(`"sparseLoopDevice":{"size":" 3Ti "}`), "sparseLoopDevice.size", `write "3Ti"`},
		{base(`"node":"*","sparseLoopDevice":{"size":"1Gi"}`), "node", "not a Salt minion id"},
		{base(`"node":"node-1,node-2","sparseLoopDevice":{"size":"1Gi"}`), "node", "no globs, commas"},
		{base(`"node":"G@os:Debian","sparseLoopDevice":{"size":"1Gi"}`), "node", "not a Salt minion id"},
		{base(`"sparseLoopDevice":{"size":"10Mi","size":"1Ti"}`), "sparseLoopDevice.size", "given twice"},
		{base(`"name":"x","sparseLoopDevice":{"size":"10Mi"}`), "name", "given twice"},
		{base(`"mkfsOptions":["-d","../../../../etc/ssh"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "copies a host directory"},
		{base(`"mkfsOptions":["-n"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "dry run"},
		{base(`"mkfsOptions":["-E","offset=4096"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", `"offset" is not allowed`},
		{base(`"mkfsOptions":["-J","device=/dev/sda"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", `"device" is not allowed`},
		{base(`"mkfsOptions":["-F"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "forcing"},
		{base(`"mkfsOptions":["-O","journal_dev"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", "journal_dev"},
		{base(`"mkfsOptions":["-m"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "needs a value"},
		{base(`"mkfsOptions":["-jq"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "one option per element"},
		{base(`"mkfsOptions":["-m","0","sda"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[2]", "not an option"},
		{base(`"fsType":"xfs","mkfsOptions":["-d","file,name=/etc/x"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", `"file" is not allowed`},
		{base(`"fsType":"xfs","mkfsOptions":["-f"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "forcing"},
		{base(`"fsType":"xfs","mkfsOptions":["-N"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "dry run"},
		{base(`"fsType":"xfs","mkfsOptions":["-p","/etc/proto"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "protofile"},
		{base(`"fsType":"xfs","mkfsOptions":["-r","rtdev=/dev/sda"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[0]", "realtime"},
		{base(`"fsType":"xfs","mkfsOptions":["-L","thirteen-char"],"sparseLoopDevice":{"size":"1Gi"}`), "mkfsOptions[1]", "longer than 12"},
		{base(`"sparseLoopDevice":{"size":"1Gi"},"rawBlockDevice":{"devicePath":"/dev/sdb"}`), "sparseLoopDevice", "not several"},
		{base(`"sparseLoopDevice":{"size":"1Gi"},"lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"}`), "sparseLoopDevice", "not several"},
		{base(`"lvmLogicalVolume":{"size":"1Gi"}`), "lvmLogicalVolume.vgName", "missing"},
		{base(`"lvmLogicalVolume":{"vgName":"-vg","size":"1Gi"}`), "lvmLogicalVolume.vgName", "not a volume group name"},
		{base(`"lvmLogicalVolume":{"vgName":"vg/0","size":"1Gi"}`), "lvmLogicalVolume.vgName", "not a volume group name"},
		{base(`"lvmLogicalVolume":{"vgName":"..","size":"1Gi"}`), "lvmLogicalVolume.vgName", "not a volume group name"},
		{base(`"lvmLogicalVolume":{"vgName":"vg0"}`), "lvmLogicalVolume.size", ""},
		{base(`"lvmLogicalVolume":{"vgName":"vg0","size":"lots"}`), "lvmLogicalVolume.size", ""},
		{base(`"fsType":"xfs","lvmLogicalVolume":{"vgName":"vg0","size":"100Mi"}`), "lvmLogicalVolume.size", "300Mi"},
		{base(`"lvmLogicalVolume":{"vgName":"vg0","size":"1Gi","wipe":true}`), "lvmLogicalVolume", "unknown field"},
		{`{"name":"snapshot-1","uuid":"` + u1 + `","lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"}}`, "name", "reserves"},
		{base(`"mode":"Filesystem"`), "sparseLoopDevice", "missing"},
		{base(`"sparseLoopDevice":{"size":"0"}`), "sparseLoopDevice.size", "greater than zero"},
		{base(`"sparseLoopDevice":{"size":"-5Gi"}`), "sparseLoopDevice.size", "greater than zero"},
		{base(`"sparseLoopDevice":{"size":"lots"}`), "sparseLoopDevice.size", "not a size"},
		{base(`"sparseLoopDevice":{}`), "sparseLoopDevice.size", "empty"},
		{base(`"sparseLoopDevice":{"size":true}`), "spec", "size must be"},
		{base(`"fsType":"xfs","sparseLoopDevice":{"size":"256Mi"}`), "sparseLoopDevice.size", "300Mi"},
		{base(`"sparseLoopDevice":{"size":"512Ki"}`), "sparseLoopDevice.size", "at least 1Mi"},
		{base(`"mode":"Block","sparseLoopDevice":{"size":"2Mi"}`), "sparseLoopDevice.size", "at least 4Mi"},
		{base(`"rawBlockDevice":{"devicePath":""}`), "rawBlockDevice.devicePath", "missing"},
		{base(`"rawBlockDevice":{"devicePath":"sdb"}`), "rawBlockDevice.devicePath", "relative"},
		{base(`"rawBlockDevice":{"devicePath":"/dev/../etc/passwd"}`), "rawBlockDevice.devicePath", "clean"},
		{base(`"rawBlockDevice":{"devicePath":"/dev/sdb/"}`), "rawBlockDevice.devicePath", "clean"},
		{base(`"rawBlockDevice":{"devicePath":"/tmp/disk.img"}`), "rawBlockDevice.devicePath", "not under /dev"},
		{base(`"rawBlockDevice":{"devicePath":"/dev/"}`), "rawBlockDevice.devicePath", "clean"},
	}
	for _, c := range cases {
		_, err := parse(t, c.js)
		var fe *FieldError
		if assert.True(t, errors.As(err, &fe), "%s: want a FieldError, got %v", c.js, err) {
			assert.Equal(t, c.field, fe.Field, c.js)
			assert.Contains(t, fe.Msg, c.hint, c.js)
		}
	}
}

func TestLVMLogicalVolume(t *testing.T) {
	s, err := parse(t, `{"name":"a","uuid":"`+u1+`","lvmLogicalVolume":{"vgName":"vg_data-1.x+y","size":"64Mi"}}`)
	require.NoError(t, err)
	assert.Equal(t, TypeLVM, s.Type())
	assert.Equal(t, int64(64<<20), s.SizeBytes)
	assert.Equal(t, "/dev/disk/by-uuid/"+u1, s.PersistentPath())
	assert.True(t, s.MatchesPersistentPath("/dev/disk/by-uuid/"+u1))

	b, err := parse(t, `{"name":"a","uuid":"`+u1+`","mode":"Block","lvmLogicalVolume":{"vgName":"vg0","size":"64Mi"}}`)
	require.NoError(t, err)
	assert.Empty(t, b.PersistentPath(), "the LV's own UUID names it, which the spec does not know")
	dm := "/dev/disk/by-id/dm-uuid-LVM-" + strings.Repeat("aB3", 21) + "x"
	assert.True(t, b.MatchesPersistentPath(dm))
	r, err := parse(t, `{"name":"a","uuid":"`+u1+`","mode":"Block","rawBlockDevice":{"devicePath":"/dev/vg0/lv"}}`)
	require.NoError(t, err)
	assert.True(t, r.MatchesPersistentPath(dm), "an existing LV given as a raw Block volume is named by LVM's UUID")
	assert.True(t, r.MatchesPersistentPath("/dev/disk/by-partuuid/"+u1))
	sp, err := parse(t, `{"name":"a","uuid":"`+u1+`","mode":"Block","sparseLoopDevice":{"size":"64Mi"}}`)
	require.NoError(t, err)
	assert.False(t, sp.MatchesPersistentPath(dm))
	for _, bad := range []string{"", "/dev/disk/by-partuuid/" + u1, dm[:len(dm)-1], dm + "/../sda", "/dev/disk/by-id/dm-uuid-CRYPT-" + strings.Repeat("a", 64)} {
		assert.False(t, b.MatchesPersistentPath(bad), bad)
	}

	c, err := parse(t, `{"name":"a","uuid":"`+u1+`","lvmLogicalVolume":{"vgName":"vg1","size":"64Mi"}}`)
	require.NoError(t, err)
	same, why := s.SameVolume(c)
	assert.False(t, same)
	assert.Contains(t, why, "vgName")
	d, err := parse(t, `{"name":"a","uuid":"`+u1+`","lvmLogicalVolume":{"vgName":"vg_data-1.x+y","size":"128Mi"}}`)
	require.NoError(t, err)
	same, why = s.SameVolume(d)
	assert.False(t, same)
	assert.Contains(t, why, "size")
}

func TestXFSMinimumIsInclusive(t *testing.T) {
	_, err := parse(t, `{"name":"a","uuid":"`+u1+`","fsType":"xfs","sparseLoopDevice":{"size":"300Mi"}}`)
	assert.NoError(t, err)
}

func TestSameVolume(t *testing.T) {
	a, err := parse(t, `{"name":"a","uuid":"`+u1+`","node":"n1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.NoError(t, err)
	b, _ := parse(t, `{"name":"a","uuid":"`+u1+`","node":"n2","sparseLoopDevice":{"size":"1073741824"}}`)
	same, _ := a.SameVolume(b)
	assert.True(t, same, "node and size spelling do not matter")
	c, _ := parse(t, `{"name":"a","uuid":"`+u1+`","sparseLoopDevice":{"size":"2Gi"}}`)
	same, _ = c.SameVolume(a)
	assert.True(t, same, "a sparse volume may grow")
	same, why := a.SameVolume(c)
	assert.False(t, same)
	assert.Contains(t, why, "shrinking is refused")
	d, _ := parse(t, `{"name":"a","uuid":"`+u1+`","fsType":"xfs","sparseLoopDevice":{"size":"1Gi"}}`)
	same, why = a.SameVolume(d)
	assert.False(t, same)
	assert.Contains(t, why, "fsType")
}

func TestMkfsOptionsThatTuneAreAllowed(t *testing.T) {
	for _, tc := range []struct {
		name, fs string
		opts     []string
	}{
		{"ext4 common", "ext4", []string{"-m", "0", "-E", "lazy_itable_init=1,stride=4", "-O", "^has_journal", "-b4096", "-j", "-L", "data"}},
		{"ext4 inodes", "ext4", []string{"-i", "65536", "-I", "256", "-N", "1000", "-T", "largefile", "-e", "remount-ro", "-J", "size=16"}},
		{"xfs stripes", "xfs", []string{"-d", "agcount=4,su=64k,sw=2", "-i", "size=512", "-L", "data", "-m", "reflink=1,crc=1"}},
		{"xfs log", "xfs", []string{"-l", "size=64m,lazy-count=1", "-n", "ftype=1", "-s", "size=4096", "-b", "size=4096"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, checkMkfsOptions(tc.fs, tc.opts))
		})
	}
}

// FuzzParse: any input either fails with a field error or gives a spec that
// validates again after a JSON round trip, unchanged.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"name":"data-1","uuid":"` + u1 + `","sparseLoopDevice":{"size":"10Gi"}}`,
		`{"name":"r","uuid":"` + u1 + `","mode":"Block","rawBlockDevice":{"devicePath":"/dev/sdb"}}`,
		`{"name":"x","uuid":"` + u1 + `","fsType":"xfs","mkfsOptions":["-d","su=64k,sw=2"],"sparseLoopDevice":{"size":"1e9"}}`,
		`{"name":"d","uuid":"` + u1 + `","sparseLoopDevice":{"size":"10Mi","size":"1Ti"}}`,
		`{"name":"d","uuid":"` + u1 + `","mkfsOptions":["-E","offset=4096"],"sparseLoopDevice":{"size":1073741824}}`,
		`[{"a":[1,{"b":2}]}]`,
		`{"name":"t","uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"},"template":{"metadata":{"labels":{"a.b/c":"d"},"annotations":{"e":"f g"}}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(bytes.NewReader(data))
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error is not a field error: %v", err)
			}
			return
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("accepted spec does not parse again: %v\n%s", err, b)
		}
		if same, why := again.SameVolume(s); !same || again.UUID != s.UUID {
			t.Fatalf("round trip changed the spec: %s", why)
		}
	})
}

// The hand-written name checks accept exactly what their regexps do.
func TestNameChecksMatchTheirRegexps(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	minion := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
	cases := []string{"", "a", "-", "a-", "-a", "a-b", "A", "node-1", "node_1", "node.example.com", ".x", "_x", "x.", "é",
		"a b", "0", "9z", strings.Repeat("a", 253), strings.Repeat("a", 254), "a--b", "x*"}
	for _, c := range cases {
		if got, want := dns1123Label(c), label.MatchString(c); got != want {
			t.Errorf("dns1123Label(%q) = %v, want %v", c, got, want)
		}
		if got, want := minionID(c), minion.MatchString(c); got != want {
			t.Errorf("minionID(%q) = %v, want %v", c, got, want)
		}
	}
}

func TestApprox(t *testing.T) {
	for n, want := range map[int64]string{
		640:            "640B",
		64 << 20:       "64.0MiB",
		3 << 29:        "1.5GiB",
		10<<40 + 1<<39: "10.5TiB",
	} {
		if got := Approx(n); got != want {
			t.Errorf("Approx(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestTemplateIsValidatedAsKubernetesWould(t *testing.T) {
	withTemplate := func(tpl string) string {
		return `{"name":"data-1","uuid":"` + u1 + `","sparseLoopDevice":{"size":"1Gi"},"template":` + tpl + `}`
	}
	s, err := Parse(strings.NewReader(withTemplate(`{"metadata":{"labels":{"tier":"gold","example.com/rack":"r-12","empty":""},"annotations":{"example.com/owner":"team a: storage / ops"}}}`)))
	require.NoError(t, err)
	assert.Equal(t, "gold", s.Template.Metadata.Labels["tier"])
	assert.Equal(t, "team a: storage / ops", s.Template.Metadata.Annotations["example.com/owner"], "annotation values are free text")
	c := s.Template.Clone()
	c.Metadata.Labels["tier"] = "lead"
	assert.Equal(t, "gold", s.Template.Metadata.Labels["tier"], "Clone is deep")

	big := strings.Repeat("x", maxAnnotationBytes)
	for _, tc := range []struct{ name, tpl, field, hint string }{
		{"label key with a space", `{"metadata":{"labels":{"my tier":"gold"}}}`, `template.metadata.labels["my tier"]`, "not a qualified name"},
		{"label key too long", `{"metadata":{"labels":{"` + strings.Repeat("k", 64) + `":"v"}}}`, "template.metadata.labels", "at most 63"},
		{"uppercase prefix", `{"metadata":{"labels":{"Example.com/x":"v"}}}`, `template.metadata.labels["Example.com/x"]`, "DNS subdomain"},
		{"label value with a slash", `{"metadata":{"labels":{"tier":"gold/silver"}}}`, `template.metadata.labels["tier"]`, "not a label value"},
		{"label value too long", `{"metadata":{"labels":{"tier":"` + strings.Repeat("g", 64) + `"}}}`, `template.metadata.labels["tier"]`, "at most 63"},
		{"our uuid label", `{"metadata":{"labels":{"salt-volumes.io/uuid":"` + u1 + `"}}}`, `template.metadata.labels["salt-volumes.io/uuid"]`, "set by salt-volumes"},
		{"managed-by", `{"metadata":{"labels":{"app.kubernetes.io/managed-by":"me"}}}`, `template.metadata.labels["app.kubernetes.io/managed-by"]`, "salt-volumes sets it"},
		{"PV controller annotation", `{"metadata":{"annotations":{"pv.kubernetes.io/bound-by-controller":"yes"}}}`, `template.metadata.annotations["pv.kubernetes.io/bound-by-controller"]`, "PV controller"},
		{"annotation key", `{"metadata":{"annotations":{"/x":"v"}}}`, `template.metadata.annotations["/x"]`, "DNS subdomain"},
		{"annotations too big", `{"metadata":{"annotations":{"a":"` + big + `"}}}`, "template.metadata.annotations", "at most 262144"},
		{"misspelt labels", `{"metadata":{"Labels":{"a":"b"}}}`, "template.metadata", `unknown field "Labels"`},
		{"spec instead of metadata", `{"spec":{}}`, "template", `unknown field "spec"`},
		{"label given twice", `{"metadata":{"labels":{"a":"b","a":"c"}}}`, "template.metadata.labels.a", "given twice"},
		{"not an object", `"gold"`, "template", "must be an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(withTemplate(tc.tpl)))
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Contains(t, fe.Field, tc.field)
			assert.Contains(t, fe.Error(), tc.hint)
		})
	}
}

func TestEncryption(t *testing.T) {
	const base = `{"name":"v","uuid":"3f2504e0-4f89-41d3-9a0c-0305e82c3301",`
	s, err := Parse(strings.NewReader(base + `"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"keyfile"}}`))
	require.NoError(t, err)
	assert.Equal(t, ProviderKeyfile, s.EncryptionProvider())
	s, err = Parse(strings.NewReader(base + `"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"master"}}`))
	require.NoError(t, err)
	assert.Equal(t, ProviderMaster, s.EncryptionProvider())

	bad := map[string]struct{ field, msg string }{
		`"sparseLoopDevice":{"size":"64Mi"},"encryption":{}}`:                                                                                                   {"encryption.provider", "missing: give keyfile"},
		`"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"tpm2"}}`:                                                                                  {"encryption.provider", "not available in this release: use keyfile"},
		`"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"master","key":"eA=="}}`:                                                                   {"encryption", `unknown field "key"`},
		`"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"gpg"}}`:                                                                                   {"encryption.provider", `"gpg" is not a key provider`},
		`"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"keyfile","key":"x"}}`:                                                                     {"encryption", `unknown field "key"`},
		`"rawBlockDevice":{"devicePath":"/dev/sdb"},"encryption":{"provider":"keyfile"}}`:                                                                       {"encryption", "only sparseLoopDevice"},
		`"lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"},"encryption":{"provider":"keyfile"}}`:                                                                 {"encryption", "only sparseLoopDevice"},
		`"mode":"Block","sparseLoopDevice":{"size":"19Mi"},"encryption":{"provider":"keyfile"}}`:                                                                {"sparseLoopDevice.size", "use at least 4Mi, plus 16Mi for the LUKS2 header"},
		`"sparseLoopDevice":{"size":"16Mi"},"encryption":{"provider":"keyfile"}}`:                                                                               {"sparseLoopDevice.size", "its LUKS2 header alone takes 16Mi; use at least 17Mi"},
		`"fsType":"xfs","sparseLoopDevice":{"size":"300Mi"},"encryption":{"provider":"keyfile"}}`:                                                               {"sparseLoopDevice.size", "300Mi, plus 16Mi for the LUKS2 header"},
		`"sparseLoopDevice":{"size":"64Mi"},"source":{"volumeUUID":"9f2504e0-4f89-41d3-9a0c-0305e82c3301","snapshot":"s"},"encryption":{"provider":"keyfile"}}`: {"encryption", "a clone cannot be encrypted"},
	}
	for in, want := range bad {
		_, err := Parse(strings.NewReader(base + in))
		var fe *FieldError
		if assert.ErrorAs(t, err, &fe, in) {
			assert.Equal(t, want.field, fe.Field, in)
			assert.Contains(t, fe.Msg, want.msg, in)
		}
	}
	s, err = Parse(strings.NewReader(base + `"fsType":"xfs","sparseLoopDevice":{"size":"316Mi"},"encryption":{"provider":"keyfile"}}`))
	require.NoError(t, err, "xfs's 300Mi and the header's 16Mi")

	plain, err := Parse(strings.NewReader(base + `"sparseLoopDevice":{"size":"64Mi"}}`))
	require.NoError(t, err)
	enc, err := Parse(strings.NewReader(base + `"sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"keyfile"}}`))
	require.NoError(t, err)
	same, why := plain.SameVolume(enc)
	assert.False(t, same)
	assert.Contains(t, why, "encrypted or not from its creation")
	same, _ = enc.SameVolume(enc)
	assert.True(t, same)
	assert.Equal(t, "/dev/disk/by-uuid/"+enc.UUID, enc.PersistentPath(), "the filesystem inside the opened container")
	blk, err := Parse(strings.NewReader(base + `"mode":"Block","sparseLoopDevice":{"size":"64Mi"},"encryption":{"provider":"keyfile"}}`))
	require.NoError(t, err)
	assert.Equal(t, "/dev/mapper/sv-"+blk.UUID, blk.PersistentPath(), "the opened container itself")
	assert.True(t, blk.MatchesPersistentPath("/dev/mapper/sv-"+blk.UUID))
	assert.False(t, blk.MatchesPersistentPath("/dev/disk/by-partuuid/"+blk.UUID))
}
