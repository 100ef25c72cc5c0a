package chaos

import (
	"flag"
	"strings"
	"testing"
	"time"
)

// allBugs runs every bug case; without it TestCheckerCatchesBugs runs the
// cases marked ci, make test's set. make chaos passes it.
var allBugs = flag.Bool("chaos.allbugs", false, "run every deliberate-bug case, not only make test's set")

// failure is a check that must fail, with a failure that says one of any.
type failure struct {
	check string
	any   []string
}

// bugCases pairs each scenario with a deliberate bug that removes the
// protection the scenario attacks, and says how the checker must fail.
// Scenario 6's bug is a Postgres setting: see TestCheckerCatchesAsyncCommit.
var bugCases = []struct {
	scenario string
	// why says what goes wrong with the bug on.
	why   string
	cfg   Config
	fails []failure
	// lost and doubled: the table must count at least one lost or doubled key.
	lost, doubled bool
	// ci puts the case in make test's set: bugs the checker sees in every
	// run whatever the machine's load, one or more per layer (the API's
	// keys, the consumer's ack, the consume-log, the routers' attempts,
	// the permissions, the forward check, the receiver). The cases whose
	// bug shows only when a fault's timing meets it run in make chaos.
	ci bool
}{
	{
		ci:       true,
		scenario: "1",
		why: "the API answers a repeated idempotency key from its stored response without comparing the bodies: a " +
			"conflicting body is acknowledged with the first request's transfer",
		cfg:   Config{bugs: bugs{IgnoreKeyBody: true}, conflictShare: 0.3},
		fails: []failure{{I3, []string{"different bodies were acknowledged"}}, {"conflicts", []string{"conflicting body was answered ok"}}},
	},
	{
		scenario: "1",
		why: "the consume-log names a refund by the transfer it refunds, not by its own key: a second refund of a " +
			"transfer is taken for a repeat of the first and never applied, though acknowledged",
		cfg:   Config{bugs: bugs{RefundKeyedByParent: true}},
		fails: []failure{{I3, []string{"LOST"}}},
		lost:  true,
	},
	{
		ci:       true,
		scenario: "1",
		why: "the routers do not say their attempt (no Paymesh-Attempt header): a duplicate's copy cannot tell a " +
			"client's new request from a router's retry, and its cause is unknown",
		cfg:   Config{bugs: bugs{AttemptBlind: true}},
		fails: []failure{{"causes", []string{"of cause unknown"}}},
	},
	{
		ci:       true,
		scenario: "2",
		why: "the consumer acks each batch before its transaction commits: a worker killed before COMMIT loses " +
			"acknowledged transfers",
		// Every client request goes through the ledger's consumer (the
		// bug installs the claimed key path: the APIs' own group
		// transactions pass no consumer), and a third of the transactions
		// are killed, so that a run always has acknowledged commands whose
		// transaction and one-by-one retry both die.
		cfg:   Config{bugs: bugs{AckBeforeCommit: true}, killShare: 0.3, QuietWait: 3 * time.Second},
		fails: []failure{{I3, []string{"LOST"}}},
		lost:  true,
	},
	{
		scenario: "3",
		why: "the ledger caches a batch's keys as done when it claims them, before COMMIT: after a held transaction " +
			"fails, its redeliveries and retries are acked as duplicates",
		cfg:   Config{bugs: bugs{SeenBeforeCommit: true}},
		fails: []failure{{I3, []string{"LOST"}}},
		lost:  true,
	},
	{
		ci:       true,
		scenario: "4",
		why: "the consume-log is keyed by transfer ID, the business-key lookup skipped and the unique (client, key) " +
			"constraint dropped: a late retry under a new transfer ID applies again",
		cfg:     Config{bugs: bugs{DedupByTransferID: true}, dropBusinessKey: true},
		fails:   []failure{{I3, []string{"DOUBLED"}}},
		doubled: true,
	},
	{
		scenario: "5",
		why: "the ledger takes a COMMIT the server never answered for a success: a batch cut before its COMMIT reached " +
			"the server is acked, a request LOST or a saga step gone (its transfer left DEBITED)",
		// Longer than the others: a cut must land on an apply batch's COMMIT
		// before it reaches the server, and some land on other transactions.
		cfg:   Config{bugs: bugs{AssumeCommitted: true}, QuietWait: 3 * time.Second, Duration: 3 * time.Second},
		fails: []failure{{I3, []string{"LOST", "still DEBITED"}}},
	},
	{
		scenario: "7",
		why: "the ledgers and the routers mark a saga step sent whether or not the destination stream stored it: steps " +
			"sent while a NATS server is down are lost, and their transfers stay in transit",
		// 4 s, not the short run's 1.5: a NATS server down for 500 ms met
		// too few relays in a loaded CI run.
		cfg:   Config{bugs: bugs{StepsIgnorePubAck: true}, QuietWait: 3 * time.Second, Duration: 4 * time.Second},
		fails: []failure{{I3, []string{"still DEBITED"}}},
	},
	{
		scenario: "8",
		why: "the routers ack a command in their route stream whether or not its home region stored the forward: " +
			"commands forwarded across the cut are lost",
		// 4 s, not the short run's 1.5: a cut of 0.6 s lost 1 to 4 forwards
		// a run, and none in two runs of a loaded CI machine.
		cfg:   Config{bugs: bugs{ForwardIgnoresPubAck: true}, QuietWait: 3 * time.Second, Duration: 4 * time.Second},
		fails: []failure{{I3, []string{"LOST"}}},
		lost:  true,
	},
	{
		scenario: "9",
		why:      "the ledger gives a transaction up on its first deadlock instead of retrying it",
		// 4 s: a loaded CI run sent 41 requests in 1.5 s and met no deadlock.
		cfg:   Config{bugs: bugs{NoRetry: true}, Duration: 4 * time.Second},
		fails: []failure{{"budget", []string{"transactions gave up"}}},
	},
	{
		scenario: "10",
		why: "the store's lookup of the transfer a key made finds nothing: a resend after its key expired is answered " +
			"with a new transfer ID that never exists (the route stream's Msg-Id window drops the resend itself)",
		cfg:   Config{bugs: bugs{ForgetKeyTransfer: true}, QuietWait: 20 * time.Second},
		fails: []failure{{"same-transfer", []string{"after a step"}}},
	},
	{
		scenario: "10",
		why: "the ledger decides expiries by a clock an hour behind: every hold outlives its expiry, its expiry step " +
			"parked again and again, and the cluster never drains",
		cfg:   Config{bugs: bugs{ExpiryClockBehind: true}, QuietWait: 3 * time.Second},
		fails: []failure{{I3, []string{"still HELD"}}, {"quiet", []string{"backlog"}}},
	},
	{
		scenario: "11",
		why: "the API skips its check that the source account belongs to the client, and the ledger takes a " +
			"transfer's source as its client's: transfers from the other client's accounts (BOLA) are answered 2xx " +
			"and applied",
		cfg: Config{bugs: bugs{SkipOwnerCheck: true}},
		// The ledger records the transfer under the owner's client, so I3
		// finds it made by no request of the history (or answered to a
		// hostile request, when the API answers from it).
		fails: []failure{{"refused", []string{"BOLA transfer from the other client's account"}},
			{I3, []string{"answers only refused requests (hostile", "was made by no request of the history"}}},
	},
	{
		scenario: "12",
		why:      "the forgeries are published as the router's user, which may publish to ledger subjects: they land",
		cfg:      Config{forgeAs: "router"},
		fails:    []failure{{I3, []string{"forged"}}, {"refused", []string{"refused"}}},
	},
	{
		ci:       true,
		scenario: "12",
		why: "the ledger takes each delivery as sent on its command's own class: a fund or a saga step an API user sent " +
			"as a client command is applied",
		cfg:   Config{bugs: bugs{ClassBlind: true}},
		fails: []failure{{I3, []string{"forged"}}, {"wrong class", []string{"dead-lettered wrong_class"}}},
	},
	{
		scenario: "13",
		why: "the routers mark a saga step sent and ack a forwarded command whether or not the destination stream " +
			"stored it: what they publish into us while its stream leader is down, before a new one is elected, is lost",
		// With a follower stopped too (quorumLoss) us has no leader for
		// 6 s, so some publish meets it on every run: the window
		// between a leader's loss and the next election alone (under a
		// second here) held none in one run of two.
		// And 12 s, so that both streams' leaders are stopped within the
		// run: in 6 s only the first was, and runs lost nothing at times.
		cfg: Config{bugs: bugs{StepsIgnorePubAck: true, ForwardIgnoresPubAck: true}, quorumLoss: true, QuietWait: 3 * time.Second,
			Duration: 12 * time.Second},
		fails: []failure{{I3, []string{"LOST", "still DEBITED"}}},
	},
	{
		scenario: "14",
		why: "us runs one server (R1 streams), as the other regions: the disk loss takes the commands its route and " +
			"ledger streams held, acknowledged but not yet applied, with it",
		// The wipe takes client commands (LOST) and saga steps (their
		// transfers left still DEBITED, the money stuck in transit), as the
		// backlog happens to hold them; either way I3 names the keys.
		cfg:   Config{oneServer: true, QuietWait: 3 * time.Second},
		fails: []failure{{I3, []string{"LOST", "still DEBITED"}}},
	},
	{
		scenario: "15",
		why: "the ledger's dead-letter publishes are acked by no stream: a poisoned step is dropped as if it were " +
			"dead-lettered, and its transfer stays DEBITED with its money in transit",
		cfg:   Config{bugs: bugs{LostDeadLetters: true}, QuietWait: 3 * time.Second},
		fails: []failure{{"poison", []string{"no poisoned step was dead-lettered"}}, {I3, []string{"still DEBITED"}}},
	},
	{
		ci:       true,
		scenario: "16",
		why: "the receiving API runs a forwarded call its forward check refused: a transfer call carrying a target, a page or " +
			"an id is applied, a page with limit 0 or an account opened with an id is answered 2xx, and nothing is counted",
		cfg: Config{bugs: bugs{UncheckedForwards: true}},
		fails: []failure{{"refused", []string{"not refused"}}, {"applied", []string{"made transfer"}},
			{"counted", []string{"counted"}}, {I3, []string{"answers only refused requests"}}},
	},
	{
		ci:       true,
		scenario: "17",
		why: "the API's store answers a key it found once with its client for ever: the revoked key goes on authenticating, " +
			"and its transfers after the bound are applied",
		cfg: Config{bugs: bugs{IgnoreRevocation: true}},
		fails: []failure{{"revoked", []string{"not refused 401"}}, {"applied", []string{"made transfer"}},
			{I3, []string{"answers only refused requests"}}},
	},
	{
		ci:       true,
		scenario: "18",
		why: "the receiver applies each effect in a transaction of its own and records the event's ID after it: a crash " +
			"between the two leaves the effect without its record, and the retry applies it again",
		cfg:   Config{bugs: bugs{HookEffectOutsideTx: true}},
		fails: []failure{{"hooks-once", []string{"DOUBLED"}}},
	},
	{
		scenario: "19",
		why: "the receiver answers 2xx before its COMMIT, to stay within the sender's timeout, and commits after with the " +
			"request's context: the commit fails once the request has ended, and paymesh counts the event delivered",
		cfg:   Config{bugs: bugs{HookCommitLater: true}},
		fails: []failure{{"hooks-lost", []string{"never applied at the receiver"}}},
	},
	{
		scenario: "20",
		why: "the receiver answers 2xx when its effect failed (the error logged and dropped): the event's ID is recorded " +
			"without its effect, and paymesh never sends it again",
		cfg:   Config{bugs: bugs{HookSwallowErrors: true}},
		fails: []failure{{"hooks-once", []string{"LOST effect"}}},
	},
	{
		scenario: "21",
		why: "a claim's lease never runs out: the deliveries a killed worker had claimed are never claimed again, and stay " +
			"pending for ever",
		cfg:   Config{bugs: bugs{HookEndlessLease: true}},
		fails: []failure{{"hooks-lost", []string{"its delivery is \"pending\""}}},
	},
	{
		scenario: "22",
		why: "the formation's standby is asynchronous (out of the write quorum): the primary answers COMMIT without it, " +
			"and the commits it answered while its WAL senders were stopped die with it",
		cfg:   Config{asyncStandby: true},
		fails: []failure{{I3, []string{"LOST", "still DEBITED"}}},
		lost:  true,
	},
}

