package merge

// NextInsertLens is nextInserts on documents of the given sizes in
// bytes.
func NextInsertLens(sizes []int, streams int) []int {
	return nextInserts(len(sizes), func(i int) int { return sizes[i] }, streams)
}
