package metrics

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// labelSet maps a bounded, learned set of label values (namespaces, store
// operations) to preallocated slots. The fast path is a lookup in an
// immutable map published through an atomic pointer: no lock, and
// m[string(b)] does not allocate. A new value takes the slow path once
// (lock, copy the map, add); past the cap every new value shares the
// overflow slot.
type labelSet[T any] struct {
	idx   atomic.Pointer[map[string]int]
	full  atomic.Bool
	mu    sync.Mutex
	names []string // slot -> label value; fixed slots first
	vals  []T      // preallocated: fixed + max
	fixed int
}

func (s *labelSet[T]) init(max int, fixed []string, initVal func(*T)) {
	s.fixed = len(fixed)
	s.names = append(make([]string, 0, len(fixed)+max), fixed...)
	s.vals = make([]T, len(fixed)+max)
	if initVal != nil {
		for i := range s.vals {
			initVal(&s.vals[i])
		}
	}
	m := map[string]int{}
	s.idx.Store(&m)
}

// slot returns the slot of value b, learning it if there is room, or
// overflow once the set is full. b is not retained.
func (s *labelSet[T]) slot(b []byte, overflow int) int {
	if i, ok := (*s.idx.Load())[string(b)]; ok {
		return i
	}
	if s.full.Load() {
		return overflow
	}
	return s.learn(b, overflow)
}

// learn is the slow path: once per distinct value.
func (s *labelSet[T]) learn(b []byte, overflow int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.idx.Load()
	if i, ok := old[string(b)]; ok {
		return i
	}
	// The label value as exposed: valid UTF-8 (Prometheus refuses a
	// scrape with any other), so two values that differ only in invalid
	// bytes are one label value and share its slot, as does a value
	// spelled like a fixed slot ("none", "other"): one series each.
	name := strings.ToValidUTF8(string(b), "\uFFFD")
	i := slices.Index(s.names, name)
	if i < 0 {
		if len(s.names) == len(s.vals) {
			s.full.Store(true)
			return overflow
		}
		i = len(s.names)
		s.names = append(s.names, name)
	} else if len(old) >= 2*len(s.vals) {
		return i // aliases are cached up to a bound: b may vary without end
	}
	m := make(map[string]int, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[string(b)] = i
	s.idx.Store(&m)
	return i
}

func (s *labelSet[T]) at(i int) *T { return &s.vals[i] }

// each calls f for every slot in use, fixed slots first.
func (s *labelSet[T]) each(f func(name string, v *T)) {
	s.mu.Lock()
	names := s.names[:len(s.names):len(s.names)]
	s.mu.Unlock()
	for i, n := range names {
		f(n, &s.vals[i])
	}
}

// unsafeBytes views s as bytes without copying; the result must not be
// modified.
func unsafeBytes(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// learned is the number of values learned beyond the fixed slots.
func (s *labelSet[T]) learned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.names) - s.fixed
}
