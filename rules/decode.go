package rules

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// decoder turns viper's merged values into a Config, collecting an *Error
// for every bad value.
type decoder struct {
	v      *viper.Viper
	flagOf map[string]*pflag.Flag // lower-cased key -> bound flag
	errs   []error
}

// fail records a problem with key; msg follows "key: ".
func (d *decoder) fail(key, format string, args ...any) {
	d.errs = append(d.errs, &Error{Key: key, Msg: key + ": " + fmt.Sprintf(format, args...) + d.source(key)})
}

// source names where a top-level key's value came from when that is not
// the file, so a bad flag or variable is not looked for in the file.
func (d *decoder) source(key string) string {
	if strings.Contains(key, "[") {
		return ""
	}
	lower := strings.ToLower(key)
	if f := d.flagOf[lower]; f != nil && f.Changed {
		return " (from flag --" + f.Name + ")"
	}
	env := EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
	if _, ok := os.LookupEnv(env); ok {
		return " (from $" + env + ")"
	}
	return ""
}

// config decodes and checks every key.
func (d *decoder) config() *Config {
	c := &Config{}

	c.Listen = d.str("listen", d.v.Get("listen"))
	d.hostPort("listen", c.Listen)
	c.ListenUnix = d.socketPath("listenUnix", d.str("listenUnix", d.v.Get("listenUnix")))

	t := &c.ListenTLS
	t.CertFile = d.str("listenTLS.certFile", d.v.Get("listenTLS.certFile"))
	t.KeyFile = d.str("listenTLS.keyFile", d.v.Get("listenTLS.keyFile"))
	t.CAFile = d.str("listenTLS.caFile", d.v.Get("listenTLS.caFile"))
	t.ClientAuth = strings.ToLower(d.str("listenTLS.clientAuth", d.v.Get("listenTLS.clientAuth")))
	d.checkServerTLS(t)

	u := &c.Upstream
	u.URI = d.str("upstream.uri", d.v.Get("upstream.uri"))
	u.DataDir = d.str("upstream.dataDir", d.v.Get("upstream.dataDir"))
	u.DialTimeout = d.duration("upstream.dialTimeout", d.v.Get("upstream.dialTimeout"))
	u.TLS.Enabled = d.boolean("upstream.tls.enabled", d.v.Get("upstream.tls.enabled"))
	u.TLS.CAFile = d.str("upstream.tls.caFile", d.v.Get("upstream.tls.caFile"))
	u.TLS.CertFile = d.str("upstream.tls.certFile", d.v.Get("upstream.tls.certFile"))
	u.TLS.KeyFile = d.str("upstream.tls.keyFile", d.v.Get("upstream.tls.keyFile"))
	u.TLS.InsecureSkipVerify = d.boolean("upstream.tls.insecureSkipVerify", d.v.Get("upstream.tls.insecureSkipVerify"))
	u.TLS.ServerName = d.str("upstream.tls.serverName", d.v.Get("upstream.tls.serverName"))
	d.checkUpstream(u)

	l := &c.Limits
	l.MaxConnections = d.intIn("limits.maxConnections", d.v.Get("limits.maxConnections"), 1, 1_000_000)
	l.MaxMessageBytes = d.bytesIn("limits.maxMessageBytes", d.v.Get("limits.maxMessageBytes"), MinMessageBytes, MaxMessageBytes)
	l.MaxCursors = d.intIn("limits.maxCursors", d.v.Get("limits.maxCursors"), 1, 100_000_000)
	l.CursorTTL = d.durationAtLeastSecond("limits.cursorTTL")
	l.FrameTimeout = d.durationAtLeastSecond("limits.frameTimeout")
	l.WriteTimeout = d.durationAtLeastSecond("limits.writeTimeout")
	l.AggregateMemory = d.bytesIn("limits.aggregateMemory", d.v.Get("limits.aggregateMemory"), 1<<10, 1<<40)
	l.StagedMemory = d.bytesIn("limits.stagedMemory", d.v.Get("limits.stagedMemory"), 0, 1<<40)
	l.RetryCacheSize = d.intIn("limits.retryCacheSize", d.v.Get("limits.retryCacheSize"), 1, 100_000_000)
	l.RetryCacheTTL = d.durationAtLeastSecond("limits.retryCacheTTL")

	tm := &c.Telemetry
	tm.MetricsListen = d.str("telemetry.metricsListen", d.v.Get("telemetry.metricsListen"))
	if tm.MetricsListen != "" {
		d.hostPort("telemetry.metricsListen", tm.MetricsListen)
	}
	tm.OTLPEndpoint = d.str("telemetry.otlpEndpoint", d.v.Get("telemetry.otlpEndpoint"))
	if e := tm.OTLPEndpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			d.fail("telemetry.otlpEndpoint", "%q is not an http:// or https:// URL", e)
		}
	}
	tm.ServiceName = d.str("telemetry.serviceName", d.v.Get("telemetry.serviceName"))
	if tm.ServiceName == "" && d.ok("telemetry.serviceName") {
		d.fail("telemetry.serviceName", "is empty")
	}
	tm.LogLevel = strings.ToLower(d.str("telemetry.logLevel", d.v.Get("telemetry.logLevel")))
	switch tm.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		if d.ok("telemetry.logLevel") {
			d.fail("telemetry.logLevel", "%q is not debug, info, warn or error", tm.LogLevel)
		}
	}
	tm.LogFormat = strings.ToLower(d.str("telemetry.logFormat", d.v.Get("telemetry.logFormat")))
	switch tm.LogFormat {
	case "text", "json":
	default:
		if d.ok("telemetry.logFormat") {
			d.fail("telemetry.logFormat", "%q is not text or json", tm.LogFormat)
		}
	}

	c.ShutdownTimeout = d.duration("shutdownTimeout", d.v.Get("shutdownTimeout"))
	if c.ShutdownTimeout < 0 {
		d.fail("shutdownTimeout", "%s is negative", c.ShutdownTimeout)
	}

	c.CreateTimeseries = strings.ToLower(d.str("createTimeseries", d.v.Get("createTimeseries")))
	switch c.CreateTimeseries {
	case CreateTimeseriesAuto, CreateTimeseriesProxy, CreateTimeseriesUpstream:
	default:
		if d.ok("createTimeseries") {
			d.fail("createTimeseries", "%q is not %s, %s or %s", c.CreateTimeseries, CreateTimeseriesAuto, CreateTimeseriesProxy, CreateTimeseriesUpstream)
		}
	}

	c.Rules = d.rules(d.v.Get("rules"))
	return c
}

