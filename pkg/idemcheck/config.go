package idemcheck

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config says how to talk to the API under test: the request that makes
// an effect, how a key is sent, and how the effects are counted.
type Config struct {
	// Request is the idempotent request: its method, path and body. The
	// body's {{unique}} is replaced by a value new to each case (and
	// another for the case's "other body"), so that each case's effects
	// can be told apart.
	Request Request `yaml:"request"`
	// OtherResource is a second idempotent request, on another resource,
	// for the case that reuses a key there (optional: the case skips).
	OtherResource *Request `yaml:"other_resource"`
	// Headers are sent with every request (authentication, say). A value's
	// ${NAME} is the environment variable NAME, which must be set.
	Headers map[string]string `yaml:"headers"`
	// Key is how the API takes its Idempotency-Key.
	Key Key `yaml:"key"`
	// Effects counts the effects of one {{unique}}: a GET whose JSON
	// answer holds them in an array.
	Effects Effects `yaml:"effects"`
	// Settle is how long an effect may take to show after its answer (an
	// API that applies asynchronously), and how long the count is watched
	// for a second effect (default 2s).
	Settle Duration `yaml:"settle"`
	// Concurrency is how many identical requests the concurrent case sends
	// at once (default 16).
	Concurrency int `yaml:"concurrency"`
	// Timeout is the client's deadline in the timeout-then-retry case: the
	// first request is abandoned after it (default 1ms, so that it is cut
	// before its answer).
	Timeout Duration `yaml:"timeout"`
}

// Request is one request template.
type Request struct {
	Method string `yaml:"method"`
	Path   string `yaml:"path"`
	Body   string `yaml:"body"`
}

// Key is the API's Idempotency-Key contract.
type Key struct {
	// Header is the header's name (default Idempotency-Key).
	Header string `yaml:"header"`
	// Required says whether a request without a key is refused (4xx);
	// when false, the missing-key case skips.
	Required bool `yaml:"required"`
	// MaxLength is the longest key accepted; one longer must be refused.
	MaxLength int `yaml:"max_length"`
	// Expiry is how long a key is kept (0: as long as its effect). After
	// it the key may be used again; the expiry case waits that long when
	// it is within the --max-wait given.
	Expiry Duration `yaml:"expiry"`
}

// Effects is the read-back of a case's effects.
type Effects struct {
	// Path is a GET path whose {{unique}} is the case's value.
	Path string `yaml:"path"`
	// Items names the answer's JSON field that holds the effects' array
	// ("" when the answer is the array itself).
	Items string `yaml:"items"`
}

// Duration is a time.Duration written as "250ms", "24h".
type Duration time.Duration

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (for example 2s, 24h)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// ErrConfig is returned, wrapped, for a config that cannot be used.
var ErrConfig = errors.New("idemcheck: config")

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// LoadConfig reads and checks a config file, with the environment's values
// in place of its ${NAME}s. It returns an error wrapping ErrConfig naming
// what is wrong: the file unreadable, bad YAML, an unknown field, a
// required field missing, a variable not set.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var missing []string
	text := envRef.ReplaceAllStringFunc(string(b), func(ref string) string {
		name := envRef.FindStringSubmatch(ref)[1]
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return Config{}, fmt.Errorf("%w: %s: environment variables not set: %s", ErrConfig, path, strings.Join(missing, ", "))
	}
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	if err := c.check(); err != nil {
		return Config{}, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
	}
	return c, nil
}

// check fills the defaults and refuses what cannot work.
func (c *Config) check() error {
	if err := c.Request.check("request"); err != nil {
		return err
	}
	if !strings.Contains(c.Request.Body, uniqueMark) {
		return fmt.Errorf("request.body has no %s: the cases' effects could not be told apart", uniqueMark)
	}
	if c.OtherResource != nil {
		if err := c.OtherResource.check("other_resource"); err != nil {
			return err
		}
	}
	if c.Effects.Path == "" || !strings.HasPrefix(c.Effects.Path, "/") || !strings.Contains(c.Effects.Path, uniqueMark) {
		return fmt.Errorf("effects.path %q: want a path starting with / that holds %s", c.Effects.Path, uniqueMark)
	}
	if c.Key.Header == "" {
		c.Key.Header = "Idempotency-Key"
	}
	if c.Key.MaxLength < 1 {
		return fmt.Errorf("key.max_length %d: want the longest key the API accepts (the draft suggests 255)", c.Key.MaxLength)
	}
	if c.Settle == 0 {
		c.Settle = Duration(2 * time.Second)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Concurrency < 2 || c.Concurrency > 256 {
		return fmt.Errorf("concurrency %d: want 2 to 256", c.Concurrency)
	}
	if c.Timeout == 0 {
		c.Timeout = Duration(time.Millisecond)
	}
	return nil
}

func (r Request) check(field string) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return fmt.Errorf("%s.method %q: want POST, PUT or PATCH", field, r.Method)
	}
	if !strings.HasPrefix(r.Path, "/") {
		return fmt.Errorf("%s.path %q: want a path starting with /", field, r.Path)
	}
	return nil
}
