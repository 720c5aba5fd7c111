package spec

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/llmgw/llmgw/placement"
)

// yamlGuard refuses, reading the text once and allocating nothing, the
// YAML bodies whose parse would cost far more than their size, before the
// YAML parser builds anything:
//
//   - nesting deeper than placement.MaxSpecDepth. The parser has a limit
//     of its own, 10,000 levels, but builds a node per level first, and
//     the JSON made of it is as deep: 50 KB of nested mappings took 120 MB.
//   - more than placement.MaxSpecValues values. The parser, its tree and
//     the JSON made of it spend up to several hundred bytes on each:
//     300,000 tiny list entries took 150 MB.
//   - aliases (*name). Each stands for a copy of its anchor's value, so a
//     few hundred bytes can stand for megabytes; a spec has nothing to
//     repeat.
//   - text the scanner below cannot follow exactly: not UTF-8 (the parser
//     also reads UTF-16), or a byte-order mark after the start.
func yamlGuard(body []byte) error {
	_, err := yamlShape(body, placement.MaxSpecDepth, placement.MaxSpecValues)
	return err
}

// yamlShapeOf is what yamlShape measured: an upper bound on the nesting
// depth of the parsed tree, and the values the parser builds a node for
// (every empty value it adds stands beside a key that is counted, so the
// tree has at most twice as many nodes).
type yamlShapeOf struct {
	depth, values int
}

// errYAMLStop ends a scan where the YAML scanner reports an error: it
// builds nothing past that point either, so what was counted is all the
// parse can cost.
var errYAMLStop = errors.New("the YAML scanner stops here")

// yamlShape follows the scanner of go.yaml.in/yaml/v2, which
// sigs.k8s.io/yaml parses with, token by token: where its tokens start and
// end, where it opens and closes block indentation levels (roll_indent,
// unroll_indent), its flow level and its simple keys. It builds no token
// values, so it costs nothing per level or per value, and it stops with an
// error as soon as the depth or the values pass the limits. The depth
// bound is two per open indentation level (a block mapping, and a
// sequence that may sit at its key's indentation) plus the flow level.
//
// It has to be exact, not a heuristic: a scan that took a continued plain
// scalar's leading quote for the start of a quoted one would skip what
// follows, and the parser would build it all. FuzzYAMLShapeBoundsTheParse
// compares it with the parser's real trees.
func yamlShape(body []byte, depthLimit, valueLimit int) (yamlShapeOf, error) {
	if !utf8.Valid(body) {
		return yamlShapeOf{}, errors.New("the spec is not UTF-8 text; send it as UTF-8")
	}
	const bom = "\uFEFF"
	body = bytes.TrimPrefix(body, []byte(bom)) // the reader drops it
	if bytes.Contains(body, []byte(bom)) {
		return yamlShapeOf{}, errors.New("the spec holds a byte-order mark (U+FEFF) after its start; remove it")
	}
	s := yamlScanner{b: body[:yamlReadable(body)], depthLimit: depthLimit, valueLimit: valueLimit, keyAllowed: true}
	err := s.run()
	if errors.Is(err, errYAMLStop) {
		err = nil
	}
	return yamlShapeOf{depth: s.maxDepth, values: s.values}, err
}

// yamlReadable is how much of body the YAML reader passes on: it stops
// with an error at the first character YAML does not allow.
func yamlReadable(body []byte) int {
	for i := 0; i < len(body); {
		r, w := utf8.DecodeRune(body[i:])
		switch {
		case r == '\t' || r == '\n' || r == '\r', r >= 0x20 && r <= 0x7E, r == 0x85,
			r >= 0xA0 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= 0x10FFFF:
		default:
			return i
		}
		i += w
	}
	return len(body)
}

// yamlScanner is the state of go-yaml's scanner that decides nesting; see
// yamlShape. Names follow scannerc.go.
type yamlScanner struct {
	b          []byte
	pos        int // byte offset
	col, index int // in characters, as the scanner counts them
	line       int
	depthLimit int
	valueLimit int
	flow       int
	// indents are the open block indentation levels, innermost last;
	// depthLimit bounds how many can be open.
	indents    [placement.MaxSpecDepth/2 + 1]int
	open       int
	keyAllowed bool
	// key is the possible simple key of the block context (flow level 0;
	// keys inside flow collections open no indentation level).
	key struct {
		possible         bool
		line, index, col int
	}
	values   int
	maxDepth int
}

