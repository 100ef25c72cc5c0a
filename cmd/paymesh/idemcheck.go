package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/paymesh/paymesh/pkg/idemcheck"
)

type idemcheckCmd struct {
	Config  string        `required:"" type:"existingfile" help:"The kit's config: the request, its key, how to read its effects back (deploy/idemcheck/paymesh.yaml for paymesh)."`
	MaxWait time.Duration `default:"0s" help:"The longest the expiry case may wait for a key to expire (0: it skips)."`
	URLs    []string      `arg:"" name:"url" help:"The API's base URL; a second one (another region of the same API) is where a retry goes in other_region."`
}

// configError is a config the kit cannot use: exit 2, apart from a case
// that failed (exit 1).
type configError struct{ error }

func (configError) ExitCode() int { return 2 }

func (c *idemcheckCmd) Run(ctx context.Context) error {
	cfg, err := idemcheck.LoadConfig(c.Config)
	if err != nil {
		return configError{err}
	}
	for _, u := range c.URLs {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return configError{fmt.Errorf("idemcheck: URL %q: want http(s)://host[:port]", u)}
		}
	}
	if idemcheck.Failed(idemcheck.Run(ctx, cfg, idemcheck.Options{URLs: c.URLs, MaxWait: c.MaxWait}, os.Stdout)) {
		return errFailed
	}
	return nil
}
