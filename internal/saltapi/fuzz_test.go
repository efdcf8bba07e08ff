package saltapi

import (
	"encoding/json"
	"testing"
)

// FuzzParseListJob: whatever salt-api answers, parsing gives a JobInfo or an
// error; a known job's returns are all keyed by minion.
func FuzzParseListJob(f *testing.F) {
	f.Add([]byte(`{"jid":"1","Function":"state.apply","Minions":["node-1"],"Result":{"node-1":{"return":{"a":{"result":true}},"retcode":0}}}`))
	f.Add([]byte(`{"Error":"Cannot contact returner or no job with this jid","StartTime":"","Result":{}}`))
	f.Add([]byte(`{"Function":"state.apply","Result":{"node-1":"bare"}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := ParseListJob(json.RawMessage(b))
		if err != nil {
			return
		}
		if len(info.Returns) > 0 && !info.Known {
			t.Fatal("a job with returns is known")
		}
	})
}