func (s *yamlScanner) at(i int) byte {
	if s.pos+i < len(s.b) {
		return s.b[s.pos+i]
	}
	return 0 // the scanner's end-of-input byte
}

func (s *yamlScanner) isBreak(i int) bool {
	switch c := s.at(i); c {
	case '\r', '\n':
		return true
	case 0xC2:
		return s.at(i+1) == 0x85
	case 0xE2:
		return s.at(i+1) == 0x80 && (s.at(i+2) == 0xA8 || s.at(i+2) == 0xA9)
	}
	return false
}

func (s *yamlScanner) isBlank(i int) bool  { return s.at(i) == ' ' || s.at(i) == '\t' }
func (s *yamlScanner) isBreakz(i int) bool { return s.isBreak(i) || s.pos+i >= len(s.b) }
func (s *yamlScanner) isBlankz(i int) bool { return s.isBlank(i) || s.isBreakz(i) }

// skip moves past one character.
func (s *yamlScanner) skip() {
	_, w := utf8.DecodeRune(s.b[s.pos:])
	s.pos += w
	s.col++
	s.index++
}

// skipLine moves past one line break (CR LF is one).
func (s *yamlScanner) skipLine() {
	switch {
	case s.at(0) == '\r' && s.at(1) == '\n':
		s.pos += 2
		s.index += 2
	case s.isBreak(0):
		_, w := utf8.DecodeRune(s.b[s.pos:])
		s.pos += w
		s.index++
	default:
		return
	}
	s.col = 0
	s.line++
}

func (s *yamlScanner) indent() int {
	if s.open == 0 {
		return -1
	}
	return s.indents[s.open-1]
}

// value counts one value the parser builds a node for.
func (s *yamlScanner) value() error {
	if s.values++; s.values > s.valueLimit {
		return &placement.TooManyValuesError{Limit: s.valueLimit, At: fmt.Sprintf("line %d", s.line+1)}
	}
	return nil
}

func (s *yamlScanner) checkDepth() error {
	d := 2*s.open + s.flow
	s.maxDepth = max(s.maxDepth, d)
	if d > s.depthLimit {
		return &placement.NestingError{Limit: s.depthLimit, At: fmt.Sprintf("line %d", s.line+1)}
	}
	return nil
}

// roll opens a block indentation level at col, as roll_indent does.
func (s *yamlScanner) roll(col int) error {
	if s.flow > 0 || s.indent() >= col {
		return nil
	}
	if s.open == len(s.indents) {
		return &placement.NestingError{Limit: s.depthLimit, At: fmt.Sprintf("line %d", s.line+1)}
	}
	s.indents[s.open] = col
	s.open++
	if err := s.checkDepth(); err != nil {
		return err
	}
	return s.value() // a block collection
}

// unroll closes the levels indented deeper than col.
func (s *yamlScanner) unroll(col int) {
	if s.flow > 0 {
		return
	}
	for s.open > 0 && s.indents[s.open-1] > col {
		s.open--
	}
}

func (s *yamlScanner) saveKey() {
	if s.flow == 0 && s.keyAllowed {
		s.key.possible, s.key.line, s.key.index, s.key.col = true, s.line, s.index, s.col
	}
}

func (s *yamlScanner) removeKey() {
	if s.flow == 0 {
		s.key.possible = false
	}
}

func (s *yamlScanner) documentIndicator() bool {
	return s.col == 0 && s.isBlankz(3) &&
		((s.at(0) == '-' && s.at(1) == '-' && s.at(2) == '-') || (s.at(0) == '.' && s.at(1) == '.' && s.at(2) == '.'))
}

func (s *yamlScanner) run() error {
	for {
		s.toNextToken()
		s.unroll(s.col)
		if s.pos >= len(s.b) {
			return nil
		}
		if err := s.token(); err != nil {
			return err
		}
	}
}

// toNextToken skips blanks, comments and line breaks
// (yaml_parser_scan_to_next_token).
func (s *yamlScanner) toNextToken() {
	for {
		// Tabs are skipped in flow context and where no simple key may
		// start; elsewhere one is an error, met as a token below.
		for s.at(0) == ' ' || ((s.flow > 0 || !s.keyAllowed) && s.at(0) == '\t') {
			s.skip()
		}
		if s.at(0) == '#' {
			for !s.isBreakz(0) {
				s.skip()
			}
		}
		if !s.isBreak(0) {
			return
		}
		s.skipLine()
		if s.flow == 0 {
			s.keyAllowed = true
		}
	}
}

