package builtintools

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// MetaKeyNetEvents is the CallToolResult._meta key under which every tool
// result carries the NetEvents of its HTTP attempts. The builtin opens no
// database: the process that owns the session ledger turns these into
// net_events rows.
const MetaKeyNetEvents = "capsem/net_events"

// NetEvent records one HTTP attempt: the first request, every redirect hop,
// and attempts refused by policy or failed before or during the exchange.
// Decision values recorded in NetEvent.Decision.
const (
	DecisionAllowed = "allowed"
	DecisionDenied  = "denied"
	DecisionError   = "error"
)

type NetEvent struct {
	Timestamp time.Time `json:"timestamp"` // when the attempt started
	Domain    string    `json:"domain"`    // normalized host; empty when the URL had none
	Port      int       `json:"port"`      // explicit port, else 80/443 by scheme
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	Query     string    `json:"query"`
	// StatusCode is 0 when no response arrived.
	StatusCode int `json:"status_code"`
	// BytesSent counts request body bytes; BytesReceived counts response
	// body bytes read (0 for redirect responses, whose bodies are discarded).
	BytesSent     int64  `json:"bytes_sent"`
	BytesReceived int64  `json:"bytes_received"`
	DurationMS    int64  `json:"duration_ms"`
	Decision      string `json:"decision"`     // DecisionAllowed, DecisionDenied or DecisionError
	MatchedRule   string `json:"matched_rule"` // the allow/block pattern that decided, if any
	Error         string `json:"error"`        // why the attempt was denied or failed
	// IP is the address connected to, or refused for being private; empty
	// when no address was reached (a refused name, a failed lookup).
	IP string `json:"ip,omitempty"`
}

// NetEventsFromMeta decodes the NetEvents a builtin tool result carries in
// its _meta, as received by a client (where they arrive as generic JSON).
// A result without the key has no events.
func NetEventsFromMeta(meta map[string]any) ([]NetEvent, error) {
	raw, ok := meta[MetaKeyNetEvents]
	if !ok || raw == nil {
		return nil, nil
	}
	encoded, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("re-encoding %s: %w", MetaKeyNetEvents, err)
	}
	var events []NetEvent
	if err := json.Unmarshal(encoded, &events); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", MetaKeyNetEvents, err)
	}
	return events, nil
}

// eventLog collects the events of one tool call.
type eventLog struct {
	mu     sync.Mutex
	events []NetEvent
}

func (l *eventLog) add(event NetEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, event)
}

// snapshot returns the events so far; never nil, so _meta always carries a
// JSON array.
func (l *eventLog) snapshot() []NetEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]NetEvent{}, l.events...)
}

// hop is one HTTP attempt in progress; finish turns it into a NetEvent.
type hop struct {
	log         *eventLog
	started     time.Time
	domain      string
	port        int
	method      string
	path        string
	query       string
	bytesSent   int64
	matchedRule string
	ip          string
	finished    bool
}

func startHop(log *eventLog, method string, target *url.URL, bytesSent int64) *hop {
	h := &hop{log: log, started: time.Now(), method: method, bytesSent: bytesSent}
	if target != nil {
		h.domain, h.port = bestEffortDomainPort(target)
		h.path = target.EscapedPath()
		h.query = target.RawQuery
	}
	return h
}

// finish records the hop once; later calls are ignored so an error path
// cannot double-count an attempt already recorded.
func (h *hop) finish(decision string, statusCode int, bytesReceived int64, errMessage string) {
	if h.finished {
		return
	}
	h.finished = true
	h.log.add(NetEvent{
		Timestamp:     h.started.UTC(),
		Domain:        h.domain,
		Port:          h.port,
		Method:        h.method,
		Path:          h.path,
		Query:         h.query,
		StatusCode:    statusCode,
		BytesSent:     h.bytesSent,
		BytesReceived: bytesReceived,
		DurationMS:    time.Since(h.started).Milliseconds(),
		Decision:      decision,
		MatchedRule:   h.matchedRule,
		Error:         errMessage,
		IP:            h.ip,
	})
}

// bestEffortDomainPort describes a URL for telemetry even when it is not
// acceptable (bad host, unknown scheme), so refused attempts still say what
// was asked for.
func bestEffortDomainPort(target *url.URL) (string, int) {
	domain := target.Hostname()
	if normalized, err := netpolicy.NormalizeHost(domain); err == nil {
		domain = normalized
	}
	port, err := portOf(target)
	if err != nil {
		port = 0
	}
	return domain, port
}
