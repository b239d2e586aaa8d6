package tier

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// A proxy stages in the recorded form, or in its latest when a newer
// proxy recorded a later one (every proxy reads the forms before its
// own); a record below the first form is an error, which stages in the
// form every proxy reads.
func TestWritableFormat(t *testing.T) {
	for _, tc := range []struct {
		recorded int
		want     bucket.StagedFormat
		err      bool
	}{
		{recorded: 1, want: bucket.StagedKeyed},
		{recorded: 2, want: bucket.StagedPacked},
		{recorded: 3, want: bucket.LatestStagedFormat},
		{recorded: 0, err: true},
		{recorded: -1, err: true},
	} {
		got, err := writableFormat(tc.recorded)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("writableFormat(%d) = %d, %v; want %d, error %v", tc.recorded, got, err, tc.want, tc.err)
		}
	}
}
