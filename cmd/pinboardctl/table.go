package main

import (
	"io"
	"strings"
	"unicode"

	"golang.org/x/text/width"
)

// table lays rows out in columns two spaces apart, padded by the width
// each cell takes on a terminal. text/tabwriter pads by runes, so a cell
// with characters two columns wide (a namespace in Chinese or Japanese,
// which the registry allows) pushed the rest of its row off the header's
// columns. The last column is not padded. The zero value is ready; not
// safe for concurrent use.
type table struct {
	rows [][]string
}

// row adds one row; cells must print (see cell).
func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

// write writes the table to w.
func (t *table) write(w io.Writer) error {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// displayWidth is how many terminal columns s takes: two for East Asian
// wide and fullwidth characters, none for combining marks and format
// characters, one for the rest (what wcwidth(3) answers for printable
// text).
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		switch {
		case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		case width.LookupRune(r).Kind() == width.EastAsianWide, width.LookupRune(r).Kind() == width.EastAsianFullwidth:
			n += 2
		default:
			n++
		}
	}
	return n
}
