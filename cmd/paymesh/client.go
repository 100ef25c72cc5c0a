package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// apiClient holds the flags of the client commands.
type apiClient struct {
	APIURL string `name:"api-url" env:"PAYMESH_API_URL" default:"http://127.0.0.1:8101" help:"Any region's API."`
	APIKey string `name:"api-key" env:"PAYMESH_API_KEY" required:"" help:"Your API key (paymesh client prints one)."`
}

func (a apiClient) client() *api.Client { return &api.Client{BaseURL: a.APIURL, APIKey: a.APIKey} }

// show prints an API answer, or its problem, and fails on a problem.
func show(r api.Response, err error) error {
	if len(r.Body) > 0 {
		fmt.Println(string(r.Body))
	}
	if r.Replayed {
		fmt.Fprintln(os.Stderr, "(replayed: the first response to this Idempotency-Key)")
	}
	if err != nil && len(r.Body) == 0 {
		return err
	}
	if err != nil {
		return errFailed
	}
	return nil
}

type accountsCmd struct {
	Create struct {
		apiClient
		Currency string `required:"" help:"ISO 4217 currency."`
		Region   string `help:"Home region (default: the region of --api-url)."`
		Floor    int64  `help:"Lowest balance allowed (0: no overdraft)."`
		Key      string `help:"Idempotency-Key (default: a new random one, printed, reused on retries): the key opens one account, whichever region a retry reaches."`
		labelFlags
	} `cmd:"" help:"Open an account; retries safely on network errors."`
	Show struct {
		apiClient
		ID      string `arg:"" help:"Account id."`
		Entries bool   `help:"Show its change-log instead."`
		After   int64  `help:"With --entries: start after this version."`
		AsOf    string `name:"as-of" help:"Its balance at this instant instead (RFC 3339)."`
	} `cmd:"" help:"Show an account, from any region."`
	List struct {
		apiClient
		Currency string `help:"Only accounts in this currency."`
		Limit    int    `help:"Accounts per page (1 to 500)." default:"20"`
		Cursor   string `help:"The next_cursor of the page before."`
		labelFilters
	} `cmd:"" help:"List your accounts in every region, newest first, a page at a time."`
	Statement struct {
		apiClient
		ID    string `arg:"" help:"Account id."`
		From  string `required:"" help:"Start of the period (RFC 3339)."`
		To    string `help:"End of the period, excluded (RFC 3339; default: now)."`
		After int64  `help:"Start after this version (next_after of the page before)."`
	} `cmd:"" help:"An account's statement over a period: opening and closing balance, and the entries in between."`
	Close    accountActionCmd `cmd:"" help:"Close an account for good: it needs a zero balance, no open hold and nothing on its way out."`
	Freeze   accountActionCmd `cmd:"" help:"Stop an account's debits; credits still land."`
	Unfreeze accountActionCmd `cmd:"" help:"Let a frozen account's debits through again."`
}

// labelFlags are a request's reference and metadata.
type labelFlags struct {
	Reference string            `help:"Your own ID of it (an order or payment ID): unique among yours in its region."`
	Metadata  map[string]string `help:"Metadata to keep with it, key=value (repeat the flag, or separate pairs with ';')."`
}

// labelFilters select a list by reference and metadata.
type labelFilters struct {
	Reference string            `help:"Only those with this reference."`
	Metadata  map[string]string `help:"Only those whose metadata has key=value (repeat for several keys: all of them)."`
}

// set adds the filters to q, metadata as metadata[key]=value.
func (f labelFilters) set(q url.Values) url.Values {
	if f.Reference != "" {
		q.Set("reference", f.Reference)
	}
	for k, v := range f.Metadata {
		q.Set("metadata["+k+"]", v)
	}
	return q
}

// accountActionCmd is a close, freeze or unfreeze of an account.
type accountActionCmd struct {
	apiClient
	ID  string `arg:"" help:"Account id."`
	Key string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
}

