// Package compose loads a docker-compose file with the compose
// specification's own loader (github.com/compose-spec/compose-go/v2) and
// keeps the little of it that paymesh runs: each service's image or build
// (its context and target), command, environment, published ports,
// dependencies, healthcheck, volumes and profiles. A Mapper rewrites the
// addresses services use inside the compose network to the loopback
// addresses their published ports have on the host, so the same
// environment can start the services as processes.
package compose

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// AllProfiles, given as a profile, enables every service whatever its
// profiles.
const AllProfiles = "*"

// The conditions a dependency waits for (the compose specification's
// depends_on conditions).
const (
	ServiceStarted               = types.ServiceConditionStarted
	ServiceHealthy               = types.ServiceConditionHealthy
	ServiceCompletedSuccessfully = types.ServiceConditionCompletedSuccessfully
)

// Project is a loaded compose file.
type Project struct {
	// Name is the project name (the file's name: or its directory's).
	Name string
	// Dir is the absolute project directory, from which relative paths of
	// the file resolve.
	Dir string
	// Services are the enabled services by name: those without profiles
	// and those of the profiles given to Load.
	Services map[string]Service
}

// Service is one service of a project.
type Service struct {
	Name string
	// Image is the image the service runs; with Build it names the image
	// built, and is "" when the file names none.
	Image string
	// Build reports whether the image is built from a Dockerfile (build:).
	Build bool
	// Target is the Dockerfile stage built (build: target:), "" for the
	// last one.
	Target string
	// Context is the build context (build: context:): the absolute
	// folder, a relative one resolved from the project directory, or a
	// remote context as the file gives it; "" without Build.
	Context string
	// Command overrides the image's command; nil keeps it.
	Command []string
	// Environment is the resolved environment: a variable the file lists
	// without a value takes it from the environment given to Load, and is
	// left out when that has none.
	Environment map[string]string
	// Ports are the published ports, in the file's order.
	Ports []Port
	// DependsOn maps each service this one depends on to the condition it
	// waits for (ServiceStarted, ServiceHealthy, ...).
	DependsOn map[string]string
	// Healthcheck is the healthcheck's test (["CMD", ...] or
	// ["CMD-SHELL", ...]), nil when the service has none or disables it.
	Healthcheck []string
	// Volumes are the service's mounts, in the file's order.
	Volumes []Volume
	// Profiles are the profiles that enable the service; none means always.
	Profiles []string
	// Restart is the restart policy ("no", "always", "on-failure",
	// "unless-stopped"; "" when the file sets none).
	Restart string
}

// Port is a published port: Host on the host reaches Container in the
// service.
type Port struct {
	Host, Container int
	// Protocol is "tcp" or "udp".
	Protocol string
}

// String returns the port in the short syntax "host:container".
func (p Port) String() string { return fmt.Sprintf("%d:%d", p.Host, p.Container) }

// Volume is one mount of a service.
type Volume struct {
	// Type is "bind", "volume", "tmpfs", ...
	Type string
	// Source is, for a bind, the absolute path on the host (relative
	// paths resolved from the project directory); for a volume, its name.
	Source   string
	Target   string
	ReadOnly bool
}

// Load reads the compose file at path with the project directory as its
// directory, enabling the services of the given profiles (AllProfiles
// enables all). Variables are interpolated from an empty environment: the
// caller's environment does not leak in; use LoadEnv to give one. It
// returns an error with the loader's message when the file does not load
// or is not valid, and when two services publish the same host port.
func Load(path string, profiles ...string) (*Project, error) {
	return LoadEnv(path, nil, profiles...)
}

