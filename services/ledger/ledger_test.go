package ledger_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
)

func mustIDs(tb testing.TB) (*idgen.Regions, func(region string) string) {
	tb.Helper()
	r, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2, "ap": 3})
	if err != nil {
		tb.Fatal(err)
	}
	gens := map[string]*idgen.Generator{}
	return r, func(region string) string {
		g := gens[region]
		if g == nil {
			if g, err = idgen.NewGenerator(r, region, 1); err != nil {
				tb.Fatal(err)
			}
			gens[region] = g
		}
		id, err := g.NextString()
		if err != nil {
			tb.Fatal(err)
		}
		return id
	}
}

func TestNext(t *testing.T) {
	tests := []struct {
		from ledger.Status
		ev   ledger.Event
		want ledger.Status
	}{
		{ledger.StatusPending, ledger.EventComplete, ledger.StatusCompleted},
		{ledger.StatusPending, ledger.EventDebit, ledger.StatusDebited},
		{ledger.StatusPending, ledger.EventReject, ledger.StatusRejected},
		{ledger.StatusDebited, ledger.EventConfirm, ledger.StatusCompleted},
		{ledger.StatusDebited, ledger.EventRefund, ledger.StatusRefunded},
		// Repeated, out-of-order and backward steps are illegal.
		{ledger.StatusCompleted, ledger.EventComplete, ""},
		{ledger.StatusDebited, ledger.EventDebit, ""},
		{ledger.StatusCompleted, ledger.EventRefund, ""},
		{ledger.StatusRefunded, ledger.EventConfirm, ""},
		{ledger.StatusPending, ledger.EventConfirm, ""},
		{ledger.StatusRejected, ledger.EventComplete, ""},
	}
	for _, tt := range tests {
		got, err := ledger.Next(tt.from, tt.ev)
		if tt.want == "" {
			if ledger.ErrorCode(err) != ledger.CodeIllegalTransition {
				t.Errorf("%s --%s-->: got %q %v, want illegal_transition", tt.from, tt.ev, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s --%s-->: got %q %v, want %s", tt.from, tt.ev, got, err, tt.want)
		}
	}
}

func TestDecodeCommand(t *testing.T) {
	_, id := mustIDs(t)
	good := ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: "c1", IdempotencyKey: "k1",
		From: id("eu"), To: id("eu"), Amount: 250, Currency: "EUR", CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	t.Run("OK", func(t *testing.T) {
		got, err := ledger.DecodeCommand(good.Encode())
		if err != nil || !reflect.DeepEqual(got, good) {
			t.Fatalf("got %+v %v, want %+v", got, err, good)
		}
	})
	withAmount := func(a string) []byte {
		return []byte(strings.Replace(string(good.Encode()), `"amount":250`, `"amount":`+a, 1))
	}
	bad := map[string]struct {
		in   []byte
		code ledger.Code
	}{
		"Fraction":      {withAmount("2.5"), ledger.CodeInvalidAmount},
		"Exponent":      {withAmount("1e3"), ledger.CodeInvalidAmount},
		"String":        {withAmount(`"250"`), ledger.CodeInvalidAmount},
		"Null":          {withAmount(`null`), ledger.CodeInvalidAmount},
		"OverInt64":     {withAmount("9223372036854775808"), ledger.CodeInvalidAmount},
		"UnknownField":  {[]byte(strings.Replace(string(good.Encode()), `{`, `{"memo":"x",`, 1)), ledger.CodeInvalidRequest},
		"TrailingData":  {append(good.Encode(), []byte(`{}`)...), ledger.CodeInvalidRequest},
		"NotJSON":       {[]byte("hello"), ledger.CodeInvalidRequest},
		"Oversize":      {[]byte(`{"type":"` + strings.Repeat("x", ledger.MaxCommandBytes) + `"}`), ledger.CodeInvalidRequest},
		"MissingAmount": {[]byte(strings.Replace(string(good.Encode()), `"amount":250,`, ``, 1)), ledger.CodeInvalidAmount},
		"FieldTwice":    {[]byte(strings.Replace(string(good.Encode()), `{`, `{"to":"`+id("eu")+`",`, 1)), ledger.CodeInvalidRequest},
		"AmountTwice":   {[]byte(strings.Replace(string(good.Encode()), `{`, `{"amount":1,`, 1)), ledger.CodeInvalidRequest},
		"NameCase":      {[]byte(strings.Replace(string(good.Encode()), `"currency"`, `"Currency"`, 1)), ledger.CodeInvalidRequest},
		"InvalidUTF8":   {[]byte(strings.Replace(string(good.Encode()), `"c1"`, "\"c\xff\"", 1)), ledger.CodeInvalidRequest},
		"Array":         {[]byte(`[1,2]`), ledger.CodeInvalidRequest},
	}
	for name, tt := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := ledger.DecodeCommand(tt.in)
			if got := ledger.ErrorCode(err); got != tt.code {
				t.Fatalf("got code %q (%v), want %q", got, err, tt.code)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ids, id := mustIDs(t)
	valid := func() ledger.Command {
		return ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: "c1", IdempotencyKey: "k1",
			From: id("eu"), To: id("eu"), Amount: 1, Currency: "EUR", CreatedAt: time.Now()}
	}
	now := time.Now()
	if err := valid().Validate("eu", ids, now); err != nil {
		t.Fatalf("valid command: %v", err)
	}
	fund := valid()
	fund.Type, fund.From = ledger.TypeFund, ""
	if err := fund.Validate("eu", ids, now); err != nil {
		t.Fatalf("valid fund command: %v", err)
	}
	same := valid()
	same.To = same.From
	tests := map[string]struct {
		mut  func(*ledger.Command)
		code ledger.Code
	}{
		"ZeroAmount":        {func(c *ledger.Command) { c.Amount = 0 }, ledger.CodeInvalidAmount},
		"NegativeAmount":    {func(c *ledger.Command) { c.Amount = -5 }, ledger.CodeInvalidAmount},
		"LowercaseCurrency": {func(c *ledger.Command) { c.Currency = "eur" }, ledger.CodeInvalidCurrency},
		"NoClient":          {func(c *ledger.Command) { c.ClientID = "" }, ledger.CodeInvalidRequest},
		"SlashInKey":        {func(c *ledger.Command) { c.IdempotencyKey = "a/b" }, ledger.CodeInvalidRequest},
		"LongKey":           {func(c *ledger.Command) { c.IdempotencyKey = strings.Repeat("k", 256) }, ledger.CodeInvalidRequest},
		"NoCreatedAt":       {func(c *ledger.Command) { c.CreatedAt = time.Time{} }, ledger.CodeInvalidRequest},
		"FutureCreatedAt":   {func(c *ledger.Command) { c.CreatedAt = time.Now().Add(time.Hour) }, ledger.CodeInvalidRequest},
		"BadFrom":           {func(c *ledger.Command) { c.From = "eu-nope" }, ledger.CodeInvalidRequest},
		"BadTransferID":     {func(c *ledger.Command) { c.TransferID = "" }, ledger.CodeInvalidRequest},
		"SourceElsewhere":   {func(c *ledger.Command) { c.From = id("us") }, ledger.CodeInvalidRequest},
		"TransferElsewhere": {func(c *ledger.Command) { c.TransferID, c.From = id("ap"), id("ap") }, ledger.CodeWrongRegion},
		"StepWithoutReason": {func(c *ledger.Command) { c.Type, c.To = ledger.TypeRefuse, id("us") }, ledger.CodeInvalidRequest},
		"ReasonOnTransfer":  {func(c *ledger.Command) { c.Reason = ledger.CodeAccountNotFound }, ledger.CodeInvalidRequest},
		"SameRegionCredit":  {func(c *ledger.Command) { c.Type = ledger.TypeCredit }, ledger.CodeInvalidRequest},
		"CreditElsewhere":   {func(c *ledger.Command) { c.Type, c.To = ledger.TypeCredit, id("us") }, ledger.CodeWrongRegion},
		"TransferIDOfOther": {func(c *ledger.Command) { c.TransferID = id("us") }, ledger.CodeInvalidRequest},
		"SameAccount":       {func(c *ledger.Command) { c.To = c.From }, ledger.CodeSameAccount},
		"FundWithFrom":      {func(c *ledger.Command) { c.Type = ledger.TypeFund }, ledger.CodeInvalidRequest},
		"UnknownType":       {func(c *ledger.Command) { c.Type = "steal" }, ledger.CodeInvalidRequest},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			c := valid()
			tt.mut(&c)
			if got := ledger.ErrorCode(c.Validate("eu", ids, now)); got != tt.code {
				t.Fatalf("got %q, want %q", got, tt.code)
			}
		})
	}
}

