package rewrite

// The documents a counter or slots read returns are made by the proxy
// from the buckets, so the proxy evaluates the app's filter on them
// itself. It supports a clear subset of the query language and refuses the
// rest by name: comparisons ($eq $ne $gt $gte $lt $lte $in $nin), $exists,
// $not, and $and/$or/$nor, on top-level or dotted fields, with MongoDB's
// type bracketing and BSON order (CompareValues). Arrays are not matched
// element-wise (no field of these documents holds one, except inside a
// document meta).
