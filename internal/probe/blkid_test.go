package probe

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseWipefs(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Signature
	}{
		{"blank device prints nothing", "", nil},
		{"empty list", `{"signatures": []}`, []Signature{}},
		{"bluestore", `{"signatures":[{"device":"t2.img","offset":"0x0","type":"ceph_bluestore","uuid":null,"label":null}]}`,
			[]Signature{{Type: "ceph_bluestore", Offset: "0x0"}}},
		{"gpt, both headers", `{"signatures":[{"device":"/dev/loop3","offset":"0x200","type":"gpt","uuid":null,"label":null},
			{"device":"/dev/loop3","offset":"0x3fffe00","type":"gpt","uuid":null,"label":null},
			{"device":"/dev/loop3","offset":"0x1fe","type":"PMBR","uuid":null,"label":null}]}`,
			[]Signature{{Type: "gpt", Offset: "0x200"}, {Type: "gpt", Offset: "0x3fffe00"}, {Type: "PMBR", Offset: "0x1fe"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseWipefs(strings.NewReader(tc.in))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := ParseWipefs(strings.NewReader("{not json"))
	assert.Error(t, err)
}
