package orders

// readOrder reads value when it has the shape producers write — an
// object whose only members are "user_id", a plain integer, and "items",
// an array of strings of printable ASCII without escapes, each at most
// once, with any JSON whitespace — and reports false for anything else:
// Parse then hands it to encoding/json. For a value it reads, the Order is
// the one json.Unmarshal makes (FuzzParse compares the two); it only costs
// a tenth as much, which a consumer reading tens of thousands of orders a
// second per core notices.
func readOrder(v []byte) (o Order, ok bool) {
	r := reader{v: v}
	if !r.next('{') {
		return o, false
	}
	var user, items bool
	if r.next('}') {
		return o, r.end()
	}
	for {
		key, ok := r.plainBytes()
		if !ok || !r.next(':') {
			return o, false
		}
		switch string(key) {
		case "user_id":
			if user {
				return o, false // the last one wins in encoding/json: left to it
			}
			user = true
			if o.UserID, ok = r.integer(); !ok {
				return o, false
			}
		case "items":
			if items {
				return o, false
			}
			items = true
			if o.Items, ok = r.strings(); !ok {
				return o, false
			}
		default:
			return o, false // another member, or one encoding/json matches without case
		}
		switch {
		case r.next(','):
		case r.next('}'):
			return o, r.end()
		default:
			return o, false
		}
	}
}

// reader reads v from i on.
type reader struct {
	v []byte
	i int
}

func (r *reader) space() {
	for r.i < len(r.v) {
		switch r.v[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips whitespace and c, and reports whether c was there.
func (r *reader) next(c byte) bool {
	r.space()
	if r.i < len(r.v) && r.v[r.i] == c {
		r.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (r *reader) end() bool {
	r.space()
	return r.i == len(r.v)
}

// plainBytes reads a string of printable ASCII without escapes and
// returns its bytes (in v, not copied).
func (r *reader) plainBytes() ([]byte, bool) {
	if !r.next('"') {
		return nil, false
	}
	start := r.i
	for ; r.i < len(r.v); r.i++ {
		switch c := r.v[r.i]; {
		case c == '"':
			r.i++
			return r.v[start : r.i-1], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// integer reads a JSON integer that fits an int64 with room to spare (at
// most 18 digits): no fraction, no exponent.
func (r *reader) integer() (int64, bool) {
	r.space()
	neg := r.i < len(r.v) && r.v[r.i] == '-'
	if neg {
		r.i++
	}
	start := r.i
	var n int64
	for ; r.i < len(r.v) && r.v[r.i] >= '0' && r.v[r.i] <= '9'; r.i++ {
		n = n*10 + int64(r.v[r.i]-'0')
	}
	digits := r.i - start
	switch {
	case digits == 0 || digits > 18:
		return 0, false
	case digits > 1 && r.v[start] == '0': // not JSON
		return 0, false
	case r.i < len(r.v) && (r.v[r.i] == '.' || r.v[r.i] == 'e' || r.v[r.i] == 'E'):
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// strings reads an array of plain strings (see plainBytes).
func (r *reader) strings() ([]string, bool) {
	if !r.next('[') {
		return nil, false
	}
	out := make([]string, 0, 4)
	if r.next(']') {
		return out, true
	}
	for {
		b, ok := r.plainBytes()
		if !ok {
			return nil, false
		}
		out = append(out, string(b))
		switch {
		case r.next(']'):
			return out, true
		case !r.next(','):
			return nil, false
		}
	}
}