// ok reports whether no problem was recorded yet for key, so a check that
// builds on its value may run.
func (d *decoder) ok(key string) bool {
	for _, e := range d.errs {
		if e.(*Error).Key == key {
			return false
		}
	}
	return true
}

// --- scalar conversions; each records an error and returns the zero value
// when v does not convert. ---

func (d *decoder) str(key string, v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case int, int64, uint64, float64, bool:
		return fmt.Sprint(v)
	}
	d.fail(key, "must be a single value, not %v", v)
	return ""
}

func (d *decoder) boolean(key string, v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err == nil {
			return b
		}
	}
	d.fail(key, "%s is not true or false", show(v))
	return false
}

// integer converts v, reporting whether it did.
func integer(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v), true
		}
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return int64(v), true
		}
	case string:
		n, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(v), "_", ""), 10, 64)
		if err == nil {
			return n, true
		}
	}
	return 0, false
}

// intIn converts v and checks lo <= v <= hi.
func (d *decoder) intIn(key string, v any, lo, hi int64) int {
	n, ok := integer(v)
	if !ok {
		d.fail(key, "%s is not a whole number", show(v))
		return 0
	}
	if n < lo || n > hi {
		d.fail(key, "%d is out of range [%d, %d]", n, lo, hi)
		return 0
	}
	return int(n)
}

// bytesIn is a byte count (bytes) within [lo, hi].
func (d *decoder) bytesIn(key string, v any, lo, hi int64) int {
	n, ok := d.bytes(key, v)
	if !ok {
		return 0
	}
	if n < lo || n > hi {
		d.fail(key, "%d bytes is out of range [%d, %d]", n, lo, hi)
		return 0
	}
	return int(n)
}

// duration converts a Go duration string such as "90s" or "1h30m".
func (d *decoder) duration(key string, v any) time.Duration {
	switch v := v.(type) {
	case nil:
		return 0
	case time.Duration:
		return v
	case string:
		dur, err := time.ParseDuration(strings.TrimSpace(v))
		if err == nil {
			return dur
		}
		d.fail(key, "%q is not a duration such as 90s, 10m or 1h", v)
		return 0
	}
	if n, ok := integer(v); ok {
		d.fail(key, "%d has no unit; write it as e.g. %ds", n, n)
		return 0
	}
	d.fail(key, "%s is not a duration such as 90s, 10m or 1h", show(v))
	return 0
}

// durationAtLeastSecond reads the duration at key, which must be at least
// 1s when set: shorter bounds cut off ordinary traffic.
func (d *decoder) durationAtLeastSecond(key string) time.Duration {
	dur := d.duration(key, d.v.Get(key))
	if dur < time.Second && d.ok(key) {
		d.fail(key, "%s is less than 1s", dur)
	}
	return dur
}

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	// longest suffixes first
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1000}, {"mb", 1000 * 1000}, {"gb", 1000 * 1000 * 1000},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"b", 1},
}

// ParseBytes reads a byte count: a whole number, optionally followed by a
// unit: B, KiB, MiB, GiB (powers of 1024; K, M, G too) or KB, MB, GB
// (powers of 1000). Units ignore case; a space may come before the unit.
func ParseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(t, "_", ""), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a byte count such as 1048576, 512KiB or 1MiB", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

func (d *decoder) bytes(key string, v any) (int64, bool) {
	if s, ok := v.(string); ok {
		n, err := ParseBytes(s)
		if err != nil {
			d.fail(key, "%v", err)
			return 0, false
		}
		return n, true
	}
	if n, ok := integer(v); ok {
		return n, true
	}
	d.fail(key, "%s is not a byte count such as 1048576, 512KiB or 1MiB", show(v))
	return 0, false
}