// token follows one token (yaml_parser_fetch_next_token).
func (s *yamlScanner) token() error {
	c := s.at(0)
	switch {
	case s.col == 0 && c == '%': // a directive
		s.unroll(-1)
		s.removeKey()
		s.keyAllowed = false
		for !s.isBreakz(0) {
			s.skip()
		}
	case s.documentIndicator():
		s.unroll(-1)
		s.removeKey()
		s.keyAllowed = false
		s.skip()
		s.skip()
		s.skip()
	case c == '[' || c == '{':
		s.saveKey()
		s.flow++
		if err := s.checkDepth(); err != nil {
			return err
		}
		s.keyAllowed = true
		s.skip()
		return s.value()
	case c == ']' || c == '}':
		s.removeKey()
		if s.flow > 0 {
			s.flow--
		}
		s.keyAllowed = false
		s.skip()
	case c == ',':
		s.removeKey()
		s.keyAllowed = true
		s.skip()
		return s.value() // the parser may add an empty entry
	case c == '-' && s.isBlankz(1): // a block entry
		if s.flow == 0 {
			if err := s.roll(s.col); err != nil {
				return err
			}
		}
		s.removeKey()
		s.keyAllowed = true
		s.skip()
		return s.value()
	case c == '?' && (s.flow > 0 || s.isBlankz(1)): // a complex key
		if s.flow == 0 {
			if err := s.roll(s.col); err != nil {
				return err
			}
		}
		s.removeKey()
		s.keyAllowed = s.flow == 0
		s.skip()
		return s.value()
	case c == ':' && (s.flow > 0 || s.isBlankz(1)): // a value
		if s.key.possible && s.flow == 0 && s.key.line == s.line && s.key.index+1024 >= s.index {
			// The simple key before it opens a mapping at its column.
			if err := s.roll(s.key.col); err != nil {
				return err
			}
			s.key.possible = false
			s.keyAllowed = false
			s.skip()
			return nil
		}
		if s.flow == 0 {
			if err := s.roll(s.col); err != nil {
				return err
			}
		}
		s.keyAllowed = s.flow == 0
		s.skip()
		return s.value()
	case c == '*':
		return fmt.Errorf("line %d: YAML aliases (*name) are not accepted in a spec: each stands for a copy of its anchor's value; write the value out", s.line+1)
	case c == '&': // an anchor: a property, not a value
		s.saveKey()
		s.keyAllowed = false
		s.skip()
		for c := s.at(0); c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || c == '-'; c = s.at(0) {
			s.skip()
		}
	case c == '!': // a tag: its characters run to a blank, or it is an error
		s.saveKey()
		s.keyAllowed = false
		for !s.isBlankz(0) {
			s.skip()
		}
	case (c == '|' || c == '>') && s.flow == 0:
		s.removeKey()
		s.keyAllowed = true
		if err := s.value(); err != nil {
			return err
		}
		return s.blockScalar()
	case c == '\'' || c == '"':
		s.saveKey()
		s.keyAllowed = false
		if err := s.value(); err != nil {
			return err
		}
		return s.quoted(c)
	case s.plainStart(c):
		s.saveKey()
		s.keyAllowed = false
		if err := s.value(); err != nil {
			return err
		}
		return s.plain()
	default:
		return errYAMLStop // "found character that cannot start any token"
	}
	return nil
}

