package manager

import "sync"

// liveSet names the intents that an operation of this process is working
// on. Reconcile runs while other operations are in flight (on demand, or
// when libvirtd comes back or a VM starts); an intent in the set belongs to
// its operation, and reconcile must not finish or undo it underneath. At
// start-up the set is empty, so every intent on disk is a crash's leftover.
//
// An operation adds its intent before writing it and removes it after
// deleting it, so an intent on disk that is absent from the set is either
// a leftover or already deleted; reconcile claims it and reads it again
// to tell the two apart.
type liveSet struct {
	mu  sync.Mutex
	ids map[string]string // intent → instance
}

// add marks an intent as owned; the returned func ends the ownership.
func (l *liveSet) add(intent, instance string) func() {
	l.claim(intent, instance)
	return func() { l.done(intent) }
}

// claim marks an intent as owned unless another owner holds it.
func (l *liveSet) claim(intent, instance string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.ids[intent]; ok {
		return false
	}
	if l.ids == nil {
		l.ids = map[string]string{}
	}
	l.ids[intent] = instance
	return true
}

func (l *liveSet) done(intent string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.ids, intent)
}

// busy reports whether an operation is working on an instance.
func (l *liveSet) busy(instance string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, inst := range l.ids {
		if inst == instance {
			return true
		}
	}
	return false
}
