package regions_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/compose"
)

// The observability services of docker-compose.yml, one for all regions.
const (
	collectorService  = "otel-collector"
	jaegerService     = "jaeger"
	prometheusService = "prometheus"
	grafanaService    = "grafana"
)

var observabilityServices = []string{collectorService, jaegerService, prometheusService, grafanaService}

// loadYAML decodes the file at rel (from the repository root) into v.
func loadYAML(t *testing.T, rel string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// mountedFile returns the repository file (relative to the repository
// root) that service name mounts at target, and whether read-only,
// checking that it is a regular file.
func mountedFile(t *testing.T, p *compose.Project, name, target string) (string, bool) {
	t.Helper()
	v, ok := service(t, p, name).Mount(target)
	if !ok {
		t.Fatalf("%s: nothing mounted at %s (volumes %+v)", name, target, service(t, p, name).Volumes)
	}
	src := repoPath(t, p, name, v)
	if fi, err := os.Stat(filepath.Join(repoRoot, src)); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s: mount at %s: source %s is not a file of the repository (%v)", name, target, v.Source, err)
	}
	return src, v.ReadOnly
}

// repoPath returns a bind mount's source relative to the repository root,
// failing the test when it is not a bind of a path inside the repository.
func repoPath(t *testing.T, p *compose.Project, name string, v compose.Volume) string {
	t.Helper()
	rel, err := filepath.Rel(p.Dir, v.Source)
	if v.Type != "bind" || err != nil || !filepath.IsLocal(rel) {
		t.Fatalf("%s: mount at %s: %s %s is not a bind of a path of the repository", name, v.Target, v.Type, v.Source)
	}
	return filepath.ToSlash(rel)
}

// flag returns the value of --name=value in a command, or "".
func flag(cmd []string, name string) string {
	for _, a := range cmd {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// port returns the port of host:port, :port or a URL, 0 when there is none.
func port(addr string) int {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// host returns the host of host:port or a URL.
func host(addr string) string {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		return u.Hostname()
	}
	h, _, _ := net.SplitHostPort(addr)
	return h
}

// tracedServices are the compose services that export traces: every
// region's ledger, router and API, with the OTEL_SERVICE_NAME each has.
func tracedServices(tab regions.Table) map[string]string {
	out := map[string]string{}
	for _, r := range tab.Regions {
		for _, kind := range []string{"ledger", "router", "api"} {
			out[kind+"-"+r.Name] = "paymesh-" + kind + "-" + r.Name
		}
	}
	return out
}

// TestPrometheusScrapesEveryMetricsEndpoint: Prometheus runs from
// deploy/prometheus/prometheus.yml with exemplar storage, and its scrape
// targets are exactly the /metrics endpoints the paymesh services listen on:
// every region's ledger, router and API and the load profile's receiver, by
// service name and the port of
// the service's listen variable.
func TestPrometheusScrapesEveryMetricsEndpoint(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	prom := service(t, p, prometheusService)
	if !slices.Contains(prom.Command, "--enable-feature=exemplar-storage") {
		t.Errorf("%s: command %v lacks --enable-feature=exemplar-storage", prometheusService, prom.Command)
	}
	cfgFile, _ := mountedFile(t, p, prometheusService, flag(prom.Command, "config.file"))
	if cfgFile != "deploy/prometheus/prometheus.yml" {
		t.Errorf("%s: runs from %s, want deploy/prometheus/prometheus.yml", prometheusService, cfgFile)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	loadYAML(t, cfgFile, &cfg)
	var got, want []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job %s: metrics_path %q, the services serve /metrics", sc.JobName, sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			got = append(got, st.Targets...)
		}
	}
	for _, r := range tab.Regions {
		for _, e := range metricsEndpoints(r) {
			listen := service(t, p, e.Service).Environment[e.Env]
			want = append(want, fmt.Sprintf("%s:%d", e.Service, port(listen)))
		}
	}
	// The load profile's reference receiver serves its own.
	want = append(want, fmt.Sprintf("receiver:%d", port(service(t, p, "receiver").Environment["PAYMESH_RECEIVER_METRICS_LISTEN"])))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: scrape targets %v, want exactly the metrics endpoints %v", cfgFile, got, want)
	}
}