func TestPlanBatch(t *testing.T) {
	_, id := mustIDs(t)
	a, b, usd, closed, mint, hop := id("eu"), id("eu"), id("eu"), id("eu"), id("eu"), id("eu")
	accounts := map[string]ledger.Account{
		a:      {ID: a, ClientID: "c", Kind: ledger.KindCustomer, Currency: "EUR", Balance: 100, Version: 3},
		b:      {ID: b, ClientID: "c", Kind: ledger.KindCustomer, Currency: "EUR", Balance: ledger.NoFloor * -1 / 2, Floor: -50},
		usd:    {ID: usd, ClientID: "c", Kind: ledger.KindCustomer, Currency: "USD", Balance: 10},
		closed: {ID: closed, ClientID: "c", Kind: ledger.KindCustomer, Currency: "EUR", Closed: true},
		mint:   {ID: mint, ClientID: "paymesh", Kind: ledger.KindIssuance, Currency: "EUR", Floor: ledger.NoFloor},
		hop:    {ID: hop, ClientID: "paymesh", Kind: ledger.KindTransit, Currency: "EUR", Balance: 5, Floor: ledger.NoFloor},
	}
	b0 := accounts[b].Balance
	cmd := func(from, to string, amount int64) ledger.Command {
		return ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: "c", IdempotencyKey: id("eu"),
			From: from, To: to, Amount: amount, Currency: "EUR", CreatedAt: time.Now()}
	}
	ghost := id("eu")
	cmds := []ledger.Command{
		cmd(a, b, 60),     // ok: a 100 -> 40
		cmd(a, b, 41),     // a has 40: insufficient
		cmd(a, b, 40),     // exactly to the floor: ok, a -> 0
		cmd(b, a, b0+151), // b holds b0+100, floor -50: one short
		cmd(ghost, a, 1),  // unknown source
		cmd(a, ghost, 1),  // unknown destination
		cmd(a, usd, 1),    // currency mismatch
		cmd(a, closed, 1), // closed
		cmd(mint, a, 1),   // issuance is not a customer account
		{Type: ledger.TypeFund, TransferID: id("eu"), ClientID: "c", IdempotencyKey: "f", From: mint, To: b, Amount: 1<<63 - 1, Currency: "EUR", CreatedAt: time.Now()}, // overflow b
		{Type: ledger.TypeFund, TransferID: id("eu"), ClientID: "c", IdempotencyKey: "g", From: mint, To: mint, Amount: 1, Currency: "EUR", CreatedAt: time.Now()},      // fund the issuance account itself
		cmd(a, mint, 1), // into the issuance account
		cmd(a, hop, 1),  // into the transit account
		cmd(hop, a, 1),  // out of the transit account
		{Type: ledger.TypeFund, TransferID: id("eu"), ClientID: "c", IdempotencyKey: "h", From: mint, To: hop, Amount: 1, Currency: "EUR", CreatedAt: time.Now()}, // fund the transit account
	}
	p := ledger.Batch{Accounts: accounts, Issuance: map[string]string{"EUR": mint}}.Plan(cmds)
	want := []ledger.Code{"", ledger.CodeInsufficientFunds, "", ledger.CodeInsufficientFunds, ledger.CodeAccountNotFound,
		ledger.CodeAccountNotFound, ledger.CodeCurrencyMismatch, ledger.CodeAccountClosed, ledger.CodeSystemAccount, ledger.CodeBalanceOverflow,
		ledger.CodeSameAccount, ledger.CodeSystemAccount, ledger.CodeSystemAccount, ledger.CodeSystemAccount, ledger.CodeSystemAccount}
	for i, o := range p.Outcomes {
		if want[i] == ledger.CodeAccountNotFound {
			// Not a refusal: nothing is recorded, so that a replay applies
			// the request once the account exists.
			if o.Result != ledger.AwaitingAccount || o.Err == nil || o.Err.Code != want[i] || o.Transfer.ID != "" || len(o.Postings) != 0 {
				t.Errorf("command %d: got %v %v transfer %q with %d postings, want awaiting_account, nothing recorded",
					i, o.Result, o.Err, o.Transfer.ID, len(o.Postings))
			}
			continue
		}
		if o.Transfer.Reason != want[i] {
			t.Errorf("command %d: got reason %q, want %q", i, o.Transfer.Reason, want[i])
		}
		wantStatus, wantPostings := ledger.StatusCompleted, 2
		if want[i] != "" {
			wantStatus, wantPostings = ledger.StatusRejected, 0
		}
		if o.Transfer.Status != wantStatus || len(o.Postings) != wantPostings || o.Transfer.Version != 1 {
			t.Errorf("command %d: got %s v%d with %d postings, want %s v1 with %d", i, o.Transfer.Status, o.Transfer.Version, len(o.Postings), wantStatus, wantPostings)
		}
	}
	if accounts[a].Balance != 100 {
		t.Fatalf("PlanBatch modified its input")
	}
	got := map[string]ledger.AccountChange{}
	for _, c := range p.Accounts {
		got[c.ID] = c
	}
	if c := got[a]; c.ToBalance != 0 || c.FromVersion != 3 || c.ToVersion != 5 {
		t.Errorf("account a: got %+v, want balance 0, version 3 -> 5", c)
	}
	if c := got[b]; c.ToBalance != b0+100 || c.ToVersion != 2 {
		t.Errorf("account b: got %+v, want balance %d, version 2", c, b0+100)
	}
	if len(p.Accounts) != 2 {
		t.Errorf("changed accounts: got %d, want 2", len(p.Accounts))
	}
	// Postings carry the balance and version they produced, in order.
	if ps := p.Outcomes[2].Postings; ps[0].BalanceAfter != 0 || ps[0].AccountVersion != 5 || ps[0].Amount != -40 {
		t.Errorf("third transfer debit: got %+v", ps[0])
	}
}

