package join

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
)

// BindStages is stages with the variables of a let replaced by their
// values, as a $lookup's let binds its pipeline: an update's let and c
// bind its pipeline the same way (rewrite/updateop).
func BindStages(stages []agg.Stage, vars map[string]bsoncore.Value) ([]agg.Stage, error) {
	return bindStages(stages, vars)
}

// CheckVarName refuses a let variable name MongoDB refuses.
func CheckVarName(name string) error { return checkVarName(name) }
