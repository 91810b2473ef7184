package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/sync/singleflight"
)

// Kind is the encoding of the values a Decoder reads.
type Kind string

const (
	// Avro values are Avro binary encodings of the writer schema.
	Avro Kind = "avro"
	// Protobuf values start with the message-index array, then the
	// message's binary encoding.
	Protobuf Kind = "protobuf"
)

// Config says how to reach the registry. Zero values take the defaults
// noted.
type Config struct {
	// URL is the registry's base URL, the one under which /schemas/ids/{id}
	// answers (Confluent: http://host:8081; Apicurio:
	// http://host:8080/apis/ccompat/v7). Required: http or https.
	URL string
	// Username and Password are sent as HTTP basic auth when Username is
	// set.
	Username string
	Password string
	// TLS configures https URLs; nil means the system's roots.
	TLS *tls.Config
	// Timeout bounds one request to the registry; default 10s.
	Timeout time.Duration
	// CacheSize is how many compiled schemas are kept, least recently
	// used dropped first; default 1000.
	CacheSize int
}

// Defaults of Config.
const (
	DefaultTimeout   = 10 * time.Second
	DefaultCacheSize = 1000
)

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	return c
}

// Validate returns every problem with c (after defaults), each naming its
// field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var ps []error
	bad := func(format string, args ...any) { ps = append(ps, fmt.Errorf("registry: "+format, args...)) }
	if c.URL == "" {
		bad("URL is required")
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("URL %q is not an http or https URL", c.URL)
	}
	if c.Password != "" && c.Username == "" {
		bad("Password is set but Username is empty")
	}
	if c.Timeout < 0 {
		bad("Timeout %s is negative", c.Timeout)
	}
	if c.CacheSize < 0 {
		bad("CacheSize %d is negative", c.CacheSize)
	}
	return errors.Join(ps...)
}

// Decoder reads framed values into JSON. It is safe for concurrent use:
// one Decoder serves every partition, and a schema is fetched once however
// many workers ask for it at the same time. Its only goroutines are the
// HTTP connections it keeps alive to the registry between requests (each
// closed after 90s idle); its owner calls Close when done to close them
// at once.
type Decoder struct {
	cl      *sr.Client
	tr      *http.Transport
	url     string
	timeout time.Duration
	cache   *lru.Cache[int, *schema]
	fetches singleflight.Group
	// answered is set once the registry answered a request as the API
	// does: from then on a 404 about a schema id is the id being unknown.
	answered atomic.Bool
}

// New validates cfg and returns a Decoder. It does not contact the
// registry: Check does.
func New(cfg Config) (*Decoder, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: cfg.TLS, ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: cfg.Timeout}
	hc := &http.Client{Timeout: cfg.Timeout, Transport: tr}
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.HTTPClient(hc), sr.UserAgent("onceflow")}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	cache, err := lru.New[int, *schema](cfg.CacheSize)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return &Decoder{cl: cl, tr: tr, url: cfg.URL, timeout: cfg.Timeout, cache: cache}, nil
}

// Close closes the idle connections to the registry. The Decoder still
// works after it, opening new ones.
func (d *Decoder) Close() { d.tr.CloseIdleConnections() }

// Check asks the registry for its subjects once: nil when it answers; an
// error for which IsAuth holds when it refuses the credentials; an
// IsTransient one when it cannot be reached or fails for now; any other
// error when the URL answers but not as a schema registry (HTTP 404: a
// wrong path). Run it at start to fail fast on configuration.
func (d *Decoder) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	_, err := d.cl.Subjects(ctx)
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return fmt.Errorf("registry: %s does not serve the schema registry API (GET /subjects answered HTTP 404)", d.url)
	}
	if err != nil {
		return classify(err, false, 0, false)
	}
	d.answered.Store(true)
	return nil
}

