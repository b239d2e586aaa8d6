package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/layout"
)

// shape is one stored form of an hour of one-second doubles: what one
// slots bucket holds when its window is full.
type shape struct {
	name   string
	values func() any
}

// hourOfValues are the 3,600 values of a full hour, slot s holding v(s).
func hourOfValues(v func(int) float64) bson.D {
	var inner bson.D
	for s := range 3600 {
		inner = append(inner, bson.E{Key: strconv.Itoa(s), Value: v(s)})
	}
	return inner
}

var shapes = []shape{
	{"a field per slot, nested by the minute (packed: false)", func() any {
		var groups bson.D
		for g := range 60 {
			var sub bson.D
			for s := range 60 {
				sub = append(sub, bson.E{Key: strconv.Itoa(s), Value: shapeValue(g*60 + s)})
			}
			groups = append(groups, bson.E{Key: strconv.Itoa(g), Value: sub})
		}
		return groups
	}},
	{"packed, raw", func() any {
		b, _ := bson.Marshal(hourOfValues(shapeValue)) // doubles always marshal
		return bson.Binary{Subtype: layout.SlotsPackedSubtype, Data: b}
	}},
	{"packed, zstd (the default)", func() any {
		b, _ := bson.Marshal(hourOfValues(shapeValue))
		z, _ := bucket.Compress(b)
		return bson.Binary{Subtype: layout.SlotsPackedZstdSubtype, Data: z}
	}},
}

// shapeValue is a CPU reading with a decimal part, as samples have.
func shapeValue(s int) float64 { return float64((s*37)%1000) / 10 }

// benchShapes times an insert, a find by _id and a replacement by _id of
// one slots bucket of a full hour in each stored form, straight on the
// upstream (no proxy): FerretDB's cost of a document is per field, which
// is why the proxy packs slots there (rewrite/layout's packed slots).
func benchShapes(e *benchenv.Env, runs int) error {
	ctx := context.Background()
	cs, err := e.ConnectBoth(10*time.Minute, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	db := cs.Direct.Database("tsbench")
	const docs = 10
	fmt.Printf("\nmedians of %d runs x %d documents, ms; one hour of one-second doubles (3,600 values) a document, in a collection of %d\n\n", runs, docs, docs)
	fmt.Println("| stored form | document bytes | insert | find by _id | replace by _id |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for i, sh := range shapes {
		var ins, find, rep []float64
		var size int
		coll := db.Collection("shapes_" + strconv.Itoa(i))
		for range runs {
			if err := coll.Drop(ctx); err != nil {
				return err
			}
			if e.IndexIDs != nil {
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: -1}}); err != nil {
					return err
				}
				if err := e.IndexIDs(ctx, "tsbench", coll.Name()); err != nil {
					return err
				}
			}
			doc := func(id int) bson.D {
				return bson.D{{Key: "_id", Value: id}, {Key: "meta", Value: "h01"}, {Key: "num_samples", Value: int64(3600)}, {Key: "values", Value: sh.values()}}
			}
			b, _ := bson.Marshal(doc(0))
			size = len(b)
			ms := func(f func() error) (float64, error) {
				t0 := time.Now()
				err := f()
				return float64(time.Since(t0).Microseconds()) / 1000, err
			}
			for id := range docs {
				d, err := ms(func() error { _, err := coll.InsertOne(ctx, doc(id)); return err })
				if err != nil {
					return err
				}
				ins = append(ins, d)
			}
			for id := range docs {
				d, err := ms(func() error { return coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Err() })
				if err != nil {
					return err
				}
				find = append(find, d)
				d, err = ms(func() error {
					_, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}}, doc(id))
					return err
				})
				if err != nil {
					return err
				}
				rep = append(rep, d)
			}
		}
		_ = coll.Drop(ctx)
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1f |\n", sh.name, size, benchenv.Median(slices.Clone(ins)), benchenv.Median(slices.Clone(find)), benchenv.Median(slices.Clone(rep)))
	}
	return nil
}
