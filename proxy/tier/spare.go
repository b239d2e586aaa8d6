package tier

import (
	"sync"
	"time"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// spareCollections are this proxy's spare staging collections, at most one a
// rule: a merge before a read
// makes one from the collection it merged, and the proxy's next insert
// into a staging collection it has not made yet renames the spare to it
// instead of creating it. One is enough: the merge before the next read
// makes the next.
type spareCollections struct {
	mu     sync.Mutex
	byRule map[string]*spareCollection // by stage.SpareKey
	seq    int64                       // the last token given
}

type spareCollection struct {
	name, marker string
	// renamed: the merge renamed its retired collection to it, and the
	// proxy is cleaning it (since at); before, a merge reserved the name
	// (since at). made: cleaned to its marker, ready for an insert
	// (since at).
	renamed, made bool
	at            time.Time
}

// spareReserveFor is how long a merge that asked for a spare may take to
// make it before the name is given up (a merge that was cut never says).
const spareReserveFor = time.Minute

// spareIdleFor is how long a spare stays unused before the background
// drops it: the rule's writers stopped (or read nothing lately).
const spareIdleFor = time.Minute

func newSpareCollections() *spareCollections {
	return &spareCollections{byRule: map[string]*spareCollection{}}
}

// reserve gives a merge of rule at now the name of a new spare
// collection of the proxy tagged tag, unless the rule has one (made or on
// its way); renamed then says whether the merge made it.
func (s *spareCollections) reserve(rule *rules.Rule, tag string, now time.Time) (name string, ok bool) {
	key := stage.RuleSpareKey(rule)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp := s.byRule[key]; sp != nil && (sp.made || now.Sub(sp.at) < spareReserveFor) {
		return "", false
	}
	// Tokens increase: a name is never given twice by one run, and a
	// run's start (in ms) is past the previous run's tokens.
	s.seq = max(s.seq+1, now.UnixMilli())
	sp := &spareCollection{name: stage.SpareName(rule, tag, s.seq), at: now}
	s.byRule[key] = sp
	return sp.name, true
}

// renamed settles the reservation of spare name of rule: ok says whether
// a merge renamed a collection to it, with marker. It says whether the
// spare is now to be cleaned (cleanSpare).
func (s *spareCollections) renamed(rule *rules.Rule, name string, ok bool, marker string) bool {
	key := stage.RuleSpareKey(rule)
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.byRule[key]
	if sp == nil || sp.name != name {
		return false
	}
	if !ok {
		delete(s.byRule, key)
		return false
	}
	sp.renamed, sp.marker, sp.at = true, marker, time.Now()
	return true
}

// cleaned settles the cleaning of rule's spare name: ready for an
// insert, or (it failed) forgotten, left to tidySpares.
func (s *spareCollections) cleaned(rule *rules.Rule, name string, ok bool) {
	key := stage.RuleSpareKey(rule)
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.byRule[key]
	if sp == nil || sp.name != name {
		return
	}
	if !ok {
		delete(s.byRule, key)
		return
	}
	sp.made, sp.at = true, time.Now()
}

// takeIf hands the spare of the rule keyed key (stage.SpareKey) over,
// once, when ok says it may go.
func (s *spareCollections) takeIf(key string, ok func(*spareCollection) bool) (spareCollection, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.byRule[key]
	if sp == nil || !ok(sp) {
		return spareCollection{}, false
	}
	delete(s.byRule, key)
	return *sp, true
}

// take hands a cleaned spare over to an insert.
func (s *spareCollections) take(key string) (spareCollection, bool) {
	return s.takeIf(key, func(sp *spareCollection) bool { return sp.made })
}

// takeIdle hands rule's cleaned spare over when it has been unused since
// before cut.
func (s *spareCollections) takeIdle(rule *rules.Rule, cut time.Time) (spareCollection, bool) {
	return s.takeIf(stage.RuleSpareKey(rule), func(sp *spareCollection) bool { return sp.made && sp.at.Before(cut) })
}

// takeRenamed hands rule's spare over once a merge renamed a collection
// to it, cleaned or not.
func (s *spareCollections) takeRenamed(rule *rules.Rule) (spareCollection, bool) {
	return s.takeIf(stage.RuleSpareKey(rule), func(sp *spareCollection) bool { return sp.renamed })
}

// ready counts the spares cleaned and ready for an insert.
func (s *spareCollections) ready() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sp := range s.byRule {
		if sp.made {
			n++
		}
	}
	return n
}

