package config_test

import (
	"fmt"

	"github.com/onceflow/onceflow/internal/config"
)

// The kgo options for a SASL_SSL cluster come from kafka.tls and
// kafka.sasl; every client of kafka.brokers takes them. The password is a
// Secret: printing the settings shows it redacted.
func ExampleKafka_ClientOptions() {
	k := config.Kafka{
		TLS:  config.KafkaTLS{Enabled: true}, // the system's roots; ca_file for a private CA
		SASL: config.KafkaSASL{Mechanism: config.SASLScramSHA512, Username: "onceflow", Password: "s3cret"},
	}
	opts, err := k.ClientOptions() // kgo.DialTLSConfig and kgo.SASL
	fmt.Println(len(opts), err)
	fmt.Printf("%+v\n", k.SASL)
	// Output:
	// 2 <nil>
	// {Mechanism:SCRAM-SHA-512 Username:onceflow Password:xxxxx PasswordFile:}
}
