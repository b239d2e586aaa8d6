package admin

import (
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// A probe makes a scratch collection and drops it; a proxy killed or shut
// down between the two leaves it behind, and no hook at exit can drop it
// (kill -9). So each probe's collection is named for when it began, and
// a proxy sweeps the names older than StaleProbeAge before it probes.

// ProbePrefix begins the name of every probe's scratch collection.
const ProbePrefix = "tsproxy_probe_"

// StaleProbeAge is how long after it began a probe's collection is taken
// as left behind: a probe runs a few commands (seconds at most on a
// loaded upstream), so one this old belongs to no probe still running.
const StaleProbeAge = 10 * time.Minute

// sweepBatch bounds the names one sweep lists; the next proxy's sweep
// takes the rest.
const sweepBatch = 1000

// ProbeName is the name of a probe's scratch collection begun at now;
// nonce keeps two probes begun in the same second apart.
func ProbeName(now time.Time, nonce string) string {
	return ProbePrefix + strconv.FormatInt(now.Unix(), 10) + "_" + nonce
}

// probeBegan is when the probe of collection name began; false for a name
// that is no probe's, or a probe of a proxy before names carried a time
// (which is as old as that proxy, so stale).
func probeBegan(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, ProbePrefix)
	if !ok {
		return time.Time{}, false
	}
	secs, _, ok := strings.Cut(rest, "_")
	if !ok {
		return time.Time{}, true
	}
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return time.Time{}, true
	}
	return time.Unix(n, 0), true
}

// StaleProbe says whether collection name is a probe's left behind at
// now.
func StaleProbe(name string, now time.Time) bool {
	began, ok := probeBegan(name)
	return ok && now.Sub(began) >= StaleProbeAge
}

// StaleProbeSweep is the plan that drops db's probe collections left
// behind at now: it lists the names that begin with ProbePrefix and drops
// each that StaleProbe says is stale. A name dropped meanwhile by another
// proxy's sweep is no error. Its reply is {ok: 1, dropped: n}.
func StaleProbeSweep(db string, now time.Time) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		list := bsoncore.NewDocumentBuilder().AppendInt32("listCollections", 1).
			AppendDocument("filter", bsoncore.NewDocumentBuilder().
				AppendRegex("name", "^"+ProbePrefix, "").Build()).
			AppendBoolean("nameOnly", true).
			AppendDocument("cursor", bsoncore.NewDocumentBuilder().AppendInt32("batchSize", sweepBatch).Build()).
			AppendString("$db", db).Build()
		listed, ok := x.One(list)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(listed); err != nil {
			return rewrite.Result{}, err
		}
		dropped := int32(0)
		for _, name := range listedNames(listed) {
			if !StaleProbe(name, now) {
				continue
			}
			drop := bsoncore.NewDocumentBuilder().AppendString("drop", name).AppendString("$db", db).Build()
			reply, ok := x.One(drop)
			if !ok {
				return rewrite.Result{}, rewrite.ErrAborted
			}
			if err := mongoerr.ReplyError(reply); err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceNotFound {
				return rewrite.Result{}, err
			}
			dropped++
		}
		return rewrite.Result{Reply: bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).AppendInt32("dropped", dropped).Build()}, nil
	})
}

// Dropped reads a StaleProbeSweep's reply.
func Dropped(reply []byte) (int, error) {
	if err := mongoerr.ReplyError(reply); err != nil {
		return 0, err
	}
	n, _ := bsoncore.Document(reply).Lookup("dropped").AsInt64OK()
	return int(n), nil
}

// listedNames are the names in a listCollections reply's first batch.
func listedNames(reply []byte) []string {
	batch, _ := bsoncore.Document(reply).Lookup("cursor", "firstBatch").ArrayOK()
	vals, _ := batch.Values()
	var names []string
	for _, v := range vals {
		d, _ := v.DocumentOK()
		if n, ok := d.Lookup("name").StringValueOK(); ok {
			names = append(names, n)
		}
	}
	return names
}
