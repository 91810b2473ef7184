package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Template is a parsed payload template: a JSON document whose string
// values may hold placeholders, {{function arguments...}}, replaced for
// every event. The functions:
//
//	{{uuid}}                        a random UUID (version 4), as a string
//	{{event_id}}                    the event's id, as a string
//	{{seq}}                         the event's number, from 1
//	{{int MIN MAX}}                 an integer in [MIN, MAX]
//	{{decimal MIN MAX SCALE}}       a decimal in [MIN, MAX] with SCALE digits after the point
//	{{choice A B ...}}              one of the arguments, each a quoted string or a number
//	{{now}}                         the current time, RFC 3339 with nanoseconds, UTC
//	{{timestamp FROM TO}}           a time in [FROM, TO], each RFC 3339 or a date (2026-01-02)
//	{{string F ARGS...}}            function F's value as a JSON string ({{string int 1 9}}: "7")
//
// A placeholder that is a whole JSON string ("{{int 1 100}}") becomes
// the value itself: a JSON number for int, decimal and a number choice,
// a JSON string for the rest. A placeholder within a longer string
// ("acct-{{int 1 50}}") becomes text in that string. Quoted arguments use
// double quotes, escaped as JSON wants inside a string (\"EUR\"), or
// single quotes ('EUR'). A placeholder outside a JSON string is an error.
//
// Parse errors are *TemplateError values naming the line and column (from
// 1) of the problem and the function. A Template is immutable and safe
// for concurrent use; the randomness comes from the caller's generator.
type Template struct {
	parts []part
}

// part is literal text, or a placeholder.
type part struct {
	text string // literal text, when fn is nil
	fn   *call
	// whole: the placeholder is a whole JSON string; its quotes are in
	// neither neighbour's text.
	whole bool
}

// call is one placeholder's function and arguments.
type call struct {
	name     string
	asString bool // {{string ...}}
	ints     [2]int64
	dec      [2]*big.Rat
	scale    int
	choices  []json.RawMessage // each a JSON value
	times    [2]time.Time
}

// TemplateError is a template that does not parse.
type TemplateError struct {
	Line, Column int    // from 1, of the placeholder or the JSON error
	Func         string // the function, when the problem is a placeholder's
	Msg          string
}

func (e *TemplateError) Error() string {
	if e.Func != "" {
		return fmt.Sprintf("template line %d column %d: %s: %s", e.Line, e.Column, e.Func, e.Msg)
	}
	return fmt.Sprintf("template line %d column %d: %s", e.Line, e.Column, e.Msg)
}

// ParseTemplate parses src; see [Template] for the syntax. Every
// placeholder is checked (its function known, its arguments of the right
// number and kind, ranges not empty) and the document, with its
// placeholders, must be JSON.
func ParseTemplate(src []byte) (*Template, error) {
	t := &Template{}
	// masked is src with every placeholder's bytes replaced by 'x', so
	// that JSON errors keep src's offsets.
	masked := bytes.Clone(src)
	inString, escaped := false, false
	lit := 0 // start of the current literal
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c == '{' && i+1 < len(src) && src[i+1] == '{' {
			end := bytes.Index(src[i+2:], []byte("}}"))
			if end < 0 {
				line, col := position(src, i)
				return nil, &TemplateError{Line: line, Column: col, Msg: "{{ without a closing }}"}
			}
			end += i + 2
			line, col := position(src, i)
			if !inString {
				return nil, &TemplateError{Line: line, Column: col, Msg: "a placeholder outside a JSON string: put it in quotes (\"{{...}}\")"}
			}
			var inside string // the placeholder, JSON escapes undone
			if json.Unmarshal([]byte(`"`+string(src[i+2:end])+`"`), &inside) != nil {
				return nil, &TemplateError{Line: line, Column: col, Msg: "the placeholder is not valid in a JSON string (a bad escape?)"}
			}
			fn, err := parseCall(inside)
			if err != nil {
				err.Line, err.Column = line, col
				return nil, err
			}
			whole := i > 0 && src[i-1] == '"' && !escapedQuote(src, i-1) && end+2 < len(src) && src[end+2] == '"'
			text := string(src[lit:i])
			if whole {
				text = text[:len(text)-1]
			}
			t.parts = append(t.parts, part{text: text}, part{fn: fn, whole: whole})
			for j := i; j < end+2; j++ {
				masked[j] = 'x'
			}
			i = end + 1
			lit = end + 2
			if whole {
				lit++ // the closing quote
				i++
				inString = false
			}
			continue
		}
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		}
	}
	t.parts = append(t.parts, part{text: string(src[lit:])})
	if err := json.Unmarshal(masked, new(any)); err != nil {
		var se *json.SyntaxError
		off := len(src)
		if errors.As(err, &se) {
			off = int(se.Offset) - 1
		}
		line, col := position(src, max(off, 0))
		return nil, &TemplateError{Line: line, Column: col, Msg: "not JSON: " + err.Error()}
	}
	return t, nil
}

