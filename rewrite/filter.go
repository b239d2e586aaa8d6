package rewrite

// This file splits an app's event filter into the two $match stages of a
// bucketed read:
//
//   - the bucket-level filter, run before $unwind: the filter's top-level
//     (and $and) predicates on the timeField, turned into predicates on the
//     bucket's "start", and those on the metaField, turned into predicates
//     on the bucket's "meta". It selects a superset of the buckets holding
//     matching events, using the {meta: 1, start: 1} index.
//   - the event-level filter, run after $unwind: the whole filter with each
//     event path f renamed events.f and each metaField path renamed meta...
//
// An event stored without its metaField sits in a bucket whose meta is null
// and has no marker key; one stored with it has the marker (a null under
// the metaField's name, see storedEvent). MongoDB matches a missing field
// and a null alike for every operator but $exists and $type, so those two
// are answered from the marker.
