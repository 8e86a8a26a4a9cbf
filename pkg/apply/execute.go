package apply

import "context"

// Result is what Execute did.
type Result struct {
	Done   []Change `json:"done"`
	Failed *Change  `json:"failed,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// Execute performs a change set.
func Execute(ctx context.Context, m Manager, cs ChangeSet) (Result, error) {
	return Result{}, nil
}