func (c *accountsCmd) Run(ctx context.Context, k *kong.Context) error {
	switch k.Command() {
	case "accounts create":
		cr := c.Create
		req := api.AccountRequest{Currency: cr.Currency, Region: cr.Region, Floor: cr.Floor, Reference: cr.Reference, Metadata: cr.Metadata}
		return show(cr.client().CreateAccount(ctx, req, idemKey(cr.Key)))
	case "accounts list":
		q := c.List.set(given(map[string]string{"limit": strconv.Itoa(c.List.Limit), "currency": c.List.Currency, "cursor": c.List.Cursor}))
		return show(c.List.client().Get(ctx, "/v1/accounts?"+q.Encode()))
	case "accounts close <id>":
		return show(c.Close.client().AccountAction(ctx, c.Close.ID, "close", idemKey(c.Close.Key)))
	case "accounts freeze <id>":
		return show(c.Freeze.client().AccountAction(ctx, c.Freeze.ID, "freeze", idemKey(c.Freeze.Key)))
	case "accounts unfreeze <id>":
		return show(c.Unfreeze.client().AccountAction(ctx, c.Unfreeze.ID, "unfreeze", idemKey(c.Unfreeze.Key)))
	case "accounts statement <id>":
		q := given(map[string]string{"from": c.Statement.From, "to": c.Statement.To})
		if c.Statement.After > 0 {
			q.Set("after", strconv.FormatInt(c.Statement.After, 10))
		}
		return show(c.Statement.client().Get(ctx, "/v1/accounts/"+url.PathEscape(c.Statement.ID)+"/statement?"+q.Encode()))
	default:
		path := "/v1/accounts/" + url.PathEscape(c.Show.ID)
		switch {
		case c.Show.Entries && c.Show.AsOf != "":
			return errors.New("--entries and --as-of: choose one")
		case c.Show.Entries:
			path += fmt.Sprintf("/entries?after=%d", c.Show.After)
		case c.Show.AsOf != "":
			path += "?as_of=" + url.QueryEscape(c.Show.AsOf)
		}
		return show(c.Show.client().Get(ctx, path))
	}
}

