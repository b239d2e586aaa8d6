package rules

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// setup moves the test into an empty working directory (so no config.yaml
// is picked up by default) and clears every TSPROXY_ variable.
func setup(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, EnvPrefix+"_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
	return dir
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// flags returns a FlagSet from RegisterFlags with args parsed.
func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("tsproxy", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// defaultConfig is what Load returns with no file, no variables, no flags.
func defaultConfig() Config {
	return Config{
		Listen:    "127.0.0.1:27017",
		ListenTLS: TLSServer{ClientAuth: "none"},
		Upstream: Upstream{
			URI:         "embedded",
			DataDir:     "./data",
			DialTimeout: 5 * time.Second,
		},
		Limits: Limits{
			MaxConnections:  10000,
			MaxMessageBytes: 48_000_000,
			MaxCursors:      100000,
			CursorTTL:       10 * time.Minute,
			FrameTimeout:    2 * time.Minute,
			WriteTimeout:    2 * time.Minute,
			RetryCacheSize:  100000,
			RetryCacheTTL:   30 * time.Minute,
			AggregateMemory: 100 << 20,
			StagedMemory:    64 << 20,
		},
		Telemetry: Telemetry{
			MetricsListen: "127.0.0.1:9216",
			ServiceName:   "tsproxy",
			LogLevel:      "info",
			LogFormat:     "text",
		},
		ShutdownTimeout:  30 * time.Second,
		CreateTimeseries: CreateTimeseriesAuto,
	}
}

// plain drops what DeepEqual should not compare.
func plain(c *Config) Config {
	p := *c
	p.set = nil
	p.File = ""
	return p
}

func TestLoadDefaults(t *testing.T) {
	setup(t)
	for _, fs := range []*pflag.FlagSet{nil, flags(t)} {
		c, err := Load(LoadOptions{Flags: fs})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := plain(c), defaultConfig(); !reflect.DeepEqual(got, want) {
			t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
		}
		if c.File != "" {
			t.Errorf("File = %q, want none", c.File)
		}
		if c.RuleSet().Len() != 0 || c.RuleSet().Lookup("iot", "readings") != nil {
			t.Error("default config has rules")
		}
	}
}

func TestLoadFullFile(t *testing.T) {
	setup(t)
	dir := t.TempDir()
	for _, f := range []string{"server.pem", "server.key", "ca.pem", "client.pem", "client.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "tsproxy.yaml")
	yaml := strings.ReplaceAll(`
listen: 0.0.0.0:27018
listenTLS:
  certFile: DIR/server.pem
  keyFile: DIR/server.key
  caFile: DIR/ca.pem
  clientAuth: require
upstream:
  uri: mongodb://db1:27017,db2:27017/?replicaSet=rs0
  dataDir: /var/lib/tsproxy
  dialTimeout: 2s
  tls:
    enabled: true
    caFile: DIR/ca.pem
    certFile: DIR/client.pem
    keyFile: DIR/client.key
    insecureSkipVerify: false
    serverName: db.example.com
limits:
  maxConnections: 500
  maxMessageBytes: 16_000_000
  maxCursors: 2000
  cursorTTL: 90s
  frameTimeout: 30s
  writeTimeout: 1m
  retryCacheSize: 5000
  retryCacheTTL: 5m
telemetry:
  metricsListen: ":9100"
  otlpEndpoint: http://otel:4318
  serviceName: tsproxy-eu
  logLevel: DEBUG
  logFormat: json
shutdownTimeout: 5s
rules:
  - namespace: iot.readings
    timeField: ts
    metaField: sensorId
    layout: events
    bucket:
      span: 90s
      maxEvents: 500
      maxBytes: 512KiB
      insertThreshold: 20
      compression: None
    aggregates: [value, env.temp]
    collection: readings_buckets
  - namespace: logs.app.events       # collection with a dot
    timeField: at
    bucket:
      granularity: minutes
      maxBytes: 2MB
      compression: zstd
  - namespace: iot.other
    TimeField: t                      # keys ignore case, as with viper
`, "DIR", dir)
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(LoadOptions{ConfigFile: p})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "0.0.0.0:27018",
		ListenTLS: TLSServer{
			CertFile: dir + "/server.pem", KeyFile: dir + "/server.key",
			CAFile: dir + "/ca.pem", ClientAuth: "require",
		},
		Upstream: Upstream{
			URI:         "mongodb://db1:27017,db2:27017/?replicaSet=rs0",
			DataDir:     "/var/lib/tsproxy",
			DialTimeout: 2 * time.Second,
			TLS: TLSClient{
				Enabled: true, CAFile: dir + "/ca.pem",
				CertFile: dir + "/client.pem", KeyFile: dir + "/client.key",
				ServerName: "db.example.com",
			},
		},
		Limits: Limits{MaxConnections: 500, MaxMessageBytes: 16_000_000, MaxCursors: 2000, CursorTTL: 90 * time.Second,
			FrameTimeout: 30 * time.Second, WriteTimeout: time.Minute,
			RetryCacheSize: 5000, RetryCacheTTL: 5 * time.Minute, AggregateMemory: 100 << 20, StagedMemory: 64 << 20},
		Telemetry: Telemetry{
			MetricsListen: ":9100", OTLPEndpoint: "http://otel:4318",
			ServiceName: "tsproxy-eu", LogLevel: "debug", LogFormat: "json",
		},
		ShutdownTimeout:  5 * time.Second,
		CreateTimeseries: CreateTimeseriesAuto,
		Rules: []Rule{
			{
				Namespace: "iot.readings", DB: "iot", Collection: "readings",
				TimeField: "ts", MetaField: "sensorId",
				Span: 90 * time.Second, MaxEvents: 500, MaxBytes: 512 << 10, InsertThreshold: 20, Compression: CompressionNone, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
				Aggregates:       []string{"value", "env.temp"},
				BucketCollection: "readings_buckets", Layout: "events",
			},
			{
				Namespace: "logs.app.events", DB: "logs", Collection: "app.events",
				TimeField: "at",
				Span:      24 * time.Hour, MaxEvents: 1000, MaxBytes: 2_000_000, InsertThreshold: 100, Compression: CompressionZstd, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
				BucketCollection: "app.events.buckets", Layout: "events",
			},
			{
				Namespace: "iot.other", DB: "iot", Collection: "other",
				TimeField: "t",
				Span:      time.Hour, MaxEvents: 1000, MaxBytes: 1 << 20, InsertThreshold: 100, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
				BucketCollection: "other.buckets", Layout: "events",
			},
		},
	}
	if got := plain(c); !reflect.DeepEqual(got, want) {
		t.Errorf("full file:\n got %+v\nwant %+v", got, want)
	}
	if c.File != p {
		t.Errorf("File = %q, want %q", c.File, p)
	}
	s := c.RuleSet()
	if r := s.Lookup("iot", "readings"); r == nil || r.TimeField != "ts" {
		t.Errorf("Lookup(iot, readings) = %+v", r)
	}
	if r := s.ByBucketCollection("logs", "app.events.buckets"); r == nil || r.Namespace != "logs.app.events" {
		t.Errorf("ByBucketCollection(logs, app.events.buckets) = %+v", r)
	}
}

func TestConfigFileChoice(t *testing.T) {
	t.Run("config.yaml in the working directory", func(t *testing.T) {
		dir := setup(t)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("listen: :1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Listen != ":1" || c.File != "config.yaml" {
			t.Errorf("Listen %q File %q", c.Listen, c.File)
		}
	})
	t.Run("--config beats TSPROXY_CONFIG beats config.yaml", func(t *testing.T) {
		dir := setup(t)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("listen: :1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		envFile := writeFile(t, "env.yaml", "listen: :2\n")
		flagFile := writeFile(t, "flag.yaml", "listen: :3\n")
		t.Setenv("TSPROXY_CONFIG", envFile)
		c, err := Load(LoadOptions{Flags: flags(t)})
		if err != nil || c.Listen != ":2" {
			t.Fatalf("env config: %v %+v", err, c)
		}
		c, err = Load(LoadOptions{Flags: flags(t, "--config", flagFile)})
		if err != nil || c.Listen != ":3" {
			t.Fatalf("flag config: %v %+v", err, c)
		}
		// An empty name (--config "$CFG" with CFG unset) is refused, not
		// taken for no file: the proxy started on the defaults.
		_, err = Load(LoadOptions{Flags: flags(t, "--config="), ConfigFile: ""})
		if err == nil || err.Error() != "config: --config: the file name is empty" {
			t.Fatalf("--config=: %v", err)
		}
	})
	t.Run("a named file must exist", func(t *testing.T) {
		setup(t)
		_, err := Load(LoadOptions{ConfigFile: "nope.yaml"})
		if err == nil || !strings.Contains(err.Error(), "config: open nope.yaml: no such file") {
			t.Fatalf("err = %v", err)
		}
		_, err = Load(LoadOptions{Flags: flags(t, "--config", "nope.yaml")})
		if err == nil {
			t.Fatal("missing --config file accepted")
		}
	})
	t.Run("YAML syntax error", func(t *testing.T) {
		setup(t)
		p := writeFile(t, "bad.yaml", "listen: [\n")
		_, err := Load(LoadOptions{ConfigFile: p})
		if err == nil || !strings.HasPrefix(err.Error(), "config: "+p+": yaml:") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestPrecedence checks flag > env > file > default for every flag-bound key.
func TestPrecedence(t *testing.T) {
	keys := []struct {
		flag, env, yamlPath string
		get                 func(*Config) string
		def, file, envv, fl string
	}{
		{"listen", "TSPROXY_LISTEN", "listen", func(c *Config) string { return c.Listen },
			DefaultListen, ":1001", ":1002", ":1003"},
		{"upstream", "TSPROXY_UPSTREAM_URI", "upstream.uri", func(c *Config) string { return c.Upstream.URI },
			"embedded", "mongodb://file:1", "mongodb://env:1", "mongodb://flag:1"},
		{"data", "TSPROXY_UPSTREAM_DATADIR", "upstream.dataDir", func(c *Config) string { return c.Upstream.DataDir },
			"./data", "/file", "/env", "/flag"},
		{"listen-unix", "TSPROXY_LISTENUNIX", "listenUnix", func(c *Config) string { return c.ListenUnix },
			"", "/file/t.sock", "/env/t.sock", "/flag/t.sock"},
		{"metrics", "TSPROXY_TELEMETRY_METRICSLISTEN", "telemetry.metricsListen", func(c *Config) string { return c.Telemetry.MetricsListen },
			DefaultMetricsListen, ":2001", ":2002", ":2003"},
		{"log-level", "TSPROXY_TELEMETRY_LOGLEVEL", "telemetry.logLevel", func(c *Config) string { return c.Telemetry.LogLevel },
			"info", "debug", "warn", "error"},
	}
	for _, k := range keys {
		// the YAML for one key at a dotted path
		parts := strings.Split(k.yamlPath, ".")
		yaml := ""
		for i, p := range parts {
			yaml += strings.Repeat("  ", i) + p + ":"
			if i < len(parts)-1 {
				yaml += "\n"
			}
		}
		yaml += " " + `"` + k.file + `"` + "\n"
		for _, tc := range []struct {
			name            string
			file, env, flag bool
			want            string
		}{
			{"default", false, false, false, k.def},
			{"file", true, false, false, k.file},
			{"env beats default", false, true, false, k.envv},
			{"env beats file", true, true, false, k.envv},
			{"flag beats file", true, false, true, k.fl},
			{"flag beats env and file", true, true, true, k.fl},
		} {
			t.Run(k.flag+"/"+tc.name, func(t *testing.T) {
				setup(t)
				opts := LoadOptions{Flags: flags(t)}
				if tc.file {
					opts.ConfigFile = writeFile(t, "c.yaml", yaml)
				}
				if tc.env {
					t.Setenv(k.env, k.envv)
				}
				if tc.flag {
					opts.Flags = flags(t, "--"+k.flag+"="+k.fl)
				}
				c, err := Load(opts)
				if err != nil {
					t.Fatal(err)
				}
				if got := k.get(c); got != tc.want {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			})
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	setup(t)
	p := writeFile(t, "c.yaml", "limits:\n  maxConnections: 7\nupstream:\n  dialTimeout: 1s\n")
	t.Setenv("TSPROXY_LIMITS_MAXCONNECTIONS", "9")
	t.Setenv("TSPROXY_LIMITS_CURSORTTL", "1m")
	t.Setenv("TSPROXY_UPSTREAM_DIALTIMEOUT", "3s")
	t.Setenv("TSPROXY_TELEMETRY_METRICSLISTEN", "") // empty disables
	t.Setenv("TSPROXY_SHUTDOWNTIMEOUT", "0s")
	t.Setenv("TSPROXY_LISTENTLS_CLIENTAUTH", "none")
	c, err := Load(LoadOptions{ConfigFile: p})
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxConnections != 9 || c.Limits.CursorTTL != time.Minute || c.Upstream.DialTimeout != 3*time.Second ||
		c.Telemetry.MetricsListen != "" || c.ShutdownTimeout != 0 {
		t.Errorf("env not applied: %+v", c)
	}
}

// TestInvalid checks each problem on its own, by the whole message.
func TestInvalid(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		env  map[string]string
		args []string
		want string // one of the joined messages, whole
	}{
		// unknown keys and shapes
		{"unknown top key", "listn: :1\n", nil, nil,
			`config: unknown key "listn"; did you mean "listen"?`},
		{"unknown nested key", "upstream:\n  urii: embedded\n", nil, nil,
			`config: unknown key "upstream.urii"; did you mean "upstream.uri"?`},
		{"unknown key, no suggestion", "upstream:\n  password: x\n", nil, nil,
			`config: unknown key "upstream.password"`},
		{"unknown key in tls", "upstream:\n  tls:\n    verify: true\n", nil, nil,
			`config: unknown key "upstream.tls.verify"`},
		{"unknown key in a rule", "rules:\n  - namespace: a.b\n    timeField: t\n    metafield: m\n    metaFeld: x\n", nil, nil,
			`config: unknown key "rules[0].metaFeld"; did you mean "rules[0].metaField"?`},
		{"unknown key in a rule's bucket", "rules:\n  - namespace: a.b\n    timeField: t\n    bucket:\n      maxEvent: 5\n", nil, nil,
			`config: unknown key "rules[0].bucket.maxEvent"; did you mean "rules[0].bucket.maxEvents"?`},
		{"key twice, case apart", "rules:\n  - namespace: a.b\n    timeField: t\n    TimeField: u\n", nil, nil,
			`config: rules[0].TimeField repeats rules[0].timeField (keys ignore case)`},
		{"section not a mapping", "upstream: mongodb://x\n", nil, nil,
			`config: upstream: must be a mapping of keys (uri, dataDir, dialTimeout, tls), not "mongodb://x"`},
		{"rules not a list", "rules:\n  namespace: a.b\n", nil, nil,
			`config: rules: must be a list, not a mapping`},
		{"rule not a mapping", "rules:\n  - a.b\n", nil, nil,
			`config: rules[0]: must be a mapping of keys (namespace, timeField, metaField, layout, window, slot, valueField, preallocate, packed, bucket, aggregates, collection, rollups, expireAfter, sweepInterval, shardKey, partitionBy, ingest, mergeAfter, maxStaged), not "a.b"`},
		{"scalar given a list", "listen: [a, b]\n", nil, nil,
			`config: listen: must be a single value, not a list`},
		{"aggregates not a list", "rules:\n  - namespace: a.b\n    timeField: t\n    aggregates: value\n", nil, nil,
			`config: rules[0].aggregates: must be a list such as [a, b], not "value"`},
		{"file not a mapping", "- a\n", nil, nil,
			`config: the file: must be a mapping of keys`},

		// listen
		{"listen without port", "listen: localhost\n", nil, nil,
			`config: listen: "localhost" is not HOST:PORT`},
		{"listen bad port", "listen: localhost:99999\n", nil, nil,
			`config: listen: "localhost:99999": port "99999" is not a number from 0 to 65535`},
		{"listen from env", "", map[string]string{"TSPROXY_LISTEN": "nope"}, nil,
			`config: listen: "nope" is not HOST:PORT (from $TSPROXY_LISTEN)`},
		{"listen from flag", "", nil, []string{"--listen", "x:y"},
			`config: listen: "x:y": port "y" is not a number from 0 to 65535 (from flag --listen)`},
		{"listenUnix without .sock", "listenUnix: /tmp/tsproxy\n", nil, nil,
			`config: listenUnix: "/tmp/tsproxy" does not end in .sock: drivers take a host as a Unix socket only when it does (mongodb://%2Fpath%2Fto%2Ftsproxy.sock/)`},
		{"listenUnix too long", "listenUnix: /" + strings.Repeat("d", 110) + ".sock\n", nil, nil,
			`config: listenUnix: "/` + strings.Repeat("d", 110) + `.sock" is 116 bytes long; a Unix socket's path holds at most 107`},
		{"metrics bad", "telemetry:\n  metricsListen: 9216\n", nil, nil,
			`config: telemetry.metricsListen: "9216" is not HOST:PORT`},

		// listenTLS
		{"tls cert without key", "listenTLS:\n  certFile: CERT\n", nil, nil,
			`config: listenTLS: certFile and keyFile go together; set both or neither`},
		{"tls missing file", "listenTLS:\n  certFile: /nonexistent/c.pem\n  keyFile: CERT\n", nil, nil,
			`config: listenTLS.certFile: stat /nonexistent/c.pem: no such file or directory`},
		{"tls bad client auth", "listenTLS:\n  certFile: CERT\n  keyFile: CERT\n  clientAuth: always\n", nil, nil,
			`config: listenTLS.clientAuth: "always" is not none, request or require`},
		{"tls client auth without ca", "listenTLS:\n  certFile: CERT\n  keyFile: CERT\n  clientAuth: require\n", nil, nil,
			`config: listenTLS.clientAuth: "require" needs listenTLS.caFile to verify client certificates`},
		{"tls client auth without cert", "listenTLS:\n  clientAuth: request\n", nil, nil,
			`config: listenTLS.clientAuth: "request" needs listenTLS.certFile and listenTLS.keyFile`},

		// upstream
		{"upstream srv", "upstream:\n  uri: mongodb+srv://cluster0.example.net/\n", nil, nil,
			`config: upstream.uri: mongodb+srv:// is not supported yet; list the hosts in a mongodb://host1,host2/ URI`},
		{"upstream other scheme", "upstream:\n  uri: postgres://u:secret@h/db\n", nil, nil,
			`config: upstream.uri: "postgres://u:xxxxx@h/db" is neither "embedded" nor a mongodb:// URI`},
		{"upstream bad port", "upstream:\n  uri: mongodb://h:0x/\n", nil, nil,
			`config: upstream.uri: "mongodb://h:0x/": error parsing uri: invalid host "": port must be an integer: strconv.Atoi: parsing "0x": invalid syntax`},
		{"upstream from flag", "", nil, []string{"--upstream", "localhost:27017"},
			`config: upstream.uri: "localhost:27017" is neither "embedded" nor a mongodb:// URI (from flag --upstream)`},
		{"upstream tls with embedded", "upstream:\n  tls:\n    enabled: true\n", nil, nil,
			`config: upstream.tls: applies only to a mongodb:// upstream, not to the embedded one`},
		{"upstream tls files without enabled", "upstream:\n  uri: mongodb://h/\n  tls:\n    caFile: CERT\n", nil, nil,
			`config: upstream.tls.enabled: is false but other upstream.tls keys are set; set enabled: true or remove them`},
		{"upstream tls enabled not bool", "upstream:\n  uri: mongodb://h/\n  tls:\n    enabled: maybe\n", nil, nil,
			`config: upstream.tls.enabled: "maybe" is not true or false`},
		{"dial timeout no unit", "upstream:\n  dialTimeout: 5\n", nil, nil,
			`config: upstream.dialTimeout: 5 has no unit; write it as e.g. 5s`},
		{"dial timeout zero", "upstream:\n  dialTimeout: 0s\n", nil, nil,
			`config: upstream.dialTimeout: 0s is not positive`},
		{"data dir empty", "upstream:\n  dataDir: \"\"\n", nil, nil,
			`config: upstream.dataDir: is empty; the embedded upstream needs a data folder`},

		// limits
		{"max connections zero", "limits:\n  maxConnections: 0\n", nil, nil,
			`config: limits.maxConnections: 0 is out of range [1, 1000000]`},
		{"max message bytes too big", "limits:\n  maxMessageBytes: 48000001\n", nil, nil,
			`config: limits.maxMessageBytes: 48000001 bytes is out of range [16384, 48000000]`},
		{"max cursors not a number", "limits:\n  maxCursors: lots\n", nil, nil,
			`config: limits.maxCursors: "lots" is not a whole number`},
		{"max cursors from env", "", map[string]string{"TSPROXY_LIMITS_MAXCURSORS": "-1"}, nil,
			`config: limits.maxCursors: -1 is out of range [1, 100000000] (from $TSPROXY_LIMITS_MAXCURSORS)`},
		{"cursor ttl short", "limits:\n  cursorTTL: 10ms\n", nil, nil,
			`config: limits.cursorTTL: 10ms is less than 1s`},
		{"frame timeout short", "limits:\n  frameTimeout: 0s\n", nil, nil,
			`config: limits.frameTimeout: 0s is less than 1s`},
		{"write timeout bad", "limits:\n  writeTimeout: 5\n", nil, nil,
			`config: limits.writeTimeout: 5 has no unit; write it as e.g. 5s`},
		{"cursor ttl bad", "limits:\n  cursorTTL: forever\n", nil, nil,
			`config: limits.cursorTTL: "forever" is not a duration such as 90s, 10m or 1h`},
		{"retry cache size zero", "limits:\n  retryCacheSize: 0\n", nil, nil,
			`config: limits.retryCacheSize: 0 is out of range [1, 100000000]`},
		{"retry cache ttl short", "limits:\n  retryCacheTTL: 500ms\n", nil, nil,
			`config: limits.retryCacheTTL: 500ms is less than 1s`},
		{"shutdown negative", "shutdownTimeout: -1s\n", nil, nil,
			`config: shutdownTimeout: -1s is negative`},

		// telemetry
		{"log level", "telemetry:\n  logLevel: verbose\n", nil, nil,
			`config: telemetry.logLevel: "verbose" is not debug, info, warn or error`},
		{"log level from flag", "", nil, []string{"--log-level=trace"},
			`config: telemetry.logLevel: "trace" is not debug, info, warn or error (from flag --log-level)`},
		{"log format", "telemetry:\n  logFormat: xml\n", nil, nil,
			`config: telemetry.logFormat: "xml" is not text or json`},
		{"otlp endpoint", "telemetry:\n  otlpEndpoint: otel:4318\n", nil, nil,
			`config: telemetry.otlpEndpoint: "otel:4318" is not an http:// or https:// URL`},
		{"service name empty", "telemetry:\n  serviceName: \"\"\n", nil, nil,
			`config: telemetry.serviceName: is empty`},

		// rules
		{"rules from env", "", map[string]string{"TSPROXY_RULES": "iot.readings"}, nil,
			`config: rules: must be a list of rules in the config file, not "iot.readings" (from $TSPROXY_RULES)`},
		{"empty rule", "rules:\n  -\n", nil, nil,
			`config: rules[0]: is empty; a rule needs at least namespace and timeField`},
		{"namespace missing", "rules:\n  - timeField: t\n", nil, nil,
			`config: rules[0].namespace: is missing; write the namespace apps use, as db.collection`},
		{"namespace without collection", "rules:\n  - namespace: iot\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "iot" is not db.collection`},
		{"namespace empty db", "rules:\n  - namespace: .x\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: ".x" is not db.collection`},
		{"namespace db with space", "rules:\n  - namespace: my db.x\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "my db.x": database name "my db" may not contain " "`},
		{"namespace db with slash", "rules:\n  - namespace: a/b.x\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "a/b.x": database name "a/b" may not contain "/"`},
		{"namespace db with quote", "rules:\n  - namespace: 'a\"b.x'\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "a\"b.x": database name "a\"b" may not contain "\""`},
		{"namespace with dollar", "rules:\n  - namespace: iot.$cmd\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "iot.$cmd": collection name "$cmd" may not contain '$'`},
		{"namespace system", "rules:\n  - namespace: iot.system.views\n    timeField: t\n", nil, nil,
			`config: rules[0].namespace: "iot.system.views": collection name "system.views" is reserved (system.*)`},
		{"duplicate namespace", "rules:\n  - {namespace: iot.readings, timeField: t}\n  - {namespace: iot.x, timeField: t}\n  - {namespace: iot.readings, timeField: u}\n", nil, nil,
			`config: rules[2].namespace: "iot.readings" repeats rules[0]`},
		{"timeField missing", "rules:\n  - namespace: iot.readings\n", nil, nil,
			`config: rules[0].timeField: is missing; name the event field that holds the BSON date`},
		{"timeField dotted", "rules:\n  - namespace: iot.readings\n    timeField: a.b\n", nil, nil,
			`config: rules[0].timeField: "a.b" must be a top-level field name, without '.'`},
		{"timeField dollar", "rules:\n  - namespace: iot.readings\n    timeField: $t\n", nil, nil,
			`config: rules[0].timeField: "$t" may not start with '$'`},
		{"timeField _id", "rules:\n  - namespace: iot.readings\n    timeField: _id\n", nil, nil,
			`config: rules[0].timeField: "_id" is the event id; name another field`},
		{"metaField is timeField", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    metaField: ts\n", nil, nil,
			`config: rules[0].metaField: "ts" is also the timeField`},
		{"layout", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    layout: rollup\n", nil, nil,
			`config: rules[0].layout: "rollup" is not supported (supported: events, counter, slots)`},
		{"span and granularity", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: 1h, granularity: hours}\n", nil, nil,
			`config: rules[0].bucket: set span or granularity, not both`},
		{"span ms", "rules:\n  - namespace: a.b\n    timeField: t\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: 90ms}\n", nil, nil,
			`config: rules[1].bucket.span: "90ms" is not a whole number of seconds`},
		{"span zero", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: 0s}\n", nil, nil,
			`config: rules[0].bucket.span: "0s" is not positive`},
		{"span negative", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: -1h}\n", nil, nil,
			`config: rules[0].bucket.span: "-1h" is not positive`},
		{"span no unit", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: 3600}\n", nil, nil,
			`config: rules[0].bucket.span: 3600 has no unit; write it as e.g. 3600s`},
		{"span garbage", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {span: 1d}\n", nil, nil,
			`config: rules[0].bucket.span: "1d" is not a duration such as 90s, 10m or 1h`},
		{"granularity unknown", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {granularity: days}\n", nil, nil,
			`config: rules[0].bucket.granularity: "days" is not seconds, minutes or hours`},
		{"maxEvents zero", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxEvents: 0}\n", nil, nil,
			`config: rules[0].bucket.maxEvents: 0 is less than 1`},
		{"maxEvents text", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxEvents: many}\n", nil, nil,
			`config: rules[0].bucket.maxEvents: "many" is not a whole number`},
		{"maxBytes zero", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxBytes: 0}\n", nil, nil,
			`config: rules[0].bucket.maxBytes: 0 is less than 1KiB (1024 bytes): a bucket must hold an event`},
		{"maxBytes too big", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxBytes: 16MiB}\n", nil, nil,
			`config: rules[0].bucket.maxBytes: "16MiB" is more than the limit of 8MiB (8388608 bytes)`},
		{"maxBytes bad unit", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxBytes: 1TB}\n", nil, nil,
			`config: rules[0].bucket.maxBytes: "1TB" is not a byte count such as 1048576, 512KiB or 1MiB`},
		{"insertThreshold over maxEvents", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {maxEvents: 10, insertThreshold: 11}\n", nil, nil,
			`config: rules[0].bucket.insertThreshold: 11 is out of range [1, maxEvents=10]`},
		{"ingest unknown", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    ingest: fast\n", nil, nil,
			`config: rules[0].ingest: "fast" is not an ingest mode; use auto, staged or direct`},
		{"ingest staged counter", "rules:\n  - namespace: web.hits\n    timeField: ts\n    layout: counter\n    window: 1m\n    slot: 1s\n    ingest: staged\n", nil, nil,
			`config: rules[0].ingest: staged applies only to layout events, not counter (layout counter stages on FerretDB with auto, the default)`},
		{"mergeAfter too short", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    mergeAfter: 1ms\n", nil, nil,
			`config: rules[0].mergeAfter: "1ms" is less than 100ms`},
		{"maxStaged too small", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    maxStaged: 10\n", nil, nil,
			`config: rules[0].maxStaged: 10 is out of range [1000, 2147483647]`},
		{"compression unknown", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {compression: lz4}\n", nil, nil,
			`config: rules[0].bucket.compression: "lz4" is not zstd or none`},
		{"insertThreshold zero", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    bucket: {insertThreshold: 0}\n", nil, nil,
			`config: rules[0].bucket.insertThreshold: 0 is out of range [1, maxEvents=1000]`},
		{"aggregate duplicate", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [v, w, v]\n", nil, nil,
			`config: rules[0].aggregates[2]: "v" repeats rules[0].aggregates[0]`},
		{"aggregate is timeField", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [ts]\n", nil, nil,
			`config: rules[0].aggregates[0]: "ts" is the timeField; its min and max are kept anyway`},
		{"aggregate is metaField", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    metaField: m\n    aggregates: [m.x]\n", nil, nil,
			`config: rules[0].aggregates[0]: "m.x" is the metaField, which is the same for a whole bucket`},
		{"aggregate dollar", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [$v]\n", nil, nil,
			`config: rules[0].aggregates[0]: "$v" may not contain '$'`},
		{"aggregate empty segment", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [a..b]\n", nil, nil,
			`config: rules[0].aggregates[0]: "a..b" has an empty segment`},
		{"aggregate empty", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [\"\"]\n", nil, nil,
			`config: rules[0].aggregates[0]: "" is empty`},
		{"aggregate number", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [1]\n", nil, nil,
			`config: rules[0].aggregates[0]: 1 is not a field name`},
		{"aggregate inside another", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    aggregates: [a.b, a]\n", nil, nil,
			`config: rules[0].aggregates[0]: "a.b" lies inside rules[0].aggregates[1] "a"; keep one of them`},
		{"collection is own", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    collection: readings\n", nil, nil,
			`config: rules[0].collection: "readings" is the rule's own collection; buckets need a collection of their own`},
		{"collection dollar", "rules:\n  - namespace: iot.readings\n    timeField: ts\n    collection: r$b\n", nil, nil,
			`config: rules[0].collection: collection name "r$b" may not contain '$'`},
		{"bucket collections collide", "rules:\n  - {namespace: iot.a, timeField: t, collection: shared}\n  - {namespace: iot.b, timeField: t, collection: shared}\n", nil, nil,
			`config: rules[1].collection: bucket namespace "iot.shared" is also the bucket namespace of rules[0]`},
		{"bucket collection is another namespace", "rules:\n  - {namespace: iot.readings, timeField: t}\n  - {namespace: iot.readings.buckets, timeField: t}\n", nil, nil,
			`config: rules[0].collection: bucket namespace "iot.readings.buckets" is the namespace of rules[1]`},
		{"bucket collection set to another namespace", "rules:\n  - {namespace: iot.a, timeField: t}\n  - {namespace: iot.b, timeField: t, collection: a}\n", nil, nil,
			`config: rules[1].collection: bucket namespace "iot.a" is the namespace of rules[0]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setup(t)
			cert := writeFile(t, "cert.pem", "x")
			opts := LoadOptions{Flags: flags(t, tc.args...)}
			if tc.yaml != "" {
				opts.ConfigFile = writeFile(t, "c.yaml", strings.ReplaceAll(tc.yaml, "CERT", cert))
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := Load(opts)
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if c != nil {
				t.Error("Config returned with an error")
			}
			lines := strings.Split(err.Error(), "\n")
			for _, l := range lines {
				if l == tc.want || strings.HasSuffix(tc.want, "keys") && strings.HasPrefix(l, tc.want) {
					return
				}
			}
			t.Errorf("no line\n  %s\nin\n  %s", tc.want, strings.Join(lines, "\n  "))
		})
	}
}

func TestAllErrorsAtOnce(t *testing.T) {
	setup(t)
	p := writeFile(t, "c.yaml", `
listen: nowhere
upstream:
  urii: x
limits:
  maxConnections: 0
rules:
  - namespace: iot.readings
    bucket: {span: 90ms, maxEvents: 0}
  - namespace: iot.readings
    timeField: ts
`)
	_, err := Load(LoadOptions{ConfigFile: p})
	if err == nil {
		t.Fatal("accepted")
	}
	want := []string{
		`config: unknown key "upstream.urii"; did you mean "upstream.uri"?`,
		`config: listen: "nowhere" is not HOST:PORT`,
		`config: limits.maxConnections: 0 is out of range [1, 1000000]`,
		`config: rules[0].timeField: is missing; name the event field that holds the BSON date`,
		`config: rules[0].bucket.span: "90ms" is not a whole number of seconds`,
		`config: rules[0].bucket.maxEvents: 0 is less than 1`,
		`config: rules[1].namespace: "iot.readings" repeats rules[0]`,
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	var e *Error
	if !errors.As(err, &e) || e.Key != "upstream.urii" {
		t.Errorf("errors.As: %+v", e)
	}
	var keys []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		keys = append(keys, e.(*Error).Key)
	}
	wantKeys := []string{"upstream.urii", "listen", "limits.maxConnections", "rules[0].timeField",
		"rules[0].bucket.span", "rules[0].bucket.maxEvents", "rules[1].namespace"}
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("keys %q, want %q", keys, wantKeys)
	}
}

// TestShippedConfig loads /config.yaml, and its example rule uncommented.
func TestShippedConfig(t *testing.T) {
	src, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	setup(t)
	c, err := Load(LoadOptions{ConfigFile: writeFile(t, "config.yaml", string(src))})
	if err != nil {
		t.Fatal(err)
	}
	demo := Rule{
		Namespace: "demo.readings", DB: "demo", Collection: "readings",
		TimeField: "ts", MetaField: "sensorId",
		Span: time.Hour, MaxEvents: 1000, MaxBytes: 1 << 20, InsertThreshold: 100, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
		Aggregates: []string{"value"}, BucketCollection: "readings.buckets", Layout: "events",
	}
	if !reflect.DeepEqual(c.Rules, []Rule{demo}) {
		t.Errorf("shipped rules:\n got %+v\nwant the demo rule", c.Rules)
	}
	got := plain(c)
	got.Rules = nil
	if want := defaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("shipped config is not the defaults:\n got %+v\nwant %+v", got, want)
	}

	// Uncomment the example rules.
	var out []string
	inRules := false
	for _, l := range strings.Split(string(src), "\n") {
		switch {
		case l == "rules:":
			inRules = true
		case inRules && strings.HasPrefix(l, "#  "):
			l = strings.TrimPrefix(l, "#")
		}
		out = append(out, l)
	}
	c, err = Load(LoadOptions{ConfigFile: writeFile(t, "example.yaml", strings.Join(out, "\n"))})
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{demo, {
		Namespace: "iot.readings", DB: "iot", Collection: "readings",
		TimeField: "ts", MetaField: "sensorId",
		Span: time.Hour, MaxEvents: 1000, MaxBytes: 1 << 20, InsertThreshold: 100, Compression: CompressionZstd, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
		Aggregates: []string{"value"}, BucketCollection: "readings.buckets", Layout: "events",
	}, {
		Namespace: "web.hits", DB: "web", Collection: "hits",
		TimeField: "ts", MetaField: "page",
		Span: time.Minute, MaxEvents: 1000, MaxBytes: 1 << 20, InsertThreshold: 100, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
		BucketCollection: "hits.buckets", Layout: "counter",
		LayoutOptions: LayoutOptions{Window: time.Minute, Slot: time.Second},
	}, {
		Namespace: "mon.cpu", DB: "mon", Collection: "cpu",
		TimeField: "ts", MetaField: "host",
		Span: time.Hour, MaxEvents: 1000, MaxBytes: 1 << 20, InsertThreshold: 100, Ingest: DefaultIngest, MergeAfter: DefaultMergeAfter, MaxStaged: DefaultMaxStaged,
		Aggregates: []string{"value"}, BucketCollection: "cpu.buckets", Layout: "slots",
		LayoutOptions: LayoutOptions{Window: time.Hour, Slot: time.Second, ValueField: "value", Aggregated: true, Preallocate: true},
	}}
	if !reflect.DeepEqual(c.Rules, want) {
		t.Errorf("example rules:\n got %+v\nwant %+v", c.Rules, want)
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1048576", 1 << 20, true},
		{"512KiB", 512 << 10, true},
		{"1MiB", 1 << 20, true},
		{"1 mib", 1 << 20, true},
		{"2MB", 2_000_000, true},
		{"3KB", 3000, true},
		{"1GiB", 1 << 30, true},
		{"64k", 64 << 10, true},
		{"100B", 100, true},
		{"1_000", 1000, true},
		{"", 0, false},
		{"MiB", 0, false},
		{"1.5MiB", 0, false},
		{"-1", 0, false},
		{"1TB", 0, false},
		{"99999999999GiB", 0, false},
	} {
		got, err := ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"mongodb://h:27017/":                    "mongodb://h:27017/",
		"mongodb://u@h/":                        "mongodb://u@h/",
		"mongodb://u:p@h1,h2/?authSource=admin": "mongodb://u:xxxxx@h1,h2/?authSource=admin",
		"mongodb://u:p%40ss@h/db?x=a@b":         "mongodb://u:xxxxx@h/db?x=a@b",
		"embedded":                              "embedded",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEnvMistakes(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want []string // all the messages, in order
	}{
		{map[string]string{"TSPROXY_UPSTREAM": "mongodb://x/"},
			[]string{"config: $TSPROXY_UPSTREAM: upstream is a section, not a value; set its keys, e.g. $TSPROXY_UPSTREAM_URI"}},
		{map[string]string{"TSPROXY_UPSTREAM_TLS": "true"},
			[]string{"config: $TSPROXY_UPSTREAM_TLS: upstream.tls is a section, not a value; set its keys, e.g. $TSPROXY_UPSTREAM_TLS_ENABLED"}},
		{map[string]string{"TSPROXY_UPSTREAM_URII": "x", "TSPROXY_UPSTREAM_TLS_ENABLE": "true", "TSPROXY_LIMITS_MAXCONNS": "1"},
			[]string{
				"config: unknown variable $TSPROXY_LIMITS_MAXCONNS",
				"config: unknown variable $TSPROXY_UPSTREAM_TLS_ENABLE",
				"config: unknown variable $TSPROXY_UPSTREAM_URII",
			}},
		// not meant for a key: left alone
		{map[string]string{"TSPROXY_E2E_UPSTREAM": "mongodb://x/", "TSPROXY_LISTEN": ":1", "TSPROXY_UPSTREAM_TLS_ENABLED": "false"}, nil},
	} {
		setup(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		c, err := Load(LoadOptions{})
		var got []string
		if err != nil {
			got = strings.Split(err.Error(), "\n")
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("env %v:\n got %q\nwant %q", tc.env, got, tc.want)
		}
		if err == nil && c.Upstream.URI != "embedded" {
			t.Errorf("env %v: upstream %q", tc.env, c.Upstream.URI)
		}
	}
}

// TestListenUnixAbsolute: a relative socket path is made absolute at load,
// so that the socket and the URI apps use name the same file.
func TestListenUnixAbsolute(t *testing.T) {
	setup(t)
	c, err := Load(LoadOptions{ConfigFile: writeFile(t, "c.yaml", "listenUnix: run/tsproxy.sock\n")})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs("run/tsproxy.sock")
	if c.ListenUnix != want {
		t.Fatalf("listenUnix %q, want %q", c.ListenUnix, want)
	}
}
