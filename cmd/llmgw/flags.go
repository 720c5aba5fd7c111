package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"
)

// renamed is old, a hidden old spelling of the string flag now, kept
// working so that scripts written against it go on running. Given, it sets
// now before the command's action runs (urfave/cli runs a set flag's
// Action after parsing, before the command's), so actions read only now.
// Both given with different values on the command line is a usage error;
// now's environment variable, a default, gives way to the old spelling.
func renamed(old, now string) cli.Flag {
	return &cli.StringFlag{Name: old, Hidden: true, Usage: "old spelling of --" + now,
		Action: func(_ context.Context, c *cli.Command, v string) error {
			if given(c, now) && c.String(now) != v {
				return usageError(fmt.Sprintf("--%s and --%s (its old spelling) say different things: give one", now, old))
			}
			if err := c.Set(now, v); err != nil {
				return fmt.Errorf("--%s: %w", old, err)
			}
			return nil
		}}
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
