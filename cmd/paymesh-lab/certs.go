package main

import (
	"fmt"
	"os"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/certs"
)

// certsCmd makes the development PKI of docker-compose.yml and the
// simulation: a CA and a certificate for the hub, each region's cluster
// and each region's Postgres (internal/lab/certs).
type certsCmd struct {
	Dir   string `name:"dir" env:"PAYMESH_CERTS_DIR" required:"" help:"Folder for ca.pem and each server's <name>.pem and <name>-key.pem (the volume the servers mount)."`
	CADir string `name:"ca-dir" env:"PAYMESH_CERTS_CA_DIR" help:"Folder for the CA's key, apart from --dir (default: --dir). An existing CA there is kept, so servers started earlier stay trusted."`
}

// Run writes the files and lists them.
func (c *certsCmd) Run(table regions.Table) error {
	m, err := certs.Make(certs.Options{Dir: c.Dir, CADir: c.CADir}, certs.Servers(table))
	if err != nil {
		return err
	}
	ca := "kept the CA of an earlier run"
	if m.NewCA {
		ca = "made a new CA"
	}
	fmt.Fprintf(os.Stdout, "certs: %s; wrote %d files (valid %s):\n", ca, len(m.Files), certs.Validity)
	for _, f := range m.Files {
		fmt.Fprintf(os.Stdout, "  %s\n", f)
	}
	return nil
}
