package container

import (
	"encoding/json"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// TestRestartUnderLoad: clients create and destroy instances while
// `systemctl restart vgpud` runs every few seconds. Calls cut off by a
// restart may fail; afterwards no device is leaked, no acknowledged
// instance is lost, nothing acknowledged as destroyed is back, no intent
// is left, and each tenant's usage is the sum of its instances.
func TestRestartUnderLoad(t *testing.T) {
	startVgpud(t)
	tenantsUsed := []string{"ct-load-a", "ct-load-b"}
	for _, tn := range tenantsUsed {
		ensureTenant(t, tn)
	}
	profiles := []string{"1g.10gb", "2g.20gb", "1g.10gb", "L4-2Q"}
	const clients, duration = 3, 30 * time.Second

	var mu sync.Mutex
	acked := map[string]bool{}     // created, and not destroyed as far as anyone was told
	destroyed := map[string]bool{} // destroyed, acknowledged
	uncertain := map[string]bool{} // a destroy was cut off
	calls, failed := 0, 0

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i)))
			var mine []string
			for {
				select {
				case <-stop:
					return
				default:
				}
				if len(mine) > 0 && rng.Intn(2) == 0 {
					k := rng.Intn(len(mine))
					id := mine[k]
					r := ctl("", "destroy", id)
					mu.Lock()
					calls++
					if r.err == nil {
						delete(acked, id)
						destroyed[id] = true
						mine = append(mine[:k], mine[k+1:]...)
					} else {
						failed++
						uncertain[id] = true
					}
					mu.Unlock()
					continue
				}
				r := ctl("", "-o", "json", "create", profiles[rng.Intn(len(profiles))], "--tenant", tenantsUsed[rng.Intn(len(tenantsUsed))])
				var d struct {
					Instance dbusapi.Instance `json:"instance"`
				}
				mu.Lock()
				calls++
				if r.err == nil && json.Unmarshal([]byte(r.out), &d) == nil && d.Instance.UUID != "" {
					acked[d.Instance.UUID] = true
					mine = append(mine, d.Instance.UUID)
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	restarts := 0
	deadline := time.Now().Add(duration)
	for time.Now().Before(deadline) {
		time.Sleep(4 * time.Second)
		if out, err := ct.sh(t.Context(), "systemctl restart vgpud.service"); err != nil {
			t.Errorf("systemctl restart: %v\n%s", err, out)
		}
		restarts++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls (%d failed, cut off by restarts or refused), %d restarts, %d instances acknowledged live", calls, failed, restarts, len(acked))
	if calls-failed < restarts {
		t.Errorf("only %d calls succeeded across %d restarts: the load did not run", calls-failed, restarts)
	}

	recs := checkConsistent(t)
	have := map[string]bool{}
	for _, in := range recs {
		have[in.UUID] = true
	}
	for id := range acked {
		if !have[id] && !uncertain[id] {
			t.Errorf("lost: acknowledged instance %s has no record", id)
		}
	}
	for id := range destroyed {
		if have[id] {
			t.Errorf("instance %s was acknowledged destroyed but has a record", id)
		}
	}
	// Leave the host as found for the tests after this one.
	for _, in := range recs {
		if in.Tenant == tenantsUsed[0] || in.Tenant == tenantsUsed[1] {
			mustCtl(t, "destroy", in.UUID)
		}
	}
}
