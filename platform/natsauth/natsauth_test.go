package natsauth

import (
	"strings"
	"testing"
)

// TestUsers checks the shape of every region's users: one per service,
// each restricted, with an inbox of its own.
func TestUsers(t *testing.T) {
	for _, r := range []string{"eu", "us"} {
		users := Users(r)
		if len(users) != len(Services) {
			t.Fatalf("region %s: %d users, want %d", r, len(users), len(Services))
		}
		for i, s := range Services {
			u := users[i]
			if u.Name != UserName(s, r) || u.Password != DevPassword(u.Name) || u.Permissions == nil {
				t.Errorf("region %s: user %d %+v, want %s restricted", r, i, u, UserName(s, r))
				continue
			}
			if got, err := UserOf(r, s); err != nil || got.Name != u.Name {
				t.Errorf("UserOf(%s, %s): %v, %v", r, s, got.Name, err)
			}
			inbox := InboxPrefix(u.Name) + ".>"
			if !strings.Contains(strings.Join(u.Permissions.SubscribeAllow, " "), inbox) {
				t.Errorf("%s: subscribe %v lacks its inbox %s", u.Name, u.Permissions.SubscribeAllow, inbox)
			}
		}
	}
	if _, err := UserOf("eu", "bank"); err == nil {
		t.Error("UserOf of an unknown service: no error")
	}
	if ConnectOptions("", "") != nil || len(ConnectOptions("api-eu", "x")) != 2 {
		t.Error("ConnectOptions: want none without a user, user info and inbox with one")
	}
}
