package main

import (
	"testing"
	"time"
)

func TestClockColumnSaysTheOffsetAndMarksItPastTheBound(t *testing.T) {
	d := func(v time.Duration) *time.Duration { return &v }
	for _, c := range []struct {
		in   *time.Duration
		want string
	}{
		{nil, "-"},
		{d(100 * time.Millisecond), "+0.1s"},
		{d(-2300 * time.Millisecond), "-2.3s"},
		{d(30 * time.Second), "+30.0s"},
		{d(-42 * time.Second), "-42.0s!"},
	} {
		if got := clockOffset(c.in); got != c.want {
			t.Errorf("clockOffset(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
