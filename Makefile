# onceflow — the targets people expect. `make help` lists them.
SHELL := /bin/bash
GO    ?= go
PKGS  := ./...

export ONCEFLOW_TEST_POSTGRES_DSN ?= $(shell infra/postgres.sh dsn)

.PHONY: help build demo test test-kfake check-rules lint fuzz bench bench-full bench-formats bench-protocols bench-retention bench-backlog bench-sustained chaos chaos-long up down up-postgres up-kafka up-jaeger up-kafka-secure up-postgres-tls up-schema-registry

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build bin/onceflow
	$(GO) build -o bin/onceflow ./cmd/onceflow

demo: up-postgres ## run the demo on the embedded Kafka and the local Postgres
	$(GO) run ./cmd/onceflow demo $(ARGS)

test: up-postgres up-kafka up-jaeger up-kafka-secure up-postgres-tls up-schema-registry ## the whole suite, race detector on: real Postgres (also over TLS), kfake and real Kafka (also over SASL_SSL), real Jaeger, srfake and a real schema registry, promtool on the alert rules
	ONCEFLOW_TEST_PROMTOOL=$$(infra/promtool.sh build) && export ONCEFLOW_TEST_PROMTOOL && \
	ONCEFLOW_TEST_KAFKA_BROKERS=$$(infra/kafka.sh brokers) ONCEFLOW_TEST_SCHEMA_REGISTRY=$$(infra/schema-registry.sh url) \
	ONCEFLOW_TEST_KAFKA_SECURE=$$(infra/kafka-secure.sh client) ONCEFLOW_TEST_POSTGRES_TLS_DSN="$$(infra/postgres-tls.sh dsn)" \
	ONCEFLOW_TEST_JAEGER_QUERY=http://127.0.0.1:16686 ONCEFLOW_TEST_JAEGER_OTLP=http://127.0.0.1:4318 \
	infra/gotest.sh -race -shuffle=on -count=1 -timeout 20m $(PKGS)

test-kfake: up-postgres ## the suite on kfake only (no Java, no Jaeger build)
	ONCEFLOW_TEST_KFAKE_ONLY=1 infra/gotest.sh -race -shuffle=on -count=1 -timeout 20m $(PKGS)

lint: ## go vet and gofmt
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The scenario benchmark is onceflow bench on the demo's configs (benchmarks/demo.yaml: emailHandler;
# benchmarks/demo-4handlers.yaml: the four) over the seed's orders; the DSN comes from the environment,
# so that results.md never quotes it.
BENCH := ONCEFLOW_POSTGRES_DSN="$(ONCEFLOW_TEST_POSTGRES_DSN)" bin/onceflow bench --sample benchmarks/orders.jsonl

bench: up-postgres build ## the scenario benchmark, short (under 2 minutes): onceflow bench on the demo's config, benchmarks/out/; then the retention experiment and the dedup micro-benchmarks
	$(BENCH) --config benchmarks/demo.yaml --events 60000 --partitions 6 --storm-changes 10 --out benchmarks/out $(ARGS)
	$(GO) run ./benchmarks retention -dsn "$(ONCEFLOW_TEST_POSTGRES_DSN)" -horizon 2s -duration 10s
	$(GO) test ./dedup -run '^$$' -bench . -benchtime 2s

bench-full: up-postgres up-kafka build ## the README's figures: onceflow bench on the demo's configs, 1 M events, five rounds, a CHECKPOINT before each run — emailHandler on kfake and on Kafka, the four handlers on kfake (about 30 minutes): benchmarks/results/demo*
	$(BENCH) --config benchmarks/demo.yaml --events 1000000 --rounds 5 --checkpoint --out benchmarks/results/demo $(ARGS)
	$(BENCH) --config benchmarks/demo.yaml --brokers=$$(infra/kafka.sh brokers) --events 1000000 --rounds 5 --checkpoint --out benchmarks/results/demo-kafka $(ARGS)
	$(BENCH) --config benchmarks/demo-4handlers.yaml --events 1000000 --rounds 5 --checkpoint --out benchmarks/results/demo-4handlers $(ARGS)

bench-formats: up-postgres up-schema-registry build ## Avro and Protobuf against JSON (the seed's orders framed for the schema registry), steady, five rounds: benchmarks/results/demo-formats
	$(BENCH) --config benchmarks/demo.yaml --formats avro,protobuf --schema-registry $$(infra/schema-registry.sh url) --avro-schema benchmarks/order.avsc --protobuf-schema benchmarks/order.proto \
		--scenarios steady --no-raw-copy --events 1000000 --rounds 5 --checkpoint --out benchmarks/results/demo-formats $(ARGS)