// TestPlanRefusesAnotherClientsSource: a transfer or hold whose source
// belongs to another client than the command's (a forged command: the API
// sends only its client's own) is invalid, dead-lettered with nothing
// recorded, and moves nothing; the owner's own transfer applies.
func TestPlanRefusesAnotherClientsSource(t *testing.T) {
	_, id := mustIDs(t)
	a, b := id("eu"), id("eu")
	accounts := map[string]ledger.Account{
		a: {ID: a, ClientID: "alice", Kind: ledger.KindCustomer, Currency: "EUR", Balance: 100},
		b: {ID: b, ClientID: "bob", Kind: ledger.KindCustomer, Currency: "EUR"},
	}
	cmd := func(client string, hold bool) ledger.Command {
		c := ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: client, IdempotencyKey: id("eu"),
			From: a, To: b, Amount: 10, Currency: "EUR", CreatedAt: time.Now(), Hold: hold}
		if hold {
			c.ExpiresAt = time.Now().Add(time.Hour)
		}
		return c
	}
	p := ledger.Batch{Accounts: accounts}.Plan([]ledger.Command{cmd("bob", false), cmd("bob", true), cmd("alice", false)})
	for i, o := range p.Outcomes[:2] {
		if o.Result != ledger.Invalid || o.Err == nil || o.Err.Code != ledger.CodeAccountNotFound || o.Transfer.ID != "" || len(o.Postings) != 0 || len(o.Outbox) != 0 {
			t.Errorf("command %d (bob names alice's account): got %v %v transfer %q, %d postings, %d steps; want invalid account_not_found, nothing recorded",
				i, o.Result, o.Err, o.Transfer.ID, len(o.Postings), len(o.Outbox))
		}
	}
	if o := p.Outcomes[2]; o.Result != ledger.Applied || o.Transfer.Status != ledger.StatusCompleted {
		t.Errorf("alice's own transfer: got %v %v, want applied, COMPLETED", o.Result, o.Err)
	}
}

