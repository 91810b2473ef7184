package wire

import "bytes"

var nulEscape = []byte(`\u0000`)

// HasNULEscape reports whether the JSON text b holds the escape \u0000: a
// NUL character, which PostgreSQL can store in neither text nor jsonb. The
// six bytes count only where they are an escape, preceded by an even
// number of backslashes: in `"C:\\u0000"` they are an escaped backslash
// followed by the letters u0000, which Postgres stores. b is assumed to be
// JSON; HasNULEscape does not validate it.
func HasNULEscape(b []byte) bool {
	for from := 0; ; {
		i := bytes.Index(b[from:], nulEscape)
		if i < 0 {
			return false
		}
		i += from
		n := 0
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		from = i + 1
	}
}
