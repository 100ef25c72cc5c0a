package natsembed

import (
	"github.com/nats-io/nats-server/v2/server"

	"github.com/paymesh/paymesh/platform/natsauth"
)

// ServerUsers turns natsauth users into a server's users, as nats-server's
// config parser would from deploy/regions/nats/*.conf.
func ServerUsers(users []natsauth.User) []*server.User {
	out := make([]*server.User, len(users))
	for i, u := range users {
		out[i] = &server.User{Username: u.Name, Password: u.Password, Permissions: ServerPermissions(u.Permissions)}
	}
	return out
}

// ServerPermissions turns natsauth permissions into a server's; nil stays
// nil (unrestricted).
func ServerPermissions(p *natsauth.Permissions) *server.Permissions {
	if p == nil {
		return nil
	}
	sp := &server.Permissions{Publish: subjectPermission(p.PublishAllow, p.PublishDeny),
		Subscribe: subjectPermission(p.SubscribeAllow, p.SubscribeDeny)}
	if p.AllowResponses {
		sp.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS,
			Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}

func subjectPermission(allow, deny []string) *server.SubjectPermission {
	if allow == nil && deny == nil {
		return nil
	}
	return &server.SubjectPermission{Allow: allow, Deny: deny}
}
