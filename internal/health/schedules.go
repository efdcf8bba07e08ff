package health

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// SaltSchedule is one row of a node's snapshotSchedules (the outcome of a
// Salt snapshot schedule on one of its volumes, salt_volumes.status). It
// carries no interval: the schedule's fields stay in the minion's
// scheduler.
type SaltSchedule struct {
	Node         string
	Schedule     string
	Volume       string
	UUID         string
	LastSuccess  *time.Time
	LastSnapshot string
	Failing      bool
	LastError    string
	LastErrorAt  *time.Time
}

// MaxScheduleRows bounds the rows kept of one report, as the node's
// module does (any minion can send reports).
const MaxScheduleRows = 64

// maxScheduleError bounds an error kept (the module cuts at 300).
const maxScheduleError = 300

// What a row's fields may be: any minion can send reports, and what is
// kept is listed, written as metric labels and shown in terminals. A
// Salt schedule's name is at most 48 of lower-case letters, digits, '-'
// and '.', its snapshots' names that and the time; a volume's name is a
// DNS label; a uuid is a volume's, lower case.
var (
	saltName   = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
	volumeName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	volumeUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// ParseSchedules reads the rows a node sent. A row that is not an
// object, whose schedule or volume is not such a name or whose uuid is
// not a uuid, is skipped (and a second row of the same schedule and
// volume); a field of the wrong type is left empty, a lastSnapshot that
// is no snapshot name too, and lastError is cut to 300 bytes, without
// control characters. Which rows are the node's own is ownSchedules'
// part.
func ParseSchedules(raw json.RawMessage) []SaltSchedule {
	var rows []json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &rows) != nil {
		return nil
	}
	var out []SaltSchedule
	seen := map[[2]string]bool{}
	for _, b := range rows {
		var row map[string]any
		if json.Unmarshal(b, &row) != nil {
			continue
		}
		s := SaltSchedule{Schedule: str(row["schedule"]), Volume: str(row["volume"]), UUID: str(row["uuid"]),
			LastSnapshot: str(row["lastSnapshot"]), LastError: str(row["lastError"]),
			LastSuccess: when(row["lastSuccess"]), LastErrorAt: when(row["lastErrorAt"])}
		s.Failing, _ = row["failing"].(bool)
		if len(s.UUID) == 36 {
			s.UUID = strings.ToLower(s.UUID)
		}
		key := [2]string{s.Schedule, s.Volume}
		if !saltName.MatchString(s.Schedule) || !volumeName.MatchString(s.Volume) || !volumeUUID.MatchString(s.UUID) || seen[key] {
			continue
		}
		seen[key] = true
		if !saltName.MatchString(s.LastSnapshot) {
			s.LastSnapshot = ""
		}
		s.LastError = cleanError(s.LastError)
		out = append(out, s)
		if len(out) == MaxScheduleRows {
			break
		}
	}
	return out
}

// cleanError keeps an error fit to show and to label: valid UTF-8,
// whitespace as a space, no other control or format character (terminal
// escapes, bidi overrides), at most maxScheduleError bytes and "...".
func cleanError(e string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(e, "\uFFFD") {
		switch {
		case r == '\n' || r == '\t' || r == '\r':
			b.WriteByte(' ')
		case unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r):
		default:
			if b.Len()+utf8.RuneLen(r) > maxScheduleError {
				return b.String() + "..."
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ownSchedules keeps the rows of the report's own volumes: a row's uuid
// must be one of the volumes it lists (not an orphan), under the row's
// volume name; a minion cannot report (and raise the overdue alert of) a
// schedule of a volume it does not say it holds.
func ownSchedules(rows []SaltSchedule, vols []saltvolumes.Device) []SaltSchedule {
	if len(rows) == 0 {
		return nil
	}
	names := make(map[string]string, len(vols))
	for _, d := range vols {
		if d.UUID != "" && d.State != "orphan" {
			names[strings.ToLower(d.UUID)] = d.Name
		}
	}
	var out []SaltSchedule
	for _, r := range rows {
		if name, ok := names[r.UUID]; ok && (name == "" || name == r.Volume) {
			out = append(out, r)
		}
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func when(v any) *time.Time {
	t, err := time.Parse(time.RFC3339, str(v))
	if err != nil {
		return nil
	}
	t = t.UTC()
	return &t
}

// SaltSchedules returns the Salt schedule rows of every node's last
// report, by node, schedule and volume.
func (g *Registry) SaltSchedules() []SaltSchedule {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []SaltSchedule
	for name, n := range g.nodes {
		if n.last == nil {
			continue
		}
		// Parse and Confirmed keep the report's own; a report made
		// otherwise is held to the same.
		for _, s := range ownSchedules(n.last.Schedules, n.last.Volumes) {
			s.Node = name
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Schedule != b.Schedule {
			return a.Schedule < b.Schedule
		}
		return a.Volume < b.Volume
	})
	return out
}
