package dbusapi

import (
	"context"
	"errors"
	"testing"
)

// TestReadBack: the read after a successful change never activates vgpud,
// and a vgpud that left the bus after answering (it was stopping), or a
// caller who may change but not read, gets what the reply said; any other
// error is the caller's. An object removed by another client between the
// reply and the read is what the reply said too.
func TestReadBack(t *testing.T) {
	for _, tt := range []struct {
		name    string
		err     error
		want    int
		wantErr bool
	}{
		{name: "read", want: 1},
		{name: "vgpud gone", err: &Error{Name: NameUnavailable, Message: "gone"}, want: 7},
		{name: "may not read", err: &Error{Name: NameAccessDenied, Message: "no"}, want: 7},
		// Destroyed by another client between the reply and the read:
		// the create succeeded, and says so with what the reply named.
		{name: "removed meanwhile", err: &Error{Name: NameNotFound, Message: "no instance"}, want: 7},
		{name: "other error", err: &Error{Name: NameTimeout, Message: "slow"}, wantErr: true},
		{name: "not a bus error", err: errors.New("boom"), wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readBack(context.Background(), func(ctx context.Context) (int, error) {
				if ctx.Value(noAutoStart{}) == nil {
					t.Error("the read-back may start vgpud through D-Bus activation")
				}
				if tt.err != nil {
					return 0, tt.err
				}
				return 1, nil
			}, 7)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Fatalf("got %d, want %d", got, tt.want)
			}
		})
	}
}
