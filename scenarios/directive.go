package scenarios

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// directive is one command of a scenario.
type directive struct {
	line     int
	raw      string
	cmd      string
	pos      []*posArg
	kv       []*kvArg
	expected string
	// double is set when the expected output is fenced by "----\n----"
	// (it contains blank lines).
	double bool
	// noEvent: the command did not happen (a wait that timed out), so it
	// records no event for measure.
	noEvent bool
}

type posArg struct {
	val  string
	used bool
}

type kvArg struct {
	key    string
	val    string
	list   []string
	isList bool
	used   bool
}

// usageError is a mistake in the scenario file itself: it fails the
// scenario, unlike errors of the system under test, which are output.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// Argument accessors. Each marks what it reads as used; leftovers fail the
// scenario (see unused).

func (d *directive) arg(key string) *kvArg {
	for _, a := range d.kv {
		if a.key == key {
			a.used = true
			return a
		}
	}
	return nil
}

func (d *directive) has(key string) bool {
	for _, a := range d.kv {
		if a.key == key {
			return true
		}
	}
	return false
}

// kvRaw reads a key as used without type checks.
func (d *directive) kvRaw(key string) (string, bool) {
	a := d.arg(key)
	if a == nil {
		return "", false
	}
	return a.val, true
}

func (d *directive) str(key, def string) (string, error) {
	a := d.arg(key)
	if a == nil {
		return def, nil
	}
	if a.isList {
		return "", usagef("%s: want a single value, not a list", key)
	}
	return a.val, nil
}

func (d *directive) need(key string) (string, error) {
	if !d.has(key) {
		return "", usagef("%s: missing argument %s=", d.cmd, key)
	}
	return d.str(key, "")
}

func (d *directive) integer(key string, def int) (int, error) {
	s, err := d.str(key, "")
	if err != nil || s == "" {
		return def, err
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, usagef("%s=%s: want a non-negative integer", key, s)
	}
	return v, nil
}

func (d *directive) boolean(key string, def bool) (bool, error) {
	s, err := d.str(key, "")
	if err != nil || s == "" {
		return def, err
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, usagef("%s=%s: want true or false", key, s)
	}
	return v, nil
}

func (d *directive) duration(key string, def time.Duration) (time.Duration, error) {
	s, err := d.str(key, "")
	if err != nil || s == "" {
		return def, err
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return 0, usagef("%s=%s: want a positive duration such as 3s", key, s)
	}
	return v, nil
}

// list accepts key=(a,b) and key=a.
func (d *directive) list(key string) ([]string, bool) {
	a := d.arg(key)
	if a == nil {
		return nil, false
	}
	if a.isList {
		return a.list, true
	}
	if a.val == "" {
		return []string{}, true
	}
	return strings.Split(a.val, ","), true
}

// positional returns the remaining positional arguments, marking them used.
func (d *directive) positional() []string {
	var out []string
	for _, p := range d.pos {
		if !p.used {
			p.used = true
			out = append(out, p.val)
		}
	}
	return out
}

// nextPos consumes the next positional argument.
func (d *directive) nextPos(what string) (string, error) {
	for _, p := range d.pos {
		if !p.used {
			p.used = true
			return p.val, nil
		}
	}
	return "", usagef("%s: missing %s", d.cmd, what)
}

func (d *directive) unused() error {
	var left []string
	for _, p := range d.pos {
		if !p.used {
			left = append(left, p.val)
		}
	}
	for _, a := range d.kv {
		if !a.used {
			left = append(left, a.key+"=")
		}
	}
	if len(left) > 0 {
		return usagef("%s: unused arguments: %s", d.cmd, strings.Join(left, " "))
	}
	return nil
}