// TestFundFingerprint: a fund command's fingerprint does not depend on the
// issuance account the ledger fills in, so a retry matches the stored one.
func TestFundFingerprint(t *testing.T) {
	c := ledger.Command{Type: ledger.TypeFund, To: "eu-x", Amount: 5, Currency: "EUR"}
	resolved := c
	resolved.From = "eu-mint"
	if string(c.Fingerprint()) != string(resolved.Fingerprint()) {
		t.Fatal("fund fingerprint changed when From was resolved")
	}
	other := c
	other.Amount = 6
	if string(c.Fingerprint()) == string(other.Fingerprint()) {
		t.Fatal("fingerprint ignores the amount")
	}
}

// TestSagaStage: only a step applied now ends a stage; requests, duplicates
// and parked steps end none.
func TestSagaStage(t *testing.T) {
	applied, dup, parked := ledger.Result{Kind: ledger.Applied}, ledger.Result{Kind: ledger.Duplicate}, ledger.Result{Kind: ledger.Parked}
	for _, tt := range []struct {
		typ  string
		r    ledger.Result
		want string
	}{
		{ledger.TypeCredit, applied, ledger.StageCredit},
		{ledger.TypeConfirm, applied, ledger.StageSettle},
		{ledger.TypeRefuse, applied, ledger.StageRefund},
		{ledger.TypeTransfer, applied, ""},
		{ledger.TypeFund, applied, ""},
		{ledger.TypeCredit, dup, ""},
		{ledger.TypeConfirm, parked, ""},
	} {
		if got := ledger.SagaStage(ledger.Command{Type: tt.typ}, tt.r); got != tt.want {
			t.Errorf("%s %s: stage %q, want %q", tt.typ, tt.r.Kind, got, tt.want)
		}
	}
}

