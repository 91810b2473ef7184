package bench_test

import (
	"fmt"

	"github.com/onceflow/onceflow/bench"
)

// A template's placeholders, replaced for each event; the same seed gives
// the same payloads.
func ExampleParseTemplate() {
	t, err := bench.ParseTemplate([]byte(`{"account": "acct-{{int 1 9}}", "amount": "{{decimal 1 99 2}}", "currency": "{{choice 'EUR' 'USD'}}", "n": "{{seq}}"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := bench.Generate(bench.FromTemplate(t), bench.GenerateConfig{Events: 3, Partitions: 1, Seed: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range s.Events {
		fmt.Println(string(e.Value))
	}
	_, err = bench.ParseTemplate([]byte("{\n  \"amount\": \"{{decimal 1 99}}\"\n}"))
	fmt.Println(err)
	// Output:
	// {"account": "acct-4", "amount": 83.23, "currency": "EUR", "n": 1}
	// {"account": "acct-1", "amount": 4.96, "currency": "EUR", "n": 2}
	// {"account": "acct-4", "amount": 13.33, "currency": "USD", "n": 3}
	// template line 2 column 14: decimal: takes 3 arguments ({{decimal MIN MAX SCALE}}), got 2
}
