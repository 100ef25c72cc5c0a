package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
)

// wanCmd runs one region's WAN link: a TCP proxy between the region's
// nats-server and the hub, shaped like the network between regions, with
// its control API.
type wanCmd struct {
	Link      string        `env:"PAYMESH_WAN_LINK" help:"Region whose link to the hub this is: picks the default latency from the region table's wan round trips, and the default ports."`
	Listen    string        `env:"PAYMESH_WAN_LISTEN" help:"Address to accept the region's leafnode connections on (default: 127.0.0.1:<the region's wan_port>)."`
	Target    string        `env:"PAYMESH_WAN_TARGET" help:"The hub's leafnode address (default: 127.0.0.1:<hub leaf_port>)."`
	Control   string        `env:"PAYMESH_WAN_CONTROL" help:"Address of the control API (GET /, POST /cut, /heal, /latency) (default: 127.0.0.1:<the region's wan_control_port>); 'off' for none."`
	Latency   string        `env:"PAYMESH_WAN_LATENCY" help:"One-way latency in each direction, such as 40ms (default: the table's one-way delay of the region's link; 0 for none)."`
	Jitter    time.Duration `env:"PAYMESH_WAN_JITTER" help:"Latency spread: each chunk waits latency±jitter, uniformly (bytes are never reordered)."`
	ResetRate float64       `name:"reset-rate" env:"PAYMESH_WAN_RESET_RATE" help:"Connection resets per second on the link, each on a random live connection."`
}

// resolve returns the link's listen, target and control addresses and its
// shape, from the flags and the region table. It returns an error that
// names the flag at fault.
func (c *wanCmd) resolve(t regions.Table) (listen, target, control string, shape faultproxy.Shape, err error) {
	listen, target, control = c.Listen, c.Target, c.Control
	if target == "" {
		target = "127.0.0.1:" + strconv.Itoa(t.Hub.LeafPort)
	}
	if c.Link != "" {
		reg, ok := t.Get(c.Link)
		if !ok {
			return "", "", "", shape, fmt.Errorf("--link %q: unknown region (the region table has %s)", c.Link, strings.Join(t.Names(), ", "))
		}
		shape.Latency = t.LinkDelay(reg.Name)
		if listen == "" {
			listen = "127.0.0.1:" + strconv.Itoa(reg.WANPort)
		}
		if control == "" {
			control = "127.0.0.1:" + strconv.Itoa(reg.WANControlPort)
		}
	}
	if listen == "" {
		return "", "", "", shape, errors.New("--listen: no address, and no --link to take the region's wan_port from")
	}
	if control == "" {
		return "", "", "", shape, errors.New("--control: no address, and no --link to take the region's wan_control_port from ('off' for none)")
	}
	if c.Latency != "" {
		if shape.Latency, err = time.ParseDuration(c.Latency); err != nil {
			return "", "", "", shape, fmt.Errorf("--latency %q: want a duration such as 40ms", c.Latency)
		}
	}
	shape.Jitter, shape.ResetRate = c.Jitter, c.ResetRate
	if err := shape.Validate(); err != nil {
		return "", "", "", shape, fmt.Errorf("bad link shape: %w", err)
	}
	return listen, target, control, shape, nil
}

func (c *wanCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	listen, target, control, shape, err := c.resolve(t)
	if err != nil {
		return err
	}
	p, err := faultproxy.Listen(listen, target)
	if err != nil {
		return err
	}
	defer p.Close()
	p.SetShape(shape)
	controlURL := "off"
	errc := make(chan error, 1)
	if control != "off" {
		ln, err := net.Listen("tcp", control)
		if err != nil {
			return fmt.Errorf("control API: %w", err)
		}
		srv := &http.Server{Handler: faultproxy.Handler(p), ReadHeaderTimeout: 5 * time.Second}
		defer srv.Close()
		go func() { errc <- srv.Serve(ln) }()
		controlURL = "http://" + ln.Addr().String()
	}
	log.Info("wan link up", "link", c.Link, "listen", p.Addr(), "target", target, "control", controlURL, "shape", shape.String())
	select {
	case <-ctx.Done():
		st := p.Status()
		log.Info("wan link down", "link", c.Link, "accepted", st.Accepted, "resets", st.Resets)
		return nil
	case err := <-errc:
		return fmt.Errorf("control API: %w", err)
	}
}
