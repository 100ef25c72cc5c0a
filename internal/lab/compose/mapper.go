package compose

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// loopback is the host address a published port is reached on.
const loopback = "127.0.0.1"

// Mapper rewrites the addresses services use inside the compose network
// ("postgres-eu-1:5432", "nats://nats-eu:4222", "http://api-eu:8101") to the
// loopback addresses their published ports have on the host, and listen
// addresses on every interface ("0.0.0.0:9101") to loopback.
type Mapper struct {
	project string
	// to maps "service:container-port" to "host:port".
	to map[string]string
	// services are the names of the project's services.
	services map[string]bool
	// addrRE finds a service's or 0.0.0.0's host:port inside a value.
	addrRE *regexp.Regexp
}

// Mapper returns a Mapper for the project's published ports, plus extra
// mappings for the ports of services that publish none (for example
// "nats-hub:7422" to "127.0.0.1:7422"; an extra mapping wins over a
// published port). It returns an error when an extra key is not
// "service:port" of a service of the project, or its value is not
// host:port.
func (p *Project) Mapper(extra map[string]string) (*Mapper, error) {
	m := &Mapper{project: p.Name, to: map[string]string{}, services: map[string]bool{}}
	for name, s := range p.Services {
		m.services[name] = true
		for _, port := range s.Ports {
			if port.Protocol != "udp" {
				m.to[name+":"+strconv.Itoa(port.Container)] = net.JoinHostPort(loopback, strconv.Itoa(port.Host))
			}
		}
	}
	for from, to := range extra {
		h, _, err := splitPort(from)
		if err != nil || !m.services[h] {
			return nil, fmt.Errorf("compose: extra mapping %q: want service:port of a service of project %s", from, p.Name)
		}
		if _, _, err := splitPort(to); err != nil {
			return nil, fmt.Errorf("compose: extra mapping %s=%q: want host:port", from, to)
		}
		m.to[from] = to
	}
	// A name matches only when followed by ":port" and not preceded by a
	// name character, so "nats" never matches inside "nats-eu" or "my-nats".
	names := []string{regexp.QuoteMeta("0.0.0.0")}
	for n := range m.services {
		names = append(names, regexp.QuoteMeta(n))
	}
	sort.Strings(names)
	m.addrRE = regexp.MustCompile(`(^|[^A-Za-z0-9_.-])(` + strings.Join(names, "|") + `):([0-9]+)`)
	return m, nil
}

// Addr rewrites one address: host:port, ":port", or a URL with a host and
// port (the rest of the URL is kept as it is). It returns an error when the
// address has no port, when its host is not a service of the project (or
// 0.0.0.0), or when the service does not publish that port and no extra
// mapping covers it.
func (m *Mapper) Addr(addr string) (string, error) {
	start, end := 0, len(addr)
	if i := strings.Index(addr, "://"); i >= 0 {
		start = i + 3
		if j := strings.IndexAny(addr[start:], "/?#"); j >= 0 {
			end = start + j
		}
		if at := strings.LastIndex(addr[start:end], "@"); at >= 0 {
			start += at + 1
		}
	}
	h, p, err := splitPort(addr[start:end])
	if err != nil {
		return "", fmt.Errorf("compose: address %q: want host:port or a URL with one", addr)
	}
	to, err := m.hostPort("", h, p)
	if err != nil {
		return "", fmt.Errorf("compose: address %q: %w", addr, err)
	}
	return addr[:start] + to + addr[end:], nil
}

// Env returns a copy of env in which every value that holds a service's
// host:port or a 0.0.0.0 listen address has it rewritten (lists such as
// "eu=http://api-eu:8101,us=http://api-us:8102" included); other values
// are copied as they are. It returns an error naming the variable when a
// service's port is neither published nor mapped.
func (m *Mapper) Env(env map[string]string) (map[string]string, error) {
	out, err := m.env("", env)
	if err != nil {
		return nil, fmt.Errorf("compose: %w", err)
	}
	return out, nil
}

// ServiceEnv is Env for the environment of service s, in which a 0.0.0.0
// listen address is s's own port: it maps to where that port of s is
// published or mapped ("wan-eu:7422" mapped to "127.0.0.1:7401" makes
// wan-eu's "0.0.0.0:7422" "127.0.0.1:7401"), and to 127.0.0.1 on the same
// port when it is neither.
func (m *Mapper) ServiceEnv(s Service) (map[string]string, error) {
	env, err := m.env(s.Name, s.Environment)
	if err != nil {
		return nil, fmt.Errorf("compose: service %s: %w", s.Name, err)
	}
	return env, nil
}

// Text rewrites every service host:port and 0.0.0.0 listen address in s,
// a value or a whole config file (a nats-server config's leafnode remote
// "nats-leaf://...@wan-eu:7422", say), and leaves the rest as it is. It
// returns an error when a service's port is neither published nor mapped.
func (m *Mapper) Text(s string) (string, error) {
	out, err := m.text("", s)
	if err != nil {
		return "", fmt.Errorf("compose: %w", err)
	}
	return out, nil
}

// env maps env for service self ("" for none).
func (m *Mapper) env(self string, env map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(env))
	for k, v := range env {
		mapped, err := m.text(self, v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		out[k] = mapped
	}
	return out, nil
}

// text maps s for service self ("" for none).
func (m *Mapper) text(self, s string) (string, error) {
	var err error
	out := m.addrRE.ReplaceAllStringFunc(s, func(match string) string {
		sub := m.addrRE.FindStringSubmatch(match)
		to, e := m.hostPort(self, sub[2], sub[3])
		if e != nil {
			err = e
			return match
		}
		return sub[1] + to
	})
	return out, err
}

// hostPort maps one host and port; a listen address on every interface is
// one of service self's ports, when self is not "".
func (m *Mapper) hostPort(self, host, port string) (string, error) {
	switch {
	case (host == "" || host == "0.0.0.0" || host == "::") && m.to[self+":"+port] != "":
		return m.to[self+":"+port], nil
	case host == "" || host == "0.0.0.0" || host == "::":
		return net.JoinHostPort(loopback, port), nil
	case m.to[host+":"+port] != "":
		return m.to[host+":"+port], nil
	case m.services[host]:
		return "", fmt.Errorf("service %s publishes no port %s, and no extra mapping gives one", host, port)
	default:
		return "", fmt.Errorf("host %q is not a service of project %s", host, m.project)
	}
}

// splitPort splits host:port, requiring a numeric port.
func splitPort(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", err
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("port %q: want 1..65535", port)
	}
	return host, port, nil
}
