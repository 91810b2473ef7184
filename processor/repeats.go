package processor

import (
	"sync"
	"time"
)

// repeatWindow is how long a log line said again is held back: the first
// is logged, the same line within the window only counted, and the count
// is said with the next one logged after it.
const repeatWindow = time.Minute

// maxRepeatKeys bounds the lines remembered; past it they are forgotten
// all at once, so a line is at worst said again early.
const maxRepeatKeys = 1024

// repeats holds back log lines said again within repeatWindow. The zero
// value is ready; it is safe for concurrent use.
type repeats struct {
	mu   sync.Mutex
	last map[string]repeat
}

type repeat struct {
	at   time.Time // when the line was last logged
	held int       // times it was held back since
}

// allow reports whether the line k is logged at now, and how many times
// it was held back since it last was.
func (r *repeats) allow(k string, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil || len(r.last) >= maxRepeatKeys {
		r.last = map[string]repeat{}
	}
	p, ok := r.last[k]
	if ok && now.Sub(p.at) < repeatWindow {
		p.held++
		r.last[k] = p
		return false, 0
	}
	r.last[k] = repeat{at: now}
	return true, p.held
}
