package apply

import (
	"fmt"
	"strings"
)

// PreflightError is a change set refused before its first change: the
// host, its store and its tenants are as they were. Problems says what
// does not fit, one line each; Kind is the manager's sentinel for the
// first of them (ErrNoCapacity, ErrQuotaExceeded, ...).
type PreflightError struct {
	Source   string   `json:"source,omitempty"`
	Config   string   `json:"config,omitempty"`
	Problems []string `json:"problems"`
	Kind     error    `json:"-"`
}

// maxShown bounds the problems an error message lists.
const maxShown = 8

func (e *PreflightError) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Config != "" {
			fmt.Fprintf(&b, " (config %s)", e.Config)
		}
		b.WriteString(": ")
	}
	b.WriteString("refused before any change (nothing was changed): ")
	shown := e.Problems
	if len(shown) > maxShown {
		shown = shown[:maxShown]
	}
	b.WriteString(strings.Join(shown, "; "))
	if n := len(e.Problems) - len(shown); n > 0 {
		fmt.Fprintf(&b, "; and %d more", n)
	}
	return b.String()
}

func (e *PreflightError) Unwrap() error { return e.Kind }

// problems collects what does not fit; the first one's sentinel names the
// refusal.
type problems struct {
	kind  error
	lines []string
}

func (p *problems) add(kind error, format string, args ...any) {
	if p.kind == nil {
		p.kind = kind
	}
	p.lines = append(p.lines, fmt.Sprintf(format, args...))
}

// err is the refusal of cs for the problems found, nil when none.
func (p *problems) err(cs ChangeSet) error {
	if len(p.lines) == 0 {
		return nil
	}
	return &PreflightError{Source: cs.Source, Config: cs.Config, Kind: p.kind, Problems: p.lines}
}
