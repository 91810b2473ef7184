package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// profile is what one run measures besides its rate: with -spans, span
// durations, the CPU split and the WAL written; with -cpuprofile (the
// scenario -cpuprofile-of names), this process's CPU profile. Its owner calls done
// once the members are stopped, and stop on every path.
type profile struct {
	b       *bench
	e       *env
	cpuFile *os.File // the running CPU profile, nil when none
	cpu     cpuSnap
	wal     WAL
	cps     int64 // checkpoints begun before the run
	fromCP  bool  // the run began right after a CHECKPOINT
	on      bool  // -spans
	mem     bool  // -memprofile's base is written: stop writes the profile
}

// writeAllocs writes the allocations of this process so far (-memprofile).
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-memprofile: %w", err)
	}
	runtime.GC() // the profile is as of the last collection
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("-memprofile: %w", err)
	}
	return f.Close()
}

// startProfile starts measuring a run on e; cpu says whether this run
// is the one -cpuprofile profiles.
func (b *bench) startProfile(ctx context.Context, e *env, cpu bool) (*profile, error) {
	p := &profile{b: b, e: e, on: b.spans != nil}
	var err error
	if p.cps, err = checkpoints(ctx, e.probe); err != nil {
		return nil, err
	}
	if !b.noCheckpoint {
		ok, err := checkpoint(ctx, e.probe)
		if err != nil {
			return nil, err
		}
		if !ok {
			b.noCheckpoint = true
			progress("runs start wherever the server's checkpoint cycle is: the role may not CHECKPOINT " +
				"(GRANT pg_checkpoint TO it, as infra/postgres.sh does); a checkpoint during a run slows its writes after it")
		}
		p.fromCP = ok
		if ok {
			if p.cps, err = checkpointCounted(ctx, e.probe, p.cps); err != nil {
				return nil, err
			}
		}
	}
	if p.on {
		b.spans.take() // migrations and anything before the members start
		pids, pm, err := runBackends(ctx, e.pool, e.app)
		if err != nil {
			return nil, err
		}
		if p.wal, err = readWAL(ctx, e.pool); err != nil {
			return nil, err
		}
		p.cpu = snapCPU(pids, pm, b.o.brokerPID)
	}
	if cpu {
		if err := p.startCPU(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// startCPU starts the profiles of the profiled part of a run: the CPU
// profile into -cpuprofile, and -memprofile's base (stop writes the
// allocations since), each if set.
func (p *profile) startCPU() error {
	if p.b.o.memprofile != "" && !p.mem {
		if err := writeAllocs(p.b.o.memprofile + ".base"); err != nil {
			return err
		}
		p.mem = true
	}
	if p.b.o.cpuprofile == "" || p.cpuFile != nil {
		return nil
	}
	f, err := os.Create(p.b.o.cpuprofile)
	if err != nil {
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	p.cpuFile = f
	return nil
}

// done ends the measurements into r.
func (p *profile) done(ctx context.Context, r *Run) error {
	if err := p.stop(); err != nil {
		return err
	}
	cps, err := checkpoints(ctx, p.e.probe)
	if err != nil {
		return err
	}
	cps -= p.cps
	r.FromCheckpoint, r.Checkpoints = p.fromCP, &cps
	if !p.on {
		return nil
	}
	pids, pm, err := runBackends(ctx, p.e.pool, p.e.app)
	if err != nil {
		return err
	}
	end := snapCPU(pids, pm, p.b.o.brokerPID)
	for pid := range end.backends { // backends opened during the run count whole
		if _, ok := p.cpu.backends[pid]; !ok {
			p.cpu.backends[pid] = 0
		}
	}
	r.CPU = cpuSplit(p.cpu, end)
	w, err := readWAL(ctx, p.e.pool)
	if err != nil {
		return err
	}
	r.WAL = &WAL{Records: w.Records - p.wal.Records, FPI: w.FPI - p.wal.FPI, Bytes: w.Bytes - p.wal.Bytes}
	r.SpanStats = p.b.spans.take()
	return nil
}

// stop ends the profiles startCPU started, if any.
func (p *profile) stop() error {
	if p.mem {
		p.mem = false
		if err := writeAllocs(p.b.o.memprofile); err != nil {
			return err
		}
	}
	if p.cpuFile == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.cpuFile.Close()
	p.cpuFile = nil
	if err != nil {
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	progress("wrote the CPU profile of %s to %s", p.b.o.cpuprofOf, p.b.o.cpuprofile)
	return nil
}