// LoadEnv is Load with interpolation, and the values of variables listed
// without one, from env only.
func LoadEnv(path string, env map[string]string, profiles ...string) (*Project, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("compose: %s: %w", path, err)
	}
	dir := filepath.Dir(abs)
	vars := make([]string, 0, len(env))
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	opts, err := cli.NewProjectOptions([]string{abs},
		cli.WithWorkingDirectory(dir),
		cli.WithEnv(vars),
		cli.WithProfiles(profiles),
	)
	if err != nil {
		return nil, fmt.Errorf("compose: %s: %w", path, err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		return nil, fmt.Errorf("compose: load %s: %w", path, err)
	}
	out := &Project{Name: p.Name, Dir: dir, Services: make(map[string]Service, len(p.Services))}
	for name, s := range p.Services {
		svc, err := convert(name, s)
		if err != nil {
			return nil, fmt.Errorf("compose: %s: %w", path, err)
		}
		out.Services[name] = svc
	}
	if err := out.checkHostPorts(); err != nil {
		return nil, fmt.Errorf("compose: %s: %w", path, err)
	}
	return out, nil
}

// convert keeps what paymesh needs of a loaded service.
func convert(name string, s types.ServiceConfig) (Service, error) {
	svc := Service{
		Name:        name,
		Image:       s.Image,
		Build:       s.Build != nil,
		Environment: map[string]string{},
		DependsOn:   map[string]string{},
		Profiles:    slices.Clone(s.Profiles),
		Restart:     s.Restart,
	}
	if s.Build != nil {
		svc.Target, svc.Context = s.Build.Target, s.Build.Context
	}
	if len(s.Command) > 0 {
		svc.Command = slices.Clone([]string(s.Command))
	}
	for k, v := range s.Environment {
		if v != nil {
			svc.Environment[k] = *v
		}
	}
	for _, p := range s.Ports {
		if p.Published == "" {
			continue // a container port without a host port
		}
		host, err := strconv.Atoi(p.Published)
		if err != nil {
			return Service{}, fmt.Errorf("service %s: published port %q: want one port number", name, p.Published)
		}
		svc.Ports = append(svc.Ports, Port{Host: host, Container: int(p.Target), Protocol: p.Protocol})
	}
	for dep, d := range s.DependsOn {
		svc.DependsOn[dep] = d.Condition
	}
	if hc := s.HealthCheck; hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE" {
		svc.Healthcheck = slices.Clone([]string(hc.Test))
	}
	for _, v := range s.Volumes {
		svc.Volumes = append(svc.Volumes, Volume{Type: v.Type, Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	return svc, nil
}

// checkHostPorts returns an error when two services publish one host port
// for one protocol: the second could not start.
func (p *Project) checkHostPorts() error {
	owner := map[string]string{}
	for _, name := range p.ServiceNames() {
		for _, port := range p.Services[name].Ports {
			key := strconv.Itoa(port.Host) + "/" + port.Protocol
			if other, ok := owner[key]; ok {
				return fmt.Errorf("host port %d/%s is published by both %s and %s", port.Host, port.Protocol, other, name)
			}
			owner[key] = name
		}
	}
	return nil
}

// ServiceNames returns the names of the enabled services, sorted.
func (p *Project) ServiceNames() []string { return slices.Sorted(maps.Keys(p.Services)) }

// Service returns the named service, or an error naming the project's
// services when there is none.
func (p *Project) Service(name string) (Service, error) {
	s, ok := p.Services[name]
	if !ok {
		return Service{}, fmt.Errorf("compose: project %s has no service %q (services: %s)", p.Name, name, strings.Join(p.ServiceNames(), ", "))
	}
	return s, nil
}

// Published returns the host port on which the service publishes
// container port (tcp), or false.
func (s Service) Published(container int) (int, bool) {
	for _, p := range s.Ports {
		if p.Container == container && p.Protocol != "udp" {
			return p.Host, true
		}
	}
	return 0, false
}

// Mount returns the volume mounted at target, or false.
func (s Service) Mount(target string) (Volume, bool) {
	for _, v := range s.Volumes {
		if v.Target == target {
			return v, true
		}
	}
	return Volume{}, false
}
