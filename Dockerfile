# One image for every paymesh service of docker-compose.yml: `paymesh ledger`,
# `router`, `api`, `wan`, `verify`, `client`, `load` (deploy/regions/compose_test.go
# checks that it builds ./cmd/paymesh with the Go of go.mod).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/paymesh ./cmd/paymesh

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/paymesh /paymesh
ENTRYPOINT ["/paymesh"]
