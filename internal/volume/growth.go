package volume

// Reasons of a growth, set by the requests service and the reconciler and
// read by the Kubernetes side.
const (
	// ReasonResizing: a grow was asked for; the prepare state runs with
	// the new size.
	ReasonResizing = "Resizing"
	// ReasonResizeFailed: the growth's state run failed; asking again (the
	// same size, or any size from the one it had) runs it again.
	ReasonResizeFailed = "ResizeFailed"
)

// StartGrowth makes v wait for the prepare run that grows it.
func StartGrowth(v *Volume, msg string) {
	st := &v.Status
	st.Phase, st.JobID, st.Step, st.Growing = Pending, "", "", true
	st.Reason, st.Message = ReasonResizing, msg
}

// GrowthAsked tells whether a prepared sparse or LVM volume's spec asks for
// more than its last prepare had.
func GrowthAsked(v *Volume) bool {
	return v.Status.PreparedSize > 0 && v.Spec.Bytes() > v.Status.PreparedSize
}