// TestHoldTransitions checks every (status, event) pair of the machine
// against its table: the hold's edges apply, every other pair is illegal
// (a repeated, late or backward step), and nothing leaves a terminal
// status.
func TestHoldTransitions(t *testing.T) {
	legal := map[ledger.Status]map[ledger.Event]ledger.Status{
		ledger.StatusPending: {ledger.EventComplete: ledger.StatusCompleted, ledger.EventDebit: ledger.StatusDebited,
			ledger.EventReject: ledger.StatusRejected, ledger.EventHold: ledger.StatusHeld},
		ledger.StatusHeld: {ledger.EventCapture: ledger.StatusCompleted, ledger.EventCaptureDebit: ledger.StatusDebited,
			ledger.EventVoid: ledger.StatusVoided, ledger.EventExpire: ledger.StatusExpired},
		ledger.StatusDebited: {ledger.EventConfirm: ledger.StatusCompleted, ledger.EventRefund: ledger.StatusRefunded},
	}
	illegal := 0
	for _, from := range ledger.Statuses() {
		for _, ev := range ledger.Events() {
			got, err := ledger.Next(from, ev)
			want, ok := legal[from][ev]
			switch {
			case ok && (err != nil || got != want):
				t.Errorf("%s --%s-->: got %q %v, want %s", from, ev, got, err, want)
			case !ok && ledger.ErrorCode(err) != ledger.CodeIllegalTransition:
				t.Errorf("%s --%s-->: got %q %v, want illegal_transition", from, ev, got, err)
			case !ok:
				illegal++
			}
		}
	}
	if want := len(ledger.Statuses())*len(ledger.Events()) - 10; illegal != want {
		t.Errorf("%d illegal pairs, want %d", illegal, want)
	}
}

