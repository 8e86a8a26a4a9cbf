package placementapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Provider is a resource provider.
type Provider struct {
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	Generation int    `json:"generation"`
	ParentUUID string `json:"parent_provider_uuid,omitempty"`
	RootUUID   string `json:"root_provider_uuid,omitempty"`
}

// Inventory is one resource class's inventory on a provider.
type Inventory struct {
	Total           int     `json:"total"`
	Reserved        int     `json:"reserved"`
	MinUnit         int     `json:"min_unit"`
	MaxUnit         int     `json:"max_unit"`
	StepSize        int     `json:"step_size"`
	AllocationRatio float64 `json:"allocation_ratio"`
}

// Allocation is what one consumer holds on one provider.
type Allocation struct {
	Resources map[string]int `json:"resources"`
}

// Consumer is everything one consumer holds, by provider UUID.
type Consumer struct {
	Allocations map[string]Allocation `json:"allocations"`
	// Generation is nil for a consumer Placement does not know.
	Generation   *int   `json:"consumer_generation"`
	ProjectID    string `json:"project_id,omitempty"`
	UserID       string `json:"user_id,omitempty"`
	ConsumerType string `json:"consumer_type,omitempty"`
}

// CheckVersion reads the root document and fails with ErrVersion when the
// server's newest microversion is older than MinVersion.
func (c *Client) CheckVersion(ctx context.Context) (string, error) {
	var root struct {
		Versions []struct {
			ID         string `json:"id"`
			MaxVersion string `json:"max_version"`
		} `json:"versions"`
	}
	if err := c.Do(ctx, "GET", "/", nil, &root); err != nil {
		return "", err
	}
	if len(root.Versions) == 0 || root.Versions[0].MaxVersion == "" {
		return "", fmt.Errorf("root document names no version: %w", ErrMalformed)
	}
	maxV := root.Versions[0].MaxVersion
	older, err := versionLess(maxV, MinVersion)
	if err != nil {
		return "", err
	}
	if older {
		return maxV, fmt.Errorf("server's newest microversion %s is older than %s: %w", maxV, MinVersion, ErrVersion)
	}
	return maxV, nil
}

func versionLess(a, b string) (bool, error) {
	pa, err := parseVersion(a)
	if err != nil {
		return false, err
	}
	pb, err := parseVersion(b)
	if err != nil {
		return false, err
	}
	return pa[0] < pb[0] || (pa[0] == pb[0] && pa[1] < pb[1]), nil
}

func parseVersion(v string) ([2]int, error) {
	maj, min, ok := strings.Cut(v, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil {
		return [2]int{}, fmt.Errorf("microversion %q: %w", v, ErrMalformed)
	}
	return [2]int{a, b}, nil
}

// Tree lists the providers in the tree rooted at root (1.14).
func (c *Client) Tree(ctx context.Context, root string) ([]Provider, error) {
	var out struct {
		Providers []Provider `json:"resource_providers"`
	}
	if err := c.Do(ctx, "GET", "/resource_providers?in_tree="+url.QueryEscape(root), nil, &out); err != nil {
		return nil, err
	}
	for _, p := range out.Providers {
		if p.UUID == "" {
			return nil, fmt.Errorf("provider without a UUID in tree %s: %w", root, ErrMalformed)
		}
	}
	return out.Providers, nil
}

// Provider reads one provider.
func (c *Client) Provider(ctx context.Context, id string) (Provider, error) {
	var p Provider
	if err := c.Do(ctx, "GET", "/resource_providers/"+url.PathEscape(id), nil, &p); err != nil {
		return Provider{}, err
	}
	if p.UUID == "" {
		return Provider{}, fmt.Errorf("provider %s: answer without a UUID: %w", id, ErrMalformed)
	}
	return p, nil
}

// CreateProvider creates a provider (parent "" for a root).
func (c *Client) CreateProvider(ctx context.Context, id, name, parent string) error {
	in := map[string]any{"uuid": id, "name": name}
	if parent != "" {
		in["parent_provider_uuid"] = parent
	}
	return c.Do(ctx, "POST", "/resource_providers", in, nil)
}

// DeleteProvider deletes a provider (it must have no allocations and no children).
func (c *Client) DeleteProvider(ctx context.Context, id string) error {
	return c.Do(ctx, "DELETE", "/resource_providers/"+url.PathEscape(id), nil, nil)
}

// EnsureResourceClass creates a custom resource class; an existing one is fine.
func (c *Client) EnsureResourceClass(ctx context.Context, name string) error {
	_, err := c.DefineResourceClass(ctx, name)
	return err
}

// DefineResourceClass is EnsureResourceClass, reporting whether Placement
// made the class now (false: it had it).
func (c *Client) DefineResourceClass(ctx context.Context, name string) (bool, error) {
	status, err := c.DoStatus(ctx, "PUT", "/resource_classes/"+url.PathEscape(name), nil, nil)
	return status == http.StatusCreated, err
}

// EnsureTrait creates a custom trait; an existing one is fine.
func (c *Client) EnsureTrait(ctx context.Context, name string) error {
	_, err := c.DefineTrait(ctx, name)
	return err
}

// DefineTrait is EnsureTrait, reporting whether Placement made the trait
// now (false: it had it).
func (c *Client) DefineTrait(ctx context.Context, name string) (bool, error) {
	status, err := c.DoStatus(ctx, "PUT", "/traits/"+url.PathEscape(name), nil, nil)
	return status == http.StatusCreated, err
}

// ResourceClasses lists the names of every resource class Placement
// knows, standard and custom: one request instead of one PUT per class.
func (c *Client) ResourceClasses(ctx context.Context) ([]string, error) {
	var out struct {
		Classes []struct {
			Name string `json:"name"`
		} `json:"resource_classes"`
	}
	if err := c.Do(ctx, "GET", "/resource_classes", nil, &out); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out.Classes))
	for _, rc := range out.Classes {
		if rc.Name == "" {
			return nil, fmt.Errorf("resource class without a name: %w", ErrMalformed)
		}
		names = append(names, rc.Name)
	}
	return names, nil
}

