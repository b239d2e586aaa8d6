package rules

import (
	"time"
)

// Defaults of the configuration. The shipped config.yaml states the same
// values; Load applies them to every key the file, the environment and the
// flags leave unset.
const (
	DefaultListen          = "127.0.0.1:27017"
	DefaultUpstreamURI     = UpstreamEmbedded
	DefaultDataDir         = "./data"
	DefaultDialTimeout     = 5 * time.Second
	DefaultMaxConnections  = 10000
	DefaultMaxMessageBytes = MaxMessageBytes
	DefaultMaxCursors      = 100000
	DefaultCursorTTL       = 10 * time.Minute
	DefaultRetryCacheSize  = 100000
	DefaultRetryCacheTTL   = 30 * time.Minute
	// DefaultFrameTimeout and DefaultWriteTimeout are 2 minutes: a 48 MB
	// message over a 400 KB/s link.
	DefaultFrameTimeout = 2 * time.Minute
	DefaultWriteTimeout = 2 * time.Minute
	// DefaultAggregateMemory is what one blocking stage of an
	// aggregation the proxy runs itself may hold: MongoDB's 100 MB.
	DefaultAggregateMemory = 100 << 20
	// DefaultStagedMemory is what one proxy keeps of its staged inserts
	// to merge them without reading them back (limits.stagedMemory).
	DefaultStagedMemory    = 64 << 20
	DefaultMetricsListen   = "127.0.0.1:9216"
	DefaultServiceName     = "tsproxy"
	DefaultLogLevel        = "info"
	DefaultLogFormat       = "text"
	DefaultShutdownTimeout = 30 * time.Second

	// DefaultConfigFile is read when no file is named and it exists in the
	// working directory.
	DefaultConfigFile = "config.yaml"

	// UpstreamEmbedded is the upstream URI that selects the in-process
	// FerretDB/SQLite server.
	UpstreamEmbedded = "embedded"

	// MaxMessageBytes is MongoDB's maxMessageSizeBytes, the largest wire
	// message limits.maxMessageBytes may allow.
	MaxMessageBytes = 48_000_000
	// MinMessageBytes is the smallest limits.maxMessageBytes accepted: below
	// it even a handshake may not fit.
	MinMessageBytes = 16 * 1024
)

// Client authentication modes of ListenTLS.ClientAuth.
const (
	ClientAuthNone    = "none"    // no client certificate asked for
	ClientAuthRequest = "request" // asked for; verified against CAFile when sent
	ClientAuthRequire = "require" // required and verified against CAFile
)

// Config is the whole tsproxy configuration, as Load returns it: defaults
// applied, every value checked.
type Config struct {
	// Listen is the HOST:PORT the proxy accepts MongoDB clients on
	// (key "listen", flag --listen). Default "127.0.0.1:27017".
	Listen string
	// ListenUnix is the path of a Unix domain socket the proxy also
	// accepts MongoDB clients on (key "listenUnix", flag --listen-unix),
	// for apps on its host: mongodb://%2Fpath%2Fto%2Ftsproxy.sock/. It ends
	// in ".sock", as drivers require of a socket host; made absolute at
	// load. Empty (the default): none. No TLS on it (ListenTLS is the TCP
	// listener's); who may connect is the socket file's permissions.
	ListenUnix string
	// ListenTLS makes the listener speak TLS (key "listenTLS"). Left empty,
	// the listener is plain TCP.
	ListenTLS TLSServer
	// Upstream is the server the proxy forwards to (key "upstream").
	Upstream Upstream
	// Limits bound what one proxy holds (key "limits").
	Limits Limits
	// Telemetry configures metrics, traces and logs (key "telemetry").
	Telemetry Telemetry
	// Rules are the bucketed namespaces (key "rules"), in file order, with
	// every default filled in. Build the lookup once with RuleSet.
	Rules []Rule
	// ShutdownTimeout is how long a graceful shutdown waits for clients
	// before closing their connections (key "shutdownTimeout"). Default 30s;
	// 0 closes at once.
	ShutdownTimeout time.Duration

	// CreateTimeseries says who serves a create with MongoDB's timeseries
	// option on a namespace without a rule (key "createTimeseries"):
	// CreateTimeseriesAuto (the default) the upstream where it has
	// time-series collections (MongoDB 5.0+), else the proxy.
	CreateTimeseries string

	// File is the config file that was read; empty when none was.
	File string

	set *Set // built by Load
}

// RuleSet returns the lookup over c.Rules. Load builds it once; for a
// Config built by hand it is built on each call, so keep the result.
func (c *Config) RuleSet() *Set {
	if c.set != nil {
		return c.set
	}
	return NewSet(c.Rules)
}

// TLSServer is the listener's TLS setting (key "listenTLS").
type TLSServer struct {
	// CertFile and KeyFile are the PEM certificate chain and private key
	// the proxy presents ("listenTLS.certFile", "listenTLS.keyFile"). Both
	// or neither; set, the listener speaks TLS only.
	CertFile string
	KeyFile  string
	// CAFile holds the PEM CAs that client certificates are verified
	// against ("listenTLS.caFile"). Needed when ClientAuth is "request" or
	// "require".
	CAFile string
	// ClientAuth is "none" (default), "request" (a client certificate is
	// asked for and verified when sent) or "require" ("listenTLS.clientAuth").
	ClientAuth string
}

