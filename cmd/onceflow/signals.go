package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// abortOnSecondSignal calls abort (no commit, like a crash) if SIGINT or
// SIGTERM arrives again after ctx ended (the first signal ends ctx, in
// main). The returned stop ends the watch and returns once its goroutine
// has exited; call it on every path. It returns nil when no second signal
// aborted, else an exitError of 128 plus the signal's number, the status a
// shell gives a process a signal ended: a supervisor sees that in-flight
// batches were rolled back rather than drained.
func abortOnSecondSignal(ctx context.Context, log *slog.Logger, abort func()) (stop func() error) {
	done := make(chan struct{})
	exited := make(chan struct{})
	var aborted atomic.Int32 // the second signal's number, 0 if none
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sig)
		log.Info("stopping: draining (in-flight batches finish within drain_timeout); a second SIGTERM or SIGINT aborts")
		select {
		case s := <-sig:
			log.Warn("second signal: aborting without committing")
			n := int32(syscall.SIGTERM)
			if s, ok := s.(syscall.Signal); ok {
				n = int32(s)
			}
			aborted.Store(n)
			abort()
		case <-done:
		}
	}()
	return func() error {
		close(done)
		<-exited
		if n := aborted.Load(); n != 0 {
			return exitError(128 + n)
		}
		return nil
	}
}
