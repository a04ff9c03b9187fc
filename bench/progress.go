package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws one progress line on a terminal while a phase runs:
//
//	hot/pinboard open  [########------------]  42%   4.2s/10s  19,870 req/s  err 0
//
// On a terminal the line redraws in place four times a second; otherwise
// (make bench > log) one line is printed every five seconds.
type Progress struct {
	w        io.Writer
	tty      bool
	label    string
	total    time.Duration
	live     *Live
	start    time.Time
	stop     chan struct{}
	done     sync.WaitGroup
	lastDone uint64
	lastAt   time.Time
}

// IsTerminal reports whether f is a character device.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// StartProgress starts drawing on w for a phase of about total; live may
// be nil for phases without a request counter. tty chooses redrawing.
func StartProgress(w io.Writer, tty bool, label string, total time.Duration, live *Live) *Progress {
	p := &Progress{w: w, tty: tty, label: label, total: total, live: live, start: time.Now(), stop: make(chan struct{})}
	p.lastAt = p.start
	every := 250 * time.Millisecond
	if !tty {
		every = 5 * time.Second
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case now := <-t.C:
				p.draw(now, false)
			}
		}
	}()
	return p
}

// Stop ends the line with a final state.
func (p *Progress) Stop() {
	close(p.stop)
	p.done.Wait()
	p.draw(time.Now(), true)
}

func (p *Progress) draw(now time.Time, final bool) {
	el := now.Sub(p.start)
	frac := 1.0
	if p.total > 0 && !final {
		frac = min(el.Seconds()/p.total.Seconds(), 1)
	}
	const width = 20
	n := int(frac * width)
	bar := strings.Repeat("#", n) + strings.Repeat("-", width-n)
	line := fmt.Sprintf("%-28s [%s] %3.0f%% %6.1fs/%-5s", p.label, bar, frac*100, el.Seconds(), p.total.Round(time.Second))
	if p.live != nil {
		d := p.live.Done.Load()
		var rate float64
		if final {
			rate = float64(d) / el.Seconds()
		} else if dt := now.Sub(p.lastAt).Seconds(); dt > 0 {
			rate = float64(d-p.lastDone) / dt
		}
		p.lastDone, p.lastAt = d, now
		line += fmt.Sprintf(" %9s req/s  err %d", thousands(int64(rate)), p.live.Errors.Load())
	}
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}

// thousands formats n with comma separators: 1234567 → "1,234,567".
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
