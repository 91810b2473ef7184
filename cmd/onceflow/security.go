package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/pipeline"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaOptions are the options of every Kafka client onceflow creates for
// kafka.brokers, whatever it does (consume, publish dead letters, relay the
// outbox, administer): kafka.tls and kafka.sasl, then tracing for clientID.
// The result is the caller's.
func (a *app) kafkaOptions(clientID string) []kgo.Opt {
	return append(slices.Clone(a.kafkaSecurity), a.kafkaTracing(clientID)...)
}

// whenKafka returns once brokers answer a ping over kafka.tls and
// kafka.sasl, waiting with capped backoff while they are down, and logging
// that it waits. What waiting cannot cure — an address where something
// other than Kafka answers (PostgreSQL, an HTTP server), SASL
// authentication refused, a mechanism the broker does not enable, a
// certificate not trusted, a handshake refused — is returned at once,
// naming kafka.brokers, the address and the keys to check; so is ctx's
// end.
//
// Each address is pinged on its own: franz-go's Ping stops at the first
// seed that answers, and a seed that is not Kafka must be found whichever
// place it has in the list. One address answering is enough to go on;
// the others may be down.
func (a *app) whenKafka(ctx context.Context, brokers []string) error {
	cls := make([]*kgo.Client, len(brokers))
	for i, addr := range brokers {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ClientID(a.cfg.Kafka.ClientID + "-check"),
			kgo.RequestRetries(0)}, a.kafkaSecurity...)...)
		if err != nil {
			return fmt.Errorf("kafka client: %w", err)
		}
		defer cl.Close()
		cls[i] = cl
	}
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		errs := make([]error, len(cls))
		var wg sync.WaitGroup
		for i, cl := range cls {
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				errs[i] = cl.Ping(pctx)
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		answered := false
		var down []string
		for i, err := range errs {
			if err == nil {
				answered = true
				continue
			}
			switch why := a.kafkaMisconfigured(err); {
			case strings.HasPrefix(why, whyNotKafka):
				return fmt.Errorf("kafka.brokers: %s: %s", brokers[i], why)
			case why != "":
				return fmt.Errorf("kafka brokers %v: %s", brokers, why)
			}
			down = append(down, brokers[i]+": "+a.redactKafka(err.Error()))
		}
		if answered {
			if attempt > 1 {
				a.log.Info("kafka brokers answer", "brokers", brokers)
			}
			return nil
		}
		a.log.Warn("waiting for the kafka brokers", "brokers", brokers, "attempt", attempt, "retry_in", backoff,
			"err", strings.Join(down, "; "))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// pingKafka pings the brokers once, within kafka.produce_timeout, for the
// one-shot commands: an error says what to check when it is a
// configuration error, or that the brokers do not answer.
func (a *app) pingKafka(ctx context.Context, cl *kgo.Client) error {
	pctx, cancel := context.WithTimeout(ctx, a.cfg.Kafka.ProduceTimeout)
	defer cancel()
	err := cl.Ping(pctx)
	switch {
	case err == nil:
		return nil
	case a.kafkaMisconfigured(err) != "":
		return fmt.Errorf("kafka brokers %v: %s", a.cfg.Kafka.Brokers, a.kafkaMisconfigured(err))
	}
	return fmt.Errorf("kafka brokers %v do not answer: %s", a.cfg.Kafka.Brokers, a.redactKafka(err.Error()))
}

// notKafka reports whether err, from a request to one address, says that
// the peer answered with bytes that are no Kafka response: a frame size
// no Kafka response has (PostgreSQL's "E", HTTP's "HTTP", SSH's banner),
// a response to another request, or one too short to be any. A broker
// that is down, restarting or slow closes or refuses the connection, or
// does not answer: those are not it. (A TLS alert is kafkaMisconfigured's
// own case, tried first.)
//
// franz-go's errors for these are not exported: they are told by their
// messages.
func notKafka(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "invalid large response size") || strings.Contains(msg, "invalid negative response size") ||
		strings.Contains(msg, "correlation ID mismatch") || errors.Is(err, kbin.ErrNotEnoughData)
}

// whyNotKafka is what kafkaMisconfigured says of a peer that is not Kafka.
const whyNotKafka = "what answers on this address does not speak the Kafka protocol " +
	"(another service's port, such as PostgreSQL or an HTTP server? check kafka.brokers)"

// kafkaMisconfigured says which settings to check when err is a
// configuration error that waiting does not cure, or "" when it may be.
func (a *app) kafkaMisconfigured(err error) string {
	var (
		remote *net.OpError // a TLS alert from the broker is a "remote error"
		record tls.RecordHeaderError
	)
	s := a.cfg.Kafka.SASL
	why := ""
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		why = fmt.Sprintf("SASL authentication failed for user %q with %s (check kafka.sasl.username and kafka.sasl.password)", s.Username, s.Mechanism)
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		why = fmt.Sprintf("SASL mechanism %s is not enabled on the broker (kafka.sasl.mechanism)", s.Mechanism)
	case certificateUntrusted(err):
		why = "TLS: the broker's certificate is not trusted (check kafka.tls.ca_file and kafka.tls.server_name)"
	case errors.As(err, &remote) && remote.Op == "remote error":
		why = "TLS: the broker refused the handshake (a client certificate it accepts: kafka.tls.cert_file and kafka.tls.key_file)"
	case errors.As(err, &record):
		why = "TLS: the broker does not speak TLS on this address (kafka.tls.enabled, kafka.brokers)"
	case strings.Contains(err.Error(), "plaintext connection speaking to a tls endpoint"):
		// franz-go read a TLS alert where a Kafka response should be. (Its
		// "is SASL missing?" is only a guess at a closed connection, which
		// a restarting broker also gives: that one is waited for.)
		why = "TLS: the broker speaks TLS on this address (kafka.tls.enabled)"
	case notKafka(err):
		why = whyNotKafka
	default:
		return ""
	}
	return why + ": " + a.redactKafka(err.Error())
}

// redactKafka removes the SASL password from msg, should a broker's message
// ever quote it.
func (a *app) redactKafka(msg string) string {
	if pw := a.cfg.Kafka.SASL.Password.Reveal(); pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return msg
}

// certificateUntrusted reports whether err is a server certificate that
// failed verification: an unknown CA, another host name, an expired or
// otherwise invalid certificate. Waiting does not cure it.
func certificateUntrusted(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// postgresTLSProblem says what to check when err is a TLS failure that
// waiting for Postgres does not cure, or "" when it is not one.
func postgresTLSProblem(err error) string {
	return strings.ReplaceAll(pipeline.TLSProblem(err), "the DSN", "postgres.dsn")
}
