# Multi-stage build: a static binary (the embedded FerretDB uses a pure-Go
# SQLite, so no cgo) on a distroless base, running as a non-root user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/tsproxy ./cmd/tsproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tsproxy /usr/local/bin/tsproxy
COPY config.yaml /etc/tsproxy/config.yaml
WORKDIR /var/lib/tsproxy
USER nonroot:nonroot
EXPOSE 27017 9216
# Listen on all interfaces inside the container; data of the embedded
# upstream under /var/lib/tsproxy/data (mount a volume there).
ENTRYPOINT ["/usr/local/bin/tsproxy", "--config", "/etc/tsproxy/config.yaml", "--listen", "0.0.0.0:27017", "--metrics", "0.0.0.0:9216"]
