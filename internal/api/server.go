package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Check is one readiness condition: Ready returns nil when it holds, else
// why not. It is called with a 2s deadline.
type Check struct {
	Name  string
	Ready func(context.Context) error
}

// PostgresCheck is ready when pool answers a ping.
func PostgresCheck(pool *pgxpool.Pool) Check {
	return Check{Name: "postgres", Ready: func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("postgres does not answer: %w", err)
		}
		return nil
	}}
}

// NewMux returns a mux serving /healthz (the process is up), /readyz (200
// when every check is ready, else 503 naming each check that is not, with
// its reason) and, when metrics is not nil, /metrics.
func NewMux(metrics http.Handler, checks ...Check) *http.ServeMux {
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		waiting := map[string]string{}
		for _, c := range checks {
			if err := c.Ready(ctx); err != nil {
				waiting[c.Name] = err.Error()
			}
		}
		if len(waiting) > 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "waiting_for": waiting})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return mux
}

// Server is an HTTP server started by Start. Its owner calls Stop on every
// path; Stop is safe to call once.
type Server struct {
	srv  *http.Server
	addr string
	errc chan error // Serve's result; buffered, read by Stop
}

// readTimeout bounds reading a request, its body included: a client that
// stalls mid-body (1 MiB at most) is cut off rather than held open for
// ever; idleTimeout, a kept-alive connection's wait for its next request.
var (
	readTimeout = 30 * time.Second
	idleTimeout = 2 * time.Minute
)

// Start listens on addr and serves h in a goroutine the Server owns until
// Stop. The error names addr when it cannot listen.
func Start(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http.addr %s: %w", addr, err)
	}
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: readTimeout, IdleTimeout: idleTimeout},
		addr: ln.Addr().String(), errc: make(chan error, 1)}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.errc <- err
	}()
	return s, nil
}

// Addr is the address the server listens on (the port chosen, for ":0").
func (s *Server) Addr() string { return s.addr }

// Stop shuts the server down, letting requests in flight finish until ctx
// ends, and returns once its goroutine has exited, with the error the
// server stopped on, if any.
func (s *Server) Stop(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	return errors.Join(<-s.errc, err)
}
