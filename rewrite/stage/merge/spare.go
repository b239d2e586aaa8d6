package merge

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// Spare staging collections. A proxy's first insert into a staging
// collection creates it and writes its marker: on FerretDB a
// create costs 5-8 ms (a table, its index, the catalog), against about 1
// ms for an insert. A merge before a read freezes the collection that the
// reads' writers were inserting into, so with a read every few per-event
// inserts, every few inserts paid that create (tsbench dashboard: inserts
// at 0.38 of direct with a read every 4).
//
// So the merge before a read (Host.ReserveSpare) keeps the retired
// collection it merged instead of dropping it: it renames it to a spare
// name of its proxy's (SpareName), one command as the drop was. The proxy
// then deletes every document of the spare but its marker
// (SpareCleanCommand), after the read is answered, and its next first
// insert into a staging collection renames the cleaned spare to that
// collection's name (a rename changes only FerretDB's catalog) instead of
// creating one, keeping the marker as the collection's own: the
// collection then holds the marker and nothing else, as markKept's create
// and insert leave it, so what Kept says holds. A rename onto a name
// that exists fails, as a create does.
//
// A spare's name is of no form Parse reads (as LostName's): no read,
// merge or flush takes it, or the documents it holds before it is
// cleaned, for staged work, on any proxy. It is in the staging tier's
// names, so it is hidden from clients and dropped with the rule's
// staging. A merge cut before its rename leaves the retired collection
// (and its plan), which the next merge finishes; a spare left by a proxy
// that stopped, or not cleaned, is dropped by its proxy when it finds it
// unused.

// recycle makes retired collection r, merged, the spare that
// Host.ReserveSpare names, when it asks for one and the merge read r
// from what the proxy kept (so its marker is known); done says whether
// r is gone so. A rename that fails (the spare's name is taken) leaves r
// to be dropped.
func (m *Merge) recycle(x *rewrite.Exec, r stage.Collection) (done bool, err error) {
	marker := m.keptMarkers[r.Name]
	if marker == "" {
		return false, nil
	}
	name, ok := m.host().ReserveSpare(r)
	if !ok {
		return false, nil
	}
	defer func() { m.host().SpareRenamed(name, done, marker) }()
	reply, ok := x.One(stage.RenameCommand(m.rule.DB, r.Name, name))
	if !ok {
		return false, rewrite.ErrAborted
	}
	if mongoerr.ReplyError(reply) != nil {
		return false, nil
	}
	m.Stats.Spares++
	return true, nil
}
