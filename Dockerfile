# Two images from one Dockerfile (deploy/regions/compose_test.go checks both,
# and that each is built with the Go of go.mod):
# - the product, the default target `paymesh`: ./cmd/paymesh, the services
#   (`ledger`, `router`, `api`) and the operator's tools (`migrate`, `verify`,
#   `client`, `dlq`); it holds nothing of the lab;
# - the lab, target `lab`: ./cmd/paymesh-lab, the WAN links (`wan`) and the
#   load (`load`) that docker-compose.yml runs around the regions.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/paymesh ./cmd/paymesh

FROM build AS build-lab
RUN CGO_ENABLED=0 go build -trimpath -o /out/paymesh-lab ./cmd/paymesh-lab

FROM gcr.io/distroless/static-debian12:nonroot AS lab
COPY --from=build-lab /out/paymesh-lab /paymesh-lab
ENTRYPOINT ["/paymesh-lab"]

FROM gcr.io/distroless/static-debian12:nonroot AS paymesh
COPY --from=build /out/paymesh /paymesh
ENTRYPOINT ["/paymesh"]
