package snapshots

// LeadsTerm tells whether Run runs now, for a term of this replica's
// leadership: the records are then written through the term's fenced
// store (a write after the term was lost fails). A caller that must not
// write unfenced (the Kubernetes controller's restores) asks right before
// it writes. Once the term ends (Run returned) writes fall back to
// Records, unfenced: a request between this answer and its write is the
// window left.
func (s *Service) LeadsTerm() bool {
	s.termMu.Lock()
	defer s.termMu.Unlock()
	return s.term != nil
}
