package page

import (
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// cell is one table cell: its text (spaces collapsed) and the title of
// the first element in it that has one.
type cell struct{ text, title string }

func findID(n *html.Node, id string) *html.Node {
	if n.Type == html.ElementNode {
		for _, a := range n.Attr {
			if a.Key == "id" && a.Val == id {
				return n
			}
		}
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := findID(c, id); f != nil {
			return f
		}
	}
	return nil
}

func each(n *html.Node, tag string, fn func(*html.Node)) {
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if c.Type == html.ElementNode && c.Data == tag {
			fn(c)
		}
		each(c, tag, fn)
	}
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

func titleOf(n *html.Node) string {
	var t string
	each(n, "span", func(s *html.Node) {
		for _, a := range s.Attr {
			if a.Key == "title" && t == "" && strings.Contains(a.Val, " ") {
				t = a.Val
			}
		}
	})
	return t
}

// rows reads table id as maps from header to cell.
func rows(t *testing.T, doc *html.Node, id string) []map[string]cell {
	t.Helper()
	table := findID(doc, id)
	if table == nil {
		t.Fatalf("no table %q", id)
	}
	var header []string
	var out []map[string]cell
	each(table, "tr", func(tr *html.Node) {
		var cells []*html.Node
		for c := tr.FirstChild; c != nil; c = c.NextSibling {
			if c.Type == html.ElementNode && (c.Data == "td" || c.Data == "th") {
				cells = append(cells, c)
			}
		}
		if len(cells) > 0 && cells[0].Data == "th" {
			for _, c := range cells {
				header = append(header, textOf(c))
			}
			return
		}
		r := map[string]cell{}
		for i, c := range cells {
			if i < len(header) {
				r[header[i]] = cell{text: textOf(c), title: titleOf(c)}
			}
		}
		out = append(out, r)
	})
	return out
}

// row is the row of table id whose first column starts with key.
func row(t *testing.T, doc *html.Node, id, key string) map[string]cell {
	t.Helper()
	for _, r := range rows(t, doc, id) {
		for _, first := range []string{"node", "deployment", "shard"} {
			if c, ok := r[first]; ok && (c.text == key || strings.HasPrefix(c.text, key+" ")) {
				return r
			}
		}
	}
	t.Fatalf("table %s has no row %q", id, key)
	return nil
}

// checkTables wants the three tables, each with a header and rows whose
// cells match it.
func checkTables(t *testing.T, doc *html.Node) {
	t.Helper()
	for id, cols := range map[string]int{"nodes": 8, "deployments": 9, "shards": 9} {
		rs := rows(t, doc, id)
		if len(rs) == 0 {
			t.Errorf("table %s has no rows", id)
		}
		for i, r := range rs {
			if len(r) != cols {
				t.Errorf("table %s row %d has %d cells, want %d: %+v", id, i, len(r), cols, r)
			}
		}
	}
}