// ListTraits lists the traits Placement knows whose name starts with prefix
// ("" for all of them).
func (c *Client) ListTraits(ctx context.Context, prefix string) ([]string, error) {
	var out struct {
		Traits *[]string `json:"traits"`
	}
	path := "/traits"
	if prefix != "" {
		path += "?name=" + url.QueryEscape("startswith:"+prefix)
	}
	if err := c.Do(ctx, "GET", path, nil, &out); err != nil {
		return nil, err
	}
	if out.Traits == nil {
		return nil, fmt.Errorf("traits: no traits field: %w", ErrMalformed)
	}
	return *out.Traits, nil
}

// Inventories reads a provider's inventories and generation.
func (c *Client) Inventories(ctx context.Context, id string) (map[string]Inventory, int, error) {
	var out struct {
		Generation  *int                 `json:"resource_provider_generation"`
		Inventories map[string]Inventory `json:"inventories"`
	}
	if err := c.Do(ctx, "GET", "/resource_providers/"+url.PathEscape(id)+"/inventories", nil, &out); err != nil {
		return nil, 0, err
	}
	if out.Generation == nil {
		return nil, 0, fmt.Errorf("inventories of %s: no generation: %w", id, ErrMalformed)
	}
	return out.Inventories, *out.Generation, nil
}

// SetInventories replaces a provider's inventories at generation gen and
// returns the new generation.
func (c *Client) SetInventories(ctx context.Context, id string, gen int, inv map[string]Inventory) (int, error) {
	var out struct {
		Generation *int `json:"resource_provider_generation"`
	}
	in := map[string]any{"resource_provider_generation": gen, "inventories": inv}
	if err := c.Do(ctx, "PUT", "/resource_providers/"+url.PathEscape(id)+"/inventories", in, &out); err != nil {
		return 0, err
	}
	if out.Generation == nil {
		return 0, fmt.Errorf("inventories of %s: no generation: %w", id, ErrMalformed)
	}
	return *out.Generation, nil
}

// Traits reads a provider's traits and generation.
func (c *Client) Traits(ctx context.Context, id string) ([]string, int, error) {
	var out struct {
		Generation *int     `json:"resource_provider_generation"`
		Traits     []string `json:"traits"`
	}
	if err := c.Do(ctx, "GET", "/resource_providers/"+url.PathEscape(id)+"/traits", nil, &out); err != nil {
		return nil, 0, err
	}
	if out.Generation == nil {
		return nil, 0, fmt.Errorf("traits of %s: no generation: %w", id, ErrMalformed)
	}
	return out.Traits, *out.Generation, nil
}

