package placement

import (
	"strings"
	"testing"
	"time"
)

// start_timeout is how long the runner waits for an engine; it does not
// change how the engine runs, so setting or changing it rolls nothing.
func TestStartTimeoutLeavesTheSpecVersion(t *testing.T) {
	base := Deployment{Name: "chat", Model: "m", Replicas: 1}
	with := base
	with.StartTimeout = Duration(3 * time.Hour)
	if base.SpecVersion() != with.SpecVersion() {
		t.Fatalf("start_timeout changed the spec version: %s vs %s", base.SpecVersion(), with.SpecVersion())
	}
	// No default is written into a stored spec: decoding a spec without
	// the field keeps it zero, so a spec stored before it existed reads the
	// same.
	d, err := DecodeDeployment([]byte(`{"name":"chat","model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.StartTimeout != 0 {
		t.Fatalf("decoded start_timeout %s, want unset", d.StartTimeout)
	}
	d, err = DecodeDeployment([]byte(`{"name":"chat","model":"m","start_timeout":"90m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(d.StartTimeout) != 90*time.Minute {
		t.Fatalf("start_timeout %s, want 1h30m", d.StartTimeout)
	}
}

func TestStartTimeoutBadInput(t *testing.T) {
	for _, v := range []string{`"0s"`, `"-5m"`, `"169h"`, `"soon"`, `12`} {
		_, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","start_timeout":` + v + `}`))
		if err == nil || !strings.Contains(err.Error(), "start_timeout") {
			t.Errorf("start_timeout %s: err %v, want an error naming start_timeout", v, err)
		}
	}
}
