package merge

import (
	"errors"
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// FerretDB v1.24 on PostgreSQL drops a collection in two statements that
// are not one transaction: DROP TABLE, then the delete of the collection's
// catalog entry (metadata.Registry.collectionDrop). Killed between them, it
// keeps an entry whose table is gone: after a restart every command on
// that name fails with PostgreSQL's undefined_table (SQLSTATE 42P01), the
// drop included, so FerretDB can never be rid of it. A merge drops its
// retired collection last, once its events are in buckets and its retries
// recorded, so such a crash leaves a retired collection that every later
// merge, and every read of the rule (which merges first), failed on.
//
// What such a collection held is gone with its table, and its merge had
// written it all before the drop. So a merge that cannot read a retired
// collection because its table does not exist sets it aside: it renames
// it to its LostName, which only changes FerretDB's catalog (the table is
// not touched, and is not needed), and goes on. A collection that a
// concurrent drop removed while the read ran gives the same error once:
// its rename then finds nothing to rename.

// lostTableError is a read of retired collection coll that the upstream
// answered with undefined_table.
type lostTableError struct {
	coll string
	err  error
}

func (e *lostTableError) Error() string { return e.err.Error() }
func (e *lostTableError) Unwrap() error { return e.err }

// lostIn marks err, the error of a read of coll alone, as a lost table
// when the upstream answered undefined_table.
func lostIn(coll string, err error) error {
	if err != nil && mongoerr.DroppedUnderQuery(err) {
		return &lostTableError{coll: coll, err: err}
	}
	return err
}

// setAsideLost handles err, an error of the merge of retired collection
// r: when it is a read of r that met a lost table (lostIn), r is renamed
// to its LostName and nil returned; any other error is returned as it
// is.
func (m *Merge) setAsideLost(x *rewrite.Exec, r stage.Collection, err error) error {
	var lost *lostTableError
	if !errors.As(err, &lost) || lost.coll != r.Name {
		return err
	}
	reply, ok := x.One(stage.SetAsideCommand(m.rule, r.Name))
	if !ok {
		return rewrite.ErrAborted
	}
	if rerr := mongoerr.ReplyError(reply); rerr != nil {
		if mongoerr.CodeOf(rerr) == mongoerr.NamespaceNotFound {
			return nil // dropped meanwhile: merged by whoever dropped it
		}
		return fmt.Errorf("%w; and setting it aside failed: %w", err, rerr)
	}
	m.Stats.Lost = append(m.Stats.Lost, r.Name)
	return nil
}
