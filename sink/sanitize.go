package sink

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxReasonBytes bounds a dead letter's stored reason, in bytes; a longer
// reason keeps its first bytes (whole characters) and says how many were
// cut.
const MaxReasonBytes = 4096

// sanitizeDeadLetter returns d as it can be stored, whoever built it (the
// decoder, a handler's rejection, a Postgres error, Parse): its text
// fields valid UTF-8 (each run of invalid bytes replaced by U+FFFD), with no NUL
// (replaced by U+FFFD: Postgres text cannot hold it), the reason at most
// MaxReasonBytes. Topic names are Kafka's, ASCII by the broker's rules;
// the key and value are bytea and kept as they are.
func sanitizeDeadLetter(d DeadLetter) DeadLetter {
	d.Topic = sanitizeText(d.Topic, 0)
	d.Reason = sanitizeText(d.Reason, MaxReasonBytes)
	return d
}

// sanitizeText returns s as valid UTF-8 without NUL, at most limit bytes
// when limit > 36 (cut at a character boundary, with a note of the bytes
// cut); limit <= 0 does not bound it.
func sanitizeText(s string, limit int) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && (limit <= 0 || len(s) <= limit) {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if limit <= 0 || len(s) <= limit {
		return s
	}
	// The note is at most 36 bytes: keep what leaves room for it.
	n := max(limit-36, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "… (" + strconv.Itoa(len(s)-n) + " bytes cut)"
}
