package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts the name of every environment variable Load reads. A
// key's variable is the prefix, "_", and the key upper-cased with its dots
// turned into "_": upstream.uri is TSPROXY_UPSTREAM_URI, upstream.dataDir is
// TSPROXY_UPSTREAM_DATADIR. A variable set to "" counts as set (so
// TSPROXY_TELEMETRY_METRICSLISTEN= disables metrics). Rules come from the
// file only.
const EnvPrefix = "TSPROXY"

// EnvConfigFile names the config file when neither LoadOptions.ConfigFile
// nor --config does.
const EnvConfigFile = EnvPrefix + "_CONFIG"

// Names of the flags RegisterFlags defines.
const (
	FlagConfig     = "config"
	FlagListen     = "listen"
	FlagListenUnix = "listen-unix"
	FlagUpstream   = "upstream"
	FlagData       = "data"
	FlagMetrics    = "metrics"
	FlagLogLevel   = "log-level"
)

// flagKeys binds each flag to its config key.
var flagKeys = []struct{ flag, key string }{
	{FlagListen, "listen"},
	{FlagListenUnix, "listenUnix"},
	{FlagUpstream, "upstream.uri"},
	{FlagData, "upstream.dataDir"},
	{FlagMetrics, "telemetry.metricsListen"},
	{FlagLogLevel, "telemetry.logLevel"},
}

// RegisterFlags defines on fs the flags Load reads: --config FILE,
// --listen HOST:PORT, --listen-unix PATH, --upstream URI|embedded, --data DIR,
// --metrics HOST:PORT and --log-level LEVEL. Their defaults are empty: a
// flag counts only when given, and then beats the environment and the file.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String(FlagConfig, "", "YAML config `file` (default "+DefaultConfigFile+" when it exists; env "+EnvConfigFile+")")
	fs.String(FlagListen, "", "`HOST:PORT` to accept MongoDB clients on (key listen; default "+DefaultListen+")")
	fs.String(FlagListenUnix, "", "`PATH` of a Unix socket (ending in .sock) to accept MongoDB clients on as well, for apps on this host (key listenUnix; default none)")
	fs.String(FlagUpstream, "", "upstream `URI`: \"embedded\" or mongodb://host[:port][,host...]/?options (key upstream.uri; default "+DefaultUpstreamURI+")")
	fs.String(FlagData, "", "data `DIR` of the embedded upstream (key upstream.dataDir; default "+DefaultDataDir+")")
	fs.String(FlagMetrics, "", "`HOST:PORT` of the Prometheus /metrics endpoint (key telemetry.metricsListen; default "+DefaultMetricsListen+"; \"\" disables)")
	fs.String(FlagLogLevel, "", "log `level`: debug, info, warn or error (key telemetry.logLevel; default "+DefaultLogLevel+")")
}

// LoadOptions says where Load looks.
type LoadOptions struct {
	// ConfigFile is the YAML file to read; it must exist. Empty: the
	// --config flag when given, else $TSPROXY_CONFIG when set, else
	// config.yaml when it exists in the working directory, else no file.
	ConfigFile string
	// Flags holds the flags of RegisterFlags (others are ignored); nil or
	// a flag left out means no flag values.
	Flags *pflag.FlagSet
}

// Error is one problem found in the configuration. Load returns all of
// them joined with errors.Join; each prints as "config: " + Msg.
type Error struct {
	// Key is the key path in error, e.g. "rules[1].bucket.span"; "" for a
	// problem with the file as a whole.
	Key string
	// Msg is the message, which names Key.
	Msg string
}

func (e *Error) Error() string { return "config: " + e.Msg }

// defaults are applied through viper, under every other source.
var defaults = map[string]any{
	"listen":                          DefaultListen,
	"listenUnix":                      "",
	"listenTLS.clientAuth":            ClientAuthNone,
	"upstream.uri":                    DefaultUpstreamURI,
	"upstream.dataDir":                DefaultDataDir,
	"upstream.dialTimeout":            DefaultDialTimeout,
	"upstream.tls.enabled":            false,
	"limits.maxConnections":           DefaultMaxConnections,
	"limits.maxMessageBytes":          DefaultMaxMessageBytes,
	"limits.maxCursors":               DefaultMaxCursors,
	"limits.cursorTTL":                DefaultCursorTTL,
	"limits.frameTimeout":             DefaultFrameTimeout,
	"limits.writeTimeout":             DefaultWriteTimeout,
	"limits.retryCacheSize":           DefaultRetryCacheSize,
	"limits.retryCacheTTL":            DefaultRetryCacheTTL,
	"limits.aggregateMemory":          DefaultAggregateMemory,
	"limits.stagedMemory":             DefaultStagedMemory,
	"telemetry.metricsListen":         DefaultMetricsListen,
	"telemetry.serviceName":           DefaultServiceName,
	"telemetry.logLevel":              DefaultLogLevel,
	"telemetry.logFormat":             DefaultLogFormat,
	"shutdownTimeout":                 DefaultShutdownTimeout,
	"createTimeseries":                CreateTimeseriesAuto,
	"listenTLS.certFile":              "",
	"listenTLS.keyFile":               "",
	"listenTLS.caFile":                "",
	"upstream.tls.caFile":             "",
	"upstream.tls.certFile":           "",
	"upstream.tls.keyFile":            "",
	"upstream.tls.serverName":         "",
	"upstream.tls.insecureSkipVerify": false,
	"telemetry.otlpEndpoint":          "",
}

