package scenarios

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// script is one parsed scenario file. It keeps every line it does not
// interpret (comments, blank lines) so that -rewrite reproduces the file
// with only the expected outputs changed.
type script struct {
	path     string
	segs     []segment
	labels   []string
	requires []string
}

// segment is a verbatim line (d == nil) or a directive with its expected
// output.
type segment struct {
	text string
	d    *directive
}

const sep = "----"

func parseFile(path string) (*script, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseScript(path, string(b))
}

func parseScript(path, text string) (*script, error) {
	s := &script{path: path}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if text == "" {
		lines = nil
	}
	seenDirective := false
	for i := 0; i < len(lines); {
		l := lines[i]
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "#") {
			if !seenDirective {
				if v, ok := header(t, "labels"); ok {
					s.labels = append(s.labels, v...)
				}
				if v, ok := header(t, "requires"); ok {
					s.requires = append(s.requires, v...)
				}
			}
			s.segs = append(s.segs, segment{text: l})
			i++
			continue
		}
		if t == sep {
			return nil, fmt.Errorf("%s:%d: %q without a command before it", path, i+1, sep)
		}
		seenDirective = true
		d, err := parseDirective(l, i+1)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		i++
		if i >= len(lines) || strings.TrimSpace(lines[i]) != sep {
			return nil, fmt.Errorf("%s:%d: want %q on the line after the command (then the expected output)", path, d.line, sep)
		}
		i++
		var out []string
		if i < len(lines) && strings.TrimSpace(lines[i]) == sep {
			d.double = true
			i++
			closed := false
			for i < len(lines) {
				if strings.TrimSpace(lines[i]) == sep && i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == sep {
					i += 2
					closed = true
					break
				}
				out = append(out, lines[i])
				i++
			}
			if !closed {
				return nil, fmt.Errorf("%s:%d: expected output opened with two %q lines is not closed by two", path, d.line, sep)
			}
		} else {
			for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
				out = append(out, lines[i])
				i++
			}
		}
		d.expected = normalize(strings.Join(out, "\n"))
		s.segs = append(s.segs, segment{d: d})
	}
	return s, nil
}

// header reads "# key: a, b c" comment lines.
func header(line, key string) ([]string, bool) {
	rest, ok := strings.CutPrefix(line, "#")
	if !ok {
		return nil, false
	}
	rest, ok = strings.CutPrefix(strings.TrimSpace(rest), key+":")
	if !ok {
		return nil, false
	}
	return strings.FieldsFunc(rest, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }), true
}

// render writes the script back with actual outputs in place of the
// expected ones.
func (s *script) render() string {
	var b strings.Builder
	for _, sg := range s.segs {
		if sg.d == nil {
			b.WriteString(sg.text + "\n")
			continue
		}
		d := sg.d
		b.WriteString(d.raw + "\n" + sep + "\n")
		out := d.expected
		if strings.Contains(out, "\n\n") || strings.HasPrefix(out, "\n") {
			b.WriteString(sep + "\n" + out + "\n" + sep + "\n" + sep + "\n")
			continue
		}
		if out != "" {
			b.WriteString(out + "\n")
		}
	}
	return b.String()
}

// normalize trims trailing spaces from every line and trailing blank lines,
// so that editors and tabwriter padding do not make outputs differ.
func normalize(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t\r")
	}
	return strings.Trim(strings.Join(lines, "\n"), "\n")
}

var keyRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

func parseDirective(line string, n int) (*directive, error) {
	toks, err := tokenize(line)
	if err != nil {
		return nil, err
	}
	d := &directive{line: n, raw: strings.TrimRight(line, " \t"), cmd: toks[0]}
	for _, t := range toks[1:] {
		k, v, ok := strings.Cut(t, "=")
		if ok && keyRE.MatchString(k) {
			a := &kvArg{key: k, val: v}
			if strings.HasPrefix(v, "(") {
				if !strings.HasSuffix(v, ")") {
					return nil, fmt.Errorf("%s: list not closed with ')'", k)
				}
				a.isList = true
				if a.list, err = splitList(v[1 : len(v)-1]); err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
			} else {
				a.val = unquote(v)
			}
			for _, o := range d.kv {
				if o.key == k {
					return nil, fmt.Errorf("argument %s given twice", k)
				}
			}
			d.kv = append(d.kv, a)
			continue
		}
		d.pos = append(d.pos, &posArg{val: unquote(t)})
	}
	return d, nil
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
	}
	return s
}

// tokenize splits on spaces outside parentheses and double quotes.
func tokenize(s string) ([]string, error) {
	var toks []string
	var cur strings.Builder
	depth, inQ, started := 0, false, false
	flush := func() {
		if started {
			toks = append(toks, cur.String())
		}
		cur.Reset()
		started = false
	}
	for _, r := range s {
		switch {
		case inQ:
			cur.WriteRune(r)
			if r == '"' {
				inQ = false
			}
		case r == '"':
			inQ, started = true, true
			cur.WriteRune(r)
		case r == '(':
			depth++
			started = true
			cur.WriteRune(r)
		case r == ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("unbalanced ')'")
			}
			cur.WriteRune(r)
		case unicode.IsSpace(r) && depth == 0:
			flush()
		default:
			started = true
			cur.WriteRune(r)
		}
	}
	if inQ {
		return nil, fmt.Errorf("unterminated quote")
	}
	if depth != 0 {
		return nil, fmt.Errorf("unbalanced '('")
	}
	flush()
	if len(toks) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	return toks, nil
}

// splitList splits "a,b,\"c,d\"" on commas outside quotes.
func splitList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return []string{}, nil
	}
	var out []string
	var cur strings.Builder
	inQ := false
	for _, r := range s {
		switch {
		case r == '"':
			inQ = !inQ
			cur.WriteRune(r)
		case r == ',' && !inQ:
			out = append(out, unquote(strings.TrimSpace(cur.String())))
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	if inQ {
		return nil, fmt.Errorf("unterminated quote in list")
	}
	return append(out, unquote(strings.TrimSpace(cur.String()))), nil
}