// SetTraits replaces a provider's traits at generation gen.
func (c *Client) SetTraits(ctx context.Context, id string, gen int, traits []string) (int, error) {
	var out struct {
		Generation *int `json:"resource_provider_generation"`
	}
	in := map[string]any{"resource_provider_generation": gen, "traits": traits}
	if err := c.Do(ctx, "PUT", "/resource_providers/"+url.PathEscape(id)+"/traits", in, &out); err != nil {
		return 0, err
	}
	if out.Generation == nil {
		return 0, fmt.Errorf("traits of %s: no generation: %w", id, ErrMalformed)
	}
	return *out.Generation, nil
}

// ProviderAllocations reads what every consumer holds on one provider.
func (c *Client) ProviderAllocations(ctx context.Context, id string) (map[string]map[string]int, error) {
	res, _, err := c.ProviderAllocationsAt(ctx, id)
	return res, err
}

// ProviderAllocationsAt is ProviderAllocations with the provider's
// generation, which Placement reads before the allocations: an
// allocation that lands in between makes a write at that generation a
// conflict.
func (c *Client) ProviderAllocationsAt(ctx context.Context, id string) (map[string]map[string]int, int, error) {
	var out struct {
		Generation  *int                  `json:"resource_provider_generation"`
		Allocations map[string]Allocation `json:"allocations"`
	}
	if err := c.Do(ctx, "GET", "/resource_providers/"+url.PathEscape(id)+"/allocations", nil, &out); err != nil {
		return nil, 0, err
	}
	if out.Generation == nil {
		return nil, 0, fmt.Errorf("allocations of %s: no generation: %w", id, ErrMalformed)
	}
	res := map[string]map[string]int{}
	for consumer, a := range out.Allocations {
		res[consumer] = a.Resources
	}
	return res, *out.Generation, nil
}

// Consumer reads one consumer's allocations (an unknown consumer has none
// and a nil generation).
func (c *Client) Consumer(ctx context.Context, id string) (Consumer, error) {
	var out Consumer
	if err := c.Do(ctx, "GET", "/allocations/"+url.PathEscape(id), nil, &out); err != nil {
		return Consumer{}, err
	}
	if out.Allocations == nil {
		return Consumer{}, fmt.Errorf("allocations of %s: no allocations field: %w", id, ErrMalformed)
	}
	for p, a := range out.Allocations {
		for rc, n := range a.Resources {
			if n <= 0 {
				return Consumer{}, fmt.Errorf("allocations of %s: %s on %s is %d: %w", id, rc, p, n, ErrMalformed)
			}
		}
	}
	return out, nil
}

// PutConsumer replaces a consumer's allocations. cons.Generation must be
// what Consumer returned (nil for a new consumer); a change in between is
// ErrConflict. Empty allocations delete the consumer: at cons.Generation
// where it is set (a PUT of no allocations, microversion 1.28), so a
// change since the read is ErrConflict too; whatever it holds where it is
// nil (a DELETE).
func (c *Client) PutConsumer(ctx context.Context, id string, cons Consumer) error {
	if len(cons.Allocations) == 0 {
		if cons.Generation == nil {
			return c.Do(ctx, "DELETE", "/allocations/"+url.PathEscape(id), nil, nil)
		}
		cons.Allocations = map[string]Allocation{}
	}
	return c.Do(ctx, "PUT", "/allocations/"+url.PathEscape(id), cons, nil)
}

// PostAllocations writes several consumers' allocations in one request
// (POST /allocations), all or none: a batch of new consumers, or an
// instance's allocation moved to its migration's consumer as Nova moves
// it. Each Consumer's Generation is checked as PutConsumer checks it (what
// Consumer returned; nil: a consumer Placement must not know yet), so one
// that changed, or exists, fails the request with ErrConflict and nothing
// is written. Empty allocations remove what that consumer holds.
func (c *Client) PostAllocations(ctx context.Context, cons map[string]Consumer) error {
	for id, x := range cons {
		if x.Allocations == nil {
			x.Allocations = map[string]Allocation{}
			cons[id] = x
		}
	}
	return c.Do(ctx, "POST", "/allocations", cons, nil)
}

// Candidate is one allocation request a scheduler may claim.
type Candidate struct {
	Allocations map[string]Allocation `json:"allocations"`
}

// AllocationCandidates asks GET /allocation_candidates; query is the raw
// query string (e.g. "resources1=CUSTOM_X:1,CUSTOM_Y:4&limit=10").
func (c *Client) AllocationCandidates(ctx context.Context, query string) ([]Candidate, error) {
	var out struct {
		Requests []Candidate `json:"allocation_requests"`
	}
	if err := c.Do(ctx, "GET", "/allocation_candidates?"+query, nil, &out); err != nil {
		return nil, err
	}
	return out.Requests, nil
}
