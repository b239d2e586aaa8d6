// Package updateop applies MongoDB's update language to one document: a
// replacement, an update of operators ($set, $unset, $inc, $mul, $min,
// $max, $rename, $currentDate, $setOnInsert, $push with $each,
// $position, $slice and $sort, $addToSet, $pop, $pull, $pullAll, $bit),
// or a pipeline of $set/$addFields, $unset, $project, $replaceRoot and
// $replaceWith (run by rewrite/agg). Operators apply in the lexicographic
// order of their paths, as MongoDB 5.0+ applies them, so new fields land
// where MongoDB puts them; errors carry MongoDB's codes and messages.
//
// It is pure: a document in, a document out. The update plans of a
// bucketed namespace (rewrite/updates) apply it to each matched event.
package updateop
