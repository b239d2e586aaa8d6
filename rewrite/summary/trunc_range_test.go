package summary

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read"
)

// TestDateTruncCalendarBinSizeLimit: MongoDB refuses a $dateTrunc of
// unit day/week/month/quarter/year whose binSize exceeds 100,000,000,000
// (uassert 5439006 "dateTrunc unsupported binSize value",
// date_time_support.cpp truncateDate). The summary path must not answer
// such a pipeline with data (it should decline, so the read path / upstream
// gives MongoDB's error). For calendar units the proxy has no bound at all,
// and 12*binSize overflows int64.
func TestDateTruncCalendarBinSizeLimit(t *testing.T) {
	h := time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	mm := D{{Key: "ts", Value: rwtest.DT(h)}, {Key: "v", Value: int32(1)}}
	for _, c := range []struct {
		unit string
		bin  int64
	}{
		{"month", 200_000_000_000}, // MongoDB: error 5439006; proxy: one bin from 2000-01-01
		{"year", 1<<62 + 1},        // 12*binSize wraps to 12: proxy answers yearly bins
		{"year", 1 << 62},          // 12*binSize wraps to 0: floorMod(x, 0) panics
	} {
		t.Run(c.unit, func(t *testing.T) {
			pipeline := A{grp(trunc(c.unit, E{Key: "binSize", Value: c.bin}), acc("n", "$count", D{}))}
			p, ok := PlanAggregation(sumCmd(t, pipeline), sumRule(), read.Options{})
			if !ok {
				return // declined: the upstream answers (with MongoDB's error)
			}
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("binSize %d %s: panic %v", c.bin, c.unit, r)
				}
			}()
			if _, err := p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{bkt("a", h, 1, mm, mm, nil)}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})); err != nil {
				t.Fatal(err)
			}
			out, ok, err := p.Result()
			if err == nil && ok {
				t.Fatalf("binSize %d %s: answered from summaries %s; MongoDB fails with 5439006 \"dateTrunc unsupported binSize value\"", c.bin, c.unit, rwtest.JSON(out))
			}
		})
	}
}

// TestDateTruncYearBinBeforeReference: a binSize within MongoDB's
// bound whose bin start leaves the date range. MongoDB: the event of 1990
// falls in the bin starting 10^10 years before 2000; dateAdd refuses that
// amount (uassert 5976500, isDateAddAmountValid: at most ~5.85e8 years),
// and past ~2.9e8 years its result overflows (5166406). The proxy answers
// with a wrapped date.
func TestDateTruncYearBinBeforeReference(t *testing.T) {
	h := time.Date(1990, 3, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	mm := D{{Key: "ts", Value: rwtest.DT(h)}, {Key: "v", Value: int32(1)}}
	pipeline := A{grp(trunc("year", E{Key: "binSize", Value: int64(10_000_000_000)}), acc("n", "$count", D{}))}
	out, ok, err := runSummaryErr(t, pipeline, A{bkt("a", h, 1, mm, mm, nil)})
	if err == nil && ok {
		t.Fatalf("answered from summaries: %s; MongoDB fails with 5976500 \"invalid dateAdd 'amount' parameter value\" (bin start 1e10 years before 2000)", out)
	}
}
