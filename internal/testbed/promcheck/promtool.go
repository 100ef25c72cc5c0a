package promcheck

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// promtool runs promtool with args and returns an error quoting its output
// when it fails.
func promtool(ctx context.Context, args ...string) error {
	bin, err := exec.LookPath(PromtoolBinary)
	if err != nil {
		return fmt.Errorf("promcheck: %w (scripts/prometheus installs Debian's prometheus package)", err)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("promcheck: promtool %s: %w:\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// CheckConfig runs `promtool check config` on a Prometheus config (which
// also checks the rule files it names). It returns an error quoting
// promtool when the config is invalid.
func CheckConfig(ctx context.Context, path string) error {
	return promtool(ctx, "check", "config", path)
}

// CheckRules runs `promtool check rules` on rule files. It returns an
// error quoting promtool when a rule is invalid.
func CheckRules(ctx context.Context, paths ...string) error {
	return promtool(ctx, append([]string{"check", "rules"}, paths...)...)
}

// TestRules runs `promtool test rules` on rule unit-test files. It returns
// an error quoting promtool when a test fails.
func TestRules(ctx context.Context, paths ...string) error {
	return promtool(ctx, append([]string{"test", "rules"}, paths...)...)
}
