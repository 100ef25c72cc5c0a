package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// volumesDir is the run folder's subfolder of compose's named volumes,
// one folder each (volumes/<name>), shared by every service that mounts
// the volume, as in compose.
const volumesDir = "volumes"

// mounts returns where the simulation keeps each mount of a service, by
// its target inside the container: a bind's source, or a named volume's
// folder in the run folder (created here). Other mounts (tmpfs) are not
// given: their paths stay as they are.
func (s *sim) mounts(name string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range s.plan.project.Services[name].Volumes {
		switch v.Type {
		case "bind":
			out[v.Target] = v.Source
		case "volume":
			dir := filepath.Join(s.dir, volumesDir, v.Source)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("sim: %s: volume %s: %w", name, v.Source, err)
			}
			out[v.Target] = dir
		}
	}
	return out, nil
}

// mapPaths rewrites, in text (an argument, a variable's value or a whole
// config file), every path under a mount target of m to the same path
// under its host folder: "/certs/ca.pem" with /certs mounted from the
// volume certs becomes "<run>/volumes/certs/ca.pem". A target matches only
// where a value starts (after the start, a space, a quote, "=" or ",") and
// where a path element ends (before the end, "/", a space, a quote, "," or
// "&"), so "/certs" never matches inside "/etc/certs" or "/certs2".
func mapPaths(m map[string]string, text string) string {
	norm := make(map[string]string, len(m))
	targets := make([]string, 0, len(m))
	for t, host := range m {
		t = strings.TrimRight(t, "/")
		norm[t] = host
		targets = append(targets, t)
	}
	// Longest first, so that /certs/extra wins over /certs.
	slices.SortFunc(targets, func(a, b string) int { return len(b) - len(a) })
	quoted := make([]string, len(targets))
	for i, t := range targets {
		quoted[i] = regexp.QuoteMeta(t)
	}
	if len(quoted) == 0 {
		return text
	}
	re := regexp.MustCompile(`(?:^|[\s"'=,])(` + strings.Join(quoted, "|") + `)`)
	var b strings.Builder
	last := 0
	for _, loc := range re.FindAllStringSubmatchIndex(text, -1) {
		start, end := loc[2], loc[3]
		if end < len(text) && !strings.ContainsRune("/ \t\n\"',&", rune(text[end])) {
			continue // a longer name: /certs2
		}
		b.WriteString(text[last:start])
		b.WriteString(norm[text[start:end]])
		last = end
	}
	b.WriteString(text[last:])
	return b.String()
}

// mappedPaths returns a copy of values with mapPaths applied to each.
func mappedPaths(m map[string]string, values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = mapPaths(m, v)
	}
	return out
}
