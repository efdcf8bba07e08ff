package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/access"
)

// A person's role comes from serve's config and their Salt groups, both of
// which change while a session lasts (12 h by default) and while a token
// they made lives on: it is derived again from the master's answer at
// most personTTL old, on every request and on every open watch stream.
const (
	personTTL = 2 * time.Minute
	// personStale: while the master does not answer, an older answer is
	// used up to this age; past it the person's requests are refused
	// (a master that is down must not freeze a demotion for ever).
	personStale = 15 * time.Minute
)

type personCache struct {
	mu      sync.Mutex
	answers map[string]personAnswer
}

type personAnswer struct {
	role   access.Role
	groups []string
	at     time.Time
}

func (s *Server) rememberPerson(user, eauth string, role access.Role, groups []string) {
	s.people.mu.Lock()
	defer s.people.mu.Unlock()
	if s.people.answers == nil || len(s.people.answers) > 10000 {
		s.people.answers = map[string]personAnswer{}
	}
	s.people.answers[user+"\x00"+eauth] = personAnswer{role: role, groups: groups, at: time.Now()}
}

// bound re-derives the role of p's person (a session's user, a token's
// maker) and lowers p to it: a session takes the person's role and groups
// as they are now, a token made by a person at most that role. A person
// left with no role is unauthenticated (their session and tokens stop).
func (s *Server) bound(ctx context.Context, p *access.Principal) error {
	person := p.Person()
	if person == "" {
		return nil
	}
	if s.Logins == nil || s.Logins.People == nil {
		// Logins switched off: the natural way to take everyone's access
		// away must take it from their sessions and tokens too.
		return access.ErrUnauthenticated
	}
	key := person + "\x00" + p.Eauth
	s.people.mu.Lock()
	a, known := s.people.answers[key]
	s.people.mu.Unlock()
	if !known || time.Since(a.at) >= personTTL {
		acc, err := s.Logins.People.UserAccess(ctx, person, p.Eauth, nil)
		switch {
		case err == nil:
			a = personAnswer{role: s.Logins.Roles.For(p.Eauth, person, acc.Groups), groups: acc.Groups, at: time.Now()}
			s.rememberPerson(person, p.Eauth, a.role, a.groups)
		case known && time.Since(a.at) < personStale:
			s.Log.Warn("the salt master did not confirm a person's role: using its answer of before", "user", person, "age", time.Since(a.at).Round(time.Second), "error", err)
		default:
			return fmt.Errorf("confirming %s's role with the salt master: %w", person, err)
		}
	}
	if a.role == "" {
		return access.ErrUnauthenticated
	}
	if p.Kind == "session" {
		p.Role, p.Groups = a.role, a.groups
	} else {
		p.Role = access.Lower(p.Role, a.role)
	}
	return nil
}
