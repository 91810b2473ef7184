package sink

import "github.com/jackc/pgx/v5"

// insertedDeadLetters returns the dead letters of dls (sanitized, in the
// order of dls) whose rows the INSERT … RETURNING topic, partition,
// "offset" of rows inserted: the count onceflow_dead_letters_total and
// the logs go by, so that a record read again whose dead letter was
// recorded before is neither counted nor logged twice. A dead letter
// that appears twice in dls is returned once.
func insertedDeadLetters(rows pgx.Rows, dls []DeadLetter) ([]DeadLetter, error) {
	type at struct {
		topic     string
		partition int32
		offset    int64
	}
	inserted := map[at]bool{}
	var k at
	if _, err := pgx.ForEachRow(rows, []any{&k.topic, &k.partition, &k.offset}, func() error {
		inserted[k] = true
		return nil
	}); err != nil {
		return nil, err
	}
	if len(inserted) == 0 {
		return nil, nil
	}
	out := make([]DeadLetter, 0, len(inserted))
	for _, d := range dls {
		d = sanitizeDeadLetter(d)
		if k := (at{d.Topic, d.Partition, d.Offset}); inserted[k] {
			out = append(out, d)
			delete(inserted, k)
		}
	}
	return out, nil
}
