package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// DataError is a value that cannot be decoded whatever the registry does
// next: it is not framed, names a schema id the registry does not know,
// or its body does not match its schema. SchemaID is 0 when the value
// names none; Subject is empty when the registry named none.
type DataError struct {
	SchemaID int
	Subject  string
	Reason   string

	named bool // the value names SchemaID even though it is 0
}

func (e *DataError) Error() string {
	switch {
	case e.SchemaID == 0 && !e.named:
		return e.Reason
	case e.Subject == "":
		return fmt.Sprintf("schema id %d: %s", e.SchemaID, e.Reason)
	default:
		return fmt.Sprintf("schema id %d (subject %s): %s", e.SchemaID, e.Subject, e.Reason)
	}
}

// tlsError is the registry's TLS handshake failing on the client's side
// of the configuration: a certificate the client does not trust, or a
// name it does not carry, or an https URL of a server that speaks plain
// HTTP. No retry fixes it; it is neither transient nor auth.
type tlsError struct{ err error }

func (e *tlsError) Error() string {
	return fmt.Sprintf("schema registry's TLS: %v (check the URL's scheme and decode.schema_registry.tls)", e.err)
}

func (e *tlsError) Unwrap() error { return e.err }

// isTLSConfig reports whether err is a TLS handshake failing for the
// client's configuration rather than the network.
func isTLSConfig(err error) bool {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
		header  tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.As(err, &host) || errors.As(err, &header) ||
		// net/http replaces the tls.RecordHeaderError of a plain HTTP
		// answer by an error of text alone.
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

// registryError is the registry failing to answer, or refusing to.
type registryError struct {
	status int // HTTP status; 0 when there was no answer
	err    error
}

func (e *registryError) Error() string {
	switch {
	case e.status == http.StatusUnauthorized || e.status == http.StatusForbidden:
		return fmt.Sprintf("schema registry refused the credentials (HTTP %d): %v", e.status, e.err)
	case e.status != 0:
		return fmt.Sprintf("schema registry answered HTTP %d: %v", e.status, e.err)
	default:
		return fmt.Sprintf("schema registry unreachable: %v", e.err)
	}
}

func (e *registryError) Unwrap() error { return e.err }

// IsTransient reports whether err is the registry being unreachable or
// failing for now (no answer, a timeout, 5xx, 429, or any other answer
// that is not about the value): retry later. A TLS handshake that fails
// on the client's configuration (a certificate it does not trust, a name
// the certificate does not carry, an https URL of a plain HTTP server) is
// not transient: Decoder.Check returns it to fail the start. A registry that is down never
// makes a record a dead letter.
func IsTransient(err error) bool {
	var re *registryError
	return errors.As(err, &re) && !IsAuth(err)
}

// IsAuth reports whether err is the registry refusing the credentials
// (HTTP 401 or 403): configuration, which no retry fixes.
func IsAuth(err error) bool {
	var re *registryError
	return errors.As(err, &re) && (re.status == http.StatusUnauthorized || re.status == http.StatusForbidden)
}

// codeSchemaNotFound is the error_code of Confluent's API (Apicurio's
// ccompat too) for a schema id it does not know.
const codeSchemaNotFound = 40403

// classify turns an error of the sr client asking for a schema (byID: by
// the value's schema id, id) into a *DataError (the id is unknown), or a
// registryError. A 404 about an id is the id being unknown when its
// error_code says so (40403), or when the registry answered this Decoder
// before (answered: the API is at this URL) and the 404 is the API's own
// JSON error (Apicurio answers error_code 0 for some ids). A 404 of any
// other shape (a proxy's page, a path that is not the API's) is never a
// reason to dead-letter: Check reports a wrong path at start.
func classify(err error, byID bool, id int, answered bool) error {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		if byID && re.StatusCode == http.StatusNotFound &&
			(re.ErrorCode == codeSchemaNotFound || (answered && re.Message != "")) {
			return &DataError{SchemaID: id, Reason: "the schema registry does not know this schema id"}
		}
		return &registryError{status: re.StatusCode, err: err}
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if isTLSConfig(err) {
		return &tlsError{err}
	}
	return &registryError{err: err}
}
