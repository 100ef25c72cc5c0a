package sim

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/paymesh/paymesh/internal/lab/compose"
)

// NotRun names the images of docker-compose.yml that the simulation does
// not run, each with the reason. Every other service of the file has a
// counterpart (see makePlan); a test fails when one has none.
var NotRun = map[string]string{
	"grafana/grafana":                      "no Grafana here: the dashboard's panel queries run against the simulation's Prometheus instead (promcheck.CheckPanels)",
	"otel/opentelemetry-collector-contrib": "the services send their spans straight to Jaeger, an OpenTelemetry collector itself (its OTLP receiver); compose's collector only batches and forwards them",
}

// kind is how the simulation runs a compose service.
type kind int

const (
	kindNATS       kind = iota + 1 // a nats-server process built from go.mod's version
	kindFormation                  // a pg_auto_failover server: deploy/postgres/formation as a process
	kindPrometheus                 // Debian's prometheus, through internal/testbed/promcheck
	kindJaeger                     // bin/jaeger, built from tools/jaeger's pinned version
	kindService                    // a long-running paymesh process (ledger, router, api, wan, receiver)
	kindSetup                      // a paymesh command run to completion before the load
	kindLoad                       // paymesh-lab load, with the fault schedule around it
	kindTool                       // a paymesh command run once the load has drained (verify, dlq list)
)

func (k kind) String() string {
	return [...]string{"?", "nats-server process", "pg_auto_failover server (deploy/postgres/formation)", "prometheus (promcheck)", "jaeger process", "paymesh process",
		"paymesh command before the load", "paymesh-lab load", "paymesh command after the load"}[k]
}

// paymeshCommands maps the paymesh commands compose runs to their kind.
var paymeshCommands = map[string]kind{
	"ledger": kindService, "router": kindService, "api": kindService, "wan": kindService, "receiver": kindService,
	"client": kindSetup, "migrate": kindSetup, "certs": kindSetup, "webhooks": kindSetup,
	"load":   kindLoad,
	"verify": kindTool, "dlq": kindTool,
}

// The Dockerfile's targets: the product image (the default) and the lab's.
const (
	productTarget = "paymesh"
	labTarget     = "lab"
)

// plan is the simulation's counterpart of every compose service.
type plan struct {
	project *compose.Project
	kinds   map[string]kind
	notRun  map[string]string // service -> reason
	order   []string          // services to run, dependencies first
}

// imageName is an image reference without its tag.
func imageName(image string) string {
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

// makePlan gives every service of the project its counterpart. It returns
// an error naming each service that has none, and when the dependencies
// form a cycle.
func makePlan(p *compose.Project) (*plan, error) {
	pl := &plan{project: p, kinds: map[string]kind{}, notRun: map[string]string{}}
	var missing []string
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		img := imageName(s.Image)
		switch {
		case NotRun[img] != "":
			pl.notRun[name] = NotRun[img]
		case img == "nats":
			pl.kinds[name] = kindNATS
		case img == formationImage && s.Build:
			pl.kinds[name] = kindFormation
		case img == "prom/prometheus":
			pl.kinds[name] = kindPrometheus
		case img == "jaegertracing/jaeger":
			pl.kinds[name] = kindJaeger
		case s.Build && (s.Target == productTarget || s.Target == labTarget) && len(s.Command) > 0 && paymeshCommands[s.Command[0]] != 0:
			pl.kinds[name] = paymeshCommands[s.Command[0]]
		default:
			missing = append(missing, fmt.Sprintf("%s (image %q, command %q)", name, s.Image, s.Command))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("sim: docker-compose services without a counterpart in the simulation: %s; run them in internal/lab/sim or name their image in sim.NotRun with the reason",
			strings.Join(missing, ", "))
	}
	// Dependencies first (Kahn's algorithm, by name among equals).
	deps := map[string][]string{}
	for name := range pl.kinds {
		for d := range p.Services[name].DependsOn {
			if _, run := pl.kinds[d]; run {
				deps[name] = append(deps[name], d)
			}
		}
	}
	done := map[string]bool{}
	for len(pl.order) < len(pl.kinds) {
		var ready []string
		for name := range pl.kinds {
			if !done[name] && !slices.ContainsFunc(deps[name], func(d string) bool { return !done[d] }) {
				ready = append(ready, name)
			}
		}
		if len(ready) == 0 {
			return nil, fmt.Errorf("sim: docker-compose dependencies form a cycle among the services left")
		}
		sort.Strings(ready)
		for _, n := range ready {
			done[n] = true
		}
		pl.order = append(pl.order, ready...)
	}
	return pl, nil
}

// of returns the services of kind k, in start order.
func (pl *plan) of(k kind) []string {
	var out []string
	for _, n := range pl.order {
		if pl.kinds[n] == k {
			out = append(out, n)
		}
	}
	return out
}