// escapedQuote reports whether the quote at i is escaped (an odd number
// of backslashes before it).
func escapedQuote(src []byte, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && src[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

// position is the line and column (from 1, in bytes) of offset off.
func position(src []byte, off int) (line, col int) {
	off = min(off, len(src))
	line = 1 + bytes.Count(src[:off], []byte("\n"))
	col = off - bytes.LastIndexByte(src[:off], '\n')
	return line, col
}

// parseCall parses a placeholder's inside: a function and its arguments.
func parseCall(inside string) (*call, *TemplateError) {
	words, err := splitArgs(inside)
	if err != nil {
		return nil, &TemplateError{Msg: err.Error()}
	}
	if len(words) == 0 {
		return nil, &TemplateError{Msg: "an empty placeholder: {{}} names no function (uuid, event_id, seq, int, decimal, choice, now, timestamp, string)"}
	}
	c := &call{name: words[0].text}
	if c.name == "string" {
		if len(words) < 2 {
			return nil, &TemplateError{Func: "string", Msg: "names no function: {{string int 1 9}}"}
		}
		c.asString = true
		c.name = words[1].text
		words = words[1:]
	}
	bad := func(format string, a ...any) (*call, *TemplateError) {
		return nil, &TemplateError{Func: c.name, Msg: fmt.Sprintf(format, a...)}
	}
	args := words[1:]
	want := func(n int, usage string) *TemplateError {
		if len(args) != n {
			return &TemplateError{Func: c.name, Msg: fmt.Sprintf("takes %d arguments (%s), got %d", n, usage, len(args))}
		}
		return nil
	}
	switch c.name {
	case "uuid", "event_id", "seq", "now":
		if e := want(0, "none"); e != nil {
			return nil, e
		}
	case "int":
		if e := want(2, "{{int MIN MAX}}"); e != nil {
			return nil, e
		}
		for i, a := range args {
			v, err := strconv.ParseInt(a.text, 10, 64)
			if err != nil || a.quoted {
				return bad("argument %d, %s, is not an integer", i+1, a.show())
			}
			c.ints[i] = v
		}
		if c.ints[0] > c.ints[1] {
			return bad("MIN %d is above MAX %d", c.ints[0], c.ints[1])
		}
		if c.ints[0] == math.MinInt64 && c.ints[1] == math.MaxInt64 {
			return bad("the range is the whole of int64: narrow it")
		}
	case "decimal":
		if e := want(3, "{{decimal MIN MAX SCALE}}"); e != nil {
			return nil, e
		}
		for i, a := range args[:2] {
			r, ok := new(big.Rat).SetString(a.text)
			if !ok || a.quoted || strings.ContainsAny(a.text, "/eE") {
				return bad("argument %d, %s, is not a decimal number", i+1, a.show())
			}
			c.dec[i] = r
		}
		s, err := strconv.Atoi(args[2].text)
		if err != nil || args[2].quoted || s < 0 || s > 18 {
			return bad("SCALE %s is not an integer from 0 to 18", args[2].show())
		}
		c.scale = s
		if c.dec[0].Cmp(c.dec[1]) > 0 {
			return bad("MIN %s is above MAX %s", args[0].text, args[1].text)
		}
		switch n := steps(c.dec[0], c.dec[1], s); {
		case n == nil:
			return bad("no decimal with %d digits after the point lies in [%s, %s]", s, args[0].text, args[1].text)
		case !n.IsUint64() || n.Uint64() == math.MaxUint64:
			return bad("[%s, %s] holds more than 2^64 values of scale %d: narrow it", args[0].text, args[1].text, s)
		}
	case "choice":
		if len(args) == 0 {
			return bad("takes at least one argument ({{choice 'EUR' 'USD'}})")
		}
		for i, a := range args {
			if a.quoted {
				b, _ := json.Marshal(a.text)
				c.choices = append(c.choices, b)
				continue
			}
			if !json.Valid([]byte(a.text)) || a.text == "true" || a.text == "false" || a.text == "null" {
				return bad("argument %d, %s, is neither a quoted string nor a number", i+1, a.show())
			}
			c.choices = append(c.choices, json.RawMessage(a.text))
		}
	case "timestamp":
		if e := want(2, "{{timestamp FROM TO}}"); e != nil {
			return nil, e
		}
		for i, a := range args {
			t, err := parseTime(a.text)
			if err != nil {
				return bad("argument %d, %s, is neither RFC 3339 (2026-01-02T15:04:05Z) nor a date (2026-01-02)", i+1, a.show())
			}
			c.times[i] = t
		}
		if c.times[0].After(c.times[1]) {
			return bad("FROM %s is after TO %s", args[0].text, args[1].text)
		}
	case "string":
		return bad("string takes a function, not string")
	default:
		return bad("unknown function (known: uuid, event_id, seq, int, decimal, choice, now, timestamp, string)")
	}
	return c, nil
}

func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	return time.Parse(time.DateOnly, s)
}

// steps is the number of values of scale digits in [lo, hi] minus one,
// with lo rounded up: nil when there is none.
func steps(lo, hi *big.Rat, scale int) *big.Int {
	a, b := scaled(lo, scale, true), scaled(hi, scale, false)
	if a.Cmp(b) > 0 {
		return nil
	}
	return new(big.Int).Sub(b, a)
}

// scaled is r × 10^scale rounded up (ceil) or down.
func scaled(r *big.Rat, scale int, ceil bool) *big.Int {
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil)
	x := new(big.Rat).Mul(r, new(big.Rat).SetInt(p))
	q, m := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int)) // floor for a positive denominator
	if ceil && m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// word is one argument of a placeholder.