func (s *yamlScanner) plainStart(c byte) bool {
	switch c {
	case '-':
		return !s.isBlank(1)
	case '?', ':':
		return s.flow == 0 && !s.isBlankz(1)
	case ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`':
		return false
	}
	return !s.isBlankz(0)
}

// blockScalar follows a literal or folded scalar
// (yaml_parser_scan_block_scalar): its header, then every line indented
// at least as far as its content.
func (s *yamlScanner) blockScalar() error {
	s.skip()
	increment := 0
	digit := func() bool {
		if c := s.at(0); c >= '1' && c <= '9' {
			increment = int(c - '0')
			s.skip()
			return true
		}
		return s.at(0) != '0'
	}
	if c := s.at(0); c == '+' || c == '-' {
		s.skip()
		if !digit() {
			return errYAMLStop // an indentation indicator of 0
		}
	} else if c >= '0' && c <= '9' {
		if !digit() {
			return errYAMLStop
		}
		if c := s.at(0); c == '+' || c == '-' {
			s.skip()
		}
	}
	for s.isBlank(0) {
		s.skip()
	}
	if s.at(0) == '#' {
		for !s.isBreakz(0) {
			s.skip()
		}
	}
	if !s.isBreakz(0) {
		return errYAMLStop
	}
	s.skipLine()
	indent := 0
	if increment > 0 {
		indent = max(s.indent(), 0) + increment
	}
	if !s.blockBreaks(&indent) {
		return errYAMLStop
	}
	for s.col == indent && s.pos < len(s.b) {
		for !s.isBreakz(0) {
			s.skip()
		}
		s.skipLine()
		if !s.blockBreaks(&indent) {
			return errYAMLStop
		}
	}
	return nil
}

// blockBreaks skips a block scalar's indentation and empty lines, and
// settles its indentation from the first line with content
// (yaml_parser_scan_block_scalar_breaks). false: the scanner's error.
func (s *yamlScanner) blockBreaks(indent *int) bool {
	maxIndent := 0
	for {
		for (*indent == 0 || s.col < *indent) && s.at(0) == ' ' {
			s.skip()
		}
		maxIndent = max(maxIndent, s.col)
		if (*indent == 0 || s.col < *indent) && s.at(0) == '\t' {
			return false
		}
		if !s.isBreak(0) {
			break
		}
		s.skipLine()
	}
	if *indent == 0 {
		*indent = max(maxIndent, s.indent()+1, 1)
	}
	return true
}

// quoted follows a single- or double-quoted scalar, over line breaks
// (yaml_parser_scan_flow_scalar).
func (s *yamlScanner) quoted(q byte) error {
	s.skip()
	for {
		if s.documentIndicator() || s.pos >= len(s.b) {
			return errYAMLStop
		}
		for !s.isBlankz(0) {
			c := s.at(0)
			switch {
			case q == '\'' && c == '\'' && s.at(1) == '\'':
				s.skip()
				s.skip()
				continue
			case c == q:
			case q == '"' && c == '\\' && s.isBreak(1):
				s.skip()
				s.skipLine()
			case q == '"' && c == '\\':
				digits := 0
				switch s.at(1) {
				case '0', 'a', 'b', 't', '\t', 'n', 'v', 'f', 'r', 'e', ' ', '"', '\'', '\\', 'N', '_', 'L', 'P':
				case 'x':
					digits = 2
				case 'u':
					digits = 4
				case 'U':
					digits = 8
				default:
					return errYAMLStop
				}
				s.skip()
				s.skip()
				for range digits {
					if c := s.at(0); !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
						return errYAMLStop
					}
					s.skip()
				}
				continue
			default:
				s.skip()
				continue
			}
			break
		}
		if s.at(0) == q {
			s.skip()
			return nil
		}
		for s.isBlank(0) || s.isBreak(0) {
			if s.isBlank(0) {
				s.skip()
			} else {
				s.skipLine()
			}
		}
	}
}

// plain follows a plain scalar, over the lines that continue it
// (yaml_parser_scan_plain_scalar).
func (s *yamlScanner) plain() error {
	indent := s.indent() + 1
	leadingBlanks := false
	for {
		if s.documentIndicator() || s.at(0) == '#' {
			break
		}
		for !s.isBlankz(0) {
			c := s.at(0)
			if (c == ':' && s.isBlankz(1)) || (s.flow > 0 && (c == ',' || c == '?' || c == '[' || c == ']' || c == '{' || c == '}')) {
				break
			}
			leadingBlanks = false
			s.skip()
		}
		if !s.isBlank(0) && !s.isBreak(0) {
			break
		}
		for s.isBlank(0) || s.isBreak(0) {
			if s.isBlank(0) {
				if leadingBlanks && s.col < indent && s.at(0) == '\t' {
					return errYAMLStop
				}
				s.skip()
			} else {
				s.skipLine()
				leadingBlanks = true
			}
		}
		if s.flow == 0 && s.col < indent {
			break
		}
	}
	if leadingBlanks {
		s.keyAllowed = true
	}
	return nil
}