// Load reads the configuration: defaults, then the YAML file, then
// TSPROXY_* environment variables, then the flags, each beating the one
// before. It checks every value and returns every problem at once, joined;
// each is an *Error naming its key.
func Load(opts LoadOptions) (*Config, error) {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AllowEmptyEnv(true)
	// Bind each key rather than viper.AutomaticEnv: with AutomaticEnv a
	// variable named like a section (TSPROXY_UPSTREAM) hides every key in it.
	for _, k := range envKeys() {
		if err := v.BindEnv(k); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	for k, def := range defaults {
		v.SetDefault(k, def)
	}

	d := &decoder{v: v, flagOf: map[string]*pflag.Flag{}}
	if opts.Flags != nil {
		for _, fk := range flagKeys {
			f := opts.Flags.Lookup(fk.flag)
			if f == nil {
				continue
			}
			if err := v.BindPFlag(fk.key, f); err != nil {
				return nil, fmt.Errorf("config: flag --%s: %w", fk.flag, err)
			}
			d.flagOf[strings.ToLower(fk.key)] = f
		}
	}

	file, must := configFile(opts)
	if file == "" && must {
		return nil, &Error{Msg: fmt.Sprintf("--%s: the file name is empty", FlagConfig)}
	}
	var errs []error
	envErrs := checkEnv(os.Environ())
	if file != "" {
		b, err := os.ReadFile(file)
		switch {
		case err == nil:
			var root yaml.Node
			if err := yaml.Unmarshal(b, &root); err != nil {
				return nil, &Error{Msg: fmt.Sprintf("%s: %v", file, err)}
			}
			errs = append(errs, checkKeys(&root)...)
			if doc := root.Content; len(doc) > 0 && !isNull(resolve(doc[0])) && resolve(doc[0]).Kind != yaml.MappingNode {
				return nil, errors.Join(errs...) // viper cannot read it
			}
			v.SetConfigType("yaml")
			if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
				return nil, &Error{Msg: fmt.Sprintf("%s: %v", file, err)}
			}
		case errors.Is(err, os.ErrNotExist) && !must:
			file = ""
		default:
			return nil, &Error{Msg: err.Error()}
		}
	}

	cfg := d.config()
	cfg.File = file
	errs = append(errs, envErrs...)
	errs = append(errs, d.errs...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg.set = NewSet(cfg.Rules)
	return cfg, nil
}

// configFile picks the file to read and whether it must exist.
func configFile(opts LoadOptions) (string, bool) {
	if opts.ConfigFile != "" {
		return opts.ConfigFile, true
	}
	if opts.Flags != nil {
		if f := opts.Flags.Lookup(FlagConfig); f != nil && f.Changed {
			// An empty value (--config "$CFG" with CFG unset) names no
			// file: must, so that Load refuses it rather than start on
			// the defaults.
			return f.Value.String(), true
		}
	}
	if p, ok := os.LookupEnv(EnvConfigFile); ok && p != "" {
		return p, true
	}
	return DefaultConfigFile, false
}

// envKeys lists the keys read from the environment: every key of the
// schema outside the rules, and "rules" itself (to say it is file-only).
func envKeys() []string {
	var out []string
	var walk func(prefix string, specs []keySpec)
	walk = func(prefix string, specs []keySpec) {
		for _, s := range specs {
			k := join(prefix, s.name)
			if s.kind == mapping {
				walk(k, s.children)
			} else {
				out = append(out, k)
			}
		}
	}
	walk("", schema)
	return out
}

// envName is the variable of key.
func envName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// checkEnv reports TSPROXY_ variables that look meant for a key but name
// none: a section (TSPROXY_UPSTREAM) or a misspelt key in a section
// (TSPROXY_UPSTREAM_URII). Other TSPROXY_ variables (TSPROXY_E2E_UPSTREAM
// of the tests) are left alone.
// knownSpelling is the known variable that name is, but for its
// underscores.
func knownSpelling(name string, known map[string]bool) (string, bool) {
	bare := strings.ReplaceAll(name, "_", "")
	for k := range known {
		if strings.ReplaceAll(k, "_", "") == bare {
			return k, true
		}
	}
	return "", false
}

func checkEnv(environ []string) []error {
	known := map[string]bool{envName(""): true, EnvConfigFile: true}
	for _, k := range envKeys() {
		known[envName(k)] = true
	}
	var sections []string
	var walk func(prefix string, specs []keySpec)
	walk = func(prefix string, specs []keySpec) {
		for _, s := range specs {
			if s.kind == mapping {
				k := join(prefix, s.name)
				sections = append(sections, k)
				walk(k, s.children)
			}
		}
	}
	walk("", schema)

	var names []string
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, EnvPrefix+"_") && !known[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		// the deepest section the variable falls in
		sec := ""
		for _, c := range sections {
			if cn := envName(c); (name == cn || strings.HasPrefix(name, cn+"_")) && len(c) > len(sec) {
				sec = c
			}
		}
		switch {
		case sec == "":
			// Other programs' variables may share the prefix (the tests'
			// TSPROXY_E2E_*): only a known name spelt with other
			// underscores is taken for a typo ($TSPROXY_LISTEN_UNIX
			// for $TSPROXY_LISTENUNIX, which was ignored).
			if want, ok := knownSpelling(name, known); ok {
				errs = append(errs, &Error{Key: "$" + name, Msg: fmt.Sprintf("unknown variable $%s; did you mean $%s?", name, want)})
			}
		case name == envName(sec):
			errs = append(errs, &Error{Key: "$" + name, Msg: fmt.Sprintf(
				"$%s: %s is a section, not a value; set its keys, e.g. $%s",
				name, sec, envName(sec+"."+firstLeaf(sec)))})
		default:
			errs = append(errs, &Error{Key: "$" + name, Msg: fmt.Sprintf("unknown variable $%s", name)})
		}
	}
	return errs
}

func firstLeaf(section string) string {
	specs := schema
	for _, part := range strings.Split(section, ".") {
		s, _ := findKey(specs, part)
		specs = s.children
	}
	return specs[0].name
}
