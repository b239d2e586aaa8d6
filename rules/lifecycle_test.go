package rules

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLifecycleValid(t *testing.T) {
	cases := []struct {
		name string
		rule string // YAML keys added to a rule on iot.readings
		want func(r *Rule)
	}{
		{"none", "", func(r *Rule) {}},
		{"rollups sorted, days", "rollups: [1d, 1m, 1h]", func(r *Rule) {
			r.Rollups = []time.Duration{time.Minute, time.Hour, 24 * time.Hour}
		}},
		{"expireAfter days, default sweep", "expireAfter: 30d", func(r *Rule) {
			r.ExpireAfter = 30 * 24 * time.Hour
			r.SweepInterval = DefaultSweepInterval
		}},
		{"expireAfter and sweepInterval", "expireAfter: 90m\n    sweepInterval: 200ms", func(r *Rule) {
			r.ExpireAfter = 90 * time.Minute
			r.SweepInterval = 200 * time.Millisecond
		}},
		{"shardKey", "shardKey: true", func(r *Rule) { r.ShardKey = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setup(t)
			yaml := "rules:\n  - namespace: iot.readings\n    timeField: ts\n    " + tc.rule + "\n"
			c, err := Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "c.yaml", yaml)})
			if err != nil {
				t.Fatal(err)
			}
			got := c.Rules[0]
			want := got
			want.Rollups, want.ExpireAfter, want.SweepInterval, want.ShardKey = nil, 0, 0, false
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestLifecycleInvalid(t *testing.T) {
	cases := []struct{ rule, want string }{
		{"rollups: 1h", `rules[0].rollups: must be a list such as [1m, 1h, 1d], not "1h"`},
		{"rollups: [1h, 60m]", `rules[0].rollups[1]: "60m" repeats rules[0].rollups[0]`},
		{"rollups: [500ms]", `rules[0].rollups[0]: "500ms" is not a whole number of seconds, at least 1s`},
		{"rollups: [1x]", `rules[0].rollups[0]: "1x" is not a duration such as 90s, 10m, 1h or 30d`},
		{"rollups: [1m, 2m, 3m, 4m, 5m, 6m, 7m, 8m, 9m]", `rules[0].rollups: has 9 resolutions; at most 8`},
		{"expireAfter: 0s", `rules[0].expireAfter: "0s" is not positive; leave it out to keep buckets forever`},
		{"expireAfter: -1h", `rules[0].expireAfter: "-1h" is not a positive whole number of seconds`},
		{"expireAfter: 30", `rules[0].expireAfter: 30 is not a duration such as 90s, 10m, 1h or 30d`},
		{"expireAfter: 0d", `rules[0].expireAfter: "0d" is not a duration such as 90s, 10m, 1h or 30d`},
		{"sweepInterval: 1m", `rules[0].sweepInterval: is set but expireAfter is not; the sweeper only removes expired buckets`},
		{"expireAfter: 1h\n    sweepInterval: 1ms", `rules[0].sweepInterval: "1ms" is less than 100ms`},
		{"shardKey: maybe", `rules[0].shardKey: "maybe" is not true or false`},
		{"layout: counter\n    rollups: [1h]", `rules[0].rollups: applies only to layout events, not counter`},
		{"layout: slots\n    shardKey: true", `rules[0].shardKey: applies only to layout events, not slots`},
	}
	for _, tc := range cases {
		t.Run(tc.rule, func(t *testing.T) {
			setup(t)
			yaml := "rules:\n  - namespace: iot.readings\n    timeField: ts\n    " + tc.rule + "\n"
			_, err := Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "c.yaml", yaml)})
			if err == nil {
				t.Fatal("accepted")
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if l == "config: "+tc.want {
					return
				}
			}
			t.Errorf("no line\n  config: %s\nin\n  %s", tc.want, err)
		})
	}
}

func TestRollupNames(t *testing.T) {
	r := Rule{DB: "iot", Collection: "readings"}
	for res, want := range map[time.Duration]string{
		time.Minute: "iot.readings.rollup_1m", time.Hour: "iot.readings.rollup_1h",
		24 * time.Hour: "iot.readings.rollup_1d", 90 * time.Second: "iot.readings.rollup_90s",
		36 * time.Hour: "iot.readings.rollup_36h",
	} {
		if got := r.RollupNamespace(res); got != want {
			t.Errorf("%v: %q, want %q", res, got, want)
		}
	}
}