// bugTries is how many runs a bug case gets to show its bug. Each fault
// fires at times the scheduler decides, so a short run may, rarely, not
// exercise the missing protection; the bug must show in one of them.
const bugTries = 2

// TestCheckerCatchesBugs runs a scenario with each deliberate bug on: the
// checker must fail, and name the keys, transfers or requests. It runs the
// cases marked ci, or with -chaos.allbugs (make chaos) every case.
func TestCheckerCatchesBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection runs")
	}
	for _, bc := range bugCases {
		if !bc.ci && !*allBugs {
			continue
		}
		s, err := scenarioByName(bc.scenario)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(s.name, func(t *testing.T) {
			needs(t, bc.scenario)
			t.Logf("bug: %s", bc.why)
			cfg := bc.cfg
			if cfg.QuietWait == 0 {
				cfg.QuietWait = 10 * time.Second
			}
			for try := 1; ; try++ {
				r := runOne(t, cfg, bc.scenario)
				missing := unseen(t, r, bc.fails)
				switch {
				case bc.lost && r.Lost == 0:
					missing = append(missing, "no key counted as lost")
				case bc.doubled && r.Doubled == 0:
					missing = append(missing, "no key counted as doubled")
				}
				if len(missing) == 0 {
					return
				}
				if try == bugTries {
					t.Fatalf("in %d runs with the deliberate bug on, the checker did not see it: %s", bugTries, strings.Join(missing, "; "))
				}
				t.Logf("run %d: %s; again", try, strings.Join(missing, "; "))
			}
		})
	}
}

// unseen logs the failures the result shows and returns, for each it does
// not show, why.
func unseen(t *testing.T, r Result, fails []failure) []string {
	var out []string
	for _, f := range fails {
		line, err := findFailure(r, f.check, f.any...)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		t.Logf("%s names: %s", f.check, line)
	}
	return out
}

// TestBugCasesCoverScenarios: every built scenario has a deliberate-bug
// case (6 has its own test, TestCheckerCatchesAsyncCommit).
func TestBugCasesCoverScenarios(t *testing.T) {
	covered := map[string]bool{"6-pg-restart": true}
	for _, bc := range bugCases {
		s, err := scenarioByName(bc.scenario)
		if err != nil {
			t.Fatal(err)
		}
		covered[s.name] = true
	}
	for _, name := range Scenarios() {
		if !covered[name] {
			t.Errorf("scenario %s has no deliberate-bug test", name)
		}
	}
}
