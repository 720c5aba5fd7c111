package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"
)

// oldSpelling is a flag's former name, kept working and hidden from help
// so that scripts written against it go on running. configure hands its
// value to the flag's name of today before the command runs, so actions
// read only that one.
type oldSpelling struct {
	*cli.StringFlag
	now string
}

// renamed is old, a hidden old spelling of the string flag now.
func renamed(old, now string) cli.Flag {
	return &oldSpelling{StringFlag: &cli.StringFlag{Name: old, Hidden: true, Usage: "old spelling of --" + now}, now: now}
}

// takeOldSpellings makes c, before it runs, set each renamed flag's new
// name from its old spelling when that was given. Both given with
// different values on the command line is a usage error; the new name's
// environment variable, a default, gives way to the old spelling.
func takeOldSpellings(c *cli.Command) {
	var olds []*oldSpelling
	for _, f := range c.Flags {
		if o, ok := f.(*oldSpelling); ok {
			olds = append(olds, o)
		}
	}
	if len(olds) == 0 {
		return
	}
	before := c.Before
	c.Before = func(ctx context.Context, c *cli.Command) (context.Context, error) {
		for _, o := range olds {
			if !c.IsSet(o.Name) {
				continue
			}
			v := c.String(o.Name)
			if given(c, o.now) && c.String(o.now) != v {
				return ctx, usageError(fmt.Sprintf("--%s and --%s (its old spelling) say different things: give one", o.now, o.Name))
			}
			if err := c.Set(o.now, v); err != nil {
				return ctx, fmt.Errorf("--%s: %w", o.Name, err)
			}
		}
		if before != nil {
			return before(ctx, c)
		}
		return ctx, nil
	}
}

// given reports whether the string flag name was set on the command line,
// not only from its environment variable.
func given(c *cli.Command, name string) bool {
	if !c.IsSet(name) {
		return false
	}
	for _, f := range c.Flags {
		if sf, ok := f.(*cli.StringFlag); ok && sf.Name == name {
			env, ok := sf.Sources.Lookup()
			return !ok || env != c.String(name)
		}
	}
	return true
}
