package mongoerr

//go:generate stringer -type=Code -linecomment -output=code_string.go

// Code is a MongoDB error code. Its String is MongoDB's codeName; codes the
// server names "Location<code>" are named so here too.
type Code int32

// The codes the proxy answers with, or reads in the upstream's replies.
const (
	UnknownError                       Code = 8     // UnknownError
	InternalError                      Code = 1     // InternalError
	BadValue                           Code = 2     // BadValue
	HostUnreachable                    Code = 6     // HostUnreachable
	FailedToParse                      Code = 9     // FailedToParse
	Unauthorized                       Code = 13    // Unauthorized
	IllegalOperation                   Code = 20    // IllegalOperation
	TypeMismatch                       Code = 14    // TypeMismatch
	InvalidLength                      Code = 16    // InvalidLength
	AuthenticationFailed               Code = 18    // AuthenticationFailed
	InvalidBSON                        Code = 22    // InvalidBSON
	NamespaceNotFound                  Code = 26    // NamespaceNotFound
	PathNotViable                      Code = 28    // PathNotViable
	ConflictingUpdateOperators         Code = 40    // ConflictingUpdateOperators
	DollarPrefixedFieldName            Code = 52    // DollarPrefixedFieldName
	EmptyFieldName                     Code = 56    // EmptyFieldName
	ImmutableField                     Code = 66    // ImmutableField
	IndexNotFound                      Code = 27    // IndexNotFound
	CursorNotFound                     Code = 43    // CursorNotFound
	MaxTimeMSExpired                   Code = 50    // MaxTimeMSExpired
	NamespaceExists                    Code = 48    // NamespaceExists
	CommandNotFound                    Code = 59    // CommandNotFound
	InvalidOptions                     Code = 72    // InvalidOptions
	InvalidNamespace                   Code = 73    // InvalidNamespace
	OperationFailed                    Code = 96    // OperationFailed
	ConflictingOperationInProgress     Code = 117   // ConflictingOperationInProgress
	CommandNotSupportedOnView          Code = 166   // CommandNotSupportedOnView
	TransactionTooOld                  Code = 225   // TransactionTooOld
	OperationNotSupportedInTransaction Code = 263   // OperationNotSupportedInTransaction
	QueryExceededMemoryLimit           Code = 292   // QueryExceededMemoryLimitNoDiskUseAllowed
	NotImplemented                     Code = 238   // NotImplemented
	BSONObjectTooLarge                 Code = 10334 // BSONObjectTooLarge
	InterruptedAtShutdown              Code = 11600 // InterruptedAtShutdown
	DuplicateKey                       Code = 11000 // DuplicateKey
	DistinctTooBig                     Code = 17217 // Location17217
	ProjectionCollide                  Code = 31249 // Location31249
	ProjectionMixed                    Code = 31254 // Location31254
	NoBucketBranch                     Code = 40066 // Location40066
	IDLFailedToParse                   Code = 40414 // Location40414
	IDLUnknownField                    Code = 40415 // Location40415
	GetMoreOutsideSession              Code = 50736 // Location50736
	GetMoreWithoutSession              Code = 50737 // Location50737
	GetMoreInOtherSession              Code = 50738 // Location50738

	// The proxy's own, for limits no server code names.
	TooManyConnections Code = 8001 // TooManyConnections
	TooManyCursors     Code = 8002 // TooManyCursors
)

// Name is MongoDB's codeName of c, or "" for a code this package does not
// name (the reply then carries the code alone).
func (c Code) Name() string {
	if s := c.String(); len(s) < 5 || s[:5] != "Code(" {
		return s
	}
	return ""
}
