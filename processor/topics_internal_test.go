package processor

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// franz-go says, in kgoTopicRecreated's words, when a topic its client
// consumes is deleted and created again under the same name, and
// kgoLogger tells the Consumer which topic: the Consumer re-adds it then,
// without waiting for the fetches' errors. Should franz-go word it
// otherwise, this fails.
func TestRecreatedTopicSaidByTheClient(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const topic = "orders"
	admin, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	create := func() {
		t.Helper()
		for {
			resp, err := adm.CreateTopic(ctx, 2, 1, nil, topic)
			if err == nil && resp.Err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("create %s: %v %v", topic, err, resp.Err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	create()
	if err := admin.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	said := make(chan string, 8)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(200*time.Millisecond),
		kgo.WithLogger(kgoLogger{log: slog.New(slog.DiscardHandler), seen: &repeats{}, recreated: func(topic string) { said <- topic }}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if fs := cl.PollFetches(ctx); fs.NumRecords() != 1 {
		t.Fatalf("consumed %d records before the topic was recreated, want 1 (%v)", fs.NumRecords(), fs.Errors())
	}
	// Polls go on: the client refreshes its metadata meanwhile.
	pctx, stopPolls := context.WithCancel(ctx)
	defer stopPolls()
	go func() {
		for pctx.Err() == nil {
			cl.PollFetches(pctx)
		}
	}()

	if resp, err := adm.DeleteTopics(ctx, topic); err != nil || resp.Error() != nil {
		t.Fatalf("delete %s: %v %v", topic, err, resp.Error())
	}
	create()
	select {
	case got := <-said:
		if got != topic {
			t.Errorf("said recreated: %q, want %q", got, topic)
		}
	case <-ctx.Done():
		t.Fatal("franz-go said nothing kgoLogger took for a recreated topic within 60s")
	}
}

// A topic whose fetches fail with UNKNOWN_TOPIC_ID is re-added at most
// once per readdEvery; one the client said it saw recreated is re-added
// at once, even just after a re-add (a topic recreated twice in a few
// seconds), and is then no longer pending.
func TestReaddRecreatedAtOnce(t *testing.T) {
	cl := fakeClient(t, []kfake.Opt{kfake.SeedTopics(1, "orders")}, kgo.ConsumeTopics("orders"))
	c := &Consumer{cfg: Config{Topics: []string{"orders"}}, log: slog.New(slog.DiscardHandler),
		parts: map[tp]*partition{}, topicIDs: map[string]uuid.NullUUID{}}
	just := time.Now().Add(-time.Second) // re-added a second ago
	readdedAt := map[string]time.Time{"orders": just}

	c.readd(cl, []string{"orders"}, c.recreatedTopics(), readdedAt)
	if !readdedAt["orders"].Equal(just) {
		t.Errorf("fetch errors a second after a re-add re-added the topic again")
	}
	c.noteRecreated("orders")
	c.noteRecreated("other") // not consumed: not noted
	if got := c.recreatedTopics(); len(got) != 1 || got[0] != "orders" {
		t.Fatalf("pending after the client's line: %v, want [orders]", got)
	}
	c.readd(cl, nil, c.recreatedTopics(), readdedAt)
	if readdedAt["orders"].Equal(just) {
		t.Errorf("the client's line a second after a re-add did not re-add the topic")
	}
	if got := c.recreatedTopics(); len(got) != 0 {
		t.Errorf("pending after the re-add: %v, want none", got)
	}
}

// A consumed topic is said missing once two looks in a row find it so:
// one look that misses it (metadata just after it was created again) says
// nothing, neither that it is missing nor that it exists now.
func TestTopicSaidMissingAtTheSecondLook(t *testing.T) {
	cl := fakeClient(t, nil, kgo.MetadataMinAge(10*time.Millisecond))
	var buf bytes.Buffer
	c := &Consumer{cfg: Config{Topics: []string{"orders"}, CallTimeout: 10 * time.Second}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	state := map[string]topicState{}
	look := func() {
		time.Sleep(lookFresh + 20*time.Millisecond) // past the freshness a look asks for
		c.checkTopics(t.Context(), cl, state)
	}
	said := func(s string) int { return strings.Count(buf.String(), s) }

	look() // missing once
	if n := said("does not exist"); n != 0 {
		t.Fatalf("said missing after one look: %s", buf.String())
	}
	if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	look()
	if buf.Len() != 0 {
		t.Fatalf("a topic missing at one look only, then there: said %s", buf.String())
	}
	if _, err := kadm.NewClient(cl).DeleteTopics(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	look()
	look()
	look()
	if n := said("does not exist"); n != 1 {
		t.Fatalf("missing at three looks: said so %d times, want 1: %s", n, buf.String())
	}
	if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	look()
	if n := said("exists now"); n != 1 {
		t.Errorf("created after it was said missing: said it exists %d times, want 1: %s", n, buf.String())
	}
}

// Each look at the topics asks the brokers, whatever the client's
// metadata min age (5 s by default): a topic created again between two
// looks is seen at the second, not said missing from the first look's
// cached answer.
func TestTopicLookIsFresh(t *testing.T) {
	cl := fakeClient(t, nil) // the default min age
	var buf bytes.Buffer
	c := &Consumer{cfg: Config{Topics: []string{"orders"}, CallTimeout: 10 * time.Second}, log: slog.New(slog.NewTextHandler(&buf, nil)),
		topicIDs: map[string]uuid.NullUUID{}}
	state := map[string]topicState{}
	c.checkTopics(t.Context(), cl, state) // missing once
	if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lookFresh + 100*time.Millisecond) // the next look, seconds later
	c.checkTopics(t.Context(), cl, state)
	if buf.Len() != 0 {
		t.Fatalf("a topic created between two looks: said %s", buf.String())
	}
}

// A look at the topics that finds a consumed topic under another id than
// the one the member took its partitions under notes it recreated, to be
// re-added (a member whose partitions are all paused fetches nothing, and
// its client learns of the new id only at its next metadata refresh); the
// same id, or none held (not assigned, or re-added already), notes
// nothing.
func TestTopicLookNotesANewID(t *testing.T) {
	cl := fakeClient(t, []kfake.Opt{kfake.SeedTopics(1, "orders")})
	current := uuid.NullUUID{UUID: uuid.UUID(topicIDOf(t, cl, "orders")), Valid: true}
	for _, tc := range []struct {
		name string
		held uuid.NullUUID
		want []string
	}{
		{"another id", uuid.NullUUID{UUID: uuid.New(), Valid: true}, []string{"orders"}},
		{"the same id", current, nil},
		{"none held", uuid.NullUUID{}, nil},
	} {
		c := &Consumer{cfg: Config{Topics: []string{"orders"}, CallTimeout: 10 * time.Second}, log: slog.New(slog.DiscardHandler),
			topicIDs: map[string]uuid.NullUUID{}}
		if tc.held.Valid {
			c.topicIDs["orders"] = tc.held
		}
		c.checkTopics(t.Context(), cl, map[string]topicState{})
		if got := c.recreatedTopics(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: noted recreated %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A look that finds a consumed topic with another partition count or id
// than the last look asks for the client's metadata to be read again:
// partitions added (said), the topic recreated, and recreated and grown
// between two looks (the client may have learned the new topic before
// partitions were added to it, and its group's leader would see them only
// at its own refresh, minutes later). The same topic, or a first look,
// asks nothing.
func TestTopicLookAsksForARefresh(t *testing.T) {
	cl := fakeClient(t, []kfake.Opt{kfake.SeedTopics(2, "orders")})
	id := topicIDOf(t, cl, "orders")
	for _, tc := range []struct {
		name    string
		last    topicState
		refresh bool
		said    string
	}{
		{"first look", topicState{}, false, ""},
		{"unchanged", topicState{partitions: 2, id: id}, false, ""},
		{"partitions added", topicState{partitions: 1, id: id}, true, "partitions added"},
		{"recreated", topicState{partitions: 2, id: [16]byte{1}}, true, ""},
		{"recreated and grown", topicState{partitions: 1, id: [16]byte{1}}, true, ""},
	} {
		var buf bytes.Buffer
		c := &Consumer{cfg: Config{Topics: []string{"orders"}, CallTimeout: 10 * time.Second}, log: slog.New(slog.NewTextHandler(&buf, nil)),
			topicIDs: map[string]uuid.NullUUID{}}
		state := map[string]topicState{"orders": tc.last}
		if got := c.checkTopics(t.Context(), cl, state); got != tc.refresh {
			t.Errorf("%s: refresh %v, want %v", tc.name, got, tc.refresh)
		}
		if st := state["orders"]; st.partitions != 2 || st.id != id {
			t.Errorf("%s: state after the look %+v, want 2 partitions under %x", tc.name, st, id)
		}
		if tc.said != "" && !strings.Contains(buf.String(), tc.said) || tc.said == "" && strings.Contains(buf.String(), "partitions added") {
			t.Errorf("%s: logged %q, want %q", tc.name, buf.String(), tc.said)
		}
	}
}

// fakeClient starts a one-broker kfake cluster with opts and returns a
// client of it with copts; both end with the test.
func fakeClient(t *testing.T, opts []kfake.Opt, copts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, copts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// topicIDOf returns topic's Kafka topic id.
func topicIDOf(t *testing.T, cl *kgo.Client, topic string) [16]byte {
	t.Helper()
	details, err := kadm.NewClient(cl).ListTopics(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return [16]byte(details[topic].ID)
}