// Prometheus's alert rules: the repository file and where the prometheus
// service mounts it.
const (
	alertsFile   = "deploy/prometheus/alerts.yml"
	alertsTarget = "/etc/prometheus/alerts.yml"
)

// TestPrometheusLoadsAlertRules: the prometheus service mounts
// deploy/prometheus/alerts.yml read-only at /etc/prometheus/alerts.yml;
// every rule_files pattern of its config matches files it mounts, each a
// file of the repository; and once the rules file exists, the config loads
// it.
func TestPrometheusLoadsAlertRules(t *testing.T) {
	p := loadCompose(t)
	prom := service(t, p, prometheusService)
	v, ok := prom.Mount(alertsTarget)
	if !ok || repoPath(t, p, prometheusService, v) != alertsFile || !v.ReadOnly {
		t.Errorf("%s: mount at %s %+v (found %v), want %s read-only", prometheusService, alertsTarget, v, ok, alertsFile)
	}
	cfgTarget := flag(prom.Command, "config.file")
	cfgFile, _ := mountedFile(t, p, prometheusService, cfgTarget)
	var cfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	loadYAML(t, cfgFile, &cfg)
	var loaded []string
	for _, pattern := range cfg.RuleFiles {
		if !path.IsAbs(pattern) {
			pattern = path.Join(path.Dir(cfgTarget), pattern) // relative to the config file
		}
		var matched bool
		for _, m := range prom.Volumes {
			if ok, _ := path.Match(pattern, m.Target); ok {
				mountedFile(t, p, prometheusService, m.Target)
				loaded, matched = append(loaded, m.Target), true
			}
		}
		if !matched {
			t.Errorf("%s: rule_files %s matches nothing %s mounts", cfgFile, pattern, prometheusService)
		}
	}
	if _, err := os.Stat(filepath.Join(repoRoot, alertsFile)); err == nil && !slices.Contains(loaded, alertsTarget) {
		t.Errorf("%s: rule_files %v do not load %s (%s)", cfgFile, cfg.RuleFiles, alertsTarget, alertsFile)
	}
}

