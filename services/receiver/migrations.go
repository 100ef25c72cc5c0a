package receiver

import (
	"embed"
	"io/fs"

	"github.com/paymesh/paymesh/platform/pgdb"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the receiver's migration set: its inbox and the toy
// shop's tables, in the receiver's own database.
func Migrations() pgdb.Migration {
	sub, _ := fs.Sub(migrations, "migrations") // cannot fail: the path is embedded
	return pgdb.Migration{FS: sub, Table: "receiver_schema_version"}
}