// Decode reads value, framed in the Confluent wire format, as kind says,
// and returns it as JSON that Postgres can store as jsonb (valid UTF-8, no
// \u0000), with the schema id it names. Errors: *DataError for the value
// itself (the same value always fails); IsTransient and IsAuth errors for
// the registry; a TLS handshake failing on the client's configuration
// (neither, and no reason to dead-letter either: Check reports it at
// start); ctx's error when ctx ends first.
func (d *Decoder) Decode(ctx context.Context, kind Kind, value []byte) ([]byte, error) {
	var h sr.ConfluentHeader
	id, body, err := h.DecodeID(value)
	if err != nil {
		return nil, &DataError{Reason: notFramed(value)}
	}
	if id <= 0 || id > math.MaxInt32 {
		// Registries assign ids from 1 up to 2^31-1 (Confluent's clients
		// read the 4 bytes as a signed int32): no request can find it.
		return nil, &DataError{SchemaID: id, named: true, Reason: fmt.Sprintf(
			"no schema registry assigns this schema id (ids are 1 to %d; Confluent's clients read it as %d)", math.MaxInt32, int32(uint32(id)))}
	}
	s, err := d.schema(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.broken != "" {
		return nil, s.dataError("%s", s.broken)
	}
	if s.kind != kind {
		return nil, s.dataError("the schema is %s, not %s", s.typ, kind)
	}
	switch kind {
	case Avro:
		return s.decodeAvro(body)
	case Protobuf:
		index, rest, err := h.DecodeIndex(body, maxIndexDepth)
		if err != nil {
			return nil, s.dataError("the message-index array is corrupt: %v", err)
		}
		return s.decodeProtobuf(index, rest)
	}
	return nil, fmt.Errorf("registry: unknown kind %q", kind)
}

// maxIndexDepth bounds the Protobuf message-index array: how deep a
// message may be nested in its .proto.
const maxIndexDepth = 64

func notFramed(v []byte) string {
	switch {
	case len(v) == 0:
		return "value is empty, not framed for a schema registry"
	case v[0] != 0:
		return fmt.Sprintf("value is not framed for a schema registry: its first byte is 0x%02x, not the magic byte 0", v[0])
	default:
		return fmt.Sprintf("value is not framed for a schema registry: %d bytes, too short for the magic byte and a 4-byte schema id", len(v))
	}
}

// schema returns the compiled schema of id, from the cache or the
// registry.
func (d *Decoder) schema(ctx context.Context, id int) (*schema, error) {
	if s, ok := d.cache.Get(id); ok {
		return s, nil
	}
	v, err, _ := d.fetches.Do(strconv.Itoa(id), func() (any, error) {
		if s, ok := d.cache.Get(id); ok {
			return s, nil
		}
		s, err := d.fetch(ctx, id)
		if err != nil {
			return nil, err
		}
		d.cache.Add(id, s)
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*schema), nil
}

// fetch asks the registry for schema id, its references and its subject,
// each request bounded by the timeout, and compiles it.
func (d *Decoder) fetch(ctx context.Context, id int) (*schema, error) {
	call := func(f func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, d.timeout)
		defer cancel()
		return f(ctx)
	}
	var text sr.Schema
	if err := call(func(ctx context.Context) (err error) { text, err = d.cl.SchemaByID(ctx, id); return err }); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, classify(err, true, id, d.answered.Load())
	}
	d.answered.Store(true)
	s := &schema{id: id, typ: text.Type}
	// The subject only names the schema in dead letters: a registry that
	// cannot say is no reason to fail.
	var uses []sr.SubjectSchema
	if call(func(ctx context.Context) (err error) { uses, err = d.cl.SchemaUsagesByID(ctx, id); return err }) == nil && len(uses) > 0 {
		s.subject = uses[0].Subject
	}
	var refs []reference
	if err := d.references(ctx, call, text.References, &refs, map[string]bool{}, 0); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var de *DataError
		if errors.As(err, &de) {
			return nil, s.dataError("%s", de.Reason)
		}
		return nil, err
	}
	if err := s.compile(text.Schema, refs); err != nil {
		// Kept like a good one: every record of this id fails alike,
		// without asking the registry again.
		s.broken = fmt.Sprintf("the registry's schema does not compile: %v", err)
	}
	return s, nil
}

// maxReferenceDepth bounds how deep schema references nest.
const maxReferenceDepth = 32

// reference is a schema another one refers to by name: for Protobuf the
// import path, for Avro the full name of a type.
type reference struct{ name, text string }

// references fetches refs and theirs into out, each after those it refers
// to.
func (d *Decoder) references(ctx context.Context, call func(func(context.Context) error) error, refs []sr.SchemaReference, out *[]reference, seen map[string]bool, depth int) error {
	if depth > maxReferenceDepth {
		return &DataError{Reason: fmt.Sprintf("schema references nest deeper than %d", maxReferenceDepth)}
	}
	for _, r := range refs {
		if seen[r.Name] {
			continue
		}
		seen[r.Name] = true
		var ss sr.SubjectSchema
		if err := call(func(ctx context.Context) (err error) {
			ss, err = d.cl.SchemaByVersion(ctx, r.Subject, r.Version)
			return err
		}); err != nil {
			var re *sr.ResponseError
			if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
				return &DataError{Reason: fmt.Sprintf("reference %q (subject %s version %d) is not known to the registry", r.Name, r.Subject, r.Version)}
			}
			return classify(err, false, 0, false)
		}
		if err := d.references(ctx, call, ss.References, out, seen, depth+1); err != nil {
			return err
		}
		*out = append(*out, reference{name: r.Name, text: ss.Schema.Schema})
	}
	return nil
}
