# paymesh: `make demo` runs the demo, `make test` the test suite.
GO      ?= go
ARGS    ?=
PG_URL  ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable

.PHONY: demo test test-short build fuzz services clean

## demo: run the single-region demo on the local Postgres and an embedded JetStream
demo: services
	$(GO) run ./cmd/paymesh demo $(ARGS)

## test: vet and run every test against real Postgres and real JetStream
test: services
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 10m ./...

## test-short: the suite without the long randomized runs
test-short: services
	$(GO) test -count=1 -short ./...

## build: build bin/paymesh
build:
	$(GO) build -o bin/paymesh ./cmd/paymesh

## fuzz: fuzz the ID parser for 30 s
fuzz:
	$(GO) test ./pkg/idgen -run '^$$' -fuzz FuzzParse -fuzztime 30s

## services: make sure the local Postgres and NATS are up (see scripts/services)
services:
	@./scripts/services

clean:
	rm -rf bin