// Enabled reports whether the listener speaks TLS.
func (t TLSServer) Enabled() bool { return t.CertFile != "" }

// Upstream is where the proxy sends what it forwards (key "upstream").
type Upstream struct {
	// URI is "embedded" (default: an in-process FerretDB with SQLite storage
	// in DataDir) or a mongodb://host[:port][,host...]/?options connection
	// string ("upstream.uri", flag --upstream). mongodb+srv:// is not
	// supported yet.
	URI string
	// DataDir is the embedded upstream's data folder ("upstream.dataDir",
	// flag --data). Default "./data", relative to the working directory.
	DataDir string
	// DialTimeout bounds one connection attempt to the upstream
	// ("upstream.dialTimeout"). Default 5s.
	DialTimeout time.Duration
	// TLS is how the proxy speaks TLS to a mongodb:// upstream
	// ("upstream.tls").
	TLS TLSClient
}

// Embedded reports whether the upstream is the in-process server.
func (u Upstream) Embedded() bool { return u.URI == UpstreamEmbedded }

// TLSClient is the TLS setting of the upstream connections
// (key "upstream.tls").
type TLSClient struct {
	// Enabled turns TLS on ("upstream.tls.enabled"). Default false.
	Enabled bool
	// CAFile holds PEM CAs that verify the upstream's certificate
	// ("upstream.tls.caFile"); empty: the system roots.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and key for mutual
	// TLS ("upstream.tls.certFile", "upstream.tls.keyFile"). Both or neither.
	CertFile string
	KeyFile  string
	// InsecureSkipVerify skips verifying the upstream's certificate
	// ("upstream.tls.insecureSkipVerify"). For tests only.
	InsecureSkipVerify bool
	// ServerName overrides the name checked in the upstream's certificate
	// ("upstream.tls.serverName"); empty: the host dialled.
	ServerName string
}

// Limits bound the resources one proxy uses (key "limits").
type Limits struct {
	// MaxConnections is the most client connections served at once
	// ("limits.maxConnections"); more are refused. 1..1000000, default 10000.
	MaxConnections int
	// MaxMessageBytes is the largest wire message accepted from a client or
	// an upstream ("limits.maxMessageBytes"), between MinMessageBytes and
	// MaxMessageBytes (48000000, the default). Also announced in hello.
	MaxMessageBytes int
	// MaxCursors is the most open proxy cursors over all clients
	// ("limits.maxCursors"), 1..100000000. Default 100000.
	MaxCursors int
	// CursorTTL closes a proxy cursor left idle this long
	// ("limits.cursorTTL"). Default 10m; at least 1s.
	CursorTTL time.Duration
	// FrameTimeout bounds a client message's arrival once its first byte
	// came, and a TLS handshake ("limits.frameTimeout"); WriteTimeout the
	// write of a reply to a client ("limits.writeTimeout"). A client past
	// either is disconnected; an idle client never is. Default 2m each; at
	// least 1s.
	FrameTimeout, WriteTimeout time.Duration
	// RetryCacheSize is how many sessions' last retryable rewritten write
	// the proxy remembers, to answer a driver's retry with the write's
	// reply instead of writing again ("limits.retryCacheSize"),
	// 1..100000000. Default 100000.
	RetryCacheSize int
	// RetryCacheTTL forgets such a record after this long
	// ("limits.retryCacheTTL"). Default 30m (MongoDB's session timeout);
	// at least 1s.
	RetryCacheTTL time.Duration
	// AggregateMemory bounds, in bytes, what one blocking stage ($group,
	// $sort, $sortByCount) of an aggregation the proxy runs itself holds
	// ("limits.aggregateMemory"); past it the aggregation fails with
	// QueryExceededMemoryLimitNoDiskUseAllowed. 1 KiB..1 TiB, default
	// 100 MiB.
	AggregateMemory int
	// StagedMemory bounds, in bytes, the staged documents the proxy keeps
	// in memory so that the merge of a staging collection it froze need
	// not read the collection back ("limits.stagedMemory"); past it, a
	// collection is read back. 0 keeps none; at most 1 TiB, default
	// 64 MiB.
	StagedMemory int
}

// Telemetry configures what the proxy tells about itself (key "telemetry").
type Telemetry struct {
	// MetricsListen is the HOST:PORT of the Prometheus /metrics endpoint
	// ("telemetry.metricsListen", flag --metrics). Default "127.0.0.1:9216";
	// "" disables it.
	MetricsListen string
	// OTLPEndpoint is where traces and metrics are pushed over OTLP/HTTP
	// ("telemetry.otlpEndpoint"), e.g. "http://localhost:4318"; "" disables
	// OTLP.
	OTLPEndpoint string
	// ServiceName is the service.name resource attribute
	// ("telemetry.serviceName"). Default "tsproxy".
	ServiceName string
	// LogLevel is debug, info (default), warn or error
	// ("telemetry.logLevel", flag --log-level). Stored lower-case.
	LogLevel string
	// LogFormat is text (default) or json ("telemetry.logFormat").
	LogFormat string
}
