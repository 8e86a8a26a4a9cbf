package manager

import "sync"

// inflightSet names the intents that this process is working on. Reconcile
// runs while other operations are in flight (on demand, or when libvirtd
// comes back or a VM starts); an intent in the set belongs to its
// operation (or to the undo that finishes it in the background), and
// reconcile must not finish or undo it underneath. At start-up the set is
// empty, so every intent on disk is a crash's leftover.
//
// An operation adds its intent before writing it and removes it after
// deleting it, so an intent on disk that is absent from the set is either
// a leftover or already deleted; reconcile takes it and reads it again
// to tell the two apart. Holders are counted: an operation that hands its
// intent to a background undo adds it again before it lets go.
type inflightSet struct {
	mu  sync.Mutex
	ids map[string]*inflightEntry
}

type inflightEntry struct {
	instance string
	holders  int
}

// add holds an intent; the returned func lets go of it.
func (l *inflightSet) add(intent, instance string) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hold(intent, instance)
	return func() { l.done(intent) }
}

func (l *inflightSet) hold(intent, instance string) {
	if l.ids == nil {
		l.ids = map[string]*inflightEntry{}
	}
	e := l.ids[intent]
	if e == nil {
		e = &inflightEntry{instance: instance}
		l.ids[intent] = e
	}
	e.holders++
}

// take holds an intent unless someone holds it already.
func (l *inflightSet) take(intent, instance string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.ids[intent]; ok {
		return false
	}
	l.hold(intent, instance)
	return true
}

// done lets go of an intent once.
func (l *inflightSet) done(intent string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.ids[intent]; e != nil {
		if e.holders--; e.holders <= 0 {
			delete(l.ids, intent)
		}
	}
}

// busy reports whether an operation is working on an instance.
func (l *inflightSet) busy(instance string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.ids {
		if e.instance == instance {
			return true
		}
	}
	return false
}

// idle reports whether no operation is in flight.
func (l *inflightSet) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids) == 0
}