// ReadySpares is how many spare staging collections the proxy holds
// cleaned, for an insert to take. The upstream shows a spare cleaned a
// moment before the proxy learns it from the delete's reply: until then
// an insert creates its collection, as without a spare.
func (t *Tier) ReadySpares() int { return t.spares.ready() }

// kept says whether name is rule's spare, made or on its way.
func (s *spareCollections) kept(rule *rules.Rule, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.byRule[stage.RuleSpareKey(rule)]
	return sp != nil && sp.name == name
}

// cleanSpare deletes every document of rule's spare name but its marker,
// after the merge that renamed it, off the read's way: on a connection of
// the background pool, which the background rounds keep open anyway (a
// helper would stay open connIdle after each read, apart from them).
func (t *Tier) cleanSpare(rule *rules.Rule, name, marker string) {
	reply := t.background.Run(rewrite.Upstream{Body: stage.SpareCleanCommand(rule.DB, name, marker)})
	t.spares.cleaned(rule, name, reply != nil && mongoerr.IsOK(reply))
}

// useSpare makes staging collection db.coll from a spare of its rule, if
// this proxy has one: it renames the spare, whose marker becomes the
// collection's (kc's). It says whether it did; if not, markKept creates
// the collection. A spare that cannot be renamed (the name exists, or the
// spare went with a drop of the namespace) is dropped.
func (t *Tier) useSpare(asIs exec.Runner, kc *keptColl, db, coll string) bool {
	key, ok := stage.SpareKey(db, coll)
	if !ok {
		return false
	}
	sp, ok := t.spares.take(key)
	if !ok {
		return false
	}
	replies, err := asIs.RunStep(rewrite.Step{{Body: stage.SpareRenameCommand(db, sp.name, coll)}})
	if err == nil && len(replies) == 1 && mongoerr.IsOK(replies[0]) {
		t.kept.marked(kc, sp.marker)
		return true
	}
	if err == nil {
		_, _ = asIs.RunStep(rewrite.Step{{Body: source.DropCommand(db, sp.name)}})
	}
	return false
}

// dropSpare drops rule's spare, if it has one (a flush leaves no staging
// behind). One being cleaned goes too: its cleaning then finds it gone.
func (t *Tier) dropSpare(r exec.Runner, rule *rules.Rule) error {
	sp, ok := t.spares.takeRenamed(rule)
	if !ok {
		return nil
	}
	return dropSpareNamed(r, rule, sp.name)
}

func dropSpareNamed(r exec.Runner, rule *rules.Rule, name string) error {
	res, err := exec.Drive(r, rewrite.Passthrough(source.DropCommand(rule.DB, name), nil))
	if err != nil {
		return UpstreamFailure{Err: err}
	}
	if err := mongoerr.ReplyError(res.Reply); err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceNotFound {
		return err
	}
	return nil
}

// tidySpares is the background round's care of rule's spares, on list (a
// listing of its database): the proxy's spare unused for spareIdleFor is
// dropped, and so are spares of its tag it does not keep (left by a merge
// cut after it made one, or by an earlier run of the proxy) once they
// are older than a reservation lasts.
func (t *Tier) tidySpares(r exec.Runner, rule *rules.Rule, list []byte, now time.Time) error {
	if sp, ok := t.spares.takeIdle(rule, now.Add(-spareIdleFor)); ok {
		if err := dropSpareNamed(r, rule, sp.name); err != nil {
			return err
		}
	}
	docs, _, err := cursor.Docs(list)
	if err != nil {
		return nil // a hint: the next round lists again
	}
	tag := t.StagerTag()
	for _, d := range docs {
		name, _ := d.Lookup("name").StringValueOK()
		owner, token, ok := stage.ParseSpare(rule, name)
		if !ok || owner != tag || now.UnixMilli()-token < spareReserveFor.Milliseconds() || t.spares.kept(rule, name) {
			continue
		}
		if err := dropSpareNamed(r, rule, name); err != nil {
			return err
		}
	}
	return nil
}
