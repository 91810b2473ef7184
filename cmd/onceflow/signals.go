package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// abortOnSecondSignal calls abort (no commit, like a crash) if SIGINT or
// SIGTERM arrives again after ctx ended (the first signal ends ctx, in
// main). The returned stop ends the watch and returns once its goroutine
// has exited; call it on every path.
func abortOnSecondSignal(ctx context.Context, log *slog.Logger, abort func()) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
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
		case <-sig:
			log.Warn("second signal: aborting without committing")
			abort()
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