type word struct {
	text   string
	quoted bool
}

func (w word) show() string {
	if w.quoted {
		return strconv.Quote(w.text)
	}
	return w.text
}

// splitArgs splits a placeholder's inside (its JSON escapes undone) into
// words: bare words, and strings in single or double quotes.
func splitArgs(s string) ([]word, error) {
	var ws []word
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'' || c == '"':
			open := string(c)
			i++
			end := strings.Index(s[i:], open)
			if end < 0 {
				return nil, fmt.Errorf("a quoted argument without its closing %s", open)
			}
			ws = append(ws, word{text: s[i : i+end], quoted: true})
			i += end + len(open)
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r'\"", rune(s[j])) {
				j++
			}
			if j == i {
				return nil, fmt.Errorf("unexpected %q", s[i])
			}
			ws = append(ws, word{text: s[i:j]})
			i = j
		}
	}
	return ws, nil
}

// render appends the template's value for one event to dst.
func (t *Template) render(dst []byte, rng *rand.Rand, id uuid.UUID, seq int64, now time.Time) []byte {
	for _, p := range t.parts {
		if p.fn == nil {
			dst = append(dst, p.text...)
			continue
		}
		v, isString := p.fn.value(rng, id, seq, now)
		switch {
		case p.whole && (isString || p.fn.asString):
			b, _ := json.Marshal(v)
			dst = append(dst, b...)
		case p.whole:
			dst = append(dst, v...)
		default: // within a string: the text, escaped as JSON
			b, _ := json.Marshal(v)
			dst = append(dst, b[1:len(b)-1]...)
		}
	}
	return dst
}

// value is the function's value for one event, as text, and whether it
// is a string (a choice's quoted argument, a uuid...) rather than a
// number.
func (c *call) value(rng *rand.Rand, id uuid.UUID, seq int64, now time.Time) (string, bool) {
	switch c.name {
	case "uuid":
		var u uuid.UUID
		for i := range 2 {
			v := rng.Uint64()
			for j := range 8 {
				u[i*8+j] = byte(v >> (8 * j))
			}
		}
		u[6] = u[6]&0x0f | 0x40
		u[8] = u[8]&0x3f | 0x80
		return u.String(), true
	case "event_id":
		return id.String(), true
	case "seq":
		return strconv.FormatInt(seq, 10), false
	case "now":
		return now.UTC().Format(time.RFC3339Nano), true
	case "int":
		span := uint64(c.ints[1] - c.ints[0])
		return strconv.FormatInt(c.ints[0]+int64(rng.Uint64N(span+1)), 10), false
	case "decimal":
		lo := scaled(c.dec[0], c.scale, true)
		n := steps(c.dec[0], c.dec[1], c.scale)
		pick := new(big.Int).SetUint64(rng.Uint64N(n.Uint64() + 1)) // n fits: checked by parseCall
		return formatScaled(new(big.Int).Add(lo, pick), c.scale), false
	case "choice":
		v := c.choices[rng.IntN(len(c.choices))]
		if v[0] == '"' {
			var s string
			_ = json.Unmarshal(v, &s)
			return s, true
		}
		return string(v), false
	case "timestamp":
		span := c.times[1].Sub(c.times[0])
		var d time.Duration
		if span > 0 {
			d = time.Duration(rng.Int64N(int64(span) + 1))
		}
		return c.times[0].Add(d).UTC().Format(time.RFC3339Nano), true
	}
	return "", true // unreachable: parseCall knows every name
}

// formatScaled writes v / 10^scale with exactly scale digits after the
// point.
func formatScaled(v *big.Int, scale int) string {
	neg := v.Sign() < 0
	s := new(big.Int).Abs(v).String()
	if scale > 0 {
		if len(s) <= scale {
			s = strings.Repeat("0", scale-len(s)+1) + s
		}
		s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	}
	if neg {
		s = "-" + s
	}
	return s
}
