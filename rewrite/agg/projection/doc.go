// Package projection applies $project, $addFields and $set specs to a
// document, as MongoDB does: dotted paths and nested documents are one
// tree, inclusion and exclusion are not mixed (but for _id), computed
// fields are expressions, and a path through an array applies to each
// of its documents.
//
// It does no I/O.
package projection
