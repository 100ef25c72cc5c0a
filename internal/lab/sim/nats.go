package sim

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// natsModule is the nats-server module whose version go.mod pins.
const natsModule = "github.com/nats-io/nats-server/v2"

// buildNATSServer returns the path of a nats-server binary of the version
// go.mod pins, built into binDir once per version
// (binDir/nats-server-<version>). It returns an error with the go tool's
// output when the build fails.
func buildNATSServer(ctx context.Context, root, binDir string, out io.Writer) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", natsModule)
	cmd.Dir = root
	v, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("sim: the nats-server version go.mod pins (go list -m %s): %w", natsModule, err)
	}
	version := strings.TrimSpace(string(v))
	path := filepath.Join(binDir, "nats-server-"+version)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	fmt.Fprintf(out, "building nats-server %s (once; cached in %s)\n", version, path)
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	tmp := path + ".tmp"
	cmd = exec.CommandContext(ctx, "go", "build", "-o", tmp, natsModule)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sim: go build %s: %w: %s", natsModule, err, b)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	return path, nil
}

// addrMapper maps a compose address (service:port) to loopback.
type addrMapper interface {
	Addr(addr string) (string, error)
}

var (
	confPort      = regexp.MustCompile(`(?m)^port: *([0-9]+) *$`)
	confHTTP      = regexp.MustCompile(`(?m)^http: *([0-9]+) *$`)
	confStoreDir  = regexp.MustCompile(`(?m)^(\s*)store_dir: *\S+ *$`)
	confBlockPort = regexp.MustCompile(`(?m)^(\s+)port: *([0-9]+) *$`)
	confRemote    = regexp.MustCompile(`nats-(?:leaf|route)://[^"\s]+`)
)

// rewriteConf rewrites a nats-server config of docker-compose service
// service for loopback: its client, monitor, leafnode and cluster ports
// listen on 127.0.0.1 at the host ports the mapper gives for service:port,
// the JetStream store goes to storeDir, and leafnode remote and cluster
// route URLs point at the mapped addresses. A region's nodes share one
// config; each gets its own rewritten copy, with its own ports. It returns an error when the config has no client
// port, or a port or remote the mapper cannot map.
func rewriteConf(conf []byte, service string, m addrMapper, storeDir string) ([]byte, error) {
	s := string(conf)
	var err error
	listen := func(port string) string {
		to, e := m.Addr(net.JoinHostPort(service, port))
		if e != nil && err == nil {
			err = e
		}
		return to
	}
	if !confPort.MatchString(s) {
		return nil, fmt.Errorf("sim: nats config of %s: no top-level \"port:\" line", service)
	}
	s = confPort.ReplaceAllStringFunc(s, func(line string) string {
		return "listen: " + listen(confPort.FindStringSubmatch(line)[1])
	})
	s = confHTTP.ReplaceAllStringFunc(s, func(line string) string {
		return "http: " + listen(confHTTP.FindStringSubmatch(line)[1])
	})
	// Indented port lines are a block's: the hub's leafnodes block, a
	// region's cluster block.
	s = confBlockPort.ReplaceAllStringFunc(s, func(line string) string {
		sub := confBlockPort.FindStringSubmatch(line)
		return sub[1] + "listen: " + listen(sub[2])
	})
	s = confStoreDir.ReplaceAllStringFunc(s, func(line string) string {
		return confStoreDir.FindStringSubmatch(line)[1] + "store_dir: " + strconv.Quote(storeDir)
	})
	s = confRemote.ReplaceAllStringFunc(s, func(url string) string {
		to, e := m.Addr(url)
		if e != nil && err == nil {
			err = e
		}
		return to
	})
	if err != nil {
		return nil, fmt.Errorf("sim: nats config of %s: %w", service, err)
	}
	return []byte(s), nil
}
