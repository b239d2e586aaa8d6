package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Drain is a plan that runs cmd, which opens a cursor on db.coll, and
// every getMore of it, handing each batch's documents to take; then it
// answers with done's result. An error reply, or take's error, ends it
// with that error.
func Drain(cmd []byte, db, coll string, take func([]bsoncore.Document) error, done func() Result) Plan {
	return &drainPlan{next: cmd, db: db, coll: coll, take: take, done: done}
}

// DrainBatched is Drain with every getMore asking for batch documents:
// without a batchSize, FerretDB answers a getMore with 250 documents
// whatever their size, and the find's own batchSize is not kept.
func DrainBatched(cmd []byte, db, coll string, batch int32, take func([]bsoncore.Document) error, done func() Result) Plan {
	return &drainPlan{next: cmd, db: db, coll: coll, batch: batch, take: take, done: done}
}

type drainPlan struct {
	next     []byte
	db, coll string
	batch    int32 // of each getMore; 0: the upstream's default
	take     func([]bsoncore.Document) error
	done     func() Result
	failed   error // take's error: the cursor is killed, then this answers
	killing  bool
}

func (p *drainPlan) Next() (Step, bool) {
	if p.next == nil {
		return nil, true
	}
	return Step{{Body: p.next}}, false
}

func (p *drainPlan) Feed(replies [][]byte) error {
	p.next = nil
	if p.killing {
		return p.failed
	}
	docs, id, err := cursor.Docs(replies[0])
	if err != nil {
		return err
	}
	if err := p.take(docs); err != nil {
		if id == 0 {
			return err
		}
		// The upstream cursor would stay open until its timeout.
		p.failed, p.killing = err, true
		p.next = KillCursorsCommand(p.db, p.coll, id)
		return nil
	}
	if id != 0 {
		p.next = GetMoreCommand(p.db, p.coll, id)
		if p.batch > 0 {
			p.next = getMoreBatched(p.db, p.coll, id, p.batch)
		}
	}
	return nil
}

func (p *drainPlan) Result() Result { return p.done() }

func getMoreBatched(db, coll string, id int64, batch int32) []byte {
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", id).
		AppendString("collection", coll).AppendInt32("batchSize", batch).AppendString("$db", db).Build()
}

// KillCursorsCommand kills cursor id on db.coll.
func KillCursorsCommand(db, coll string, id int64) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("killCursors", coll).
		AppendArray("cursors", bsoncore.NewArrayBuilder().AppendInt64(id).Build()).
		AppendString("$db", db).Build()
}

// GetMoreCommand asks the upstream for the next batch of cursor id on
// db.coll.
func GetMoreCommand(db, coll string, id int64) []byte {
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", id).
		AppendString("collection", coll).AppendString("$db", db).Build()
}