// TestValidateHoldsAndActions: the bad shapes of a hold, a capture, a void
// and a refund are refused with their codes.
func TestValidateHoldsAndActions(t *testing.T) {
	regions, id := mustIDs(t)
	now := time.Now()
	eu1, eu2, us1 := id("eu"), id("eu"), id("us")
	hold := ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: "c1", IdempotencyKey: "k1",
		From: eu1, To: eu2, Amount: 10, Currency: "EUR", CreatedAt: now, Hold: true, ExpiresAt: now.Add(time.Hour)}
	capture := ledger.Command{Type: ledger.TypeCapture, TransferID: hold.TransferID, ClientID: "c1", IdempotencyKey: "k2",
		From: eu1, To: eu2, Currency: "EUR", CreatedAt: now}
	refund := ledger.Command{Type: ledger.TypeRefund, TransferID: id("us"), ClientID: "c1", IdempotencyKey: "k3",
		From: us1, To: eu1, Amount: 5, Currency: "EUR", CreatedAt: now, RefundOf: id("eu")}
	for _, c := range []ledger.Command{hold, capture, refund} {
		home, _ := regions.HomeRegion(c.From)
		if err := c.Validate(home, regions, now); err != nil {
			t.Fatalf("%s: %v", c.Type, err)
		}
	}
	change := func(c ledger.Command, f func(*ledger.Command)) ledger.Command { f(&c); return c }
	for name, tc := range map[string]struct {
		c    ledger.Command
		code ledger.Code
	}{
		"HoldExpiresBeforeCreation": {change(hold, func(c *ledger.Command) { c.ExpiresAt = now.Add(-time.Second) }), ledger.CodeInvalidRequest},
		"HoldPast30Days":            {change(hold, func(c *ledger.Command) { c.ExpiresAt = now.Add(31 * 24 * time.Hour) }), ledger.CodeInvalidRequest},
		"ExpiryWithoutHold":         {change(hold, func(c *ledger.Command) { c.Hold = false }), ledger.CodeInvalidRequest},
		"FundAsHold":                {change(hold, func(c *ledger.Command) { c.Type, c.From = ledger.TypeFund, "" }), ledger.CodeInvalidRequest},
		"NegativeCapture":           {change(capture, func(c *ledger.Command) { c.Amount = -1 }), ledger.CodeInvalidAmount},
		"VoidWithAmount":            {change(capture, func(c *ledger.Command) { c.Type, c.Amount = ledger.TypeVoid, 1 }), ledger.CodeInvalidAmount},
		"CaptureElsewhere":          {change(capture, func(c *ledger.Command) { c.TransferID = id("us") }), ledger.CodeInvalidRequest},
		"CaptureAsRefund":           {change(capture, func(c *ledger.Command) { c.RefundOf = id("eu") }), ledger.CodeInvalidRequest},
		"RefundWithoutParent":       {change(refund, func(c *ledger.Command) { c.RefundOf = "" }), ledger.CodeInvalidRequest},
		"RefundOfAnotherRegion":     {change(refund, func(c *ledger.Command) { c.RefundOf = id("ap") }), ledger.CodeInvalidRequest},
		"RefundNegative":            {change(refund, func(c *ledger.Command) { c.Amount = -5 }), ledger.CodeInvalidAmount},
		"TransferWithParent":        {change(hold, func(c *ledger.Command) { c.Hold, c.ExpiresAt, c.RefundOf = false, time.Time{}, id("eu") }), ledger.CodeInvalidRequest},
	} {
		t.Run(name, func(t *testing.T) {
			home, _ := regions.HomeRegion(tc.c.From)
			if err := tc.c.Validate(home, regions, now); ledger.ErrorCode(err) != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
		})
	}
	// The command round-trips through its JSON form, new fields included.
	for _, c := range []ledger.Command{hold, capture, refund} {
		c.CreatedAt, c.ExpiresAt = c.CreatedAt.UTC().Truncate(time.Microsecond), c.ExpiresAt.UTC().Truncate(time.Microsecond)
		if c.ExpiresAt.Equal(time.Time{}.UTC()) {
			c.ExpiresAt = time.Time{}
		}
		got, err := ledger.DecodeCommand(c.Encode())
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("%s round trip: got %+v %v, want %+v", c.Type, got, err, c)
		}
	}
}