func show(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// --- checks of whole values ---

// maxSocketPath is the longest path a Unix socket's address holds on
// Linux (sun_path is 108 bytes, the last a NUL).
const maxSocketPath = 107

// socketPath checks the path of a Unix socket to listen on and makes it
// absolute ("" stays "": none).
func (d *decoder) socketPath(key, path string) string {
	if path == "" {
		return ""
	}
	if !strings.HasSuffix(path, ".sock") {
		d.fail(key, "%q does not end in .sock: drivers take a host as a Unix socket only when it does (mongodb://%%2Fpath%%2Fto%%2Ftsproxy.sock/)", path)
		return path
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		d.fail(key, "%q: %v", path, err)
		return path
	}
	if len(abs) > maxSocketPath {
		d.fail(key, "%q is %d bytes long; a Unix socket's path holds at most %d", abs, len(abs), maxSocketPath)
	}
	return abs
}

func (d *decoder) hostPort(key, s string) {
	if err := checkHostPort(s); err != nil {
		d.fail(key, "%v", err)
	}
}

// checkHostPort accepts HOST:PORT with a numeric port; HOST may be empty
// (every interface), a name, an IPv4 address or a bracketed IPv6 one.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT", s)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", s, port)
	}
	if strings.ContainsAny(host, " /\\\t") {
		return fmt.Errorf("%q: %q is not a host name or IP address", s, host)
	}
	return nil
}

func (d *decoder) file(key, path string) {
	if path == "" {
		return
	}
	st, err := os.Stat(path)
	if err != nil {
		d.fail(key, "%v", err)
		return
	}
	if st.IsDir() {
		d.fail(key, "%q is a directory", path)
	}
}

func (d *decoder) checkServerTLS(t *TLSServer) {
	const k = "listenTLS"
	if (t.CertFile == "") != (t.KeyFile == "") {
		d.fail(k, "certFile and keyFile go together; set both or neither")
	}
	d.file(k+".certFile", t.CertFile)
	d.file(k+".keyFile", t.KeyFile)
	d.file(k+".caFile", t.CAFile)
	switch t.ClientAuth {
	case "":
		t.ClientAuth = ClientAuthNone
	case ClientAuthNone:
	case ClientAuthRequest, ClientAuthRequire:
		if t.CertFile == "" {
			d.fail(k+".clientAuth", "%q needs listenTLS.certFile and listenTLS.keyFile", t.ClientAuth)
		} else if t.CAFile == "" {
			d.fail(k+".clientAuth", "%q needs listenTLS.caFile to verify client certificates", t.ClientAuth)
		}
		return
	default:
		d.fail(k+".clientAuth", "%q is not none, request or require", t.ClientAuth)
		return
	}
	if t.CAFile != "" {
		d.fail(k+".caFile", "is set but listenTLS.clientAuth is none; set clientAuth to request or require")
	}
}

func (d *decoder) checkUpstream(u *Upstream) {
	switch {
	case strings.EqualFold(u.URI, UpstreamEmbedded):
		u.URI = UpstreamEmbedded
		if u.DataDir == "" {
			d.fail("upstream.dataDir", "is empty; the embedded upstream needs a data folder")
		}
		if u.TLS != (TLSClient{}) {
			d.fail("upstream.tls", "applies only to a mongodb:// upstream, not to the embedded one")
		}
	case strings.HasPrefix(u.URI, "mongodb+srv://"):
		d.fail("upstream.uri", "mongodb+srv:// is not supported yet; list the hosts in a mongodb://host1,host2/ URI")
	case strings.HasPrefix(u.URI, "mongodb://"):
		// The driver's public options parse the URI as drivers will.
		if err := options.Client().ApplyURI(u.URI).Validate(); err != nil {
			d.fail("upstream.uri", "%q: %v", Redact(u.URI), err)
		}
		t := u.TLS
		if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify) {
			d.fail("upstream.tls.enabled", "is false but other upstream.tls keys are set; set enabled: true or remove them")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			d.fail("upstream.tls", "certFile and keyFile go together; set both or neither")
		}
		d.file("upstream.tls.caFile", t.CAFile)
		d.file("upstream.tls.certFile", t.CertFile)
		d.file("upstream.tls.keyFile", t.KeyFile)
	default:
		d.fail("upstream.uri", "%q is neither \"embedded\" nor a mongodb:// URI", Redact(u.URI))
	}
	if u.DialTimeout <= 0 && d.ok("upstream.dialTimeout") {
		d.fail("upstream.dialTimeout", "%s is not positive", u.DialTimeout)
	}
}

// Redact hides the password of a connection string, for logs and errors.
// The user info ends at the first "@", as the driver reads it: a password
// may hold "?" (and a refused one "/"), which a cut at the hosts' end
// left in the clear.
func Redact(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	userInfo, hosts, ok := strings.Cut(rest, "@")
	if !ok {
		return uri
	}
	user, _, hasPass := strings.Cut(userInfo, ":")
	if !hasPass {
		return uri
	}
	return scheme + "://" + user + ":xxxxx@" + hosts
}
