package orders

import "testing"

func TestGenerate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		events   int
		ratio    float64
		messages int
	}{
		{"no duplicates", 100, 0, 100},
		{"half", 100, 0.5, 150},
		{"more duplicates than events", 10, 3, 40},
		{"empty", 0, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Generate(tc.events, tc.ratio, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Messages) != tc.messages || len(s.Unique) != tc.events {
				t.Fatalf("got %d messages, %d unique; want %d and %d", len(s.Messages), len(s.Unique), tc.messages, tc.events)
			}
			for _, m := range s.Messages {
				o, ok := s.Unique[m.ID]
				if !ok {
					t.Fatalf("message %s is no event of the stream", m.ID)
				}
				got, err := Parse(m.Value)
				if err != nil || got.UserID != o.UserID || len(got.Items) != len(o.Items) {
					t.Fatalf("message %s = %s (%v), want %+v", m.ID, m.Value, err, o)
				}
			}
			again, _ := Generate(tc.events, tc.ratio, 7)
			for i := range s.Messages {
				if again.Messages[i].ID != s.Messages[i].ID {
					t.Fatalf("message %d differs between two runs with one seed", i)
				}
			}
		})
	}
	if _, err := Generate(-1, 0, 1); err == nil {
		t.Error("Generate(-1) returned no error")
	}
}
