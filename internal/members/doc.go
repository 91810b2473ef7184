// Package members owns the members of a consumer group that a program runs
// on purpose to show or measure the flow: the demo, the benchmark, the
// chaos tool and tests start, stop, crash and count members through it, so
// that the processor step (package processor) can be put through joins,
// leaves and crashes in one way.
//
// A [Group] starts members with a [Starter] and keeps them in start order.
// [InProcess] starts a processor.Consumer over a sink.Writer in this
// process; a Starter of OS processes (the onceflow binary, stopped with
// SIGTERM and crashed with SIGKILL) fits the same [Member] interface; a
// member that can also be frozen (SIGSTOP, SIGCONT) would offer that
// beside it, for the owner that needs it.
// Every member a Group started is stopped and waited for by [Group.StopAll],
// which its owner defers right after creating the Group, so no member
// outlives the pool or the schema it writes to.
//
// [Committed] reads from Postgres how far a group has committed.
package members
