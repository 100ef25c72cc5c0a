package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Jaeger in the simulation: the jaeger service of docker-compose.yml runs
// as bin/jaeger-<version>, built once from the module tools/jaeger pins,
// with compose's config (deploy/jaeger/config.yaml) and its listen
// addresses moved to loopback through the variables the config reads.
// The services export their spans to its OTLP/HTTP receiver.
const (
	jaegerModule    = "github.com/jaegertracing/jaeger"
	jaegerCommand   = jaegerModule + "/cmd/jaeger"
	jaegerToolsDir  = "tools/jaeger"
	jaegerUIPort    = 16686
	jaegerOTLPHTTP  = 4318
	jaegerOTLPGRPC  = 4317
	jaegerQueryGRPC = 16685
	jaegerHealth    = 13133
)

// jaegerListenEnv maps each variable of deploy/jaeger/config.yaml to the
// container port whose loopback address it is set to.
var jaegerListenEnv = map[string]int{
	"JAEGER_QUERY_LISTEN":      jaegerUIPort,
	"JAEGER_QUERY_GRPC_LISTEN": jaegerQueryGRPC,
	"JAEGER_OTLP_HTTP_LISTEN":  jaegerOTLPHTTP,
	"JAEGER_OTLP_GRPC_LISTEN":  jaegerOTLPGRPC,
	"JAEGER_HEALTH_LISTEN":     jaegerHealth,
}

// jaegerExtraPorts are the ports of the jaeger service that compose does
// not publish, and the loopback ports the simulation gives them.
var jaegerExtraPorts = map[int]int{jaegerOTLPHTTP: 4318, jaegerOTLPGRPC: 4317, jaegerQueryGRPC: 16685, jaegerHealth: 13133}

// jaegerService returns the name of the compose service that runs as
// Jaeger, or "" when none does.
func (s *sim) jaegerService() string {
	if names := s.plan.of(kindJaeger); len(names) == 1 {
		return names[0]
	}
	return ""
}

// jaegerPath returns where the jaeger command at the version
// tools/jaeger/go.mod pins is built (in binDir), and that version.
func jaegerPath(ctx context.Context, root, binDir string) (path, version string, err error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", jaegerModule)
	cmd.Dir = filepath.Join(root, jaegerToolsDir)
	v, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("sim: the jaeger version %s pins (go list -m %s): %w", jaegerToolsDir, jaegerModule, err)
	}
	version = strings.TrimSpace(string(v))
	return filepath.Join(binDir, "jaeger-"+version), version, nil
}

// buildJaeger builds the jaeger command at the version tools/jaeger/go.mod
// pins into binDir, once; it returns the binary's path.
func buildJaeger(ctx context.Context, root, binDir string, out io.Writer) (string, error) {
	path, version, err := jaegerPath(ctx, root, binDir)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	start := time.Now()
	fmt.Fprintf(out, "building jaeger %s (once; cached in %s)\n", version, path)
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	tmp := path + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, jaegerCommand)
	cmd.Dir = filepath.Join(root, jaegerToolsDir)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sim: go build %s: %w: %s", jaegerCommand, err, b)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	fmt.Fprintf(out, "built jaeger %s in %s\n", version, time.Since(start).Round(time.Second))
	return path, nil
}

// prepareJaeger builds Jaeger for a full run. A quick run does not build
// it (a cold build takes minutes, longer than the quick run itself): it
// runs Jaeger when the binary is already built (make jaeger, or a full
// run before), and otherwise says so and runs without traces.
func (s *sim) prepareJaeger(ctx context.Context) error {
	name := s.jaegerService()
	if name == "" {
		return nil
	}
	path, _, err := jaegerPath(ctx, s.cfg.Root, s.cfg.BinDir)
	if err != nil {
		return err
	}
	if _, statErr := os.Stat(path); statErr != nil && s.cfg.Quick {
		delete(s.plan.kinds, name)
		s.plan.order = slices.DeleteFunc(s.plan.order, func(n string) bool { return n == name })
		s.plan.notRun[name] = fmt.Sprintf("a quick run does not build Jaeger (%s is not built; make jaeger builds it): the services export no traces", path)
		return nil
	}
	s.jaegerBin, err = buildJaeger(ctx, s.cfg.Root, s.cfg.BinDir, s.out)
	return err
}

// startJaeger runs the jaeger service with its compose command (the
// config's path mapped to the repository) and its listen addresses on
// loopback, and waits until it listens on every port.
func (s *sim) startJaeger(ctx context.Context, name string) error {
	args, err := s.args(name)
	if err != nil {
		return err
	}
	env := map[string]string{}
	for v, port := range jaegerListenEnv {
		if env[v], err = s.mapper.Addr(name + ":" + strconv.Itoa(port)); err != nil {
			return fmt.Errorf("sim: %s: %w", name, err)
		}
	}
	return s.startProc(ctx, procSpec{Name: name, Path: s.jaegerBin, Args: args, Env: env})
}

// jaegerURL returns the base URL of Jaeger's query service, or "" when the
// simulation runs no Jaeger.
func (s *sim) jaegerURL() string { return s.jaegerHTTP(jaegerUIPort) }

// otlpEndpoint returns where the services send their spans: Jaeger's
// OTLP/HTTP receiver, or "" when no Jaeger runs.
func (s *sim) otlpEndpoint() string { return s.jaegerHTTP(jaegerOTLPHTTP) }

// jaegerHTTP returns the http:// URL of a container port of the jaeger
// service on loopback, or "" when no Jaeger runs.
func (s *sim) jaegerHTTP(port int) string {
	name := s.jaegerService()
	if name == "" {
		return ""
	}
	addr, err := s.mapper.Addr(name + ":" + strconv.Itoa(port))
	if err != nil {
		return ""
	}
	return "http://" + addr
}

// jaegerExtraMappings maps the jaeger service's unpublished ports to
// loopback.
func (s *sim) jaegerExtraMappings(m map[string]string) {
	for _, name := range s.plan.of(kindJaeger) {
		for container, host := range jaegerExtraPorts {
			m[name+":"+strconv.Itoa(container)] = net.JoinHostPort("127.0.0.1", strconv.Itoa(host))
		}
	}
}

// TraceFound is a trace the report names, as Jaeger holds it.
type TraceFound struct {
	ID       string
	Spans    int
	Services []string
}

// findTrace reads one trace from Jaeger's HTTP API: how many spans it has
// and which services sent them. It returns an error when Jaeger does not
// answer or holds no such trace.
func findTrace(ctx context.Context, base, id string) (TraceFound, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/traces/"+id, nil)
	if err != nil {
		return TraceFound{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return TraceFound{}, fmt.Errorf("jaeger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return TraceFound{}, fmt.Errorf("jaeger: trace %s: %s", id, resp.Status)
	}
	var body struct {
		Data []struct {
			Spans     []struct{ ProcessID string } `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return TraceFound{}, fmt.Errorf("jaeger: trace %s: %w", id, err)
	}
	if len(body.Data) == 0 || len(body.Data[0].Spans) == 0 {
		return TraceFound{}, fmt.Errorf("jaeger: trace %s: no spans", id)
	}
	t := TraceFound{ID: id, Spans: len(body.Data[0].Spans)}
	seen := map[string]bool{}
	for _, sp := range body.Data[0].Spans {
		if n := body.Data[0].Processes[sp.ProcessID].ServiceName; n != "" && !seen[n] {
			seen[n] = true
			t.Services = append(t.Services, n)
		}
	}
	slices.Sort(t.Services)
	return t, nil
}
