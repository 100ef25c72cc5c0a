# paymesh: `make demo` runs the demo, `make test` the test suite, `make bench`
# the benchmarks.
GO      ?= go
ARGS    ?=
PG_URL  ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BENCHSTAT   ?= $(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
BENCH_COUNT ?= 10
BENCH_TIME  ?= 20000x

.PHONY: jaeger demo sim bench chaos bench-telemetry test test-long test-short build fuzz services browser prometheus pgautofailover lint-openapi clean compose-up compose-down compose-load

## demo: run the three-region demo on the local Postgres and an embedded NATS topology
demo: services
	$(GO) run ./cmd/paymesh-lab demo $(ARGS)

## jaeger: build the Jaeger that tools/jaeger/go.mod pins into bin/ (once;
## several minutes cold). make sim builds it itself; a quick run
## (ARGS=--quick, as in make test) runs it only when it is built.
JAEGER_VERSION = $(shell cd tools/jaeger && $(GO) list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)
jaeger:
	@test -x bin/jaeger-$(JAEGER_VERSION) || (cd tools/jaeger && $(GO) build -o ../../bin/jaeger-$(JAEGER_VERSION) github.com/jaegertracing/jaeger/cmd/jaeger)

## sim: docker-compose.yml's topology as separate processes on this machine
## (nats-servers, a pg_auto_failover formation per region from
## deploy/postgres/formation, WAN links, the services, load, a fault schedule,
## Prometheus and its alerts), then a PASS/FAIL report (about 3 minutes;
## ARGS=--quick for about 90 s). It needs no local NATS, only the local
## PostgreSQL binaries, Debian's pg_auto_failover and Debian's prometheus.
sim: prometheus pgautofailover build
	bin/paymesh-lab sim $(ARGS)

## bench: measure throughput and latency against same-run baselines (about
## 8 minutes; ARGS=--quick for about 1.5, ARGS="--json bench.json" for a file)
bench: services build
	bin/paymesh-lab bench $(ARGS)

## chaos: every built fault-injection scenario with 3 seeds, then the table of
## faults fired, operations and invariants, then every deliberate-bug case
## (make test runs the cases marked ci; about 25 minutes; see docs/RELIABILITY.md)
chaos: services pgautofailover
	$(GO) run ./cmd/paymesh-lab chaos --seeds 1,2,3 $(ARGS)
	$(GO) test -count=1 -timeout 40m -run 'TestCheckerCatchesBugs' ./internal/lab/chaos -args -chaos.allbugs

## test: vet, lint the OpenAPI document, run every test against real Postgres
## and real JetStream, then the quick process simulation (make sim ARGS=--quick)
## (the browser test's screenshot lands in artifacts/). Three test binaries
## at a time: the suite mostly waits (fsyncs, elections, timeouts), and uses
## about a third of two cores with the default of two. The long fault runs
## are make test-long's: make test runs the fault suite's clean scenarios of
## its set (ciScenarios) and its deliberate-bug cases marked ci, and the quick
## simulation rather than the tests that start compose's whole topology.
test: services browser prometheus pgautofailover
	$(GO) vet ./...
	./scripts/lint-openapi
	@mkdir -p artifacts
	$(GO) test -p 3 -count=1 -timeout 30m -artifacts -outputdir $(CURDIR)/artifacts ./...
	$(MAKE) sim ARGS=--quick

## test-long: the runs make test leaves out (about 20 minutes): every
## scenario of the fault suite once (make chaos runs each with three seeds
## and every deliberate-bug case), and the simulation's tests that start
## compose's whole topology (a run cancelled midway frees everything; a
## run that loses commands fails and names them)
test-long: services prometheus pgautofailover
	$(GO) test -count=1 -timeout 40m -run 'TestScenarios' ./internal/lab/chaos -args -chaos.allscenarios
	$(GO) test -count=1 -timeout 40m ./internal/lab/sim -args -sim.long

## test-short: the suite without the long randomized runs
test-short: services
	$(GO) test -count=1 -short ./...

## build: build bin/paymesh (the product) and bin/paymesh-lab (the lab)
build:
	$(GO) build -o bin/paymesh ./cmd/paymesh
	$(GO) build -o bin/paymesh-lab ./cmd/paymesh-lab

## fuzz: fuzz the ID parser for 30 s
fuzz:
	$(GO) test ./pkg/idgen -run '^$$' -fuzz FuzzParse -fuzztime 30s

## browser: make sure Debian's Chromium is there for the browser test (see scripts/browser)
browser:
	@./scripts/browser

## prometheus: make sure Debian's Prometheus and promtool are there for the
## Prometheus tests (see scripts/prometheus)
prometheus:
	@./scripts/prometheus

## pgautofailover: make sure Debian's pg_auto_failover is there for the
## highly available database's tests (see scripts/pgautofailover)
pgautofailover:
	@./scripts/pgautofailover

## lint-openapi: services/api/openapi.yaml under Redocly's recommended rules, 0 errors and 0 warnings
lint-openapi:
	./scripts/lint-openapi

## bench-telemetry: what tracing and metrics cost the ledger apply path: BENCH_COUNT
## rounds of BenchmarkApplyPath (telemetry=off, then on, BENCH_TIME transfers each),
## compared by benchstat; the raw results are in bin/bench-telemetry.txt
bench-telemetry: services
	@mkdir -p bin
	$(GO) test -c -o bin/ledger-server.test ./services/ledger/ledgerd
	@rm -f bin/bench-telemetry.txt
	@for i in $$(seq $(BENCH_COUNT)); do \
		bin/ledger-server.test -test.run '^$$' -test.bench '^BenchmarkApplyPath$$' -test.benchtime $(BENCH_TIME) >bin/bench-round.txt \
			|| { cat bin/bench-round.txt; exit 1; }; \
		grep '^Benchmark' bin/bench-round.txt; cat bin/bench-round.txt >>bin/bench-telemetry.txt; \
	done
	$(BENCHSTAT) -col /telemetry bin/bench-telemetry.txt

## services: make sure the local Postgres and NATS are up (see scripts/services)
services:
	@./scripts/services

## compose-up / compose-down: the three regions as containers (needs a Docker engine)
compose-up:
	docker compose up --build -d

compose-down:
	docker compose --profile load down -v

## compose-load: register the load client, drive transfers through the three APIs, receive its webhooks
compose-load:
	docker compose --profile load up setup loadgen receiver

clean:
	rm -rf bin