bench-protocols: up-postgres up-kafka build ## the group protocols side by side on Kafka (classic, consumer), 1 M events, five rounds, a storm of 12 changes a second apart: members that come and go (kills), then static members (restarts) — about 25 minutes: benchmarks/results/demo-protocols{,-static}
	$(BENCH) --config benchmarks/demo.yaml --brokers=$$(infra/kafka.sh brokers) --group-protocol classic,consumer \
		--scenarios steady,storm,replay --no-raw-copy --events 1000000 --storm-changes 12 --storm-every 1s --rounds 5 --checkpoint --out benchmarks/results/demo-protocols $(ARGS)
	$(BENCH) --config benchmarks/demo.yaml --brokers=$$(infra/kafka.sh brokers) --group-protocol classic,consumer --instance-id \
		--scenarios steady,storm,replay --no-raw-copy --events 1000000 --storm-changes 12 --storm-every 1s --rounds 5 --checkpoint --out benchmarks/results/demo-protocols-static $(ARGS)

bench-retention: up-postgres ## processed_events size under steady load at a 20s horizon, 3 minutes: benchmarks/results/retention
	$(GO) run ./benchmarks retention -dsn "$(ONCEFLOW_TEST_POSTGRES_DSN)" -out benchmarks/results/retention $(ARGS)

bench-backlog: up-postgres up-kafka ## peak RSS of one onceflow run draining a 5M-record backlog from the real Kafka: benchmarks/out/backlog-rss
	$(GO) run ./benchmarks backlog -brokers $$(infra/kafka.sh brokers) -dsn "$(ONCEFLOW_TEST_POSTGRES_DSN)" \
		-records 5000000 -raw-copy=false -out benchmarks/out/backlog-rss $(ARGS)

PREFILL ?= 10000000
RECORDS ?= 6000000
# The sustained runs use infra/postgres-bench.sh's cluster (shared_buffers 6GB, checkpoints
# 15 min apart: the settings the README's figures assume); SUSTAINED_DSN=... measures another.
SUSTAINED_DSN ?= $$(infra/postgres-bench.sh start)
bench-sustained: up-kafka ## rate against dedup table size on PREFILL (10M) pre-filled rows, RECORDS (6M: past the first minute after the pre-fill's checkpoint) records: benchmarks/out/sustained-PREFILL
	$(GO) run ./benchmarks backlog -brokers $$(infra/kafka.sh brokers) -dsn "$(SUSTAINED_DSN)" \
		-prefill $(PREFILL) -records $(RECORDS) -raw-events 1500000 -out benchmarks/out/sustained-$(PREFILL) $(ARGS)

chaos: ## the guarantee under faults, short mode (under 4 minutes): own Kafka and Postgres (and schema registry: JSON, Avro or Protobuf by the seed); ARGS="-seed N" replays
	$(GO) run ./chaos -short $(ARGS)

chaos-long: ## the guarantee under faults, long mode: 30 minutes of faults, at least 250 SIGKILLs
	$(GO) run ./chaos -duration 30m -min-kills 250 $(ARGS)

check-rules: ## promtool check rules and test rules over deploy/prometheus (promtool built once, pinned, into ~/.cache/onceflow)
	infra/promtool.sh check

fuzz: ## fuzz the record decoders for 30s each (JSON and headers; Avro and Protobuf bodies)
	$(GO) test ./processor -run '^$$' -fuzz FuzzDecode -fuzztime 30s
	$(GO) test ./registry -run '^$$' -fuzz FuzzDecodeAvro -fuzztime 30s
	$(GO) test ./registry -run '^$$' -fuzz FuzzDecodeProtobuf -fuzztime 30s
	$(GO) test ./registry -run '^$$' -fuzz FuzzProtobufFastPath -fuzztime 30s

up: up-postgres up-kafka ## start Postgres and Kafka on this machine
up-postgres:
	@infra/postgres.sh start >/dev/null
up-kafka:
	@infra/kafka.sh start >/dev/null
up-kafka-secure: ## start the SASL_SSL Kafka (generated CA, SCRAM users) on 127.0.0.1:19094
	@infra/kafka-secure.sh start >/dev/null
up-postgres-tls: ## start the Postgres cluster that takes only TLS (15 tls, port 5452)
	@infra/postgres-tls.sh start >/dev/null
up-jaeger: ## build (first time) and start Jaeger v2 on 127.0.0.1
	@infra/jaeger.sh start >/dev/null
up-schema-registry: ## build (first time, from Maven Central) and start Apicurio Registry, Confluent API, on 127.0.0.1:18081
	@infra/schema-registry.sh start >/dev/null

down: ## stop Kafka, Jaeger and the schema registry (Postgres is the machine's; infra/postgres.sh stop)
	-@infra/kafka.sh stop
	-@infra/schema-registry.sh stop
	-@infra/kafka-secure.sh stop
	-@infra/jaeger.sh stop
