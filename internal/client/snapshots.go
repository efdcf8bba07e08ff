package client

import (
	"context"
	"net/http"
	"net/url"

	saltvolumes "github.com/salt-volumes/salt-volumes"
)

// TakeSnapshot asks for snapshot name of a volume (taking it again answers
// the one asked for).
//
// size, a thick LVM snapshot's copy-on-write space ("2Gi"), is optional:
// a sparse or thin volume takes none.
func (c *Client) TakeSnapshot(ctx context.Context, volume, name string, size ...string) (saltvolumes.Snapshot, error) {
	var s saltvolumes.Snapshot
	body := map[string]any{"name": name}
	if len(size) > 0 && size[0] != "" {
		body["size"] = size[0]
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/volumes/"+url.PathEscape(volume)+"/snapshots", body, &s)
	return s, err
}

// TakeSnapshotFor asks for a snapshot that exists only to be cloned as the
// new volume clone: the control plane deletes it once that is Available.
func (c *Client) TakeSnapshotFor(ctx context.Context, volume, name, clone string) (saltvolumes.Snapshot, error) {
	var s saltvolumes.Snapshot
	err := c.do(ctx, http.MethodPost, "/api/v1/volumes/"+url.PathEscape(volume)+"/snapshots", map[string]any{"name": name, "for": clone}, &s)
	return s, err
}

// Snapshots lists snapshots: one volume's, or all ("").
func (c *Client) Snapshots(ctx context.Context, volume string) ([]saltvolumes.Snapshot, error) {
	var out struct {
		Items []saltvolumes.Snapshot `json:"items"`
	}
	path := "/api/v1/snapshots"
	if volume != "" {
		path += "?volume=" + url.QueryEscape(volume)
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Items, err
}

// Snapshot reads one snapshot.
func (c *Client) Snapshot(ctx context.Context, name string) (saltvolumes.Snapshot, error) {
	var s saltvolumes.Snapshot
	err := c.do(ctx, http.MethodGet, "/api/v1/snapshots/"+url.PathEscape(name), nil, &s)
	return s, err
}

// DeleteSnapshot asks for a snapshot's deletion on its node.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) (saltvolumes.Snapshot, error) {
	var s saltvolumes.Snapshot
	err := c.do(ctx, http.MethodDelete, "/api/v1/snapshots/"+url.PathEscape(name), nil, &s)
	return s, err
}

// RestoreSnapshot asks for the snapshot's volume to be put back to it in
// place; asking while that runs answers the running restore. The answer's
// Restore says how it goes (Restoring, then Restored or Failed).
func (c *Client) RestoreSnapshot(ctx context.Context, name string) (saltvolumes.Snapshot, error) {
	var s saltvolumes.Snapshot
	err := c.do(ctx, http.MethodPost, "/api/v1/snapshots/"+url.PathEscape(name)+"/restore", nil, &s)
	return s, err
}

// SetSnapshotSchedule sets (or changes) a volume's snapshot schedule:
// every ("1h"), keep, and maxAge ("7d", optional).
func (c *Client) SetSnapshotSchedule(ctx context.Context, volume, every string, keep int, maxAge string) (saltvolumes.SnapshotSchedule, error) {
	var s saltvolumes.SnapshotSchedule
	body := map[string]any{"every": every, "keep": keep}
	if maxAge != "" {
		body["maxAge"] = maxAge
	}
	err := c.do(ctx, http.MethodPut, "/api/v1/volumes/"+url.PathEscape(volume)+"/snapshot-schedule", body, &s)
	return s, err
}

// DeleteSnapshotSchedule removes a volume's snapshot schedule (its
// snapshots stay).
func (c *Client) DeleteSnapshotSchedule(ctx context.Context, volume string) (saltvolumes.SnapshotSchedule, error) {
	var s saltvolumes.SnapshotSchedule
	err := c.do(ctx, http.MethodDelete, "/api/v1/volumes/"+url.PathEscape(volume)+"/snapshot-schedule", nil, &s)
	return s, err
}

// SnapshotSchedules lists the API's and the nodes' Salt snapshot
// schedules: one volume's, or all (""); source "api" or "salt" for one
// kind ("" both).
func (c *Client) SnapshotSchedules(ctx context.Context, volume, source string) ([]saltvolumes.SnapshotSchedule, error) {
	var out struct {
		Items []saltvolumes.SnapshotSchedule `json:"items"`
	}
	q := url.Values{}
	if volume != "" {
		q.Set("volume", volume)
	}
	if source != "" {
		q.Set("source", source)
	}
	path := "/api/v1/snapshot-schedules"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Items, err
}
