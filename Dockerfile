# onceflow image: a static binary on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/onceflow ./cmd/onceflow

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/onceflow /onceflow
COPY config.example.yaml /etc/onceflow/config.yaml
ENTRYPOINT ["/onceflow"]
CMD ["serve", "--config", "/etc/onceflow/config.yaml"]
