package placement

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// replicas: {min, max} is stored as autoscale with replicas at min; the
// scaling fields stay out of the spec version; the stored form decodes
// to the same spec.
func TestAutoscaleSpec(t *testing.T) {
	d, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","replicas":{"min":2,"max":5},"target_inflight":4,"scale_down_delay":"30s"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Autoscale{Min: 2, Max: 5, TargetInflight: 4, ScaleDownDelay: Duration(30 * time.Second)}
	if d.Autoscale == nil || *d.Autoscale != want || d.Replicas != 2 {
		t.Fatalf("decoded %+v (replicas %d), want %+v at 2", d.Autoscale, d.Replicas, want)
	}
	fixed := d
	fixed.Autoscale, fixed.Replicas = nil, 3
	if d.SpecVersion() != fixed.SpecVersion() {
		t.Errorf("autoscaling changed the spec version: %s vs %s", d.SpecVersion(), fixed.SpecVersion())
	}
	stored, _ := json.Marshal(d)
	if !strings.Contains(string(stored), `"replicas":2,`) || !strings.Contains(string(stored), `"autoscale":{"min":2,"max":5,"target_inflight":4,"scale_down_delay":"30s"}`) {
		t.Errorf("stored as %s", stored)
	}
	again, err := DecodeDeployment(stored)
	if err != nil || !sameDeployment(again, d) {
		t.Errorf("the stored form decodes to %+v, %v", again, err)
	}
	if f := d.FieldsAbove(4); len(f) != 1 || f[0].Field != "autoscale" || f[0].Protocol != 5 {
		t.Errorf("fields above protocol 4: %+v", f)
	}
	if f := d.FieldsAbove(5); len(f) != 0 {
		t.Errorf("fields above protocol 5: %+v", f)
	}
}

func sameDeployment(a, b Deployment) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// A deployment that may scale to zero starts at one replica, and its
// idle window is stored with the range.
func TestScaleToZeroSpec(t *testing.T) {
	d, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","replicas":{"min":0,"max":2},"idle_window":"2m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Replicas != 1 || d.Autoscale.Min != 0 || d.Autoscale.IdleWindow != Duration(2*time.Minute) {
		t.Errorf("decoded replicas %d, autoscale %+v", d.Replicas, d.Autoscale)
	}
}

// Bad scaling input is refused naming the field and what it takes.
func TestAutoscaleBadInput(t *testing.T) {
	for body, want := range map[string]string{
		`"replicas":{"min":3,"max":2}`:                               `replicas.min: invalid value "3": at most replicas.max (2)`,
		`"replicas":{"min":-1,"max":2}`:                              `replicas.min: invalid value "-1": an integer from 0 to 1000`,
		`"replicas":{"min":1,"max":2},"idle_window":"5m"`:            `idle_window: invalid value "5m0s": only with replicas.min 0`,
		`"replicas":{"min":0,"max":2},"idle_window":"-5m"`:           `idle_window: invalid value "-5m0s": a duration from 1s to 24h`,
		`"replicas":{"min":1}`:                                       `replicas.max: invalid value "(missing)"`,
		`"replicas":{"min":1,"max":2,"step":1}`:                      `unknown field "replicas.step"; valid fields are min, max`,
		`"replicas":{"min":1,"max":2000}`:                            `replicas.max: invalid value "2000": an integer from 1 to 1000`,
		`"replicas":{"min":1,"max":"x"}`:                             `replicas.max: invalid value "\"x\"": an integer`,
		`"replicas":{"min":1,"max":3},"scale_down_delay":"-1m"`:      `scale_down_delay: invalid value "-1m0s": a duration from 1s to 24h`,
		`"replicas":{"min":1,"max":3},"scale_down_delay":"0s"`:       `scale_down_delay: invalid value "\"0s\""`,
		`"replicas":{"min":1,"max":3},"target_inflight":-2`:          `target_inflight: invalid value "-2"`,
		`"replicas":2,"target_inflight":4`:                           `target_inflight: invalid value "4": only with replicas: {min: N, max: M}`,
		`"replicas":{"min":1,"max":3},"autoscale":{"min":1,"max":3}`: `autoscale (replicas: {min, max} says the same): given more than once`,
		`"replicas":7,"autoscale":{"min":1,"max":3}`:                 `replicas: invalid value "7": within replicas.min and replicas.max (1 to 3)`,
	} {
		_, err := DecodeDeployment([]byte(`{"name":"chat","model":"m",` + body + `}`))
		if err == nil || !errors.Is(err, ErrInvalidDeployment) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