// collectorConfig is the part of the collector's config the tests read.
type collectorConfig struct {
	Receivers map[string]struct {
		Protocols map[string]struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"protocols"`
	} `yaml:"receivers"`
	Processors map[string]any `yaml:"processors"`
	Exporters  map[string]struct {
		Endpoint string `yaml:"endpoint"`
	} `yaml:"exporters"`
	Service struct {
		Pipelines map[string]struct {
			Receivers  []string `yaml:"receivers"`
			Processors []string `yaml:"processors"`
			Exporters  []string `yaml:"exporters"`
		} `yaml:"pipelines"`
	} `yaml:"service"`
}

// loadCollector reads the config the collector service runs from.
func loadCollector(t *testing.T, p *compose.Project) collectorConfig {
	t.Helper()
	svc := service(t, p, collectorService)
	cfgFile, _ := mountedFile(t, p, collectorService, flag(svc.Command, "config"))
	if cfgFile != "deploy/otel-collector/config.yaml" {
		t.Errorf("%s: runs from %s, want deploy/otel-collector/config.yaml", collectorService, cfgFile)
	}
	var cfg collectorConfig
	loadYAML(t, cfgFile, &cfg)
	return cfg
}

// jaegerOTLPPorts returns the ports Jaeger receives OTLP on, by protocol
// (grpc, http), from the config the jaeger service runs (Jaeger v2 is an
// OpenTelemetry collector: its config has the collector's shape). Each
// listen address there is a variable with a default, "${env:NAME:-addr}":
// compose sets none of them, so the defaults are what it listens on.
func jaegerOTLPPorts(t *testing.T, p *compose.Project) map[string]int {
	t.Helper()
	svc := service(t, p, jaegerService)
	cfgFile, _ := mountedFile(t, p, jaegerService, flag(svc.Command, "config"))
	var cfg collectorConfig
	loadYAML(t, cfgFile, &cfg)
	if pipe := cfg.Service.Pipelines["traces"]; !slices.Contains(pipe.Receivers, "otlp") {
		t.Errorf("%s: traces pipeline receivers %v, want otlp", cfgFile, pipe.Receivers)
	}
	out := map[string]int{}
	for proto, pc := range cfg.Receivers["otlp"].Protocols {
		addr := pc.Endpoint
		if m := envDefault.FindStringSubmatch(addr); m != nil {
			if _, set := svc.Environment[m[1]]; set {
				t.Errorf("%s: sets %s; the listen addresses are the config's defaults", jaegerService, m[1])
			}
			addr = m[2]
		}
		out[proto] = port(addr)
	}
	if out["grpc"] == 0 || out["http"] == 0 {
		t.Errorf("%s: otlp receiver ports %v, want grpc and http", cfgFile, out)
	}
	return out
}

// envDefault is a collector config value "${env:NAME:-default}".
var envDefault = regexp.MustCompile(`^\$\{env:([A-Za-z_][A-Za-z0-9_]*):-(.*)\}$`)

// componentType is the type of a collector component id "type[/name]".
func componentType(id string) string { t, _, _ := strings.Cut(id, "/"); return t }

// TestServicesSendTracesToCollector: every region's ledger, router and API
// names itself in OTEL_SERVICE_NAME and sends OTLP over HTTP (the protocol
// of the tracing set-up) to the collector service, on the port the
// collector's traces pipeline receives OTLP/HTTP on.
func TestServicesSendTracesToCollector(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	cfg := loadCollector(t, p)
	httpPorts := map[int]bool{}
	for _, id := range cfg.Service.Pipelines["traces"].Receivers {
		if componentType(id) == "otlp" {
			if p, ok := cfg.Receivers[id].Protocols["http"]; ok {
				httpPorts[port(p.Endpoint)] = true
			}
		}
	}
	if len(httpPorts) == 0 {
		t.Fatal("collector: no OTLP/HTTP receiver in the traces pipeline")
	}
	for svcName, otelName := range tracedServices(tab) {
		env := service(t, p, svcName).Environment
		u, err := url.Parse(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
		if err != nil || u.Scheme != "http" || u.Hostname() != collectorService || !httpPorts[port(u.Host)] {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT %q, want http://%s:<an OTLP/HTTP receiver port %v>",
				svcName, env["OTEL_EXPORTER_OTLP_ENDPOINT"], collectorService, httpPorts)
		}
		if env["OTEL_SERVICE_NAME"] != otelName {
			t.Errorf("%s: OTEL_SERVICE_NAME %q, want %q", svcName, env["OTEL_SERVICE_NAME"], otelName)
		}
	}
}

// TestCollectorExportsToJaeger: the collector's traces pipeline receives
// OTLP, batches, and exports over OTLP to the jaeger service, on the port
// Jaeger serves OTLP on for that protocol (gRPC or HTTP).
func TestCollectorExportsToJaeger(t *testing.T) {
	p := loadCompose(t)
	cfg := loadCollector(t, p)
	jaegerPorts := jaegerOTLPPorts(t, p)
	pipe, ok := cfg.Service.Pipelines["traces"]
	if !ok {
		t.Fatal("collector: no traces pipeline")
	}
	if !slices.ContainsFunc(pipe.Receivers, func(id string) bool { return componentType(id) == "otlp" }) {
		t.Errorf("collector: traces pipeline receivers %v, want an otlp receiver", pipe.Receivers)
	}
	for _, id := range pipe.Processors {
		if _, ok := cfg.Processors[id]; !ok {
			t.Errorf("collector: processor %s used but not configured", id)
		}
	}
	if !slices.ContainsFunc(pipe.Processors, func(id string) bool { return componentType(id) == "batch" }) {
		t.Errorf("collector: traces pipeline processors %v, want batch", pipe.Processors)
	}
	var toJaeger int
	for _, id := range pipe.Exporters {
		exp, ok := cfg.Exporters[id]
		if !ok {
			t.Errorf("collector: exporter %s used but not configured", id)
			continue
		}
		proto := map[string]string{"otlp": "grpc", "otlp_grpc": "grpc", "otlphttp": "http", "otlp_http": "http"}[componentType(id)]
		if proto == "" || host(exp.Endpoint) != jaegerService {
			continue
		}
		toJaeger++
		if port(exp.Endpoint) != jaegerPorts[proto] {
			t.Errorf("collector: exporter %s sends OTLP/%s to %s, but Jaeger serves OTLP/%s on %d", id, proto, exp.Endpoint, proto, jaegerPorts[proto])
		}
	}
	if toJaeger == 0 {
		t.Errorf("collector: no exporter of the traces pipeline %v sends OTLP to %s", pipe.Exporters, jaegerService)
	}
	if _, ok := service(t, p, collectorService).DependsOn[jaegerService]; !ok {
		t.Errorf("%s: does not depend on %s", collectorService, jaegerService)
	}
}

// grafanaDatasource is one provisioned data source.
type grafanaDatasource struct {
	Name     string `yaml:"name"`
	Type     string `yaml:"type"`
	UID      string `yaml:"uid"`
	URL      string `yaml:"url"`
	JSONData struct {
		ExemplarTraceIDDestinations []struct {
			Name          string `yaml:"name"`
			DatasourceUID string `yaml:"datasourceUid"`
		} `yaml:"exemplarTraceIdDestinations"`
	} `yaml:"jsonData"`
}

// TestGrafanaProvisioning: Grafana's mounts are files of the repository;
// its data sources reach the prometheus and jaeger services on the ports
// they serve; the Prometheus one sends trace_id exemplars to the Jaeger one;
// every data source uid paymesh.json uses is provisioned with the same type;
// the dashboards provider loads deploy/grafana/paymesh.json and nothing
// else; anonymous users can view; and the dashboard's Jaeger links point at
// Jaeger's published UI and name services that send traces.
func TestGrafanaProvisioning(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	g := service(t, p, grafanaService)
	if g.Environment["GF_AUTH_ANONYMOUS_ENABLED"] != "true" || g.Environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
		t.Errorf("%s: anonymous access %q role %q, want true Viewer", grafanaService, g.Environment["GF_AUTH_ANONYMOUS_ENABLED"], g.Environment["GF_AUTH_ANONYMOUS_ORG_ROLE"])
	}
	var datasources []grafanaDatasource
	var providerPaths []string
	for _, v := range g.Volumes {
		src, _ := mountedFile(t, p, grafanaService, v.Target)
		switch path.Dir(v.Target) {
		case "/etc/grafana/provisioning/datasources":
			var f struct {
				Datasources []grafanaDatasource `yaml:"datasources"`
			}
			loadYAML(t, src, &f)
			datasources = append(datasources, f.Datasources...)
		case "/etc/grafana/provisioning/dashboards":
			var f struct {
				Providers []struct {
					Type    string `yaml:"type"`
					Options struct {
						Path string `yaml:"path"`
					} `yaml:"options"`
				} `yaml:"providers"`
			}
			loadYAML(t, src, &f)
			for _, prov := range f.Providers {
				if prov.Type == "file" {
					providerPaths = append(providerPaths, path.Clean(prov.Options.Path))
				}
			}
		}
	}

	// The dashboards the providers load are the files mounted below their paths.
	var loaded []string
	for _, v := range g.Volumes {
		for _, dir := range providerPaths {
			if strings.HasPrefix(v.Target, dir+"/") {
				loaded = append(loaded, repoPath(t, p, grafanaService, v))
			}
		}
	}
	if !slices.Equal(loaded, []string{"deploy/grafana/paymesh.json"}) {
		t.Errorf("%s: dashboards provisioned %v (providers %v), want deploy/grafana/paymesh.json", grafanaService, loaded, providerPaths)
	}

	byUID := map[string]grafanaDatasource{}
	for _, ds := range datasources {
		if _, dup := byUID[ds.UID]; dup || ds.UID == "" {
			t.Errorf("data source %q: uid %q empty or used twice", ds.Name, ds.UID)
		}
		byUID[ds.UID] = ds
	}
	reach := map[string]struct {
		service string
		port    int
	}{"prometheus": {prometheusService, 9090}, "jaeger": {jaegerService, 16686}}
	for _, ds := range datasources {
		want, ok := reach[ds.Type]
		if !ok {
			t.Errorf("data source %q: type %q, want prometheus or jaeger", ds.Name, ds.Type)
			continue
		}
		if host(ds.URL) != want.service || port(ds.URL) != want.port {
			t.Errorf("data source %q: url %q, want http://%s:%d", ds.Name, ds.URL, want.service, want.port)
		}
		if _, ok := p.Services[want.service]; !ok {
			t.Errorf("data source %q: no compose service %s", ds.Name, want.service)
		}
		if ds.Type != "prometheus" {
			continue
		}
		var toJaeger bool
		for _, d := range ds.JSONData.ExemplarTraceIDDestinations {
			toJaeger = toJaeger || d.Name == "trace_id" && byUID[d.DatasourceUID].Type == "jaeger"
		}
		if !toJaeger {
			t.Errorf("data source %q: exemplarTraceIdDestinations %+v, want trace_id to a Jaeger data source", ds.Name, ds.JSONData.ExemplarTraceIDDestinations)
		}
	}
	if prom := service(t, p, prometheusService); flag(prom.Command, "web.listen-address") != "" && port(flag(prom.Command, "web.listen-address")) != 9090 {
		t.Errorf("%s: listens on %s, the data source expects 9090", prometheusService, flag(prom.Command, "web.listen-address"))
	}

	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/paymesh.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Links []struct {
			URL string `json:"url"`
		} `json:"links"`
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
			FieldConfig struct {
				Defaults struct {
					Links []struct {
						URL string `json:"url"`
					} `json:"links"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	urls := []string{}
	for _, l := range dash.Links {
		urls = append(urls, l.URL)
	}
	for _, p := range dash.Panels {
		ds, ok := byUID[p.Datasource.UID]
		if !ok || ds.Type != p.Datasource.Type {
			t.Errorf("panel %q: data source %s/%s is not provisioned", p.Title, p.Datasource.Type, p.Datasource.UID)
		}
		for _, l := range p.FieldConfig.Defaults.Links {
			urls = append(urls, l.URL)
		}
	}
	checkJaegerLinks(t, p, tab, urls)
}

// checkJaegerLinks: every link of the dashboard that opens Jaeger's UI
// goes to the host port where the jaeger service publishes it, and the
// service it searches sends traces under that name, in every region.
func checkJaegerLinks(t *testing.T, p *compose.Project, tab regions.Table, urls []string) {
	t.Helper()
	names := map[string]bool{}
	for _, n := range tracedServices(tab) {
		names[n] = true
	}
	var links int
	for _, raw := range urls {
		u, err := url.Parse(strings.NewReplacer("${", "", "}", "").Replace(raw))
		if err != nil || !strings.HasPrefix(u.Path, "/search") {
			continue
		}
		links++
		jaeger := service(t, p, jaegerService)
		if hp, ok := jaeger.Published(16686); !ok || strconv.Itoa(hp) != u.Port() {
			t.Errorf("link %s: %s does not publish Jaeger's UI on port %s (ports %v)", raw, jaegerService, u.Port(), ports(jaeger))
		}
		svc := regexp.MustCompile(`[$][{]__field[.]labels[.]region[}]`).ReplaceAllString(queryParam(raw, "service"), "%s")
		if svc == "" {
			continue
		}
		for _, r := range tab.Regions {
			if name := strings.ReplaceAll(svc, "%s", r.Name); !names[name] {
				t.Errorf("link %s: searches service %s, which no compose service sends traces as", raw, name)
			}
		}
	}
	if links == 0 {
		t.Error("paymesh.json: no link to Jaeger's search")
	}
}

// queryParam reads a query parameter of a link that holds Grafana
// variables, which url.Parse would refuse in the query.
func queryParam(raw, name string) string {
	_, q, _ := strings.Cut(raw, "?")
	for _, kv := range strings.Split(q, "&") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}
