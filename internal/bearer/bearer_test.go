package bearer

import "testing"

func TestToken(t *testing.T) {
	for _, c := range []struct {
		h, tok string
		ok     bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER   abc  ", "abc", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
		{"", "", false},
	} {
		tok, ok := Token(c.h)
		if tok != c.tok || ok != c.ok {
			t.Errorf("Token(%q) = %q, %v; want %q, %v", c.h, tok, ok, c.tok, c.ok)
		}
	}
}

func TestEqual(t *testing.T) {
	for _, c := range []struct {
		got, want string
		eq        bool
	}{
		{"s3cret", "s3cret", true},
		{"s3cret", "s3creT", false},
		{"s3cre", "s3cret", false},
		{"s3cret-and-more", "s3cret", false},
		{"", "", false},
		{"x", "", false},
	} {
		if eq := Equal(c.got, c.want); eq != c.eq {
			t.Errorf("Equal(%q, %q) = %v, want %v", c.got, c.want, eq, c.eq)
		}
	}
}
