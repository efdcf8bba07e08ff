//go:build !failpoints

package failpoint

// Enabled says whether this binary was built with the failpoints tag.
const Enabled = false

// Hit does nothing in a released binary.
func Hit(string) {}

// ToolDirs returns nothing in a released binary.
func ToolDirs() []string { return nil }