type transfersCmd struct {
	Send struct {
		apiClient
		From     string `required:"" help:"Your source account."`
		To       string `required:"" help:"Destination account, in any region."`
		Amount   string `required:"" help:"Integer minor units (cents)."`
		Currency string `required:"" help:"ISO 4217 currency."`
		Key      string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
		Hold     bool   `help:"Authorize only: reserve the amount until a capture, a void or the expiry."`
		Expires  string `help:"With --hold: when it expires (RFC 3339, or a duration from now such as 30m; default 7 days)."`
		labelFlags
	} `cmd:"" help:"Send a transfer (or a hold); retries safely on network errors."`
	Show struct {
		apiClient
		ID string `arg:"" help:"Transfer id."`
	} `cmd:"" help:"Show a transfer's status and legs, from any region."`
	List struct {
		apiClient
		Account     string `help:"Only transfers from or to this account of yours."`
		Status      string `help:"Only transfers in this status (COMPLETED, HELD, ...)."`
		CreatedFrom string `name:"created-from" help:"Only transfers created at or after this instant (RFC 3339)."`
		CreatedTo   string `name:"created-to" help:"Only transfers created before this instant (RFC 3339)."`
		Limit       int    `help:"Transfers per page (1 to 500)." default:"20"`
		Cursor      string `help:"The next_cursor of the page before."`
		labelFilters
	} `cmd:"" help:"List your transfers in every region, newest first, a page at a time."`
	Capture struct {
		apiClient
		ID     string `arg:"" help:"Hold id."`
		Amount string `help:"Integer minor units to capture (default: all of the hold)."`
		Key    string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Capture a hold of yours, all of it or an amount; the rest is released."`
	Void struct {
		apiClient
		ID  string `arg:"" help:"Hold id."`
		Key string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Release a hold of yours."`
	Refund struct {
		apiClient
		ID     string `arg:"" help:"Id of the transfer paid into your account."`
		Amount string `help:"Integer minor units to give back (default: all that is still refundable)."`
		Key    string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Refund a transfer paid into your account, in part or whole."`
}

func (c *transfersCmd) Run(ctx context.Context, k *kong.Context) error {
	switch k.Command() {
	case "transfers show <id>":
		return show(c.Show.client().Get(ctx, "/v1/transfers/"+c.Show.ID))
	case "transfers list":
		l := c.List
		q := l.set(given(map[string]string{"limit": strconv.Itoa(l.Limit), "account": l.Account, "status": l.Status,
			"created_gte": l.CreatedFrom, "created_lt": l.CreatedTo, "cursor": l.Cursor}))
		return show(l.client().Get(ctx, "/v1/transfers?"+q.Encode()))
	case "transfers capture <id>":
		amount, err := optionalAmount(c.Capture.Amount)
		if err != nil {
			return err
		}
		return show(c.Capture.client().Capture(ctx, c.Capture.ID, amount, idemKey(c.Capture.Key)))
	case "transfers void <id>":
		return show(c.Void.client().Void(ctx, c.Void.ID, idemKey(c.Void.Key)))
	case "transfers refund <id>":
		amount, err := optionalAmount(c.Refund.Amount)
		if err != nil {
			return err
		}
		return show(c.Refund.client().Refund(ctx, c.Refund.ID, amount, idemKey(c.Refund.Key)))
	}
	s := c.Send
	amount, err := ledger.ParseAmount(s.Amount)
	if err != nil {
		return err
	}
	req := api.TransferRequest{From: s.From, To: s.To, Amount: amount, Currency: s.Currency, Hold: s.Hold,
		Reference: s.Reference, Metadata: s.Metadata}
	if s.Expires != "" {
		if !s.Hold {
			return errors.New("--expires belongs to a hold (--hold)")
		}
		at, err := time.Parse(time.RFC3339, s.Expires)
		if err != nil {
			d, derr := time.ParseDuration(s.Expires)
			if derr != nil {
				return fmt.Errorf("--expires %q is neither an RFC 3339 time nor a duration", s.Expires)
			}
			at = time.Now().Add(d)
		}
		req.ExpiresAt = &at
	}
	return show(s.client().SendTransfer(ctx, req, idemKey(s.Key)))
}

// idemKey returns key, or a new random one, printed so that a retry by
// hand can reuse it.
func idemKey(key string) string {
	if key == "" {
		key = api.NewIdempotencyKey()
		fmt.Fprintf(os.Stderr, "Idempotency-Key: %s\n", key)
	}
	return key
}

// given returns the query of the parameters that have a value.
func given(params map[string]string) url.Values {
	q := url.Values{}
	for k, v := range params {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// optionalAmount parses an amount flag; empty is 0 (all).
func optionalAmount(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := ledger.ParseAmount(s)
	if err == nil && n <= 0 {
		err = ledger.Errorf(ledger.CodeInvalidAmount, "amount %d must be positive", n)
	}
	return n, err
}

type eventsCmd struct {
	List struct {
		apiClient
		After string   `help:"The next_cursor of the page before: the feed after it."`
		Type  []string `help:"Only events of these types (transfer.completed, account.frozen, ...; several: comma-separated)."`
		Limit int      `help:"Events per page (1 to 500)." default:"20"`
	} `cmd:"" help:"Read your events in every region, oldest first, a page at a time; follow the feed with its next_cursor."`
}

func (c *eventsCmd) Run(ctx context.Context) error {
	l := c.List
	q := given(map[string]string{"limit": strconv.Itoa(l.Limit), "after": l.After, "type": strings.Join(l.Type, ",")})
	return show(l.client().Get(ctx, "/v1/events?"+q.Encode()))
}

type webhooksCmd struct {
	Create struct {
		apiClient
		URL  string   `arg:"" help:"Where to post the events (https; plain http only to a host the operator allowed)."`
		Type []string `help:"Only events of these types (several: comma-separated; default every type)."`
		Key  string   `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
		// SecretFile hands the secret to a receiver that reads it
		// (paymesh receiver --secret-file), as docker-compose does.
		SecretFile string `name:"secret-file" type:"path" help:"Also write the signing secret to this file (mode 0600), for a receiver started with --secret-file."`
	} `cmd:"" help:"Receive your events at a URL, signed; prints the signing secret, shown this once."`
	List struct {
		apiClient
	} `cmd:"" help:"List your webhook endpoints, without their secrets."`
	Show struct {
		apiClient
		ID string `arg:"" help:"Endpoint id."`
	} `cmd:"" help:"Show a webhook endpoint."`
	Attempts struct {
		apiClient
		ID     string `arg:"" help:"Endpoint id."`
		Event  string `help:"Only the attempts of this event (its id)."`
		Limit  int    `help:"Attempts per page (1 to 500)." default:"20"`
		Cursor string `help:"The next_cursor of the page before."`
	} `cmd:"" help:"Every delivery attempt to an endpoint, newest first: when, how long, what came back."`
	Rotate struct {
		apiClient
		ID string `arg:"" help:"Endpoint id."`
	} `cmd:"" help:"Give an endpoint a new signing secret; the old one keeps signing beside it for 24 hours."`
	Delete struct {
		apiClient
		ID string `arg:"" help:"Endpoint id."`
	} `cmd:"" help:"Delete a webhook endpoint."`
	Redeliver struct {
		apiClient
		Event    string `arg:"" help:"Event id (<account>.<sequence>)."`
		Endpoint string `help:"Only to this endpoint (default: every endpoint that takes the event)."`
	} `cmd:"" help:"Send an event again."`
}

// writeSecret writes the signing secret of a created endpoint (body, the
// API's answer) to path, readable by its owner alone.
func writeSecret(path string, body []byte) error {
	var e api.WebhookEndpointBody
	if err := json.Unmarshal(body, &e); err != nil || e.Secret == "" {
		return fmt.Errorf("the endpoint's answer holds no secret to write to %s", path)
	}
	if err := os.WriteFile(path, []byte(e.Secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("write the secret: %w", err)
	}
	return nil
}

func (c *webhooksCmd) Run(ctx context.Context, k *kong.Context) error {
	const base = "/v1/webhook_endpoints"
	switch k.Command() {
	case "webhooks create <url>":
		cr := c.Create
		r, err := cr.client().CreateWebhookEndpoint(ctx, api.WebhookEndpointRequest{URL: cr.URL, Types: splitAll(cr.Type)}, idemKey(cr.Key))
		if err == nil && cr.SecretFile != "" {
			err = writeSecret(cr.SecretFile, r.Body)
		}
		return show(r, err)
	case "webhooks list":
		return show(c.List.client().Get(ctx, base))
	case "webhooks show <id>":
		return show(c.Show.client().Get(ctx, base+"/"+url.PathEscape(c.Show.ID)))
	case "webhooks attempts <id>":
		a := c.Attempts
		q := given(map[string]string{"limit": strconv.Itoa(a.Limit), "event": a.Event, "cursor": a.Cursor})
		return show(a.client().Get(ctx, base+"/"+url.PathEscape(a.ID)+"/attempts?"+q.Encode()))
	case "webhooks rotate <id>":
		return show(c.Rotate.client().PostOnce(ctx, base+"/"+url.PathEscape(c.Rotate.ID)+"/rotate_secret", nil))
	case "webhooks delete <id>":
		return show(c.Delete.client().Delete(ctx, base+"/"+url.PathEscape(c.Delete.ID)))
	case "webhooks redeliver <event>":
		r := c.Redeliver
		body, _ := json.Marshal(api.RedeliverRequest{Endpoint: r.Endpoint})
		return show(r.client().PostOnce(ctx, "/v1/events/"+url.PathEscape(r.Event)+"/redeliver", body))
	}
	return fmt.Errorf("unknown command %q", k.Command())
}

// splitAll splits each of vs at its commas.
func splitAll(vs []string) []string {
	var out []string
	for _, v := range vs {
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}
