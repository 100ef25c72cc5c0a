package dedup

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the consume-log's numbered SQL migrations, to be applied
// with the version table MigrationTable.
func Migrations() fs.FS {
	sub, _ := fs.Sub(migrations, "migrations") // cannot fail: the path is embedded
	return sub
}

// MigrationTable records which consume-log migrations are applied.
const MigrationTable = "dedup_schema_version"
