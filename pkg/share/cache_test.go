package share

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The cache asks its source again only when it has nothing valid: none
// read yet, invalidated, too old, or the last read failed or raced an
// Invalidate.
func TestCache(t *testing.T) {
	errRead := errors.New("read failed")
	for _, tt := range []struct {
		name   string
		maxAge time.Duration
		// between runs after the first read; fail makes the source's
		// next read fail.
		between func(c *Cache, fail *bool)
		// duringFirst runs inside the first read.
		duringFirst func(c *Cache)
		wantReads   int
	}{
		{name: "fresh", maxAge: time.Hour, wantReads: 1},
		{name: "invalidated", maxAge: time.Hour, between: func(c *Cache, _ *bool) { c.Invalidate() }, wantReads: 2},
		{name: "too old", maxAge: 0, wantReads: 2},
		{name: "invalidated while reading", maxAge: time.Hour, duringFirst: func(c *Cache) { c.Invalidate() }, wantReads: 2},
		{name: "error not kept", maxAge: time.Hour, between: func(c *Cache, fail *bool) { c.Invalidate(); *fail = true }, wantReads: 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c *Cache
			reads, fail := 0, false
			src := SourceFunc(func(context.Context) (Inventory, error) {
				reads++
				if fail {
					fail = false
					return Inventory{}, errRead
				}
				if reads == 1 && tt.duringFirst != nil {
					tt.duringFirst(c)
				}
				return Inventory{Tenants: []Tenant{{Name: "t", Guaranteed: reads%2 == 1}}}, nil
			})
			c = NewCache(src, tt.maxAge)
			ctx := context.Background()
			first, err := c.Inventory(ctx)
			if err != nil || len(first.Tenants) != 1 {
				t.Fatalf("first read = %+v, %v", first, err)
			}
			if tt.between != nil {
				tt.between(c, &fail)
			}
			for {
				_, err := c.Inventory(ctx)
				if err == nil {
					break
				}
				if !errors.Is(err, errRead) {
					t.Fatalf("read = %v, want the source's error", err)
				}
			}
			if reads != tt.wantReads {
				t.Fatalf("source read %d times, want %d", reads, tt.wantReads)
			}
		})
	}
}
